//! A small ledger application used by the behaviour tests: accounts credited by `Credited`
//! events, with an audit of the order in which events were applied.

use inbox::prelude::*;

/// An account was credited. `sequence` orders the events of one account.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Message)]
#[message(name = "test.credited")]
pub struct Credited {
    pub event_id: String,
    pub account: String,
    pub sequence: i64,
    pub amount: i64,
}

impl Credited {
    pub fn new(
        event_id: impl Into<String>,
        account: impl Into<String>,
        sequence: i64,
        amount: i64,
    ) -> Self {
        Self {
            event_id: event_id.into(),
            account: account.into(),
            sequence,
            amount,
        }
    }
}

/// The application's tables, written by the handlers in the guarded transaction.
pub const LEDGER_TABLES: [&str; 4] = [
    "CREATE TABLE accounts (id VARCHAR(255) PRIMARY KEY, balance BIGINT NOT NULL DEFAULT 0, frozen BOOLEAN NOT NULL DEFAULT FALSE)",
    "CREATE TABLE applied (account TEXT NOT NULL, sequence BIGINT NOT NULL, event_id TEXT NOT NULL, position BIGINT NOT NULL)",
    "CREATE TABLE audit_log (event_id TEXT NOT NULL, amount BIGINT NOT NULL)",
    "CREATE TABLE crash_points (account TEXT NOT NULL, sequence BIGINT NOT NULL)",
];

/// Defines, for one database and its connection type, the ledger's handlers (the caller imports `inbox::prelude::*`
/// and `Credited`). All credit handlers share one body, `apply_credit`, which records the
/// application order, fails if the account is frozen or a crash point is set for the event's
/// sequence (after writing, so a missing rollback shows), and credits the balance with a
/// read-modify-write that loses updates unless the handlers of one account are serialized:
/// - `credit`: monotonic ordering;
/// - `credit_strict`: strict ordering;
/// - `credit_quick_gap`: strict ordering with a one-second gap timeout;
/// - `credit_unsequenced`: an aggregate but no sequence (serialized, never stale);
/// - `audit` (key only, its own dedup scope): appends to `audit_log`.
#[allow(unused_macros)]
macro_rules! ledger_handlers {
    ($db:ty, $conn:ty) => {
        pub use handlers::*;

        /// Each test binary uses some of these.
        #[allow(dead_code)]
        mod handlers {
        use super::*;

        pub async fn apply_credit(tx: &mut $conn, msg: &Credited) -> Result<(), HandlerError> {
            let position: i64 =
                sqlx::query_scalar($crate::common::sql::<$db>("SELECT COUNT(*) FROM applied WHERE account = $1"))
                    .bind(msg.account.as_str())
                    .fetch_one(&mut *tx)
                    .await?;
            sqlx::query(
                $crate::common::sql::<$db>("INSERT INTO applied (account, sequence, event_id, position) VALUES ($1, $2, $3, $4)"),
            )
            .bind(msg.account.as_str())
            .bind(msg.sequence)
            .bind(msg.event_id.as_str())
            .bind(position)
            .execute(&mut *tx)
            .await?;
            let crash: i64 = sqlx::query_scalar(
                $crate::common::sql::<$db>("SELECT COUNT(*) FROM crash_points WHERE account = $1 AND sequence = $2"),
            )
            .bind(msg.account.as_str())
            .bind(msg.sequence)
            .fetch_one(&mut *tx)
            .await?;
            if crash > 0 {
                return Err(HandlerError::msg(format!("simulated crash at {} #{}", msg.account, msg.sequence)));
            }
            let account: Option<(i64, bool)> =
                sqlx::query_as($crate::common::sql::<$db>("SELECT balance, frozen FROM accounts WHERE id = $1"))
                    .bind(msg.account.as_str())
                    .fetch_optional(&mut *tx)
                    .await?;
            let (balance, frozen) = account.unwrap_or((0, false));
            if frozen {
                return Err(HandlerError::msg(format!("account {} is frozen", msg.account)));
            }
            // Widen the window in which an unserialized second writer would lose this update.
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
            let updated = sqlx::query($crate::common::sql::<$db>("UPDATE accounts SET balance = $1 WHERE id = $2"))
                .bind(balance + msg.amount)
                .bind(msg.account.as_str())
                .execute(&mut *tx)
                .await?;
            if updated.rows_affected() == 0 {
                sqlx::query($crate::common::sql::<$db>("INSERT INTO accounts (id, balance) VALUES ($1, $2)"))
                    .bind(msg.account.as_str())
                    .bind(balance + msg.amount)
                    .execute(&mut *tx)
                    .await?;
            }
            Ok(())
        }

        #[inbox_handler(key = "event_id", sequence = "sequence", aggregate = "account")]
        pub async fn credit(tx: &mut $conn, msg: Credited) -> Result<(), HandlerError> {
            apply_credit(tx, &msg).await
        }

        #[inbox_handler(key = "event_id", sequence = "sequence", aggregate = "account", ordering = "strict")]
        pub async fn credit_strict(tx: &mut $conn, msg: Credited) -> Result<(), HandlerError> {
            apply_credit(tx, &msg).await
        }

        #[inbox_handler(
            key = "event_id",
            sequence = "sequence",
            aggregate = "account",
            ordering = "strict",
            gap_timeout = "1s"
        )]
        pub async fn credit_quick_gap(tx: &mut $conn, msg: Credited) -> Result<(), HandlerError> {
            apply_credit(tx, &msg).await
        }

        #[inbox_handler(key = "event_id", aggregate = "account")]
        pub async fn credit_unsequenced(tx: &mut $conn, msg: Credited) -> Result<(), HandlerError> {
            apply_credit(tx, &msg).await
        }

        #[inbox_handler(key = "event_id", name = "audit")]
        pub async fn audit(tx: &mut $conn, msg: Credited) -> Result<(), HandlerError> {
            sqlx::query($crate::common::sql::<$db>("INSERT INTO audit_log (event_id, amount) VALUES ($1, $2)"))
                .bind(msg.event_id)
                .bind(msg.amount)
                .execute(&mut *tx)
                .await?;
            Ok(())
        }
        }
    };
}
#[allow(unused_imports)]
pub(crate) use ledger_handlers;
