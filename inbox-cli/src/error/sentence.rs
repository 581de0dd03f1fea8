//! A database error as one sentence an operator can act on, without the server's own message
//! (its wording, positions and internals); that stays for `--verbose`.

use sqlx::error::DatabaseError;

/// What `error` means for the operator, in one sentence.
pub fn of(error: &sqlx::Error) -> String {
    let sentence = match error {
        sqlx::Error::Database(error) => return refused(&**error),
        sqlx::Error::Io(error) => {
            return format!("the connection to the database failed ({error})");
        }
        sqlx::Error::Tls(_) => "the TLS connection to the database failed",
        sqlx::Error::PoolTimedOut => {
            "no database connection was free in time: the database may be overloaded or out of \
             reach"
        }
        sqlx::Error::PoolClosed | sqlx::Error::WorkerCrashed => {
            "the connection to the database closed unexpectedly"
        }
        sqlx::Error::Configuration(_) => "the database URL or its options are invalid",
        sqlx::Error::ColumnDecode { .. }
        | sqlx::Error::ColumnNotFound(_)
        | sqlx::Error::ColumnIndexOutOfBounds { .. }
        | sqlx::Error::TypeNotFound { .. }
        | sqlx::Error::Decode(_) => {
            "the database holds a value this version of `inbox` cannot read (was it written by a \
             newer one?)"
        }
        _ => "the database answered in a way this command did not expect",
    };
    sentence.to_owned()
}

/// What a statement the database refused means, from its SQLSTATE (PostgreSQL, MySQL) or result
/// code (SQLite).
fn refused(error: &dyn DatabaseError) -> String {
    if is_missing_schema(error) {
        return "the inbox schema in this database lacks a table or column this command needs"
            .to_owned();
    }
    let code = error.code().unwrap_or_default();
    // SQLSTATEs are five characters; SQLite's (extended) result codes are shorter numbers.
    let sentence = match code.parse::<u32>() {
        Ok(sqlite) if code.len() < 5 => sqlite_result(sqlite),
        _ => sqlstate(&code),
    };
    match sentence {
        Some(sentence) => sentence.to_owned(),
        None if code.is_empty() => "the database refused the operation".to_owned(),
        None => format!("the database refused the operation (code {code})"),
    }
}

/// What a SQLSTATE class (or one SQLSTATE) says.
fn sqlstate(code: &str) -> Option<&'static str> {
    let class = code.get(..2).unwrap_or_default();
    Some(match (class, code) {
        (_, "25006") => "the database is read-only",
        (_, "42501") => "the database user is not allowed to do this",
        ("08", _) => "the connection to the database failed",
        ("28", _) => "the database refused the credentials",
        ("40", _) => "the database gave up the operation because of a concurrent one: try again",
        ("53", _) => "the database is out of resources (disk, memory or connections)",
        ("57", _) => "the database cancelled the operation or is shutting down",
        ("23", _) => "the database refused the change: it breaks a constraint",
        ("22", _) => "the database refused a value as invalid",
        _ => return None,
    })
}

/// What a SQLite result code says, by its primary code (the low byte of an extended one).
fn sqlite_result(code: u32) -> Option<&'static str> {
    Some(match code & 0xff {
        5 | 6 => "the database gave up the operation because of a concurrent one: try again",
        8 => "the database is read-only",
        13 => "the database is out of resources (disk, memory or connections)",
        11 | 26 => "the database file is damaged",
        23 => "the database user is not allowed to do this",
        _ => return None,
    })
}

/// Whether the database says a table, column or schema does not exist.
pub fn is_missing_schema(error: &dyn DatabaseError) -> bool {
    /// PostgreSQL's undefined_table, undefined_column and invalid_schema_name; MySQL's
    /// ER_NO_SUCH_TABLE and ER_BAD_FIELD_ERROR (the same SQLSTATE on every database).
    const SERVER_MISSING: [&str; 5] = ["42P01", "42703", "3F000", "42S02", "42S22"];
    let server = error
        .code()
        .is_some_and(|code| SERVER_MISSING.contains(&code.as_ref()));
    let sqlite = ["no such table", "no such column"]
        .iter()
        .any(|missing| error.message().starts_with(missing));
    server || sqlite
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;
    use std::error::Error as StdError;

    use sqlx::error::ErrorKind;

    use super::*;

    /// A database error with a SQLSTATE (or SQLite code) and a server message.
    #[derive(Debug)]
    struct Refusal {
        code: &'static str,
        message: &'static str,
    }

    impl std::fmt::Display for Refusal {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.message)
        }
    }

    impl StdError for Refusal {}

    impl DatabaseError for Refusal {
        fn message(&self) -> &str {
            self.message
        }
        fn code(&self) -> Option<Cow<'_, str>> {
            Some(Cow::Borrowed(self.code))
        }
        fn as_error(&self) -> &(dyn StdError + Send + Sync + 'static) {
            self
        }
        fn as_error_mut(&mut self) -> &mut (dyn StdError + Send + Sync + 'static) {
            self
        }
        fn into_error(self: Box<Self>) -> Box<dyn StdError + Send + Sync + 'static> {
            self
        }
        fn kind(&self) -> ErrorKind {
            ErrorKind::Other
        }
    }

    fn sentence(code: &'static str, message: &'static str) -> String {
        of(&sqlx::Error::Database(Box::new(Refusal { code, message })))
    }

    #[test]
    fn a_refusal_is_told_by_its_code_without_the_servers_message() {
        let internals = "canceling statement due to user request at line 948";
        for (code, said) in [
            ("40001", "concurrent one: try again"),
            ("40P01", "concurrent one: try again"),
            ("517", "concurrent one: try again"),
            ("25006", "read-only"),
            ("42501", "not allowed"),
            ("53100", "out of resources"),
            ("57014", "cancelled"),
            ("23505", "breaks a constraint"),
            ("XX000", "refused the operation (code XX000)"),
        ] {
            let text = sentence(code, internals);
            assert!(text.contains(said), "{code}: {text}");
            assert!(!text.contains("948"), "{code}: {text}");
        }
        let missing = sentence("42P01", "relation \"inbox_actions\" does not exist");
        assert!(missing.contains("lacks a table or column"), "{missing}");
        assert!(!missing.contains("inbox_actions"), "{missing}");
        let sqlite = sentence("1", "no such column: dead_reason");
        assert!(sqlite.contains("lacks a table or column"), "{sqlite}");
    }

    #[test]
    fn a_failure_to_talk_to_the_database_says_so() {
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert!(of(&sqlx::Error::Io(refused)).starts_with("the connection to the database failed"));
        assert!(of(&sqlx::Error::PoolTimedOut).contains("no database connection"));
    }
}
