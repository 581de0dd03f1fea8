//! `#[inbox_handler(...)]`: parse the arguments and the function, validate them, expand.

mod ast;
mod attr;
mod expand;
mod valid;

use proc_macro2::TokenStream;
use quote::ToTokens;
use syn::ItemFn;

use crate::ctxt::Ctxt;

/// Expands the attribute; on error, emits the user's function unchanged next to the errors so the
/// rest of the crate does not drown in follow-up errors.
pub fn expand(args: TokenStream, item: TokenStream) -> TokenStream {
    let original: ItemFn = match syn::parse2(item.clone()) {
        Ok(original) => original,
        Err(error) => return with_error(item, error),
    };
    match try_expand(args, &original) {
        Ok(tokens) => tokens,
        Err(error) => with_error(original.into_token_stream(), error),
    }
}

fn try_expand(args: TokenStream, original: &ItemFn) -> syn::Result<TokenStream> {
    let cx = Ctxt::new();
    let args = attr::Args::from_tokens(&cx, args);
    let handler = ast::HandlerFn::from_syn(&cx, original);
    valid::check(&cx, &args, original);
    cx.check()?;
    let handler = handler.expect("a handler that passed the checks has a shape");
    Ok(expand::handler(&args, &handler))
}

fn with_error(item: TokenStream, error: syn::Error) -> TokenStream {
    let mut tokens = item;
    tokens.extend(error.into_compile_error());
    tokens
}
