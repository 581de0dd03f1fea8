//! `inbox purge`: delete the processed and stale rows older than a window, and what operators
//! resolved before it, in batches.

use inbox_core::{Backend, Retention};
use sqlx::Pool;

use crate::cli::{DEFAULT_WINDOW, PurgeArgs};
use crate::error::CliError;
use crate::output::{Output, PurgeDone, PurgePlan, Window};
use crate::prompt;

/// Previews the purge; unless it is a dry run, asks for confirmation and purges. A dry run
/// without a window previews the default one and says so; a purge needs one.
pub async fn run<DB: Backend>(
    pool: &Pool<DB>,
    args: PurgeArgs,
    out: &Output,
) -> Result<(), CliError> {
    let window = match (args.older_than, args.dry_run) {
        (Some(given), _) => Window::Given(given),
        (None, true) => Window::Default(DEFAULT_WINDOW),
        (None, false) => return Err(CliError::WindowNeeded),
    };
    let older_than = window.duration();
    let retention = Retention::new(older_than).batch_size(args.batch_size);
    let preview = inbox_core::purge_preview(pool, &retention).await?;
    if args.dry_run {
        return out.emit(&PurgePlan::new(window, preview));
    }
    let question = format!(
        "Delete {} processed or stale rows handled more than {} ago, and {} resolved by an \
         operator before then? A message redelivered after its row is gone would be handled \
         again.",
        preview.purgeable,
        humantime::format_duration(older_than),
        preview.resolved
    );
    prompt::confirm(&question, &args.confirm).await?;
    let report = inbox_core::purge(pool, &retention).await?;
    if !report.led {
        return Err(CliError::PurgeBusy);
    }
    out.emit(&PurgeDone::new(older_than, report))
}
