//! The handler forms and the inbox's setup, on every backend: composite keys, message-only
//! handlers, `Context` and `Transaction` handles, consumer scopes, and the schema.

mod common;

use inbox::prelude::*;

#[derive(Debug, Clone, Serialize, Deserialize, Message)]
#[message(name = "test.tenant_event")]
struct TenantEvent {
    tenant: String,
    event_id: u64,
    order_id: Uuid,
    sequence: i32,
}

impl TenantEvent {
    fn new(tenant: &str, event_id: u64) -> Self {
        Self {
            tenant: tenant.to_owned(),
            event_id,
            order_id: Uuid::from_u128(7),
            sequence: 1,
        }
    }
}

#[inbox_handler(key = ["tenant", "event_id"])]
async fn count_tenant_event(_msg: TenantEvent) -> Result<(), HandlerError> {
    Ok(())
}

/// A handler whose name is one character longer than the inbox tables keep.
#[inbox_handler(key = ["tenant", "event_id"], name = "handler_nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn")]
async fn long_named(_msg: TenantEvent) -> Result<(), HandlerError> {
    Ok(())
}

/// A message whose type tag is one character longer than the inbox tables keep.
#[derive(Debug, Clone, Serialize, Deserialize, Message)]
#[message(
    name = "test.ttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttt"
)]
struct LongTagged {
    event_id: u64,
}

#[inbox_handler(key = "event_id")]
async fn count_long_tagged(_msg: LongTagged) -> Result<(), HandlerError> {
    Ok(())
}

