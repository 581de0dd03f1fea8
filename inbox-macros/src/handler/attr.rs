//! The arguments of `#[inbox_handler(...)]`.

use proc_macro2::TokenStream;
use syn::{Expr, Ident, LitStr};

use crate::attr::{Attr, crate_path, for_each_arg, string_value};
use crate::ctxt::Ctxt;
use crate::symbol::{self, AGGREGATE, CRATE, GAP_TIMEOUT, KEY, NAME, ORDERING, SEQUENCE, Symbol};

/// How the ordering guard treats a sequence that skips ahead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ordering {
    /// Newer sequences apply, gaps allowed.
    Monotonic,
    /// A gap parks the message until its predecessor applies.
    Strict,
}

/// The parsed arguments. Field names keep the span of their string literal, so errors about a
/// field land on the literal the user wrote.
pub struct Args {
    /// The `key = ...` argument as written, for errors about the argument as a whole.
    pub key: Option<(Expr, Vec<Ident>)>,
    pub sequence: Option<Ident>,
    pub aggregate: Option<Ident>,
    /// `ordering = "..."` as written, and what it means.
    pub ordering: Option<(LitStr, Ordering)>,
    /// `gap_timeout = "..."` as written, in seconds.
    pub gap_timeout: Option<(LitStr, u64)>,
    pub name: Option<LitStr>,
    pub krate: Option<syn::Path>,
}

impl Args {
    pub fn from_tokens(cx: &Ctxt, args: TokenStream) -> Self {
        let mut key = Attr::none(cx, KEY);
        let mut sequence = Attr::none(cx, SEQUENCE);
        let mut aggregate = Attr::none(cx, AGGREGATE);
        let mut ordering = Attr::none(cx, ORDERING);
        let mut gap_timeout = Attr::none(cx, GAP_TIMEOUT);
        let mut name = Attr::none(cx, NAME);
        let mut krate = Attr::none(cx, CRATE);
        for_each_arg(cx, args, symbol::HANDLER_ARGS, |arg, pair| {
            let value = &pair.value;
            match arg {
                KEY => key.set(&pair.path, (value.clone(), key_fields(cx, value))),
                SEQUENCE => set_opt(&mut sequence, pair, field(cx, arg, value)),
                AGGREGATE => set_opt(&mut aggregate, pair, field(cx, arg, value)),
                ORDERING => set_opt(&mut ordering, pair, parse_ordering(cx, value)),
                GAP_TIMEOUT => set_opt(&mut gap_timeout, pair, parse_duration(cx, value)),
                NAME => set_opt(&mut name, pair, string_value(cx, arg, value)),
                _ => set_opt(&mut krate, pair, crate_path(cx, value)),
            }
        });
        Self {
            key: key.get(),
            sequence: sequence.get(),
            aggregate: aggregate.get(),
            ordering: ordering.get(),
            gap_timeout: gap_timeout.get(),
            name: name.get(),
            krate: krate.get(),
        }
    }
}

fn set_opt<T>(attr: &mut Attr<'_, T>, pair: &syn::MetaNameValue, value: Option<T>) {
    if let Some(value) = value {
        attr.set(&pair.path, value);
    }
}

/// `key = "a"` or `key = ["a", "b"]`.
fn key_fields(cx: &Ctxt, value: &Expr) -> Vec<Ident> {
    match value {
        Expr::Array(array) => array
            .elems
            .iter()
            .filter_map(|elem| field(cx, KEY, elem))
            .collect(),
        _ => field(cx, KEY, value).into_iter().collect(),
    }
}

/// A field name given as a string literal, as an identifier spanned at the literal.
fn field(cx: &Ctxt, arg: Symbol, value: &Expr) -> Option<Ident> {
    let lit = string_value(cx, arg, value)?;
    match lit.parse::<Ident>() {
        Ok(ident) => Some(ident),
        Err(_) => {
            let message = format!(
                "`{}` is not a field name; {arg} names a field of the message struct",
                lit.value()
            );
            cx.error_spanned_by(&lit, message);
            None
        }
    }
}

/// `ordering = "monotonic"` (the default) or `ordering = "strict"`.
fn parse_ordering(cx: &Ctxt, value: &Expr) -> Option<(LitStr, Ordering)> {
    let lit = string_value(cx, ORDERING, value)?;
    let ordering = match lit.value().as_str() {
        "monotonic" => Ordering::Monotonic,
        "strict" => Ordering::Strict,
        other => {
            let message =
                format!("unknown ordering `{other}`; expected \"monotonic\" or \"strict\"");
            cx.error_spanned_by(&lit, message);
            return None;
        }
    };
    Some((lit, ordering))
}

/// `gap_timeout = "15m"`: a whole number of seconds, minutes, hours or days.
fn parse_duration(cx: &Ctxt, value: &Expr) -> Option<(LitStr, u64)> {
    let lit = string_value(cx, GAP_TIMEOUT, value)?;
    let text = lit.value();
    let (number, unit) = text.split_at(
        text.find(|c: char| !c.is_ascii_digit())
            .unwrap_or(text.len()),
    );
    let scale = match unit {
        "s" => Some(1),
        "m" => Some(60),
        "h" => Some(3_600),
        "d" => Some(86_400),
        _ => None,
    };
    match (number.parse::<u64>(), scale) {
        (Ok(0), Some(_)) => {
            let message = "a gap timeout of zero would give up on every parked message at once; give it at least \"1s\"";
            cx.error_spanned_by(&lit, message);
            None
        }
        (Ok(number), Some(scale)) => Some((lit, number.saturating_mul(scale))),
        _ => {
            let message = format!(
                "`{text}` is not a duration; write a whole number and a unit, like \"30s\", \"15m\", \"2h\" or \"1d\""
            );
            cx.error_spanned_by(&lit, message);
            None
        }
    }
}
