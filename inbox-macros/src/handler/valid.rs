//! Rules on the function's shape and across arguments, one small function each.

use proc_macro2::Span;
use syn::ItemFn;

use super::attr::{Args, Ordering};
use crate::ctxt::Ctxt;

/// Checks what makes a function unusable as a handler whatever its arguments.
pub fn check_shape(cx: &Ctxt, original: &ItemFn) {
    check_async(cx, original);
    check_safe(cx, original);
    check_not_generic(cx, original);
}

/// Checks the attribute's arguments against each other.
pub fn check_args(cx: &Ctxt, args: &Args) {
    check_key(cx, args);
    check_sequence_has_aggregate(cx, args);
    check_strict_has_sequence(cx, args);
    check_gap_timeout_is_strict(cx, args);
    check_name(cx, args);
}

fn check_async(cx: &Ctxt, original: &ItemFn) {
    if original.sig.asyncness.is_none() {
        let message = "an inbox handler must be an `async fn`; add `async` before `fn`";
        cx.error_spanned_by(original.sig.fn_token, message);
    }
}

fn check_safe(cx: &Ctxt, original: &ItemFn) {
    if let Some(unsafety) = original.sig.unsafety {
        let message =
            "an inbox handler cannot be `unsafe`; keep the unsafe code in a block inside it";
        cx.error_spanned_by(unsafety, message);
    }
}

fn check_not_generic(cx: &Ctxt, original: &ItemFn) {
    let generics = &original.sig.generics;
    let message =
        "an inbox handler cannot be generic; write it for one message type and one database";
    if !generics.params.is_empty() {
        cx.error_spanned_by(&generics.params, message);
    } else if let Some(where_clause) = &generics.where_clause {
        cx.error_spanned_by(where_clause, message);
    }
}

fn check_key(cx: &Ctxt, args: &Args) {
    let Some((written, fields)) = &args.key else {
        let message = "missing `key`: name the field that identifies a message, like `#[inbox_handler(key = \"event_id\")]`";
        return cx.syn_error(syn::Error::new(Span::call_site(), message));
    };
    if fields.is_empty() && matches!(written, syn::Expr::Array(_)) {
        let message =
            "`key` names no field; list at least one, like `key = [\"tenant\", \"event_id\"]`";
        cx.error_spanned_by(written, message);
    }
    for (i, field) in fields.iter().enumerate() {
        if fields[..i].contains(field) {
            let message = format!("field `{field}` is listed twice in `key`");
            cx.error_spanned_by(field, message);
        }
    }
}

fn check_sequence_has_aggregate(cx: &Ctxt, args: &Args) {
    if let (Some(sequence), None) = (&args.sequence, &args.aggregate) {
        let message = "`sequence` needs `aggregate`: sequences are compared per aggregate; add `aggregate = \"<field>\"`";
        cx.error_spanned_by(sequence, message);
    }
}

fn check_strict_has_sequence(cx: &Ctxt, args: &Args) {
    if let (Some((written, Ordering::Strict)), None) = (&args.ordering, &args.sequence) {
        let message = "`ordering = \"strict\"` needs `sequence` and `aggregate`: it holds a message until the one before it in its aggregate has applied";
        cx.error_spanned_by(written, message);
    }
}

fn check_gap_timeout_is_strict(cx: &Ctxt, args: &Args) {
    let strict = matches!(args.ordering, Some((_, Ordering::Strict)));
    if let (Some((written, _)), false) = (&args.gap_timeout, strict) {
        let message = "`gap_timeout` applies to `ordering = \"strict\"` only: it is how long a parked message waits for a missing predecessor";
        cx.error_spanned_by(written, message);
    }
}

fn check_name(cx: &Ctxt, args: &Args) {
    if let Some(name) = &args.name
        && name.value().trim().is_empty()
    {
        cx.error_spanned_by(
            name,
            "`name` is empty; it is the handler's dedup scope and must say which handler this is",
        );
    }
}
