//! Parsing of `name = value` argument lists, shared by both macros: the one place that reports
//! unknown and duplicate arguments.

use proc_macro2::TokenStream;
use quote::ToTokens;
use syn::punctuated::Punctuated;
use syn::{Expr, Lit, LitStr, Meta, MetaNameValue, Token};

use crate::ctxt::Ctxt;
use crate::symbol::{self, Symbol};

/// One argument's value, set at most once.
pub struct Attr<'c, T> {
    cx: &'c Ctxt,
    name: Symbol,
    value: Option<T>,
}

impl<'c, T> Attr<'c, T> {
    pub fn none(cx: &'c Ctxt, name: Symbol) -> Self {
        Self {
            cx,
            name,
            value: None,
        }
    }

    /// Sets the value, or reports a duplicate at `tokens`.
    pub fn set<A: ToTokens>(&mut self, tokens: A, value: T) {
        if self.value.is_some() {
            let message = format!("duplicate argument {}; give it once", self.name);
            self.cx.error_spanned_by(tokens, message);
        } else {
            self.value = Some(value);
        }
    }

    pub fn get(self) -> Option<T> {
        self.value
    }
}

/// Splits `args` into `name = value` pairs and hands each accepted one to `each`; reports anything
/// else (unknown names, bare words, lists) at its token.
pub fn for_each_arg(
    cx: &Ctxt,
    args: TokenStream,
    accepted: &[Symbol],
    mut each: impl FnMut(Symbol, &MetaNameValue),
) {
    let parser = Punctuated::<Meta, Token![,]>::parse_terminated;
    let metas = match syn::parse::Parser::parse2(parser, args) {
        Ok(metas) => metas,
        Err(error) => return cx.syn_error(error),
    };
    for meta in &metas {
        let Meta::NameValue(pair) = meta else {
            let message = format!(
                "expected `name = value`; the arguments are {}",
                symbol::expected(accepted)
            );
            cx.error_spanned_by(meta, message);
            continue;
        };
        match accepted.iter().find(|name| pair.path == **name) {
            Some(name) => each(*name, pair),
            None => cx.error_spanned_by(&pair.path, unknown_argument(&pair.path, accepted)),
        }
    }
}

fn unknown_argument(path: &syn::Path, accepted: &[Symbol]) -> String {
    format!(
        "unknown argument `{}`; expected one of {}",
        path.to_token_stream().to_string().replace(' ', ""),
        symbol::expected(accepted)
    )
}

/// The string literal of `name = "..."`, or an error at the value.
pub fn string_value(cx: &Ctxt, name: Symbol, value: &Expr) -> Option<LitStr> {
    match value {
        Expr::Lit(syn::ExprLit {
            lit: Lit::Str(lit), ..
        }) => Some(lit.clone()),
        _ => {
            let message = format!("expected a string for {name}, like `{} = \"...\"`", name.0);
            cx.error_spanned_by(value, message);
            None
        }
    }
}

/// `crate = "path"`: the path generated code uses to reach the `inbox` crate.
pub fn crate_path(cx: &Ctxt, value: &Expr) -> Option<syn::Path> {
    let lit = string_value(cx, symbol::CRATE, value)?;
    match lit.parse::<syn::Path>() {
        Ok(path) => Some(path),
        Err(_) => {
            let message = format!(
                "`{}` is not a path; expected something like `crate = \"::my_crate::inbox\"`",
                lit.value()
            );
            cx.error_spanned_by(&lit, message);
            None
        }
    }
}
