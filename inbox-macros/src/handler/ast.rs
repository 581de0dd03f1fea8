//! The handler function as the expansion sees it, borrowing the user's syntax tree.

use syn::{
    FnArg, GenericArgument, ItemFn, PatType, PathArguments, ReturnType, Type, TypePath,
    TypeReference,
};

use crate::ctxt::Ctxt;

/// The database a handler writes to, read from its first parameter's type.
pub enum Database<'a> {
    /// The database of a connection such as `sqlx::PgConnection`: its `sqlx::Connection::Database`,
    /// so that every database sqlx and the inbox support works without the macro knowing it.
    OfConnection(&'a Type),
    /// The `DB` of `Transaction<'_, DB>` or `Context<'_, DB>`.
    Named(&'a Type),
}

/// The `&mut` database parameter of a handler.
pub struct DatabaseParam<'a> {
    /// The type behind `&mut`, as written.
    pub handle: &'a Type,
    pub database: Database<'a>,
}

/// A `State<T>` parameter: the application state the handler takes.
pub struct StateParam<'a> {
    /// The parameter's type, as written (`State<Shop>`).
    pub param: &'a Type,
    /// The state type (`Shop`).
    pub state: &'a Type,
}

/// The shape of an annotated function: which parameter is the database handle, which the state,
/// which the message, and what it returns. Every part is a reference into the original tokens.
pub struct HandlerFn<'a> {
    pub original: &'a ItemFn,
    /// The database parameter, if the handler takes one.
    pub database: Option<DatabaseParam<'a>>,
    /// The state parameter, if the handler takes one.
    pub state: Option<StateParam<'a>>,
    pub message: &'a Type,
    pub output: &'a Type,
}

impl<'a> HandlerFn<'a> {
    /// Reads the function's parameters and return type, reporting shapes that cannot be a handler.
    pub fn from_syn(cx: &Ctxt, original: &'a ItemFn) -> Option<Self> {
        let params = typed_params(cx, original)?;
        let output = output_type(cx, original);
        let (database, state, message) = match params.as_slice() {
            [message] => (None, None, message),
            [state, message] if state_param(state).is_some() => (None, state_param(state), message),
            [database, message] => (Some(database_param(cx, database)?), None, message),
            [database, state, message] => {
                let Some(state) = state_param(state) else {
                    let text = "the middle parameter of a handler that takes three is its state, like `State(shop): State<Shop>`";
                    cx.error_spanned_by(&state.ty, text);
                    return None;
                };
                (Some(database_param(cx, database)?), Some(state), message)
            }
            _ => {
                let message = format!(
                    "an inbox handler takes `(handle, message)`, `(handle, State<T>, message)`, `(State<T>, message)` or `(message)`; this one takes {} parameters",
                    params.len()
                );
                cx.error_spanned_by(&original.sig.inputs, message);
                return None;
            }
        };
        Some(Self {
            original,
            database,
            state,
            message: message_param(cx, message)?,
            output: output?,
        })
    }
}

/// A parameter of type `State<T>` (by any path ending in `State`).
fn state_param(param: &PatType) -> Option<StateParam<'_>> {
    let Type::Path(path) = ungroup(&param.ty) else {
        return None;
    };
    let last = path.path.segments.last()?;
    if last.ident != "State" {
        return None;
    }
    Some(StateParam {
        param: &param.ty,
        state: first_type_argument(&last.arguments)?,
    })
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
        cx.syn_error(syn::Error::new(
            original.sig.paren_token.span.join(),
            message,
        ));
        return None;
    }
    Some(params)
}

/// The message is taken by value, as a concrete type.
fn message_param<'a>(cx: &Ctxt, param: &'a PatType) -> Option<&'a Type> {
    match ungroup(&param.ty) {
        Type::Reference(reference) => {
            let message = "take the message by value, like `msg: OrderPaid`: the inbox hands each handler its own decoded copy";
            cx.error_spanned_by(reference.and_token, message);
            None
        }
        Type::ImplTrait(generic) => {
            cx.error_spanned_by(
                generic,
                "an inbox handler cannot be generic; take a concrete message type",
            );
            None
        }
        _ => Some(&param.ty),
    }
}

