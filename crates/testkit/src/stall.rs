//! The host-stall watchdog: a thread of its own that sleeps a few
//! milliseconds at a time and records every wake-up that came late by
//! more than [`RECORDED`].
//!
//! The design names a frozen process or VM as one of the causes that may
//! lead to a second execution (docs/design.md, I2): an owner that does not
//! run for longer than its lease cannot renew it. Tests inject such
//! freezes on purpose (SIGSTOP) and expect what they cause. A host that
//! stops scheduling everything for a while (a busy two-core machine, a VM
//! paused by its hypervisor) freezes the gateways the same way, but
//! nothing records it: a test that judges "one execution per key" would
//! report a promise broken that the design allows to break. The watchdog
//! records those stalls, so the chaos checker can excuse what they caused
//! by the design's rule (and count it), and the multi-process tests can
//! tell an inconclusive run from a failed one. It runs on an OS thread,
//! not on a runtime, so a busy runtime does not read as a stall; it sees
//! the host, not one process, which is why its users only accept stalls
//! long enough to cost an owner its lease (half a lease: renewals come
//! every third of it).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A stall: the watchdog should have woken at `start_ms` and woke at
/// `end_ms` (wall-clock milliseconds since the Unix epoch).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stall {
    /// When the watchdog should have woken.
    pub start_ms: u64,
    /// When it did.
    pub end_ms: u64,
}

impl Stall {
    /// How long it lasted.
    pub fn duration(&self) -> Duration {
        Duration::from_millis(self.end_ms.saturating_sub(self.start_ms))
    }
}

/// The time now, in milliseconds since the Unix epoch.
fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// How long the watchdog sleeps between looks.
const TICK: Duration = Duration::from_millis(20);

/// A wake-up later than this is recorded (the checker decides which of
/// them matter).
pub const RECORDED: Duration = Duration::from_millis(250);

/// A running watchdog; [`Watchdog::stop`] returns what it saw.
#[derive(Debug)]
pub struct Watchdog {
    stop: Arc<AtomicBool>,
    /// Taken by [`Watchdog::stop`]; a watchdog dropped without it (its
    /// run failed early) still ends its thread.
    thread: Option<JoinHandle<Vec<Stall>>>,
}

impl Watchdog {
    /// Starts the watchdog's thread.
    ///
    /// # Errors
    /// The thread cannot be spawned.
    pub fn start() -> std::io::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("stall-watchdog".into())
            .spawn(move || watch(&flag))?;
        Ok(Self {
            stop,
            thread: Some(thread),
        })
    }

    /// Stops the watchdog and returns the stalls it recorded, in order.
    pub fn stop(mut self) -> Vec<Stall> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default()
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn watch(stop: &AtomicBool) -> Vec<Stall> {
    let mut stalls = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let asleep = Instant::now();
        std::thread::sleep(TICK);
        let late = asleep.elapsed().saturating_sub(TICK);
        if late >= RECORDED {
            let end_ms = now_ms();
            let late_ms = u64::try_from(late.as_millis()).unwrap_or(u64::MAX);
            stalls.push(Stall {
                start_ms: end_ms.saturating_sub(late_ms),
                end_ms,
            });
        }
    }
    stalls
}

/// How many times [`unless_host_stalled`] runs a scenario the host kept
/// stalling.
const ATTEMPTS: usize = 3;

/// Runs `scenario` and lets its own assertions judge it, unless the whole
/// host stalled for half of `lease` or longer while it ran: an owner may
/// then have lost its lease as under a SIGSTOP, and the design allows a
/// second execution (docs/design.md, I2), so a failure says nothing about
/// the code. Such a failure is reported on stderr and the scenario runs
/// again, up to three times; a failure without such a stall fails at once.
///
/// # Panics
/// Re-raises the scenario's panic when no stall explains it, and panics
/// when every attempt failed under a stall (inconclusive, never passed).
pub async fn unless_host_stalled<F, Fut>(lease: Duration, mut scenario: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    use futures_util::FutureExt;
    for attempt in 1..=ATTEMPTS {
        let dog = match Watchdog::start() {
            Ok(dog) => dog,
            Err(e) => panic!("the stall watchdog cannot start: {e}"),
        };
        let result = std::panic::AssertUnwindSafe(scenario())
            .catch_unwind()
            .await;
        let longest = dog
            .stop()
            .iter()
            .map(Stall::duration)
            .max()
            .unwrap_or_default();
        let Err(failure) = result else { return };
        if longest < lease / 2 {
            std::panic::resume_unwind(failure);
        }
        eprintln!(
            "attempt {attempt} of {ATTEMPTS} failed while the host stalled for {longest:?} \
             (half the lease is {:?}): inconclusive, running it again",
            lease / 2
        );
    }
    panic!(
        "the host stalled past half the lease in each of {ATTEMPTS} attempts: the scenario \
         could not be judged"
    );
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// Stops this whole process (SIGSTOP) for `seconds`; a child resumes
    /// it.
    fn stop_self_for(seconds: &str) {
        let pid = std::process::id().to_string();
        let mut waker = std::process::Command::new("sh")
            .args(["-c", &format!("sleep {seconds}; kill -CONT {pid}")])
            .spawn()
            .unwrap();
        let stopped = std::process::Command::new("kill")
            .args(["-STOP", &pid])
            .status()
            .unwrap();
        assert!(stopped.success());
        waker.wait().unwrap();
    }

    /// A process that stops itself
    /// (SIGSTOP, as a paused VM stops everything) is recorded as one stall
    /// of about that length.
    #[test]
    fn a_stopped_process_is_recorded_as_a_stall() {
        let dog = Watchdog::start().unwrap();
        std::thread::sleep(Duration::from_millis(200));
        stop_self_for("0.6");
        std::thread::sleep(Duration::from_millis(100));
        let stalls = dog.stop();
        let longest = stalls.iter().map(Stall::duration).max().unwrap_or_default();
        assert!(
            longest >= Duration::from_millis(400),
            "a 600 ms stop is seen as a stall: {stalls:?}"
        );
    }

    /// A scenario that fails without a stall fails at once; one that
    /// passes runs once.
    #[tokio::test]
    async fn a_failure_without_a_stall_is_a_failure() {
        let mut runs = 0;
        unless_host_stalled(Duration::from_secs(10), || {
            runs += 1;
            async {}
        })
        .await;
        assert_eq!(runs, 1);
        let failed = tokio::spawn(unless_host_stalled(Duration::from_secs(10), || async {
            panic!("the scenario's assertion");
        }))
        .await;
        assert!(failed.is_err(), "the failure is not hidden");
    }

    /// A scenario that failed while the host stalled past half the lease
    /// runs again; passing then, it passes.
    #[tokio::test]
    async fn a_failure_under_a_stall_runs_again() {
        let runs = std::sync::atomic::AtomicUsize::new(0);
        unless_host_stalled(Duration::from_millis(400), || async {
            if runs.fetch_add(1, std::sync::atomic::Ordering::Relaxed) == 0 {
                // The whole process freezes 600 ms, as on a stalled host.
                stop_self_for("0.6");
                panic!("failed under the stall");
            }
        })
        .await;
        assert_eq!(runs.load(std::sync::atomic::Ordering::Relaxed), 2);
    }
}
