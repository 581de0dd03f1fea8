//! Procedural macros of the `inbox` framework. Use them through the `inbox` crate, which documents
//! them with runnable examples.

mod attr;
mod ctxt;
mod handler;
mod message;
mod symbol;

use proc_macro::TokenStream;

/// Turns an `async fn` into a guarded, effectively-once message handler.
///
/// See the `inbox` crate for the arguments and examples.
#[proc_macro_attribute]
pub fn inbox_handler(args: TokenStream, item: TokenStream) -> TokenStream {
    handler::expand(args.into(), item.into()).into()
}

/// Gives a struct its stable message type tag (`#[message(name = "...")]`, default: the type's
/// name).
///
/// See the `inbox` crate for examples.
#[proc_macro_derive(Message, attributes(message))]
pub fn derive_message(item: TokenStream) -> TokenStream {
    message::expand(item.into()).into()
}
