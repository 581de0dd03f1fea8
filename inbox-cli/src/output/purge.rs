//! `inbox purge`: what a purge would do (dry run), and what it did.

use std::time::Duration;

use inbox_core::{PurgePreview, PurgeReport};
use serde::Serialize;

use super::Render;

/// The retention window of a purge: the one `--older-than` gave, or the default a dry run
/// previews without it.
#[derive(Debug, Clone, Copy)]
pub enum Window {
    /// `--older-than`.
    Given(Duration),
    /// [`crate::cli::DEFAULT_WINDOW`].
    Default(Duration),
}

impl Window {
    /// How long rows are kept.
    pub fn duration(self) -> Duration {
        match self {
            Self::Given(window) | Self::Default(window) => window,
        }
    }
}

/// A window both ways, and whether it is the default.
#[derive(Debug, Serialize)]
struct WindowView {
    /// As given: `7days`.
    older_than: String,
    /// In seconds.
    older_than_secs: u64,
    /// `true`: no `--older-than` was given, and this is the default window.
    default_window: bool,
}

impl WindowView {
    fn new(window: Window) -> Self {
        let duration = window.duration();
        Self {
            older_than: humantime::format_duration(duration).to_string(),
            older_than_secs: duration.as_secs(),
            default_window: matches!(window, Window::Default(_)),
        }
    }

    /// "more than 7days ago", and which window that is when it is the default.
    fn human(&self) -> String {
        match self.default_window {
            true => format!(
                "more than {} ago (the default window: no --older-than was given)",
                self.older_than
            ),
            false => format!("more than {} ago", self.older_than),
        }
    }
}

/// What a purge would delete and keep: the output of `--dry-run`.
#[derive(Debug, Serialize)]
pub struct PurgePlan {
    dry_run: bool,
    #[serde(flatten)]
    window: WindowView,
    /// Processed and stale rows older than the window.
    purgeable: i64,
    /// Discarded dead letters, and rejected deliveries and conflicts resolved, before the window.
    resolved: i64,
    #[serde(flatten)]
    kept: Kept,
}

/// The rows older than the window that a purge keeps for an operator.
#[derive(Debug, Serialize)]
struct Kept {
    /// Parked messages.
    kept_parked: i64,
    /// Dead letters.
    kept_dead: i64,
    /// Rejected deliveries not resolved.
    kept_rejected: i64,
}

impl PurgePlan {
    /// What a purge with `window` would do, from its preview.
    pub fn new(window: Window, preview: PurgePreview) -> Self {
        Self {
            dry_run: true,
            window: WindowView::new(window),
            purgeable: preview.purgeable,
            resolved: preview.resolved,
            kept: Kept {
                kept_parked: preview.parked,
                kept_dead: preview.dead,
                kept_rejected: preview.rejected,
            },
        }
    }
}

impl Render for PurgePlan {
    fn human(&self) -> String {
        format!(
            "Dry run, nothing deleted: a purge would delete {} processed or stale rows handled \
             {}, and {} resolved by an operator before then (discarded dead letters, rejected \
             deliveries and conflicts), with the history of what it deletes.{}",
            self.purgeable,
            self.window.human(),
            self.resolved,
            self.kept.sentence("It would keep")
        )
    }
}

/// What a purge did.
#[derive(Debug, Serialize)]
pub struct PurgeDone {
    dry_run: bool,
    #[serde(flatten)]
    window: WindowView,
    /// Rows deleted.
    purged: u64,
    /// Batches of processed and stale rows run, each its own transaction.
    batches: u64,
    /// Discarded dead letters, and rejected deliveries and conflicts resolved, deleted.
    resolved: u64,
    /// Operators' actions deleted, on rows that are gone or on gaps.
    actions: u64,
    #[serde(flatten)]
    kept: Kept,
}

impl PurgeDone {
    /// What a purge with `window` did, from its report.
    pub fn new(window: Duration, report: PurgeReport) -> Self {
        Self {
            dry_run: false,
            window: WindowView::new(Window::Given(window)),
            purged: report.purged,
            batches: report.batches,
            resolved: report.resolved,
            actions: report.actions,
            kept: Kept {
                kept_parked: report.kept_parked,
                kept_dead: report.kept_dead,
                kept_rejected: report.kept_rejected,
            },
        }
    }
}

impl Render for PurgeDone {
    fn human(&self) -> String {
        format!(
            "Purged {} processed or stale rows handled {}, in {} batches; {} rows resolved by an \
             operator before then (discarded dead letters, rejected deliveries and conflicts) and \
             {} recorded actions.{}",
            self.purged,
            self.window.human(),
            self.batches,
            self.resolved,
            self.actions,
            self.kept.sentence("Kept")
        )
    }
}

impl Kept {
    /// The sentence about the rows kept, if there are any, starting with `kept` ("Kept", "It
    /// would keep").
    fn sentence(&self, kept: &str) -> String {
        let Self {
            kept_parked: parked,
            kept_dead: dead,
            kept_rejected: rejected,
        } = self;
        if parked + dead + rejected == 0 {
            return String::new();
        }
        format!(
            "\n{kept} {parked} parked and {dead} dead messages and {rejected} rejected deliveries \
             older than the window: they are never purged by age, and wait for an operator (see \
             `inbox parked list`, `inbox dead list` and `inbox rejected list`)."
        )
    }
}
