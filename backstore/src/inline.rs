//! Running a command's future where its data already is.

use std::future::Future;
use std::task::{Context, Waker};

/// Runs a command in the caller's task as far as it goes without waiting, and gives it a
/// task of its own only when it has to wait (for data-out, the device, an ORDERED task, a
/// send credit). Most commands finish at once — reads served from memory, writes whose data
/// came with the command — and then their responses join the batch the fabric's receive loop
/// sends next, with no task spawned and no wake-up. The first poll uses a no-op waker; the
/// spawned task polls again at once with its own, so no wake-up is lost.
pub fn run_inline(command: impl Future<Output = ()> + Send + 'static) {
    let mut command = Box::pin(command);
    if command
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
        .is_pending()
    {
        tokio::spawn(command);
    }
}
