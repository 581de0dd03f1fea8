//! The handler function as the expansion sees it, borrowing the user's syntax tree.

use syn::{FnArg, ItemFn, PatType, ReturnType, Type, TypeReference};

use crate::ctxt::Ctxt;

/// The shape of an annotated function: which parameter is the database handle, which is the
/// message, and what it returns. Every part is a reference into the original tokens.
pub struct HandlerFn<'a> {
    pub original: &'a ItemFn,
    /// The `&mut T` database parameter, if the handler takes one.
    pub database: Option<&'a TypeReference>,
    pub message: &'a Type,
    pub output: &'a Type,
}

impl<'a> HandlerFn<'a> {
    /// Reads the function's parameters and return type, reporting shapes that cannot be a handler.
    pub fn from_syn(cx: &Ctxt, original: &'a ItemFn) -> Option<Self> {
        let params = typed_params(cx, original)?;
        let output = output_type(cx, original);
        let (database, message) = match params.as_slice() {
            [message] => (None, &*message.ty),
            [database, message] => (database_param(cx, database), &*message.ty),
            _ => {
                let message = format!(
                    "an inbox handler takes `(handle, message)` or `(message)`; this one takes {} parameters",
                    params.len()
                );
                cx.error_spanned_by(&original.sig.inputs, message);
                return None;
            }
        };
        Some(Self {
            original,
            database,
            message,
            output: output?,
        })
    }
}

fn typed_params<'a>(cx: &Ctxt, original: &'a ItemFn) -> Option<Vec<&'a PatType>> {
    let mut params = Vec::new();
    for input in &original.sig.inputs {
        match input {
            FnArg::Typed(param) => params.push(param),
            FnArg::Receiver(receiver) => {
                let message = "an inbox handler cannot take `self`; make it a free `async fn` outside the `impl` block";
                cx.error_spanned_by(receiver, message);
                return None;
            }
        }
    }
    if params.is_empty() {
        let message = "an inbox handler needs the message as a parameter, like `async fn handle(tx: &mut sqlx::PgConnection, msg: OrderPaid)`";
        cx.error_spanned_by(&original.sig, message);
        return None;
    }
    Some(params)
}

/// The database parameter must be `&mut` something; whether that something is a database handle
/// is checked by a trait bound at the type.
fn database_param<'a>(cx: &Ctxt, param: &'a PatType) -> Option<&'a TypeReference> {
    match &*param.ty {
        Type::Reference(reference) if reference.mutability.is_some() => Some(reference),
        other => {
            let message = "the first parameter must be a mutable reference to a database handle, like `&mut sqlx::PgConnection`, `&mut sqlx::Transaction<'_, DB>` or `&mut inbox::Context<'_, DB>`";
            cx.error_spanned_by(other, message);
            None
        }
    }
}

fn output_type<'a>(cx: &Ctxt, original: &'a ItemFn) -> Option<&'a Type> {
    match &original.sig.output {
        ReturnType::Type(_, ty) => Some(ty),
        ReturnType::Default => {
            let message = "an inbox handler must return `Result<(), E>`; add `-> Result<(), inbox::HandlerError>`";
            cx.error_spanned_by(&original.sig, message);
            None
        }
    }
}
