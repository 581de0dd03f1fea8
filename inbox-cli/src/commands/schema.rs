//! `inbox migrate` and `inbox schema`.

use inbox_core::Backend;
use sqlx::{Pool, Postgres, Sqlite};

use crate::cli::BackendKind;
use crate::database;
use crate::error::CliError;
use crate::output::{Migrated, Output, Schema};

/// Applies the schema migrations that have not run yet.
pub async fn migrate<DB: Backend>(pool: &Pool<DB>, out: &Output) -> Result<(), CliError> {
    inbox_core::migrate(pool).await?;
    out.emit(&Migrated {
        database: DB::NAME,
        migrated: true,
    })
}

/// Prints the DDL of `backend`, or of the backend `url` names; connects to nothing.
pub fn print(
    backend: Option<BackendKind>,
    url: Option<&str>,
    out: &Output,
) -> Result<(), CliError> {
    let backend = match (backend, url) {
        (Some(backend), _) => backend,
        (None, Some(url)) => database::backend_of(url)?,
        (None, None) => return Err(CliError::MissingDatabaseUrl),
    };
    let ddl = match backend {
        BackendKind::Postgres => inbox_core::schema::<Postgres>(),
        BackendKind::Sqlite => inbox_core::schema::<Sqlite>(),
        #[cfg(feature = "mysql")]
        BackendKind::MySql => inbox_core::schema::<sqlx::MySql>(),
    };
    out.emit(&Schema { backend, ddl })
}
