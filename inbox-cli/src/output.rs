//! What a command prints: each result is a view that serializes to JSON (`--json`) and renders
//! as text for a terminal. The views are the CLI's own, so the JSON is a stable interface that
//! does not change with the core's types.

mod actions;
mod conflicts;
mod messages;
mod outbox;
mod purge;
mod rejected;
mod status;

use std::io::Write;
use std::time::{Duration, SystemTime};

use comfy_table::{Table, presets};
use serde::Serialize;

use crate::error::CliError;

pub use actions::{Action, GapSkipped, Migrated, Resolved, Schema};
pub use conflicts::{ConflictDetail, ConflictDiscarded, ConflictList};
pub use messages::{ListKind, MessageDetail, MessageList};
pub use outbox::{OutboxList, OutboxRetried};
pub use purge::{PurgeDone, PurgePlan, Window};
pub use rejected::{RejectedAction, RejectedDetail, RejectedList, RejectedResolved};
pub use status::StatusView;

/// A command's result, printable both ways.
pub trait Render: Serialize {
    /// The result as text for a terminal, without a trailing newline.
    fn human(&self) -> String;
}

/// Where and how results are printed: stdout, as tables or as one JSON document.
#[derive(Debug, Clone, Copy)]
pub struct Output {
    json: bool,
}

impl Output {
    /// Prints results as JSON if `json`, as text otherwise.
    pub fn new(json: bool) -> Self {
        Self { json }
    }

    /// Prints `view` on stdout.
    pub fn emit(&self, view: &impl Render) -> Result<(), CliError> {
        let mut stdout = std::io::stdout().lock();
        if self.json {
            serde_json::to_writer_pretty(&mut stdout, view)?;
            writeln!(stdout)?;
        } else {
            writeln!(stdout, "{}", view.human())?;
        }
        Ok(stdout.flush()?)
    }
}

/// A quiet table: a header row (if any) and aligned columns, no borders.
fn table(header: &[&str], rows: impl IntoIterator<Item = Vec<String>>) -> String {
    let mut table = Table::new();
    table.load_style(presets::NOTHING);
    if !header.is_empty() {
        table.set_header(header.to_vec());
    }
    table.add_rows(rows);
    for column in table.column_iter_mut() {
        column.set_padding((0, 2));
    }
    table.trim_fmt()
}

/// An optional value in a table cell: `-` when absent.
fn cell(value: Option<impl ToString>) -> String {
    value.map_or_else(|| "-".to_owned(), |value| value.to_string())
}

/// The most characters of an error a list shows; `dead show` has the whole text.
const ERROR_WIDTH: usize = 60;

/// The first line of `text`, cut to [`ERROR_WIDTH`] characters.
fn shorten(text: &str) -> String {
    let line = text.lines().next().unwrap_or_default();
    match line.char_indices().nth(ERROR_WIDTH) {
        Some((end, _)) => format!("{}…", &line[..end]),
        None if line.len() < text.trim_end().len() => format!("{line}…"),
        None => line.to_owned(),
    }
}

/// A time in Unix epoch milliseconds as the CLI shows every time: RFC 3339, in UTC, to the
/// second (`2026-12-02T21:23:42Z`).
fn utc(epoch_ms: i64) -> String {
    let since_epoch = Duration::from_millis(u64::try_from(epoch_ms).unwrap_or(0));
    humantime::format_rfc3339_seconds(SystemTime::UNIX_EPOCH + since_epoch).to_string()
}

/// Stored headers, one `name: value` a line (values that are not text as JSON); `(not kept)`
/// without any.
fn headers_text(headers: Option<&serde_json::Value>) -> String {
    let Some(headers) = headers else {
        return "(not kept)".to_owned();
    };
    let Some(headers) = headers.as_object() else {
        return headers.to_string();
    };
    if headers.is_empty() {
        return "(none)".to_owned();
    }
    let rows = headers.iter().map(|(name, value)| {
        let value = value
            .as_str()
            .map_or_else(|| value.to_string(), str::to_owned);
        vec![format!("{name}:"), value]
    });
    table(&[], rows)
}

/// Seconds as a rounded human duration: `3h 12m 5s`.
fn age(secs: f64) -> String {
    let whole = Duration::from_secs(secs.max(0.0).round() as u64);
    humantime::format_duration(whole).to_string()
}

/// A size in bytes, in the largest binary unit that keeps it at least 1.
fn size(bytes: i64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = "bytes";
    for next in UNITS {
        if value < 1024.0 {
            break;
        }
        value /= 1024.0;
        unit = next;
    }
    match unit {
        "bytes" => format!("{bytes} bytes"),
        _ => format!("{value:.1} {unit}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_ages_read_like_a_person_would_write_them() {
        assert_eq!(size(512), "512 bytes");
        assert_eq!(size(4096), "4.0 KiB");
        assert_eq!(size(3 * 1024 * 1024 + 512 * 1024), "3.5 MiB");
        assert_eq!(age(3725.4), "1h 2m 5s");
        assert_eq!(age(-1.0), "0s");
    }

    #[test]
    fn epoch_milliseconds_read_as_an_rfc_3339_time() {
        assert_eq!(utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc(1_700_000_000_999), "2023-11-14T22:13:20Z");
    }

    #[test]
    fn a_long_or_multiline_error_is_cut_in_a_list() {
        assert_eq!(shorten("short"), "short");
        assert_eq!(shorten("first line\nsecond"), "first line…");
        let long = "é".repeat(ERROR_WIDTH + 5);
        assert_eq!(shorten(&long), format!("{}…", "é".repeat(ERROR_WIDTH)));
    }

    #[test]
    fn a_table_has_a_header_and_aligned_columns_without_borders() {
        let text = table(&["A", "LONGER"], [vec!["value".into(), cell(None::<i64>)]]);
        assert_eq!(text, "A      LONGER\nvalue  -");
    }
}
