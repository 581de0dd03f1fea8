//! `#[derive(Message)]`: a stable type tag for a struct with named fields.

use proc_macro2::TokenStream;
use quote::{quote, quote_spanned};
use syn::{Data, DeriveInput, Fields, Ident, LitStr};

use crate::attr::{Attr, crate_path, for_each_arg, string_value};
use crate::ctxt::Ctxt;
use crate::symbol::{self, AGGREGATE, CRATE, MESSAGE, NAME};

/// The derive's input after validation.
struct MessageType<'a> {
    original: &'a DeriveInput,
    name: Option<LitStr>,
    /// The field holding the aggregate, as the literal that named it (for its span).
    aggregate: Option<LitStr>,
    krate: Option<syn::Path>,
}

/// Expands the derive. When only the `#[message(...)]` arguments are wrong, the implementation is
/// still emitted (with the default type tag) next to the errors, so that handlers of the type do
/// not report it as "not a message" too.
pub fn expand(item: TokenStream) -> TokenStream {
    let input: DeriveInput = match syn::parse2(item) {
        Ok(input) => input,
        Err(error) => return error.into_compile_error(),
    };
    let shape_cx = Ctxt::new();
    check_shape(&shape_cx, &input);
    if let Err(error) = shape_cx.check() {
        return error.into_compile_error();
    }
    let args_cx = Ctxt::new();
    let message = MessageType::from_syn(&args_cx, &input);
    let mut tokens = message.tokens();
    if let Err(error) = args_cx.check() {
        tokens.extend(error.into_compile_error());
    }
    tokens
}

impl<'a> MessageType<'a> {
    /// Reads the `#[message(...)]` arguments, recording bad ones in `cx`.
    fn from_syn(cx: &Ctxt, original: &'a DeriveInput) -> Self {
        let mut name = Attr::none(cx, NAME);
        let mut aggregate = Attr::none(cx, AGGREGATE);
        let mut krate = Attr::none(cx, CRATE);
        for attr in original
            .attrs
            .iter()
            .filter(|a| a.path().is_ident(MESSAGE.0))
        {
            let Ok(list) = attr.meta.require_list() else {
                let message = "write the message's arguments in parentheses, like `#[message(name = \"order.paid\")]`";
                cx.error_spanned_by(attr, message);
                continue;
            };
            for_each_arg(
                cx,
                list.tokens.clone(),
                symbol::MESSAGE_ARGS,
                |arg, pair| match arg {
                    NAME => {
                        if let Some(lit) = type_tag(cx, &pair.value) {
                            name.set(&pair.path, lit);
                        }
                    }
                    AGGREGATE => {
                        if let Some(lit) = aggregate_field(cx, original, &pair.value) {
                            aggregate.set(&pair.path, lit);
                        }
                    }
                    _ => {
                        if let Some(path) = crate_path(cx, &pair.value) {
                            krate.set(&pair.path, path);
                        }
                    }
                },
            );
        }
        Self {
            original,
            name: name.get(),
            aggregate: aggregate.get(),
            krate: krate.get(),
        }
    }

    fn tokens(&self) -> TokenStream {
        let ident = &self.original.ident;
        let krate = self
            .krate
            .clone()
            .unwrap_or_else(|| syn::parse_quote!(::inbox));
        let tag = match &self.name {
            Some(name) => name.value(),
            None => ident.to_string(),
        };
        let aggregate = self.aggregate.as_ref().map(|lit| {
            let field = Ident::new(&lit.value(), lit.span());
            quote_spanned! {lit.span()=>
                fn aggregate(&self) -> ::core::option::Option<#krate::__private::Cow<'_, ::core::primitive::str>> {
                    ::core::option::Option::Some(#krate::__private::Identifier::to_identifier(&self.#field))
                }
            }
        });
        quote! {
            #[automatically_derived]
            impl #krate::__private::Message for #ident {
                const TYPE: &'static ::core::primitive::str = #tag;
                #aggregate
            }
        }
    }
}

/// The `aggregate` argument: the name of one of the struct's fields.
fn aggregate_field(cx: &Ctxt, original: &DeriveInput, value: &syn::Expr) -> Option<LitStr> {
    let lit = string_value(cx, AGGREGATE, value)?;
    let Data::Struct(data) = &original.data else {
        return None;
    };
    let known = data
        .fields
        .iter()
        .filter_map(|field| field.ident.as_ref())
        .any(|field| field == lit.value().as_str());
    if !known {
        let message = format!(
            "`{}` has no field `{}`; `aggregate` names the field that holds the message's aggregate id",
            original.ident,
            lit.value()
        );
        cx.error_spanned_by(&lit, message);
        return None;
    }
    Some(lit)
}

fn type_tag(cx: &Ctxt, value: &syn::Expr) -> Option<LitStr> {
    let lit = string_value(cx, NAME, value)?;
    if lit.value().trim().is_empty() {
        cx.error_spanned_by(&lit, "the message `name` is empty; it is the type tag envelopes carry, like `name = \"order.paid\"`");
        return None;
    }
    Some(lit)
}

/// A message is a concrete struct with named fields: handlers name its fields in `key`,
/// `sequence` and `aggregate`, and its type tag must mean one type.
fn check_shape(cx: &Ctxt, original: &DeriveInput) {
    if !original.generics.params.is_empty() {
        let message = "a message type cannot be generic: its type tag must name one type; use a concrete struct";
        cx.error_spanned_by(&original.generics, message);
    }
    let fields = match &original.data {
        Data::Struct(data) => &data.fields,
        Data::Enum(data) => {
            let message = "`Message` cannot be derived for an enum: handlers read the key from named fields; derive it on a struct per event (or on a struct holding the enum)";
            return cx.error_spanned_by(data.enum_token, message);
        }
        Data::Union(data) => {
            return cx.error_spanned_by(
                data.union_token,
                "`Message` cannot be derived for a union; use a struct with named fields",
            );
        }
    };
    if !matches!(fields, Fields::Named(_)) {
        let message = "`Message` needs a struct with named fields: handlers name the fields that hold the key, like `struct OrderPaid { event_id: Uuid, .. }`";
        cx.error_spanned_by(&original.ident, message);
    }
}
