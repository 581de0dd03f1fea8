//! Test support: a handler that takes `&mut Context` called as a plain function on a context
//! built over a test transaction, and the harness that runs handlers guarded on an in-memory
//! database and shows what the inbox kept.

use inbox::prelude::*;
use inbox::testing::Harness;

#[derive(Debug, Clone, Serialize, Deserialize, Message)]
#[message(name = "test.step")]
struct Step {
    id: u64,
    name: String,
}

fn step(id: u64, name: &str) -> Step {
    Step {
        id,
        name: name.into(),
    }
}

/// Records its attempt; a step named `refused` is refused for good.
#[inbox_handler(key = "id")]
async fn record(ctx: &mut Context<'_, sqlx::Sqlite>, step: Step) -> Result<(), HandlerError> {
    if step.name == "refused" {
        return Err(HandlerError::permanent("this step is refused"));
    }
    sqlx::query("INSERT INTO steps (name, attempt) VALUES ($1, $2)")
        .bind(step.name)
        .bind(i64::from(ctx.attempt()))
        .execute(&mut **ctx)
        .await?;
    Ok(())
}

async fn steps(pool: &sqlx::SqlitePool) -> Vec<(String, i64)> {
    sqlx::query_as("SELECT name, attempt FROM steps ORDER BY name")
        .fetch_all(pool)
        .await
        .unwrap()
}

async fn harness() -> Harness<sqlx::Sqlite> {
    let harness = Harness::sqlite().await.unwrap();
    sqlx::query("CREATE TABLE steps (name TEXT NOT NULL, attempt INTEGER NOT NULL)")
        .execute(harness.pool())
        .await
        .unwrap();
    harness
}

#[tokio::test]
async fn a_context_handler_is_called_as_a_plain_function_on_a_test_transaction() {
    let harness = harness().await;
    let tx = harness.pool().begin().await.unwrap();
    let mut ctx = Context::new(tx).with_attempt(3);

    record(&mut ctx, step(1, "plain")).await.unwrap();
    ctx.into_transaction().commit().await.unwrap();

    assert_eq!(steps(harness.pool()).await, [("plain".into(), 3)]);
    assert!(
        harness.dead().await.unwrap().is_empty(),
        "nothing was guarded"
    );
}

#[tokio::test]
async fn the_harness_runs_a_handler_guarded_and_shows_what_it_kept() {
    let harness = harness().await;

    let outcomes = harness
        .deliver_all(&record, [step(1, "a"), step(1, "a"), step(2, "b")])
        .await
        .unwrap();
    let refused = harness.deliver(&record, step(3, "refused")).await;

    assert_eq!(
        outcomes,
        [Outcome::Processed, Outcome::Duplicate, Outcome::Processed]
    );
    assert!(matches!(
        refused,
        Err(inbox::Error::Handler {
            retry_after: None,
            ..
        })
    ));
    let dead = harness.dead().await.unwrap();
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(dead[0].message_id, "3");
    assert_eq!(
        steps(harness.pool()).await,
        [("a".into(), 1), ("b".into(), 1)]
    );
}
