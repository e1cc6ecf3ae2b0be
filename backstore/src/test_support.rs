//! Prerequisites of tests: a test that cannot run on this machine (no loop device, no tmpfs
//! mount, not root ...) skips with one line on stderr, except in CI, where every test must
//! run and a missing prerequisite fails it.
//!
//! Shared by the unit tests and, through `#[path]`, by the integration tests.

#![allow(dead_code)]

use std::fmt::Display;
use std::io::Write;

/// Whether CI runs the tests: `CI` is set, not empty, and neither `false` nor `0`.
pub fn in_ci() -> bool {
    std::env::var_os("CI").is_some_and(|v| !v.is_empty() && v != "false" && v != "0")
}

/// Reports that the calling test cannot run here because of `reason`: fails it in CI;
/// elsewhere writes `skipped: <test>: <reason>` to stderr (past the test harness's output
/// capture, so the skip shows) and the caller returns.
#[track_caller]
pub fn skip_or_fail(reason: impl Display) {
    let thread = std::thread::current();
    let test = thread.name().filter(|n| *n != "main").unwrap_or("test");
    assert!(
        !in_ci(),
        "{test}: {reason} (CI is set: a missing prerequisite is a failure)"
    );
    let _ = writeln!(std::io::stderr(), "skipped: {test}: {reason}");
}
