//! The log writer: request threads append their formatted lines to one
//! shared buffer, and a writer thread empties it to the output every few
//! milliseconds (at once when it grows past a threshold).
//!
//! Why not a channel with a writer thread (`tracing_appender`): a channel
//! wakes its writer thread for every line when the writer keeps up, so at
//! thousands of requests per second each log line cost a futex wake, a
//! context switch and a write syscall, about a tenth of the gateway's CPU
//! per fresh key on two cores. Here a line costs an uncontended lock and a
//! copy; the writer thread wakes on a timer and writes a batch at a time.
//!
//! Nothing is dropped: when the output stalls and the buffer reaches its
//! bound, writers wait for the writer thread to drain it, as with a full
//! channel. Dropping the [`FlushGuard`] writes what is buffered and stops
//! the thread; a crash loses at most the last flush interval of lines.

use std::io::{self, Write};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use tracing_subscriber::fmt::MakeWriter;

/// How often the writer thread empties the buffer.
const FLUSH_EVERY: Duration = Duration::from_millis(10);
/// A buffer this large wakes the writer thread before its timer.
const FLUSH_AT: usize = 256 * 1024;
/// A buffer this large makes writers wait for the writer thread.
const BOUND: usize = 16 * 1024 * 1024;

#[derive(Debug, Default)]
struct Buffer {
    lines: Vec<u8>,
    closed: bool,
}

#[derive(Debug, Default)]
struct Shared {
    buffer: Mutex<Buffer>,
    /// Wakes the writer thread (a large buffer, or closing).
    fill: Condvar,
    /// Wakes writers waiting for room.
    drained: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Buffer> {
        // A panic while holding the lock leaves whole lines behind (each
        // append is one `extend`): the buffer is still good to write.
        self.buffer.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Where `tracing_subscriber` writes lines (`with_writer`).
#[derive(Debug, Clone)]
pub(crate) struct BatchedWriter {
    shared: Arc<Shared>,
}

/// Stops the writer thread when dropped, after writing what is buffered.
#[derive(Debug)]
pub(crate) struct FlushGuard {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

/// A writer appending to the buffer and a guard for its writer thread,
/// which writes batches to `out`.
///
/// # Errors
/// The writer thread could not be started.
pub(crate) fn batched<W: Write + Send + 'static>(
    out: W,
) -> io::Result<(BatchedWriter, FlushGuard)> {
    let shared = Arc::new(Shared::default());
    let thread = std::thread::Builder::new()
        .name("idemgate-log".into())
        .spawn({
            let shared = Arc::clone(&shared);
            move || write_batches(&shared, out)
        })?;
    Ok((
        BatchedWriter {
            shared: Arc::clone(&shared),
        },
        FlushGuard {
            shared,
            thread: Some(thread),
        },
    ))
}

/// The writer thread: every `FLUSH_EVERY` (or sooner when woken), takes the
/// buffer and writes it out, until closed and empty.
fn write_batches<W: Write>(shared: &Shared, mut out: W) {
    let mut batch = Vec::new();
    loop {
        let closed = {
            let mut buffer = shared.lock();
            if !buffer.closed && buffer.lines.len() < FLUSH_AT {
                buffer = shared
                    .fill
                    .wait_timeout(buffer, FLUSH_EVERY)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0;
            }
            std::mem::swap(&mut batch, &mut buffer.lines);
            buffer.closed
        };
        shared.drained.notify_all();
        if !batch.is_empty() {
            // Nowhere to report a failed log write but the log itself: the
            // batch is dropped, the next one tried.
            let _ = out.write_all(&batch).and_then(|()| out.flush());
            batch.clear();
        }
        if closed && shared.lock().lines.is_empty() {
            return;
        }
    }
}

impl Write for &BatchedWriter {
    fn write(&mut self, line: &[u8]) -> io::Result<usize> {
        let shared = &self.shared;
        let mut buffer = shared.lock();
        while buffer.lines.len() >= BOUND && !buffer.closed {
            buffer = shared
                .drained
                .wait(buffer)
                .unwrap_or_else(PoisonError::into_inner);
        }
        buffer.lines.extend_from_slice(line);
        if buffer.lines.len() >= FLUSH_AT {
            shared.fill.notify_one();
        }
        Ok(line.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for BatchedWriter {
    type Writer = &'a BatchedWriter;

    fn make_writer(&'a self) -> Self::Writer {
        self
    }
}

impl Drop for FlushGuard {
    fn drop(&mut self) {
        self.shared.lock().closed = true;
        self.shared.fill.notify_one();
        if let Some(thread) = self.thread.take() {
            // The thread does not panic (its only fallible call's error is
            // ignored); a join error leaves nothing to do at exit.
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An output shared with the test, optionally stalled.
    #[derive(Clone, Default)]
    struct Output {
        bytes: Arc<Mutex<Vec<u8>>>,
        writes: Arc<Mutex<usize>>,
        stall: Arc<Mutex<()>>,
    }

    impl Write for Output {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            let _stalled = self.stall.lock().expect("stall lock");
            *self.writes.lock().expect("writes lock") += 1;
            self.bytes.lock().expect("bytes lock").extend_from_slice(b);
            Ok(b.len())
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    fn line(writer: &BatchedWriter, text: &str) {
        writer
            .make_writer()
            .write_all(text.as_bytes())
            .expect("append");
    }

    #[test]
    fn lines_from_many_threads_arrive_whole_in_few_writes_and_the_guard_flushes_the_rest() {
        let out = Output::default();
        let (writer, guard) = batched(out.clone()).expect("thread");
        let threads: Vec<_> = (0..8)
            .map(|t| {
                let writer = writer.clone();
                std::thread::spawn(move || {
                    for i in 0..2_000 {
                        line(&writer, &format!("thread {t} line {i}\n"));
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("writer thread");
        }
        drop(guard);
        let bytes = out.bytes.lock().expect("bytes").clone();
        let text = String::from_utf8(bytes).expect("utf-8");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 16_000, "every line written once");
        for t in 0..8 {
            let mine: Vec<&str> = lines
                .iter()
                .copied()
                .filter(|l| l.starts_with(&format!("thread {t} ")))
                .collect();
            let expected: Vec<String> =
                (0..2_000).map(|i| format!("thread {t} line {i}")).collect();
            assert_eq!(mine, expected, "thread {t}'s lines whole and in order");
        }
        let writes = *out.writes.lock().expect("writes");
        assert!(writes < 16_000 / 10, "{writes} writes for 16,000 lines");
    }

    #[test]
    fn a_stalled_output_makes_writers_wait_and_loses_nothing() {
        let out = Output::default();
        let stalled = out.stall.lock().expect("stall");
        let (writer, guard) = batched(out.clone()).expect("thread");
        let big = "x".repeat(1023) + "\n";
        let producer = {
            let writer = writer.clone();
            let big = big.clone();
            std::thread::spawn(move || {
                // Twice the bound: must wait for the stalled output.
                for _ in 0..(2 * BOUND / big.len()) {
                    line(&writer, &big);
                }
            })
        };
        std::thread::sleep(Duration::from_millis(200));
        assert!(!producer.is_finished(), "the writer waits for room");
        drop(stalled);
        producer.join().expect("producer");
        drop(guard);
        let written = out.bytes.lock().expect("bytes").len();
        assert_eq!(written, 2 * BOUND / big.len() * big.len());
    }
}
