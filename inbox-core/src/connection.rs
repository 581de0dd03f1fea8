//! Where guarded transactions get their connections: from the pool, one each, or from one
//! connection kept between them.

use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use sqlx::pool::PoolConnection;
use sqlx::{Connection, Pool, Transaction};

use crate::storage::Backend;

/// Where the guard gets the connection of each transaction it begins.
///
/// A [`Pool`] lends one per transaction: the pool checks it on the way out and on the way back
/// (sqlx pings it), two round trips more per transaction. A [`KeptConnection`] keeps one between
/// transactions, for a caller that begins many in a row.
pub trait Connect<DB: Backend>: Send {
    /// The pool, for what runs apart from the guarded transactions (releasing parked successors).
    fn pool(&self) -> &Pool<DB>;

    /// Begins a guarded transaction whose statements each end within `timeout` where the
    /// database can bound them ([`Backend::begin_within`]).
    fn begin(
        &mut self,
        timeout: Duration,
    ) -> BoxFuture<'_, Result<Transaction<'_, DB>, sqlx::Error>>;

    /// Sends what the last transaction left for the connection's next statement, before its
    /// caller waits: the rollback of the empty transaction that a commit in one round trip leaves
    /// open on PostgreSQL ([`commit_checked`](crate::storage::messages::commit_checked)), which a
    /// connection kept while it waits for work would otherwise hold as idle in transaction. The
    /// pool does it as a connection comes back to it.
    fn settle(&mut self) -> BoxFuture<'_, ()> {
        Box::pin(std::future::ready(()))
    }
}

impl<DB: Backend> Connect<DB> for Pool<DB> {
    fn pool(&self) -> &Pool<DB> {
        self
    }

    fn begin(
        &mut self,
        timeout: Duration,
    ) -> BoxFuture<'_, Result<Transaction<'_, DB>, sqlx::Error>> {
        Box::pin(async move {
            let tx: Transaction<'_, DB> = self.begin_with(DB::begin_within(timeout)).await?;
            Ok(tx)
        })
    }
}

/// One connection from a pool, kept between the guarded transactions begun on it, so that they
/// cost no pool checks. It is taken from the pool at the first transaction and given back (for
/// the pool to check it, and to apply its own lifetime rules) when it has been kept for a
/// minute or idle for ten seconds; a connection on which a transaction cannot begin (the
/// database restarted, the connection was cut) is given up, and the next transaction takes a new
/// one. Once the pool is closed, no transaction begins, as with the pool itself. A caller that
/// waits between transactions calls [`Connect::settle`] first (the runtime's workers do), so that
/// nothing the last one left stays open while it waits.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), sqlx::Error> {
/// use std::time::Duration;
/// use inbox_core::{Connect, KeptConnection};
///
/// let pool = sqlx::SqlitePool::connect("sqlite::memory:").await?;
/// let mut connection = KeptConnection::new(pool);
/// // A temporary table lives as long as its connection: the second transaction sees it.
/// let mut tx = connection.begin(Duration::from_secs(60)).await?;
/// sqlx::query("CREATE TEMP TABLE seen (n INTEGER)").execute(&mut *tx).await?;
/// tx.commit().await?;
/// let mut tx = connection.begin(Duration::from_secs(60)).await?;
/// sqlx::query("SELECT n FROM seen").fetch_all(&mut *tx).await?;
/// tx.commit().await?;
/// # Ok(()) }
/// ```
pub struct KeptConnection<DB: Backend> {
    pool: Pool<DB>,
    connection: Option<Kept<DB>>,
    broken: bool,
    /// Whether a transaction began since the connection was last settled.
    unsettled: bool,
}

/// How long a [`KeptConnection`] keeps one connection before it gives it back to the pool.
pub const KEPT_FOR: Duration = Duration::from_secs(60);

/// How long a [`KeptConnection`] keeps a connection no transaction began on.
pub const KEPT_IDLE: Duration = Duration::from_secs(10);

/// A connection taken from the pool, and since when.
struct Kept<DB: Backend> {
    connection: PoolConnection<DB>,
    taken: Instant,
    used: Instant,
}

impl<DB: Backend> Kept<DB> {
    fn keeps(&self) -> bool {
        self.taken.elapsed() < KEPT_FOR && self.used.elapsed() < KEPT_IDLE
    }
}

impl<DB: Backend> KeptConnection<DB> {
    /// A connection of `pool`, taken when the first transaction begins.
    pub fn new(pool: Pool<DB>) -> Self {
        Self {
            pool,
            connection: None,
            broken: false,
            unsettled: false,
        }
    }
}

impl<DB: Backend> Connect<DB> for KeptConnection<DB> {
    fn pool(&self) -> &Pool<DB> {
        &self.pool
    }

    fn begin(
        &mut self,
        timeout: Duration,
    ) -> BoxFuture<'_, Result<Transaction<'_, DB>, sqlx::Error>> {
        Box::pin(async move {
            let Self {
                pool,
                connection,
                broken,
                unsettled,
            } = self;
            if pool.is_closed() {
                *connection = None;
                return Err(sqlx::Error::PoolClosed);
            }
            let kept = match connection.take() {
                Some(kept) if kept.keeps() && !*broken => kept,
                _ => {
                    let now = Instant::now();
                    Kept {
                        connection: pool.acquire().await?,
                        taken: now,
                        used: now,
                    }
                }
            };
            let kept = connection.insert(kept);
            kept.used = Instant::now();
            let begun = kept.connection.begin_with(DB::begin_within(timeout)).await;
            *broken = begun.is_err();
            *unsettled = DB::SQL.messages.check_and_commit.is_some();
            begun
        })
    }

    fn settle(&mut self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            if !std::mem::take(&mut self.unsettled) {
                return;
            }
            if let Some(kept) = &mut self.connection
                && kept.connection.ping().await.is_err()
            {
                self.broken = true;
            }
        })
    }
}
