//! The inbox's tables: migrations, the check that they are there, and the DDL.

use sqlx::Pool;
use sqlx::migrate::{MigrateError, Migrator};

use super::sql;
use super::{Backend, MIGRATIONS_TABLE};

/// Applies the inbox schema migrations that have not run yet, recorded in
/// [`MIGRATIONS_TABLE`].
pub async fn migrate<DB: Backend>(pool: &Pool<DB>) -> Result<(), MigrateError> {
    let embedded = DB::migrations();
    let mut migrator = Migrator::with_migrations(embedded.migrations.to_vec());
    migrator.dangerous_set_table_name(MIGRATIONS_TABLE);
    migrator.run(pool).await
}

/// Fails if the inbox tables are missing.
pub async fn check<DB: Backend>(pool: &Pool<DB>) -> Result<(), sqlx::Error> {
    let mut conn = pool.acquire().await?;
    sql::execute::<DB>(&mut conn, DB::SQL.check_schema, &[]).await?;
    Ok(())
}
