//! The owner's work, detachable from the client's request: it runs inside
//! the request until it answers the client and moves to a task of its own
//! only if it must go on after that or the request is dropped.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio_util::task::TaskTracker;
use tokio_util::task::task_tracker::TaskTrackerToken;

/// The owner's work, run inside the client's request until it answers the
/// client, and moved to a task of its own only if it must go on after
/// that (a stream, `Prefer: respond-async`) or the request is dropped (the
/// client gave up).
///
/// Running it in a spawned task from the start would also survive the
/// client, but a non-streaming request, which is answered only after its
/// result is stored, would pay on every execution for a spawn (the future
/// moved into a task) and a hop back to the client's task: about 5% of a
/// fresh key's CPU in closed loop. While it runs inline the work holds a
/// token of the layer's task tracker, so a graceful shutdown waits for it
/// as for a detached one.
pub(super) struct Detachable {
    work: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
    tracker: TaskTracker,
    /// Counts the inline work as a task of the tracker.
    _token: TaskTrackerToken,
}

impl Detachable {
    pub(super) fn new(
        tracker: &TaskTracker,
        work: Pin<Box<dyn Future<Output = ()> + Send>>,
    ) -> Self {
        Self {
            work: Some(work),
            tracker: tracker.clone(),
            _token: tracker.token(),
        }
    }

    /// Moves the rest of the work to a task of its own.
    pub(super) fn detach(&mut self) {
        let Some(work) = self.work.take() else {
            return;
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                self.tracker.spawn_on(work, &runtime);
            }
            // Only outside a runtime (it is shutting down): the lease
            // expires and a retry runs the work again.
            Err(_) => {
                tracing::warn!("no runtime to finish the execution on; its lease will expire")
            }
        }
    }
}

impl Future for Detachable {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let Some(work) = self.work.as_mut() else {
            return Poll::Ready(());
        };
        let done = work.as_mut().poll(cx);
        if done.is_ready() {
            self.work = None;
        }
        done
    }
}

impl Drop for Detachable {
    fn drop(&mut self) {
        // The client's request was dropped mid-work: the work goes on.
        self.detach();
    }
}
