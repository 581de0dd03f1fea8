//! Tests that did not run, shown as skipped: for want of a server, or because what they test
//! does not apply.
//!
//! libtest has no "skipped" on stable Rust: a test that returns early is `ok` and counts as
//! passed, and whatever it prints through `print!`/`eprint!` is captured and thrown away when it
//! passes. `#[ignore]` would be honest, but it is fixed when the test is compiled, while whether
//! a server is there is known when it runs. So [`skip`] shows a skip twice, written to stderr
//! itself, which libtest does not capture: where it happens, beside the test's `ok`; and under
//! libtest's `test result: ok. 36 passed; ...` once the test binary is done (the C library's
//! `atexit`: a test binary has no other hook after libtest's summary), how many of the passed
//! tests did not run, and why:
//!
//! ```text
//! SKIPPED postgres::empty_consumer_is_refused: no PostgreSQL server (set INBOX_TEST_POSTGRES_URL)
//! test postgres::empty_consumer_is_refused ... ok
//! ...
//! test result: ok. 36 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.22s
//!
//! SKIPPED: 18 of the tests counted as passed above did not run:
//!     18 tests: no PostgreSQL server (set INBOX_TEST_POSTGRES_URL)
//! ```

use std::ffi::c_int;
use std::io::Write;
use std::sync::Mutex;

/// A test that did not run, and why.
struct Skip {
    test: String,
    why: String,
}

/// The tests of this process that were skipped, for the summary printed when it exits.
static SKIPPED: Mutex<Vec<Skip>> = Mutex::new(Vec::new());

/// Reports the test running on this thread as skipped because `why`, such as
/// `no PostgreSQL server (set INBOX_TEST_POSTGRES_URL)`. `label` names the test if this thread
/// is not libtest's thread for it. The test then returns without asserting anything.
pub fn skip(label: &str, why: &str) {
    let test = current_test().unwrap_or_else(|| label.to_owned());
    let Ok(mut skipped) = SKIPPED.lock() else {
        return;
    };
    if skipped.iter().any(|s| s.test == test && s.why == why) {
        return;
    }
    if skipped.is_empty() {
        // SAFETY: `print_summary` is a function without arguments that does not unwind (it
        // writes, ignoring errors, under a lock it does not unwrap), as `atexit` requires.
        unsafe { atexit(print_summary) };
    }
    let _ = writeln!(std::io::stderr(), "SKIPPED {test}: {why}");
    skipped.push(Skip {
        test,
        why: why.to_owned(),
    });
}

/// The name libtest gave this thread, which is the test's path, such as
/// `postgres::empty_consumer_is_refused`; `None` on a thread of some other kind.
fn current_test() -> Option<String> {
    let thread = std::thread::current();
    let name = thread.name()?;
    (name != "main" && !name.starts_with("tokio-")).then(|| name.to_owned())
}

unsafe extern "C" {
    /// The C library's `atexit`: registers a function to run when the process exits, which, for
    /// a test binary, is after libtest printed its summary.
    fn atexit(callback: extern "C" fn()) -> c_int;
}

/// Prints how many tests were skipped, per reason, under libtest's summary.
extern "C" fn print_summary() {
    // A thread still reporting a skip as the process exits is not waited for.
    let Ok(skipped) = SKIPPED.try_lock() else {
        return;
    };
    let mut tests: Vec<&str> = skipped.iter().map(|s| s.test.as_str()).collect();
    tests.sort();
    tests.dedup();
    let tests = tests.len();
    let mut summary =
        format!("SKIPPED: {tests} of the tests counted as passed above did not run:\n");
    let mut reasons: Vec<&str> = skipped.iter().map(|s| s.why.as_str()).collect();
    reasons.sort();
    reasons.dedup();
    for why in reasons {
        let count = skipped.iter().filter(|s| s.why == why).count();
        let tests = if count == 1 { "test" } else { "tests" };
        summary += &format!("    {count} {tests}: {why}\n");
    }
    let _ = std::io::stderr().write_all(format!("{summary}\n").as_bytes());
}
