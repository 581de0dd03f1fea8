//! The inbox's tables: migrations, the check that they are there, and the DDL.

use std::collections::{BTreeSet, HashMap};

use sqlx::Pool;
use sqlx::migrate::{MigrateError, Migrator};

use super::sql::{self, Param};
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

/// The unique keys the inbox stands on, by table: one dedup row per message and handler, one
/// stream row per aggregate, one outbox row per id, one conflict row per content. Without one, a
/// claim or an upsert either writes a second row for the same key (MySQL's duplicate-key answer
/// never comes) or fails on every message (an `ON CONFLICT` that names no key: PostgreSQL,
/// SQLite).
const KEYS: &[(&str, &[&str])] = &[
    ("inbox_messages", &["consumer", "handler", "message_id"]),
    ("inbox_streams", &["consumer", "handler", "aggregate_id"]),
    ("inbox_outbox", &["id"]),
    ("inbox_outbox_streams", &["aggregate_id"]),
    (
        "inbox_conflicts",
        &["consumer", "handler", "message_id", "payload_hash"],
    ),
];

/// Why the inbox tables cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum SchemaError {
    /// The database did not answer, or a table or column of the latest migrations is missing.
    #[error(transparent)]
    Database(#[from] sqlx::Error),
    /// A table lacks a unique key the inbox relies on (a schema applied by hand, without it).
    #[error(
        "table `{table}` has no unique key on ({columns}), which the inbox relies on to keep one \
         row per key; add it: `CREATE UNIQUE INDEX {table}_key ON {table} ({columns})`"
    )]
    MissingKey {
        /// The table.
        table: &'static str,
        /// The key's columns, comma-separated.
        columns: String,
    },
}

/// Fails if an inbox table, a column of the latest migrations, or a unique key the inbox relies
/// on (see [`SchemaError::MissingKey`]) is missing.
pub async fn check<DB: Backend>(pool: &Pool<DB>) -> Result<(), SchemaError> {
    let mut conn = pool.acquire().await?;
    sql::execute::<DB>(&mut conn, DB::SQL.check_schema, &[]).await?;
    for &(table, columns) in KEYS {
        let params = [Param::Text(table)];
        let indexed = sql::fetch_all::<DB, _>(&mut conn, DB::SQL.unique_keys, &params).await?;
        if !is_keyed_on(&indexed, columns) {
            let columns = columns.join(", ");
            return Err(SchemaError::MissingKey { table, columns });
        }
    }
    Ok(())
}

/// Whether one of the unique indexes in `indexed` (rows of an index's name and one of its
/// columns) is on exactly `columns`, in any order.
fn is_keyed_on(indexed: &[(String, String)], columns: &[&str]) -> bool {
    let mut keys: HashMap<&str, BTreeSet<String>> = HashMap::new();
    for (index, column) in indexed {
        let key = keys.entry(index.as_str()).or_default();
        key.insert(column.to_ascii_lowercase());
    }
    let wanted: BTreeSet<String> = columns.iter().map(|c| c.to_string()).collect();
    keys.values().any(|key| *key == wanted)
}

#[cfg(test)]
mod tests {
    use super::{Backend, is_keyed_on};

    fn indexed(rows: &[(&str, &str)]) -> Vec<(String, String)> {
        rows.iter()
            .map(|(index, column)| (index.to_string(), column.to_string()))
            .collect()
    }

    #[test]
    fn a_key_is_found_whatever_the_order_of_its_columns() {
        let rows = indexed(&[("pk", "handler"), ("pk", "Consumer"), ("pk", "message_id")]);

        assert!(is_keyed_on(&rows, &["consumer", "handler", "message_id"]));
    }

    #[test]
    fn an_index_on_fewer_or_more_columns_is_not_the_key() {
        let fewer = indexed(&[("by_consumer", "consumer")]);
        let more = indexed(&[("wide", "consumer"), ("wide", "handler"), ("wide", "id")]);
        let split = indexed(&[("a", "consumer"), ("b", "handler")]);

        // A prefix or an expression comes as an empty column name.
        let prefixed = indexed(&[("by_prefix", "consumer"), ("by_prefix", "")]);

        for rows in [fewer, more, split, prefixed] {
            assert!(!is_keyed_on(&rows, &["consumer", "handler"]), "{rows:?}");
        }
    }

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