/// The database parameter is `&mut` one of the handles the inbox knows; which database it names
/// decides the `Handler<DB>` implementation.
fn database_param<'a>(cx: &Ctxt, param: &'a PatType) -> Option<DatabaseParam<'a>> {
    const EXPECTED: &str = "use `&mut sqlx::PgConnection`, `&mut sqlx::SqliteConnection`, `&mut sqlx::MySqlConnection`, `&mut sqlx::Transaction<'_, DB>` or `&mut inbox::Context<'_, DB>`, or take only the message";
    let reference: &TypeReference = match ungroup(&param.ty) {
        Type::Reference(reference) if reference.mutability.is_some() => reference,
        other => {
            let message = format!(
                "the first parameter must be a mutable reference to a database handle; {EXPECTED}"
            );
            cx.error_spanned_by(other, message);
            return None;
        }
    };
    let handle = ungroup(&reference.elem);
    let database = match handle {
        Type::Path(path) => database_of(handle, path),
        _ => None,
    };
    let Some(database) = database else {
        let elem = &reference.elem;
        let written = quote::quote!(#elem).to_string().replace(" :: ", "::");
        let message = format!("`{written}` is not a database handle; {EXPECTED}");
        cx.error_spanned_by(&reference.elem, message);
        return None;
    };
    Some(DatabaseParam {
        handle: &reference.elem,
        database,
    })
}

/// `Transaction<'_, DB>` and `Context<'_, DB>` name their database; a sqlx connection type
/// (`PgConnection`, `SqliteConnection`, `MySqlConnection`, ...) implies it.
fn database_of<'a>(handle: &'a Type, path: &'a TypePath) -> Option<Database<'a>> {
    let last = path.path.segments.last()?;
    match last.ident.to_string().as_str() {
        "Transaction" | "Context" => first_type_argument(&last.arguments).map(Database::Named),
        name if name.ends_with("Connection") => Some(Database::OfConnection(handle)),
        _ => None,
    }
}

/// The first type argument: the `DB` of `Transaction<'_, DB>`, the `T` of `Result<T, E>`.
fn first_type_argument(arguments: &PathArguments) -> Option<&Type> {
    let PathArguments::AngleBracketed(arguments) = arguments else {
        return None;
    };
    arguments.args.iter().find_map(|argument| match argument {
        GenericArgument::Type(ty) => Some(ty),
        _ => None,
    })
}

/// A type passed through a `macro_rules!` fragment arrives wrapped in an invisible group.
fn ungroup(ty: &Type) -> &Type {
    match ty {
        Type::Group(group) => ungroup(&group.elem),
        Type::Paren(paren) => ungroup(&paren.elem),
        other => other,
    }
}

fn output_type<'a>(cx: &Ctxt, original: &'a ItemFn) -> Option<&'a Type> {
    let ReturnType::Type(_, ty) = &original.sig.output else {
        let message = "an inbox handler must return `Result<(), E>`; add `-> Result<(), inbox::HandlerError>`";
        cx.syn_error(syn::Error::new(
            original.sig.paren_token.span.close(),
            message,
        ));
        return None;
    };
    if let Some(problem) = not_a_unit_result(ty) {
        cx.error_spanned_by(ty, problem);
        return None;
    }
    Some(ty)
}

/// Catches return types that are visibly not `Result<(), E>`; anything else (aliases included) is
/// checked by a trait bound at the type.
fn not_a_unit_result(ty: &Type) -> Option<&'static str> {
    match ungroup(ty) {
        Type::Tuple(_) | Type::Reference(_) | Type::Array(_) | Type::Slice(_) | Type::Never(_) => {
            Some(
                "an inbox handler must return `Result<(), E>`, like `Result<(), inbox::HandlerError>`",
            )
        }
        Type::Path(path) => {
            let last = path.path.segments.last()?;
            let ok = first_type_argument(&last.arguments)?;
            let is_unit = matches!(ungroup(ok), Type::Tuple(tuple) if tuple.elems.is_empty());
            (last.ident == "Result" && !is_unit)
                .then_some("a handler's result carries nothing back: return `Result<(), E>`; keep values in the database")
        }
        _ => None,
    }
}
