//! What the guard costs: messages per second through `process()` (dedup row, stream upsert,
//! handler, commit) against the same business write in a plain transaction, and what a duplicate
//! costs. Prints figures and ratios measured in the same run; the machine's noise cancels out of
//! the ratios.
//!
//! `cargo bench --bench guard` runs on a SQLite file; `DATABASE_URL=postgres://...` adds PostgreSQL.

use std::time::{Duration, Instant};

use inbox::prelude::*;

mod ledger;

use ledger::{CREDIT, Credited, credit_postgres, credit_sqlite};

const MESSAGES: i64 = 2_000;
const ACCOUNTS: i64 = 100;

/// `MESSAGES` events, round-robin over the accounts, in sequence order.
fn events() -> Vec<Credited> {
    (0..MESSAGES)
        .map(|i| Credited {
            event_id: Uuid::new_v4(),
            account: format!("acct-{}", i % ACCOUNTS),
            sequence: i / ACCOUNTS + 1,
            amount: 1,
        })
        .collect()
}

struct Figures {
    plain: Duration,
    guarded: Duration,
    duplicate: Duration,
}

impl Figures {
    fn print(&self, backend: &str) {
        let rate = |d: Duration| MESSAGES as f64 / d.as_secs_f64();
        println!("{backend}: {MESSAGES} messages, one at a time");
        println!("  plain transaction  {:>9.0} msg/s", rate(self.plain));
        println!("  guarded (new)      {:>9.0} msg/s", rate(self.guarded));
        println!("  guarded duplicate  {:>9.0} msg/s", rate(self.duplicate));
        println!(
            "  ratio guarded/plain time {:.2}x, duplicate/plain time {:.2}x",
            self.guarded.as_secs_f64() / self.plain.as_secs_f64(),
            self.duplicate.as_secs_f64() / self.plain.as_secs_f64()
        );
    }
}

macro_rules! measure {
    ($pool:expr, $handler:expr) => {{
        let pool = $pool;
        let events = events();
        let started = Instant::now();
        for event in &events {
            let mut tx = pool.begin().await?;
            sqlx::query(CREDIT)
                .bind(event.amount)
                .bind(event.account.clone())
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
        }
        let plain = started.elapsed();
        let started = Instant::now();
        for event in &events {
            assert_eq!(
                $handler.process(&pool, event.clone()).await?,
                Outcome::Processed
            );
        }
        let guarded = started.elapsed();
        let started = Instant::now();
        for event in &events {
            assert_eq!(
                $handler.process(&pool, event.clone()).await?,
                Outcome::Duplicate
            );
        }
        Figures {
            plain,
            guarded,
            duplicate: started.elapsed(),
        }
    }};
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let sqlite = ledger::fresh_sqlite("inbox_bench_guard.db").await?;
    ledger::prepare(&sqlite, ACCOUNTS as usize).await?;
    measure!(sqlite, credit_sqlite).print("SQLite (WAL, synchronous = FULL)");

    if let Some((postgres, _)) = ledger::postgres_from_env(10).await? {
        ledger::prepare(&postgres, ACCOUNTS as usize).await?;
        measure!(postgres, credit_postgres).print("PostgreSQL");
    }
    Ok(())
}
