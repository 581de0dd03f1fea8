//! Code generation: the handler value, its `Deref` to the original function, and its `Handler`
//! implementation. The user's function is moved unchanged; only its name changes.

use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote, quote_spanned};
use syn::ext::IdentExt;
use syn::spanned::Spanned;
use syn::{Attribute, Ident, ItemFn};

use super::ast::{Database, DatabaseParam, HandlerFn};
use super::attr::{Args, Ordering};

/// Everything the expansion needs, resolved once.
struct Expansion<'a> {
    handler: &'a HandlerFn<'a>,
    args: &'a Args,
    krate: syn::Path,
    /// The name of the function moved inside the generated `const _` block.
    inner: Ident,
}

pub fn handler(args: &Args, handler: &HandlerFn<'_>) -> TokenStream {
    let expansion = Expansion {
        handler,
        args,
        krate: args
            .krate
            .clone()
            .unwrap_or_else(|| syn::parse_quote!(::inbox)),
        inner: Ident::new("__inbox_handler", Span::call_site()),
    };
    expansion.tokens()
}

impl Expansion<'_> {
    fn tokens(&self) -> TokenStream {
        let original = self.handler.original;
        let vis = &original.vis;
        let name = &original.sig.ident;
        let docs = attrs_where(original, |attr| attr.path().is_ident("doc"));
        let cfgs = attrs_where(original, is_cfg);
        let inner_fn = self.inner_fn();
        let deref = self.deref_impl();
        let handler = self.handler_impl();
        quote! {
            #(#docs)*
            #(#cfgs)*
            #[allow(non_camel_case_types)]
            #[derive(::core::clone::Clone, ::core::marker::Copy, ::core::fmt::Debug)]
            #vis struct #name;

            #(#cfgs)*
            const _: () = {
                #inner_fn
                #deref
                #handler
            };
        }
    }

    /// The user's function, renamed, with its body, spans and other attributes untouched.
    fn inner_fn(&self) -> ItemFn {
        let mut inner = self.handler.original.clone();
        inner.sig.ident = self.inner.clone();
        inner.vis = syn::Visibility::Inherited;
        inner
            .attrs
            .retain(|attr| !attr.path().is_ident("doc") && !is_cfg(attr));
        inner
    }

    /// Makes the handler value callable like the original function (unguarded), returning a boxed
    /// future.
    fn deref_impl(&self) -> TokenStream {
        let krate = &self.krate;
        let name = &self.handler.original.sig.ident;
        let inner = &self.inner;
        let message = self.handler.message;
        let output = self.handler.output;
        let handle = self.handler.database.as_ref().map(|param| param.handle);
        let state = self.handler.state.as_ref().map(|state| state.param);
        let (lifetime, borrowed) = match handle {
            Some(_) => (quote!('__inbox_c), quote!(for<'__inbox_c>)),
            None => (quote!('static), quote!()),
        };
        let types: Vec<TokenStream> = handle
            .map(|handle| quote!(&'__inbox_c mut #handle))
            .into_iter()
            .chain(state.map(|state| quote!(#state)))
            .chain([quote!(#message)])
            .collect();
        let names: Vec<Ident> = (0..types.len())
            .map(|index| format_ident!("__inbox_param{index}"))
            .collect();
        let generics = handle.map(|_| quote!(<'__inbox_c>));
        let fn_ptr =
            quote!(#borrowed fn(#(#types),*) -> #krate::__private::BoxFuture<#lifetime, #output>);
        let boxed = quote! {
            fn __inbox_boxed #generics (#(#names: #types),*) -> #krate::__private::BoxFuture<#lifetime, #output> {
                ::std::boxed::Box::pin(#inner(#(#names),*))
            }
        };
        quote! {
            #boxed

            #[automatically_derived]
            impl ::core::ops::Deref for #name {
                type Target = #fn_ptr;

                fn deref(&self) -> &Self::Target {
                    const __INBOX_FN: #fn_ptr = __inbox_boxed;
                    &__INBOX_FN
                }
            }
        }
    }

    /// The `Handler` implementation: on the handler value itself, or, for a handler that takes
    /// `State<T>`, on the value bound to its state, which `IntoHandler` and `with_state` make.
    fn handler_impl(&self) -> TokenStream {
        let krate = &self.krate;
        let name = &self.handler.original.sig.ident;
        let (generics, database) = self.generics_and_database();
        let generics = quote!(<#generics>);
        let items = self.handler_items(&database);
        let Some(state) = &self.handler.state else {
            return quote! {
                #[automatically_derived]
                impl #generics #krate::__private::Handler<#database> for #name {
                    #items
                }
            };
        };
        let state_type = state.state;
        let vis = &self.handler.original.vis;
        let (params, _) = self.generics_and_database();
        quote! {
            /// The handler bound to its state.
            #vis struct __InboxWithState(#state_type);

            #[automatically_derived]
            impl #generics #krate::__private::Handler<#database> for __InboxWithState {
                #items
            }

            #[automatically_derived]
            impl<__InboxState, #params> #krate::__private::IntoHandler<#database, __InboxState, #krate::__private::Stateful> for #name
            where
                #state_type: #krate::__private::FromRef<__InboxState>,
            {
                type Handler = __InboxWithState;

                fn into_handler(self, __inbox_state: &__InboxState) -> __InboxWithState {
                    __InboxWithState(<#state_type as #krate::__private::FromRef<__InboxState>>::from_ref(__inbox_state))
                }
            }

            impl #name {
                /// This handler bound to `state`: a plain handler, for `process` and tests.
                #[allow(dead_code)]
                #vis fn with_state(self, state: #state_type) -> __InboxWithState {
                    __InboxWithState(state)
                }
            }

        }
    }

    /// The generic parameters of the `Handler` implementation (a handler that takes only its
    /// message, and maybe its state, works on every database) and the database it is for.
    fn generics_and_database(&self) -> (TokenStream, TokenStream) {
        let krate = &self.krate;
        match &self.handler.database {
            Some(param) => (quote!(), self.database(param)),
            None => (
                quote!(__InboxDb: #krate::__private::Backend),
                quote!(__InboxDb),
            ),
        }
    }

    /// The items of the `Handler` implementation.
    fn handler_items(&self, database: &TokenStream) -> TokenStream {
        let krate = &self.krate;
        let message = self.handler.message;
        let handler_name = self.handler_name();
        let identity = self.identity();
        let ordering = self.ordering();
        let call = self.call();
        quote! {
            type Message = #message;

            fn name(&self) -> &'static ::core::primitive::str {
                #handler_name
            }

            #ordering

            fn identity(
                &self,
                __inbox_message: &#message,
            ) -> ::core::result::Result<#krate::__private::Identity, #krate::__private::Error> {
                #identity
            }

            fn handle<'__inbox_c, '__inbox_t>(
                &'__inbox_c self,
                __inbox_ctx: &'__inbox_c mut #krate::__private::Context<'__inbox_t, #database>,
                __inbox_message: #message,
            ) -> #krate::__private::BoxFuture<
                '__inbox_c,
                ::core::result::Result<(), #krate::__private::HandlerError>,
            > {
                ::std::boxed::Box::pin(async move { #call })
            }
        }
    }

    /// Overrides `Handler::ordering` for strict handlers.
    fn ordering(&self) -> TokenStream {
        let krate = &self.krate;
        if !matches!(self.args.ordering, Some((_, Ordering::Strict))) {
            return TokenStream::new();
        }
        let gap_timeout = match &self.args.gap_timeout {
            Some((_, seconds)) => quote!(::core::time::Duration::from_secs(#seconds)),
            None => quote!(#krate::__private::DEFAULT_GAP_TIMEOUT),
        };
        quote! {
            fn ordering(&self) -> #krate::__private::Ordering {
                #krate::__private::Ordering::Strict { gap_timeout: #gap_timeout }
            }
        }
    }

    /// `name = "..."`, or the function's name.
    fn handler_name(&self) -> String {
        match &self.args.name {
            Some(name) => name.value(),
            None => self.handler.original.sig.ident.unraw().to_string(),
        }
    }

    /// Reads the key, aggregate and sequence fields; each access is spanned at the string literal
    /// that named the field, so a missing field or an unusable type is reported there.
    fn identity(&self) -> TokenStream {
        let krate = &self.krate;
        let keys = self.args.key.iter().flat_map(|(_, fields)| fields).map(|field| {
            quote_spanned!(field.span()=> #krate::__private::Identifier::to_identifier(&(*__inbox_message).#field))
        });
        let aggregate = match &self.args.aggregate {
            Some(field) => quote_spanned!(field.span()=>
                ::core::option::Option::Some(#krate::__private::Identifier::to_identifier(&(*__inbox_message).#field))),
            None => quote!(::core::option::Option::None),
        };
        let sequence = match &self.args.sequence {
            Some(field) => quote_spanned!(field.span()=>
                ::core::option::Option::Some(#krate::__private::SequenceNumber::to_sequence(&(*__inbox_message).#field))),
            None => quote!(::core::option::Option::None),
        };
        quote!(#krate::__private::Identity::new(&[#(#keys),*], #aggregate, #sequence))
    }

    /// The database type of the `Handler<DB>` implementation.
    fn database(&self, param: &DatabaseParam<'_>) -> TokenStream {
        let krate = &self.krate;
        match param.database {
            Database::OfConnection(connection) => {
                quote!(<#connection as #krate::__private::Connection>::Database)
            }
            Database::Named(database) => quote!(#database),
        }
    }

    /// Calls the moved function with the handle borrowed from the context; the conversions are
    /// spanned at the user's parameter and return types so trait errors land there.
    fn call(&self) -> TokenStream {
        let krate = &self.krate;
        let inner = &self.inner;
        let output = self.handler.output;
        let state = self.handler.state.as_ref().map(|state| {
            let param = state.param;
            let state_type = state.state;
            let clone = quote_spanned!(state_type.span()=> #krate::__private::clone_state::<#state_type>(&self.0));
            quote_spanned!(param.span()=> #krate::__private::State(#clone),)
        });
        let invocation = match &self.handler.database {
            Some(param) => {
                let handle = param.handle;
                let database = self.database(param);
                let borrow = quote_spanned!(handle.span()=>
                    <#handle as #krate::__private::DatabaseHandle<'__inbox_t, #database>>::from_context(__inbox_ctx));
                quote!(#inner(#borrow, #state __inbox_message))
            }
            None => quote!({
                let _ = __inbox_ctx;
                #inner(#state __inbox_message)
            }),
        };
        let result = quote_spanned!(output.span()=>
            <#output as #krate::__private::HandlerResult>::into_result(#invocation.await));
        quote! {
            match #result {
                ::core::result::Result::Ok(()) => ::core::result::Result::Ok(()),
                ::core::result::Result::Err(__inbox_failure) => {
                    #[allow(unused_imports)]
                    use #krate::__private::classify::{Classified as _, Unclassified as _};
                    ::core::result::Result::Err((&&__inbox_failure).take_handler_error())
                }
            }
        }
    }
}

fn attrs_where(original: &ItemFn, keep: impl Fn(&Attribute) -> bool) -> Vec<&Attribute> {
    original.attrs.iter().filter(|attr| keep(attr)).collect()
}

fn is_cfg(attr: &Attribute) -> bool {
    attr.path().is_ident("cfg") || attr.path().is_ident("cfg_attr")
}
