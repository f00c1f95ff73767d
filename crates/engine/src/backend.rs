//! What a [`Store`](crate::Store) implementation needs beside the trait.
//!
//! Callers of the engine never need these; a backend does: the one time
//! base every store persists (ms since the epoch, from the wall clock or
//! from a monotonic reading of it), per-key wake-ups for waiters of a
//! store that has no change feed of its own, and the clocks the in-memory
//! store runs on (a [`ManualClock`] steps time exactly in tests).

pub use crate::memory::{Clock, ManualClock, MonotonicClock, SystemClock};
pub use crate::notify::KeyedNotify;
pub use crate::record::{monotonic_ms, ms, now_ms};