macro_rules! handlers_suite {
    ($db:ty, $conn:ty, $connect:path, $unmigrated:path, $batch:expr) => {
        use super::{count_long_tagged, count_tenant_event, long_named, TenantEvent};
        use inbox::prelude::*;

        type Pool = sqlx::Pool<$db>;

        /// An inbox builder in this suite's mode (batched or not).
        fn builder(pool: &Pool) -> inbox::InboxBuilder<$db> {
            $crate::common::builder(pool, $batch)
        }

        #[inbox_handler(key = "event_id", sequence = "sequence", aggregate = "order_id")]
        async fn record_metadata(
            ctx: &mut Context<'_, $db>,
            msg: TenantEvent,
        ) -> Result<(), HandlerError> {
            let correlation = ctx.headers().get("correlation-id").cloned();
            sqlx::query($crate::common::sql::<$db>("INSERT INTO seen (consumer, handler, message_id, aggregate, sequence, correlation, tenant) VALUES ($1, $2, $3, $4, $5, $6, $7)"))
                .bind(ctx.consumer().to_owned())
                .bind(ctx.handler())
                .bind(ctx.message_id().to_owned())
                .bind(ctx.aggregate().map(str::to_owned))
                .bind(ctx.sequence())
                .bind(correlation)
                .bind(msg.tenant)
                .execute(&mut **ctx)
                .await?;
            Ok(())
        }

        #[inbox_handler(key = "event_id", name = "tx_writer")]
        async fn write_in_transaction(
            tx: &mut sqlx::Transaction<'_, $db>,
            msg: TenantEvent,
        ) -> Result<(), HandlerError> {
            sqlx::query($crate::common::sql::<$db>("INSERT INTO seen (consumer, handler, message_id, tenant) VALUES ('-', 'tx_writer', '-', $1)"))
                .bind(msg.tenant)
                .execute(&mut **tx)
                .await?;
            Ok(())
        }

        async fn database(test: &str) -> Option<Pool> {
            let pool = $connect(test).await?;
            sqlx::query($crate::common::sql::<$db>("CREATE TABLE seen (consumer TEXT, handler TEXT, message_id TEXT, aggregate TEXT, sequence BIGINT, correlation TEXT, tenant TEXT)"))
                .execute(&pool)
                .await
                .unwrap();
            Some(pool)
        }

        async fn seen(pool: &Pool) -> i64 {
            sqlx::query_scalar($crate::common::sql::<$db>("SELECT COUNT(*) FROM seen"))
                .fetch_one(pool)
                .await
                .unwrap()
        }

        #[tokio::test]
        async fn composite_key_dedups_on_the_whole_tuple() {
            let Some(pool) = database("composite_key").await else { return };

            assert_eq!(
                count_tenant_event
                    .process(&pool, TenantEvent::new("t1", 1))
                    .await
                    .unwrap(),
                Outcome::Processed
            );
            assert_eq!(
                count_tenant_event
                    .process(&pool, TenantEvent::new("t2", 1))
                    .await
                    .unwrap(),
                Outcome::Processed
            );
            assert_eq!(
                count_tenant_event
                    .process(&pool, TenantEvent::new("t1", 1))
                    .await
                    .unwrap(),
                Outcome::Duplicate
            );

            let ids: Vec<String> =
                sqlx::query_scalar($crate::common::sql::<$db>("SELECT message_id FROM inbox_messages ORDER BY message_id"))
                    .fetch_all(&pool)
                    .await
                    .unwrap();
            assert_eq!(ids, [r#"["t1","1"]"#, r#"["t2","1"]"#]);
        }

        #[tokio::test]
        async fn context_handler_sees_the_delivery_metadata() {
            let Some(pool) = database("context_metadata").await else { return };
            let inbox = builder(&pool)
                .consumer("billing")
                .handler(record_metadata)
                .build()
                .await
                .unwrap();
            let event = TenantEvent::new("t1", 42);
            let envelope = Envelope::encode("d-1", &event)
                .unwrap()
                .with_header("correlation-id", "c-9");

            inbox.dispatch(&envelope).await.unwrap();

            let row: (String, String, String, String, i64, String) = sqlx::query_as(
                $crate::common::sql::<$db>("SELECT consumer, handler, message_id, aggregate, sequence, correlation FROM seen"),
            )
            .fetch_one(&pool)
            .await
            .unwrap();
            let aggregate = Uuid::from_u128(7).to_string();
            assert_eq!(
                row,
                (
                    "billing".into(),
                    "record_metadata".into(),
                    "42".into(),
                    aggregate,
                    1,
                    "c-9".into()
                )
            );
        }

        #[tokio::test]
        async fn transaction_handler_writes_in_the_guarded_transaction() {
            let Some(pool) = database("transaction_handle").await else { return };
            let event = TenantEvent::new("t1", 5);

            assert_eq!(
                write_in_transaction
                    .process(&pool, event.clone())
                    .await
                    .unwrap(),
                Outcome::Processed
            );
            assert_eq!(
                write_in_transaction.process(&pool, event).await.unwrap(),
                Outcome::Duplicate
            );

            assert_eq!(seen(&pool).await, 1);
        }

        #[tokio::test]
        async fn each_consumer_handles_every_message_once() {
            let Some(pool) = database("consumer_scopes").await else { return };
            let envelope = Envelope::encode("d-1", &TenantEvent::new("t1", 1)).unwrap();
            let billing = builder(&pool)
                .consumer("billing")
                .handler(record_metadata)
                .build()
                .await
                .unwrap();
            let shipping = builder(&pool)
                .consumer("shipping")
                .handler(record_metadata)
                .build()
                .await
                .unwrap();

            for inbox in [&billing, &shipping, &billing, &shipping] {
                inbox.dispatch(&envelope).await.unwrap();
            }

            let consumers: Vec<String> = sqlx::query_scalar($crate::common::sql::<$db>("SELECT consumer FROM seen ORDER BY consumer"))
                .fetch_all(&pool)
                .await
                .unwrap();
            assert_eq!(consumers, ["billing", "shipping"]);
        }

        #[tokio::test]
        async fn building_without_the_schema_says_to_migrate() {
            let Some(pool) = $unmigrated("unmigrated").await else { return };

            let error = builder(&pool)
                .handler(count_tenant_event)
                .build()
                .await
                .err()
                .unwrap();

            assert!(matches!(error, inbox::BuildError::Schema(_)), "{error}");
            assert!(
                error
                    .to_string()
                    .contains("run `inbox::migrate(&pool)` first"),
                "{error}"
            );
        }

        #[tokio::test]
        async fn empty_consumer_is_refused() {
            let Some(pool) = database("empty_consumer").await else { return };

            let error = builder(&pool)
                .consumer(" ")
                .handler(count_tenant_event)
                .build()
                .await
                .err()
                .unwrap();

            assert!(matches!(error, inbox::BuildError::EmptyConsumer), "{error}");
        }

        /// Names and type tags longer than MySQL's columns keep are refused on every database,
        /// when the inbox is built, instead of each message being refused on MySQL alone.
        #[tokio::test]
        async fn a_handler_name_or_type_tag_longer_than_the_tables_keep_is_refused_at_build() {
            let Some(pool) = database("long_names").await else { return };

            let error = builder(&pool).handler(long_named).build().await.err().unwrap();
            assert!(matches!(error, inbox::BuildError::HandlerNameTooLong { chars: 101, .. }), "{error}");
            assert!(error.to_string().contains("at most 100"), "{error}");
            let error = builder(&pool).handler(count_long_tagged).build().await.err().unwrap();
            assert!(matches!(error, inbox::BuildError::MessageTypeTooLong { chars: 256, .. }), "{error}");
            assert!(error.to_string().contains("at most 255"), "{error}");
        }

        #[tokio::test]
        async fn a_consumer_name_longer_than_the_tables_keep_is_refused_at_build() {
            let Some(pool) = database("long_consumer").await else { return };
            let build = |consumer: String| builder(&pool).consumer(consumer).handler(count_tenant_event).build();

            let error = build("é".repeat(101)).await.err().unwrap();
            assert!(matches!(error, inbox::BuildError::ConsumerTooLong(101)), "{error}");
            assert!(error.to_string().contains("at most 100"), "{error}");
            build("é".repeat(100)).await.expect("100 characters fit, however many bytes");
        }

        #[tokio::test]
        async fn migrations_are_idempotent_and_kept_apart_from_the_application() {
            let Some(pool) = database("migrations_apart").await else { return };

            inbox::migrate(&pool).await.unwrap();

            let applied = format!("SELECT COUNT(*) FROM {}", inbox::MIGRATIONS_TABLE);
            let applied: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(applied)).fetch_one(&pool).await.unwrap();
            assert!(applied > 0, "the inbox's migrations are recorded in its own table");
            let application = sqlx::query("SELECT COUNT(*) FROM _sqlx_migrations").execute(&pool).await;
            assert!(application.is_err(), "and not in the application's `_sqlx_migrations`");
        }

        /// A dedup table applied by hand without its primary key would take a second row for a
        /// message it has (or refuse every claim, where `ON CONFLICT` names the key): the build
        /// says which table lacks which key.
        #[tokio::test]
        async fn building_on_a_dedup_table_without_its_key_says_which() {
            let Some(pool) = $connect("keyless").await else { return };
            for statement in [
                "ALTER TABLE inbox_messages RENAME TO inbox_messages_keyed",
                "CREATE TABLE inbox_messages AS SELECT * FROM inbox_messages_keyed WHERE 1 = 0",
            ] {
                sqlx::query(statement).execute(&pool).await.unwrap();
            }

            let error = builder(&pool)
                .handler(count_tenant_event)
                .build()
                .await
                .err()
                .expect("refused");

            assert!(matches!(error, inbox::BuildError::IncompleteSchema(_)), "{error}");
            let message = error.to_string();
            assert!(
                message.contains("`inbox_messages` has no unique key on (consumer, handler, message_id)"),
                "{message}"
            );
        }

        #[tokio::test]
        async fn printed_schema_is_enough_to_run() {
            let Some(pool) = $unmigrated("own_ddl").await else { return };

            sqlx::raw_sql(inbox::schema::<$db>())
                .execute(&pool)
                .await
                .unwrap();

            let inbox = builder(&pool)
                .handler(count_tenant_event)
                .build()
                .await
                .unwrap();
            let handled = inbox
                .dispatch(&Envelope::encode("d-1", &TenantEvent::new("t1", 1)).unwrap())
                .await
                .unwrap();
            assert_eq!(handled[0].outcome, Outcome::Processed);
        }

        #[tokio::test]
        async fn message_only_handler_checks_identity_too() {
            let Some(pool) = database("message_only_identity").await else { return };

            let error = count_tenant_event
                .process(&pool, TenantEvent::new(&"t".repeat(600), 1))
                .await
                .unwrap_err();

            assert!(
                matches!(
                    error,
                    inbox::Error::InvalidIdentity {
                        what: "message id",
                        ..
                    }
                ),
                "{error}"
            );
        }
    };
}

common::on_every_backend!(handlers_suite, batched);

/// A SQLite database migrated before its dedup table became a rowid table keeps every row, and
/// dedup, through the rebuild.
#[tokio::test]
async fn sqlite_dedup_rows_survive_the_rebuild_of_their_table() {
    use inbox::Backend;

    let Some(pool) = common::sqlite_without_schema("dedup_rebuild").await else {
        return;
    };
    let mut before_rebuild = sqlx::Sqlite::migrations();
    before_rebuild.dangerous_set_table_name(inbox::MIGRATIONS_TABLE);
    before_rebuild.run_to(8, &pool).await.unwrap();
    let seen = TenantEvent::new("t1", 1);
    let processed = count_tenant_event
        .process(&pool, seen.clone())
        .await
        .unwrap();
    assert_eq!(processed, Outcome::Processed);

    inbox::migrate(&pool).await.unwrap();

    let again = count_tenant_event.process(&pool, seen).await.unwrap();
    let other = count_tenant_event
        .process(&pool, TenantEvent::new("t1", 2))
        .await
        .unwrap();
    assert_eq!((again, other), (Outcome::Duplicate, Outcome::Processed));
    let rows: Vec<i64> = sqlx::query_scalar("SELECT rowid FROM inbox_messages ORDER BY rowid")
        .fetch_all(&pool)
        .await
        .expect("a rowid table");
    assert_eq!(rows.len(), 2);
}

/// A SQLite pool made without the inbox's options is still put in write-ahead logging by
/// `migrate`, the mode the guard is written for: readers and the one writer do not block each
/// other.
#[tokio::test]
async fn migrate_puts_a_plain_sqlite_database_in_write_ahead_logging() {
    let Some(url) = common::sqlite_url("plain_sqlite").await else {
        return;
    };
    let pool = sqlx::SqlitePool::connect(&format!("{url}?mode=rwc"))
        .await
        .unwrap();

    inbox::migrate(&pool).await.unwrap();

    let mode: String = sqlx::query_scalar("PRAGMA journal_mode")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(mode, "wal");
}
