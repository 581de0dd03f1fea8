// Generated code names only absolute paths: the prelude's names being shadowed at module level
// does not break it.
#![allow(dead_code, non_camel_case_types)]

use ::inbox::prelude::{Deserialize, HandlerError, Message, Serialize, Uuid, inbox_handler};

struct Result;
struct Ok;
struct Err;
struct Option;
struct Some;
struct None;
struct Box;
struct Vec;
struct String;
struct Send;
struct Sync;
struct Sized;
struct Clone;
struct Copy;
struct Debug;
struct Deref;
struct Future;
struct Pin;
struct From;
struct Into;
struct Default;
struct i64;
struct core;
struct std;
struct __private;
struct Handler;
struct Context;
struct Identity;
struct Identifier;
struct SequenceNumber;
struct DatabaseHandle;
struct HandlerResult;
struct Backend;
struct Error;
struct BoxFuture;
struct __InboxDb;
struct __inbox_handler;
struct __inbox_boxed;
struct message;
struct ctx;
struct handle;
mod inbox {}

#[derive(::std::fmt::Debug, ::std::clone::Clone, Serialize, Deserialize, Message)]
#[message(name = "order.paid")]
struct OrderPaid {
    event_id: Uuid,
    order_id: ::std::string::String,
    sequence: ::core::primitive::i64,
}

#[inbox_handler(key = "event_id", sequence = "sequence", aggregate = "order_id")]
async fn mark_paid(
    _tx: &mut sqlx::SqliteConnection,
    _msg: OrderPaid,
) -> ::core::result::Result<(), HandlerError> {
    ::core::result::Result::Ok(())
}

#[inbox_handler(key = ["event_id", "order_id"])]
async fn log_payment(_msg: OrderPaid) -> ::core::result::Result<(), HandlerError> {
    ::core::result::Result::Ok(())
}

#[inbox_handler(key = "event_id", name = "audit")]
async fn audit(
    _ctx: &mut ::inbox::Context<'_, sqlx::Sqlite>,
    _msg: OrderPaid,
) -> ::core::result::Result<(), HandlerError> {
    ::core::result::Result::Ok(())
}

fn main() {}
