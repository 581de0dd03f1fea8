//! Health for probes, on every backend: a migrated database is ready with an empty backlog; a
//! dead message shows in the backlog with its age; a database without the inbox tables is not
//! ready; a failing source is reported with its error while the run goes on.

mod common;

macro_rules! health_suite {
    ($db:ty, $conn:ty, $connect:path, $unmigrated:path, $batch:expr) => {
        use std::time::Duration;

        use inbox::prelude::*;
        use inbox::{Delivery, RetryPolicy, Source, SourceError};

        #[derive(Debug, Clone, Serialize, Deserialize, Message)]
        #[message(name = "test.job")]
        struct Job {
            id: String,
        }

        #[inbox_handler(key = "id")]
        async fn refuse(_job: Job) -> Result<(), HandlerError> {
            Err(HandlerError::permanent("refused"))
        }

        async fn inbox(pool: &sqlx::Pool<$db>) -> Inbox<$db> {
            $crate::common::builder(pool, $batch)
                .retry(RetryPolicy::new(1))
                .handler(refuse)
                .build()
                .await
                .unwrap()
        }

        fn backlog(health: &inbox::Health, status: &str) -> (i64, bool) {
            let entry = health
                .backlog
                .iter()
                .find(|b| b.status == status)
                .expect("every status is reported");
            (
                entry.count,
                entry.oldest_secs.is_some_and(|secs| secs >= 0.0),
            )
        }

        /// A source that fails every time it is asked, until the test has seen enough.
        struct Failing;

        impl Source for Failing {
            async fn next(&mut self) -> Result<Option<Delivery>, SourceError> {
                Err("the broker is unreachable".into())
            }
        }

        #[tokio::test]
        async fn a_migrated_database_is_ready_with_an_empty_backlog() {
            let Some(pool) = $connect("health_ready").await else {
                return;
            };
            let inbox = inbox(&pool).await;

            let health = inbox.health().await;

            assert!(health.ready, "{health:?}");
            assert_eq!(
                (
                    health.database_error.as_deref(),
                    health.missing_migrations.len()
                ),
                (None, 0)
            );
            assert_eq!(
                [
                    backlog(&health, "parked"),
                    backlog(&health, "failed"),
                    backlog(&health, "dead")
                ],
                [(0, false); 3]
            );
            assert!(!health.source.running);
        }

        #[tokio::test]
        async fn a_dead_message_shows_in_the_backlog_with_its_age() {
            let Some(pool) = $connect("health_dead").await else {
                return;
            };
            let inbox = inbox(&pool).await;
            let job = Envelope::encode("d-1", &Job { id: "j-1".into() }).unwrap();

            let _ = inbox.dispatch(&job).await;
            let health = inbox.health().await;

            assert_eq!(backlog(&health, "dead"), (1, true), "{health:?}");
            assert!(
                health.ready,
                "a backlog calls for an operator, not a restart: {health:?}"
            );
        }

        #[tokio::test]
        async fn a_database_without_the_inbox_tables_is_not_ready() {
            let Some(pool) = $connect("health_no_tables").await else {
                return;
            };
            let inbox = inbox(&pool).await;
            sqlx::query("DROP TABLE inbox_messages")
                .execute(&pool)
                .await
                .unwrap();

            let health = inbox.health().await;

            assert!(!health.ready, "{health:?}");
            assert!(health.database_error.is_some(), "{health:?}");
        }

        #[tokio::test]
        async fn a_schema_with_migrations_not_applied_is_not_ready() {
            let Some(pool) = $connect("health_behind").await else {
                return;
            };
            let inbox = inbox(&pool).await;
            sqlx::query("DELETE FROM _inbox_migrations")
                .execute(&pool)
                .await
                .unwrap();

            let health = inbox.health().await;

            assert!(!health.ready, "{health:?}");
            assert!(!health.missing_migrations.is_empty(), "{health:?}");
        }

        #[tokio::test]
        async fn a_failing_source_is_reported_while_the_run_goes_on() {
            let Some(pool) = $connect("health_source").await else {
                return;
            };
            let inbox = inbox(&pool).await;
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            let running = {
                let inbox = inbox.clone();
                tokio::spawn(async move {
                    inbox
                        .run_until(Failing, async {
                            let _ = stopped.await;
                        })
                        .await
                })
            };

            let mut health = inbox.health().await;
            for _ in 0..100 {
                if health.source.failing_secs.is_some() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
                health = inbox.health().await;
            }
            let _ = stop.send(());
            running.await.unwrap().unwrap();

            assert!(health.source.running, "{health:?}");
            assert_eq!(
                health.source.last_error.as_deref(),
                Some("the broker is unreachable")
            );
            assert!(health.ready, "failing for less than the limit: {health:?}");
            assert!(!inbox.health().await.source.running, "the run ended");
        }
    };
}

common::on_every_backend!(health_suite);
