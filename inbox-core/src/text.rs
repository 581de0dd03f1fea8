//! Text as the databases can store it.

use std::borrow::Cow;

/// `text` with every NUL character escaped as `\0`: PostgreSQL's text columns refuse NUL, and an
/// error message or a delivery id that echoes its input may carry one. Whatever cannot be stored
/// as given is stored escaped, never dropped.
///
/// ```
/// assert_eq!(inbox_core::storable_text("a\0b"), "a\\0b");
/// assert_eq!(inbox_core::storable_text("plain"), "plain");
/// ```
pub fn storable_text(text: &str) -> Cow<'_, str> {
    match text.contains('\0') {
        true => Cow::Owned(text.replace('\0', "\\0")),
        false => Cow::Borrowed(text),
    }
}
