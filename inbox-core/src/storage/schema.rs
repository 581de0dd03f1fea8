//! The inbox's tables: migrations, the check that they are there, and the DDL.

use sqlx::Pool;
use sqlx::migrate::{MigrateError, Migrator};

use super::sql;
use super::{Backend, MIGRATIONS_TABLE};

/// Reads a column of every inbox table and finds no row: fails where a table or a column of the
/// latest migrations is missing. The same text on every database.
pub(super) const CHECK_SCHEMA: &str = "SELECT m.payload, m.headers, m.error_text, m.attempt_count, m.resolution, \
    s.last_sequence, r.reason, o.refusals, os.last_sequence, a.outcome, c.deliveries \
    FROM inbox_messages m, inbox_streams s, inbox_rejected r, inbox_outbox o, inbox_outbox_streams os, \
    inbox_actions a, inbox_conflicts c WHERE 1 = 0";

/// Applies the inbox schema migrations that have not run yet, recorded in
/// [`MIGRATIONS_TABLE`]; first, the setting the database keeps for the guard
/// ([`Backend::DATABASE_SETTING`]: SQLite's write-ahead log, whatever options the pool was made
/// with).
pub async fn migrate<DB: Backend>(pool: &Pool<DB>) -> Result<(), MigrateError> {
    if let Some(setting) = DB::DATABASE_SETTING {
        let mut conn = pool.acquire().await?;
        sql::execute::<DB>(&mut conn, setting, &[]).await?;
    }
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

#[cfg(test)]
mod tests {
    use super::Backend;

    /// Every migration of `DB`, word for word, in the DDL printed for teams that apply their own.
    fn printed_schema_holds_every_migration<DB: Backend>() {
        let ddl = DB::schema_sql();
        for migration in DB::migrations().iter() {
            assert!(
                ddl.contains(migration.sql.as_str().trim()),
                "{}'s printed schema lacks migration {} ({})",
                DB::NAME,
                migration.version,
                migration.description
            );
        }
    }

    #[cfg(feature = "postgres")]
    #[test]
    fn postgres_prints_every_migration() {
        printed_schema_holds_every_migration::<sqlx::Postgres>();
    }

    #[cfg(feature = "sqlite")]
    #[test]
    fn sqlite_prints_every_migration() {
        printed_schema_holds_every_migration::<sqlx::Sqlite>();
    }

    #[cfg(feature = "mysql")]
    #[test]
    fn mysql_prints_every_migration() {
        printed_schema_holds_every_migration::<sqlx::MySql>();
    }
}
