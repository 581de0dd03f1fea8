//! The arguments of `#[inbox_handler(...)]`.

use proc_macro2::TokenStream;
use syn::{Expr, Ident, LitStr};

use crate::attr::{Attr, crate_path, for_each_arg, string_value};
use crate::ctxt::Ctxt;
use crate::symbol::{self, AGGREGATE, CRATE, KEY, NAME, ORDERING, SEQUENCE, Symbol};

/// The parsed arguments. Field names keep the span of their string literal, so errors about a
/// field land on the literal the user wrote.
pub struct Args {
    /// The `key = ...` argument as written, for errors about the argument as a whole.
    pub key: Option<(Expr, Vec<Ident>)>,
    pub sequence: Option<Ident>,
    pub aggregate: Option<Ident>,
    pub name: Option<LitStr>,
    pub krate: Option<syn::Path>,
}

impl Args {
    pub fn from_tokens(cx: &Ctxt, args: TokenStream) -> Self {
        let mut key = Attr::none(cx, KEY);
        let mut sequence = Attr::none(cx, SEQUENCE);
        let mut aggregate = Attr::none(cx, AGGREGATE);
        let mut ordering = Attr::none(cx, ORDERING);
        let mut name = Attr::none(cx, NAME);
        let mut krate = Attr::none(cx, CRATE);
        for_each_arg(cx, args, symbol::HANDLER_ARGS, |arg, pair| {
            let value = &pair.value;
            match arg {
                KEY => key.set(&pair.path, (value.clone(), key_fields(cx, value))),
                SEQUENCE => set_opt(&mut sequence, pair, field(cx, arg, value)),
                AGGREGATE => set_opt(&mut aggregate, pair, field(cx, arg, value)),
                ORDERING => set_opt(&mut ordering, pair, check_ordering(cx, value)),
                NAME => set_opt(&mut name, pair, string_value(cx, arg, value)),
                _ => set_opt(&mut krate, pair, crate_path(cx, value)),
            }
        });
        let _checked_only = ordering.get();
        Self {
            key: key.get(),
            sequence: sequence.get(),
            aggregate: aggregate.get(),
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

/// `ordering = "monotonic"` (the default and, for now, the only ordering): newer sequences apply,
/// gaps allowed.
fn check_ordering(cx: &Ctxt, value: &Expr) -> Option<()> {
    let lit = string_value(cx, ORDERING, value)?;
    match lit.value().as_str() {
        "monotonic" => Some(()),
        other => {
            let message = format!("unknown ordering `{other}`; expected \"monotonic\"");
            cx.error_spanned_by(&lit, message);
            None
        }
    }
}
