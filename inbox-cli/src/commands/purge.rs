//! `inbox purge`: delete the processed and stale rows older than a window, in batches.

use inbox_core::{Backend, Retention};
use sqlx::Pool;

use crate::cli::PurgeArgs;
use crate::error::CliError;
use crate::output::{Output, PurgeDone, PurgePlan};
use crate::prompt;

/// Previews the purge; unless it is a dry run, asks for confirmation and purges.
pub async fn run<DB: Backend>(
    pool: &Pool<DB>,
    args: PurgeArgs,
    out: &Output,
) -> Result<(), CliError> {
    let retention = Retention::new(args.older_than).batch_size(args.batch_size);
    let preview = inbox_core::purge_preview(pool, &retention).await?;
    if args.dry_run {
        return out.emit(&PurgePlan::new(args.older_than, preview));
    }
    let question = format!(
        "Delete {} processed or stale rows handled more than {} ago? A message redelivered after \
         its row is gone would be handled again.",
        preview.purgeable,
        humantime::format_duration(args.older_than)
    );
    prompt::confirm(&question, &args.confirm).await?;
    let report = inbox_core::purge(pool, &retention).await?;
    out.emit(&PurgeDone::new(args.older_than, report))
}
