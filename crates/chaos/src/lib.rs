//! Chaos for idemgate: random faults against real processes, a recorded
//! history of what every client saw, and a checker that judges that
//! history against the promise (docs/design.md, "The promise, as
//! invariants").
//!
//! Hand-picked fault scenarios find the bugs someone already imagined.
//! Here 2–3 `idemgate serve` replicas share one store (an SQLite file, a
//! Redis master with its replica, a Redis Cluster, a PostgreSQL primary
//! with its standby) in front of `idemgate-llm-sim`; clients send random
//! requests over a small pool of keys, so duplicates meet across
//! replicas, tenants and routes; a nemesis kills, freezes and restarts
//! replicas, steps their clocks, restarts and fails the store over and
//! drops its replies, at random.
//! Every request and answer is recorded, the upstream logs every
//! execution with its key, credential and the request that caused it,
//! and [`check::check`] judges the two.
//!
//! # Layout
//! - [`check`](mod@check): the checker, a pure function over a [`History`] and the
//!   upstream's execution log, one function per invariant.
//! - [`history`]: what a run records ([`Op`](history::Op),
//!   [`Forget`](history::Forget), [`Fault`](history::Fault)).
//! - [`routes`]: the gateway routes a run exercises (every `on_inflight`
//!   mode, with and without `charges`).
//! - [`cluster`]: the processes: the upstream and the replicas, started,
//!   signalled and restarted.
//! - [`servers`]: the store servers a run owns (Redis master and replica,
//!   Redis Cluster, PostgreSQL primary and standby), started, restarted
//!   and failed over.
//! - [`workload`]: the clients and what they record.
//! - [`nemesis`]: the faults.
//! - [`run`](mod@run): one run from start to verdict, and its summary line.
//! - [`error`]: what stops a run before it can be judged.
//!
//! # The key decision
//! **The checker sees only what is observable from outside the gateway:
//! client answers and upstream executions.** It never reads the store or
//! the gateway's logs, so it judges the promise a client is made, not the
//! implementation's own account of it; and because it is a pure function,
//! each invariant is tested on constructed histories that break it. An
//! execution is tied to the request that caused it by a tag the gateway
//! forwards (`x-sim-tag`), which is what lets the checker tell a crashed
//! owner's repeated execution (at-least-once after a crash, excused and
//! counted) from a repeat the promise forbids.

pub mod check;
pub mod cluster;
pub mod error;
pub mod history;
pub mod nemesis;
pub mod routes;
pub mod run;
pub mod servers;
pub mod workload;

pub use check::{Invariant, Report, Violation, check};
pub use error::{Error, Result};
pub use history::History;
pub use run::{Broken, Outcome, RunConfig, Store, run};
