//! Compile tests of `#[inbox_handler]` and `#[derive(Message)]`: the forms they accept, and the
//! error each rejected form gets.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.pass("tests/ui/pass/*.rs");
    t.compile_fail("tests/ui/fail/*.rs");
}
