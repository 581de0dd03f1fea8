//! Retention: deleting the dedup rows that have outlived their use, without hurting live traffic.
//!
//! A processed (or stale) row only matters while its message can still be redelivered: past the
//! broker's redelivery horizon nothing will ever arrive to collide with it. Purging deletes those
//! rows in small batches, each its own short transaction, through the partial index on
//! `processed_at`, by one instance at a time. Parked and dead messages are never purged by age:
//! they wait for an operator, and a purge reports how many of them are older than its window.

use std::time::Duration;

use sqlx::Pool;

use crate::error::Error;
use crate::storage::purge::PurgePreview;
use crate::storage::{Backend, purge as statements};

/// How long dedup rows are kept, and how a purge deletes them.
///
/// ```
/// use std::time::Duration;
/// # use inbox_core as inbox;
/// use inbox::Retention;
///
/// let week = Duration::from_secs(7 * 24 * 3600);
/// let retention = Retention::new(week)
///     .redelivery_horizon(Duration::from_secs(3 * 24 * 3600))
///     .batch_size(5_000);
/// assert!(retention.window_covers_redelivery());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retention {
    window: Duration,
    redelivery_horizon: Option<Duration>,
    batch_size: u32,
    pause: Duration,
    interval: Duration,
}

impl Retention {
    /// The rows in a batch by default: small enough that a batch holds its locks for milliseconds.
    pub const DEFAULT_BATCH_SIZE: u32 = 5_000;

    /// Keeps processed and stale rows for `window` after they were handled.
    pub fn new(window: Duration) -> Self {
        Self {
            window,
            redelivery_horizon: None,
            batch_size: Self::DEFAULT_BATCH_SIZE,
            pause: Duration::from_millis(10),
            interval: Duration::from_secs(3600),
        }
    }

    /// How late the broker may redeliver a message (its retention or redelivery limit). A window
    /// shorter than this lets a late redelivery in after its dedup row is gone, so it would be
    /// handled twice: [`Retention::window_covers_redelivery`] says whether the window is safe, and
    /// a runtime warns at startup when it is not.
    pub fn redelivery_horizon(mut self, horizon: Duration) -> Self {
        self.redelivery_horizon = Some(horizon);
        self
    }

    /// The most rows one batch deletes (at least 1; default [`Retention::DEFAULT_BATCH_SIZE`]).
    pub fn batch_size(mut self, rows: u32) -> Self {
        self.batch_size = rows.max(1);
        self
    }

    /// The pause between two batches, which leaves the database to live traffic (default 10 ms).
    pub fn pause(mut self, pause: Duration) -> Self {
        self.pause = pause;
        self
    }

    /// How often a runtime purges (default: hourly).
    pub fn every(mut self, interval: Duration) -> Self {
        self.interval = interval;
        self
    }

    /// How long rows are kept.
    pub fn window(&self) -> Duration {
        self.window
    }

    /// How often a runtime purges.
    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// Whether the window is at least the configured redelivery horizon (`true` when none is
    /// configured: nothing to check against).
    pub fn window_covers_redelivery(&self) -> bool {
        self.redelivery_horizon
            .is_none_or(|horizon| self.window >= horizon)
    }

    /// Logs a warning when the window is shorter than the redelivery horizon.
    pub fn warn_if_unsafe(&self) {
        if let Some(horizon) = self
            .redelivery_horizon
            .filter(|_| !self.window_covers_redelivery())
        {
            tracing::warn!(
                window_secs = self.window.as_secs(),
                redelivery_horizon_secs = horizon.as_secs(),
                "the retention window is shorter than the broker's redelivery horizon: a message \
                 redelivered after its dedup row is purged would be handled twice"
            );
        }
    }
}

/// What a purge did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PurgeReport {
    /// Whether this instance purged; `false` when another one held the right to purge.
    pub led: bool,
    /// Rows deleted.
    pub purged: u64,
    /// Batches run, each its own transaction.
    pub batches: u64,
    /// Parked messages older than the window, kept for an operator.
    pub kept_parked: i64,
    /// Dead letters older than the window, kept for an operator.
    pub kept_dead: i64,
}

/// What [`purge`] would delete with `retention`'s window, and what it would keep.
pub async fn purge_preview<DB: Backend>(
    pool: &Pool<DB>,
    retention: &Retention,
) -> Result<PurgePreview, Error> {
    Ok(statements::preview(pool, retention.window.as_secs_f64()).await?)
}

/// Deletes the processed and stale rows older than `retention`'s window, in batches, if no other
/// instance is purging. Counted in `inbox_purged_total` and `inbox_purge_batches_total`.
pub async fn purge<DB: Backend>(
    pool: &Pool<DB>,
    retention: &Retention,
) -> Result<PurgeReport, Error> {
    let Some(leader) = statements::lead_purge(pool).await? else {
        tracing::info!("another instance holds the purge lock; this one skips its turn");
        return Ok(PurgeReport::default());
    };
    let purged = purge_batches(pool, retention).await;
    if let Err(error) = leader.step_down().await {
        tracing::warn!(%error, "could not release the purge lock cleanly; it goes with its connection");
    }
    let mut report = purged?;
    let kept = purge_preview(pool, retention).await?;
    (report.kept_parked, report.kept_dead) = (kept.parked, kept.dead);
    if kept.parked + kept.dead > 0 {
        tracing::warn!(
            parked = kept.parked,
            dead = kept.dead,
            "parked and dead messages older than the retention window are kept until an operator \
             resolves them"
        );
    }
    tracing::info!(
        purged = report.purged,
        batches = report.batches,
        "inbox purged"
    );
    Ok(report)
}

async fn purge_batches<DB: Backend>(
    pool: &Pool<DB>,
    retention: &Retention,
) -> Result<PurgeReport, Error> {
    let older_than = retention.window.as_secs_f64();
    let limit = i64::from(retention.batch_size);
    let mut report = PurgeReport {
        led: true,
        ..PurgeReport::default()
    };
    loop {
        let purged = statements::batch(pool, older_than, limit).await?;
        report.purged += purged;
        report.batches += 1;
        metrics::counter!("inbox_purged_total").increment(purged);
        metrics::counter!("inbox_purge_batches_total").increment(1);
        if purged < u64::from(retention.batch_size) {
            return Ok(report);
        }
        tokio::time::sleep(retention.pause).await;
    }
}
