//! Application state for handlers, the axum way: registered once on the inbox's builder, received
//! by each handler that asks for it with a `State<T>` parameter.

use crate::handler::Handler;
use crate::storage::Backend;

/// A handler parameter that receives a clone of the application's state (an HTTP client, the
/// configuration, a cache), registered with `InboxBuilder::state`: `State(shop): State<Shop>`
/// between the database handle and the message. The `inbox` crate's front page has an example.
#[derive(Debug, Clone, Copy, Default)]
pub struct State<T>(pub T);

/// How a handler's `State<T>` is taken from the inbox's state `S`: a clone of it when `T` is
/// `S`; implement it to hand out one part of a larger state.
///
/// ```
/// # use inbox_core as inbox;
/// use inbox::FromRef;
///
/// #[derive(Clone)]
/// struct Config { currency: String }
/// struct AppState { config: Config }
///
/// impl FromRef<AppState> for Config {
///     fn from_ref(state: &AppState) -> Config {
///         state.config.clone()
///     }
/// }
/// # let state = AppState { config: Config { currency: "EUR".into() } };
/// # assert_eq!(Config::from_ref(&state).currency, "EUR");
/// ```
#[diagnostic::on_unimplemented(
    message = "a handler takes `State<{Self}>`, but the inbox's state is `{S}`",
    label = "no `{Self}` can be taken from the inbox's state `{S}`",
    note = "register the state before the handler: `Inbox::builder(pool).state(value).handler(..)`, or implement `inbox::FromRef<{S}> for {Self}` to take it from a larger state"
)]
pub trait FromRef<S> {
    /// Takes this part out of `state`.
    fn from_ref(state: &S) -> Self;
}

impl<T: Clone> FromRef<T> for T {
    fn from_ref(state: &T) -> T {
        state.clone()
    }
}

/// What the inbox's builder registers: a [`Handler`] as it is, or a handler that takes
/// `State<T>` bound to the part of the inbox's state `S` it asks for. `Kind` tells the two
/// apart ([`Stateless`] or [`Stateful`]) and is inferred.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not an inbox handler for this database and state",
    note = "annotate an `async fn` with `#[inbox_handler(key = \"...\")]`, check that its first parameter is a handle of the pool's database, and register the state it takes with `.state(..)` before it"
)]
pub trait IntoHandler<DB: Backend, S, Kind> {
    /// The handler, with its state.
    type Handler: Handler<DB>;

    /// Binds the handler to its state.
    fn into_handler(self, state: &S) -> Self::Handler;
}

/// The [`IntoHandler`] kind of a handler without state.
#[derive(Debug)]
pub enum Stateless {}

/// The [`IntoHandler`] kind of a handler that takes `State<T>`.
#[derive(Debug)]
pub enum Stateful {}

impl<DB: Backend, S, H: Handler<DB>> IntoHandler<DB, S, Stateless> for H {
    type Handler = H;

    fn into_handler(self, _: &S) -> H {
        self
    }
}
