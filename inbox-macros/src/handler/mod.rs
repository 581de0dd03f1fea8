//! `#[inbox_handler(...)]`: parse the arguments and the function, validate them, expand.

mod ast;
mod attr;
mod expand;
mod valid;

use proc_macro2::TokenStream;
use quote::ToTokens;
use syn::ItemFn;

use crate::ctxt::Ctxt;

/// Expands the attribute. Errors come out as `compile_error!`s next to code that keeps the rest of
/// the crate compiling: the full handler when only the arguments are wrong (so uses of the handler
/// do not pile up follow-up errors), else the user's function unchanged.
pub fn expand(args: TokenStream, item: TokenStream) -> TokenStream {
    let original: ItemFn = match syn::parse2(item.clone()) {
        Ok(original) => original,
        Err(error) => return with_errors(item, [Err(error)]),
    };
    let shape_cx = Ctxt::new();
    let handler = ast::HandlerFn::from_syn(&shape_cx, &original);
    valid::check_shape(&shape_cx, &original);
    let args_cx = Ctxt::new();
    let args = attr::Args::from_tokens(&args_cx, args);
    valid::check_args(&args_cx, &args);
    match (handler, shape_cx.check()) {
        (Some(handler), Ok(())) => with_errors(expand::handler(&args, &handler), [args_cx.check()]),
        (_, shape) => with_errors(original.into_token_stream(), [shape, args_cx.check()]),
    }
}

fn with_errors<const N: usize>(
    mut tokens: TokenStream,
    checks: [syn::Result<()>; N],
) -> TokenStream {
    for error in checks.into_iter().filter_map(Result::err) {
        tokens.extend(error.into_compile_error());
    }
    tokens
}
