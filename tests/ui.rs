//! Compile tests of `#[inbox_handler]` and `#[derive(Message)]`: the forms they accept, and the
//! error each rejected form gets.
//!
//! The expected messages are those of a build with every feature (the README's test command,
//! `cargo test --workspace --all-features`): rustc writes a trait's full path (`inbox::Message`)
//! once another crate of the build has an item of the same name, as the broker clients do.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.pass("tests/ui/pass/*.rs");
    t.compile_fail("tests/ui/fail/*.rs");
}
