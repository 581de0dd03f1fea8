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
pub const LEDGER_TABLES: [&str; 3] = [
    "CREATE TABLE accounts (id TEXT PRIMARY KEY, balance BIGINT NOT NULL DEFAULT 0, frozen BOOLEAN NOT NULL DEFAULT FALSE)",
    "CREATE TABLE applied (account TEXT NOT NULL, sequence BIGINT NOT NULL, event_id TEXT NOT NULL, position BIGINT NOT NULL)",
    "CREATE TABLE audit_log (event_id TEXT NOT NULL, amount BIGINT NOT NULL)",
];

/// Defines, for one connection type, the ledger's handlers (the caller imports `inbox::prelude::*`
/// and `Credited`):
/// - `credit` (key, sequence, aggregate): records the application order, fails if the account is
///   frozen (after writing, so a missing rollback shows), and credits the balance with a
///   read-modify-write that loses updates unless the handlers of one account are serialized;
/// - `audit` (key only, its own dedup scope): appends to `audit_log`.
#[allow(unused_macros)]
macro_rules! ledger_handlers {
    ($conn:ty) => {
        #[inbox_handler(key = "event_id", sequence = "sequence", aggregate = "account")]
        pub async fn credit(tx: &mut $conn, msg: Credited) -> Result<(), HandlerError> {
            let position: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM applied WHERE account = $1")
                .bind(msg.account.clone())
                .fetch_one(&mut *tx)
                .await?;
            sqlx::query("INSERT INTO applied (account, sequence, event_id, position) VALUES ($1, $2, $3, $4)")
                .bind(msg.account.clone())
                .bind(msg.sequence)
                .bind(msg.event_id.clone())
                .bind(position)
                .execute(&mut *tx)
                .await?;
            let account: Option<(i64, bool)> = sqlx::query_as("SELECT balance, frozen FROM accounts WHERE id = $1")
                .bind(msg.account.clone())
                .fetch_optional(&mut *tx)
                .await?;
            let (balance, frozen) = account.unwrap_or((0, false));
            if frozen {
                return Err(HandlerError::msg(format!("account {} is frozen", msg.account)));
            }
            // Widen the window in which an unserialized second writer would lose this update.
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
            sqlx::query("INSERT INTO accounts (id, balance) VALUES ($1, $2) ON CONFLICT (id) DO UPDATE SET balance = excluded.balance")
                .bind(msg.account.clone())
                .bind(balance + msg.amount)
                .execute(&mut *tx)
                .await?;
            Ok(())
        }

        #[inbox_handler(key = "event_id", name = "audit")]
        pub async fn audit(tx: &mut $conn, msg: Credited) -> Result<(), HandlerError> {
            sqlx::query("INSERT INTO audit_log (event_id, amount) VALUES ($1, $2)")
                .bind(msg.event_id)
                .bind(msg.amount)
                .execute(&mut *tx)
                .await?;
            Ok(())
        }
    };
}
#[allow(unused_imports)]
pub(crate) use ledger_handlers;
