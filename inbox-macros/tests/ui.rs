//! Compile-fail tests of `#[inbox_handler]` and `#[derive(Message)]`: each case in `ui/fail` is a
//! form the macros reject, and its `.stderr` the error a user gets for it. The forms they accept
//! are ordinary code in the facade's `tests/handler_forms.rs`.
//!
//! trybuild builds the cases as a crate of their own, in `target/tests/trybuild`, against this
//! crate's dev-dependencies: the `inbox` facade with its default features (no broker client, no C
//! build), whatever features the outer `cargo test` enables, so the expected messages are the same
//! for every test command. As every case fails, it runs `cargo check`: nothing is linked. The
//! first run checks `inbox`'s dependencies there (cargo prints each); then one `cargo check` of
//! every case runs quietly, after which trybuild prints a line per case.
//!
//! After a change to a message, `TRYBUILD=overwrite cargo test -p inbox-macros --test ui` rewrites
//! the `.stderr` files: read their diff as a user would read the new messages.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/fail/*.rs");
}
