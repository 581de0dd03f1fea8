//! Argument names of the macros, in one place.

use std::fmt;

/// The name of one attribute argument.
#[derive(Copy, Clone, PartialEq, Eq)]
pub struct Symbol(pub &'static str);

pub const KEY: Symbol = Symbol("key");
pub const SEQUENCE: Symbol = Symbol("sequence");
pub const AGGREGATE: Symbol = Symbol("aggregate");
pub const ORDERING: Symbol = Symbol("ordering");
pub const GAP_TIMEOUT: Symbol = Symbol("gap_timeout");
pub const NAME: Symbol = Symbol("name");
pub const CRATE: Symbol = Symbol("crate");
pub const MESSAGE: Symbol = Symbol("message");

/// The arguments `#[inbox_handler(...)]` accepts.
pub const HANDLER_ARGS: &[Symbol] = &[KEY, SEQUENCE, AGGREGATE, ORDERING, GAP_TIMEOUT, NAME, CRATE];

/// The arguments `#[message(...)]` accepts.
pub const MESSAGE_ARGS: &[Symbol] = &[NAME, AGGREGATE, CRATE];

impl PartialEq<Symbol> for syn::Path {
    fn eq(&self, word: &Symbol) -> bool {
        self.is_ident(word.0)
    }
}

impl fmt::Display for Symbol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "`{}`", self.0)
    }
}

/// "`a`, `b`, `c`", for error messages that list the accepted names.
pub fn expected(symbols: &[Symbol]) -> String {
    symbols
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}
