//! Waiting for replicas before a DONE record counts as written.
//!
//! Redis replicates asynchronously: a master acknowledges a write before
//! any replica has it. If the master dies and a replica that never received
//! a DONE record is promoted, the record is gone, and the retry that needed
//! the stored answer (the one that follows a timeout) runs the work again.
//! So after the completion script applies, the store sends `WAIT n timeout`
//! to the same master, and a DONE that fewer than `n` replicas acknowledged
//! is reported as a temporary failure: the owner holds the result in
//! memory and writes it again (the script recognises its own DONE), until
//! it is acknowledged or the lease runs out. Nothing unacknowledged is
//! trusted.
//!
//! `n` comes from the store URL (`wait_replicas=N`), or by default from the
//! master itself: 1 when it reports a connected replica, 0 (no wait) when
//! it has none, so a single development node pays nothing. What the master
//! reports is cached for a second.
//!
//! `WAIT` blocks the connection it is sent on until the replicas answer,
//! and the store's connection is shared: a slow replica delays the other
//! commands on it by up to `wait_timeout`.

use std::sync::Mutex;
use std::time::Duration;

use idemgate_engine::{StoreError, StoreErrorKind};
use redis::Value;
use redis::cluster_routing::{Route, SlotAddr};
use tokio::time::Instant;

use crate::conn::Conn;
use crate::error::BACKEND;

/// How many replicas must acknowledge a DONE record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitReplicas {
    /// 1 when the master reports a connected replica, else 0.
    Auto,
    /// Exactly this many (0: never wait).
    Count(u32),
}

impl WaitReplicas {
    /// Reads the `wait_replicas` URL value: `auto` or a number.
    ///
    /// # Errors
    /// A message naming what was wrong.
    pub fn parse(text: &str) -> Result<Self, String> {
        if text.eq_ignore_ascii_case("auto") {
            return Ok(Self::Auto);
        }
        text.parse::<u32>()
            .map(Self::Count)
            .map_err(|_| format!("wait_replicas={text:?} is neither \"auto\" nor a number"))
    }
}

/// How long what a master said about its replicas is trusted.
const REPLICAS_SEEN_FOR: Duration = Duration::from_secs(1);

/// What the masters reported about their replicas, by the key's
/// route asked for (`None`: a single node).
#[derive(Debug, Default)]
pub(crate) struct ReplicaCounts(Mutex<Vec<(Option<Route>, u32, Instant)>>);

impl ReplicaCounts {
    fn cached(&self, slot: Option<Route>) -> Option<u32> {
        let now = Instant::now();
        let mut seen = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        seen.retain(|(_, _, at)| now.duration_since(*at) < REPLICAS_SEEN_FOR);
        seen.iter().find(|(s, _, _)| *s == slot).map(|(_, n, _)| *n)
    }

    fn note(&self, slot: Option<Route>, n: u32) {
        let mut seen = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // Bounded: a cluster has at most a few hundred masters, and an entry
        // per slot asked lives a second.
        if seen.len() < 1024 {
            seen.push((slot, n, Instant::now()));
        }
    }
}

/// Waits until `wanted` replicas of the master holding `key` acknowledged
/// every write sent before on the connection.
///
/// # Errors
/// `Unavailable` when fewer acknowledged within `timeout`; the driver's
/// error otherwise.
pub(crate) async fn wait_for_replicas(
    conn: &mut Conn,
    counts: &ReplicaCounts,
    wanted: WaitReplicas,
    key: &str,
    timeout: Duration,
) -> Result<(), StoreError> {
    let slot = conn
        .is_cluster()
        .then(|| Route::with_key(key, SlotAddr::Master));
    let n = match wanted {
        WaitReplicas::Count(n) => n,
        WaitReplicas::Auto => match counts.cached(slot) {
            Some(n) => n,
            None => {
                let role = conn
                    .query_on_master(&redis::cmd("ROLE"), slot)
                    .await
                    .map_err(crate::map_error)?;
                let n = u32::from(connected_replicas(&role) > 0);
                counts.note(slot, n);
                n
            }
        },
    };
    if n == 0 {
        return Ok(());
    }
    let millis = u64::try_from(timeout.as_millis())
        .unwrap_or(u64::MAX)
        .max(1);
    let acked: i64 = redis::from_redis_value(
        conn.query_on_master(redis::cmd("WAIT").arg(n).arg(millis), slot)
            .await
            .map_err(crate::map_error)?,
    )
    .map_err(|e| crate::map_error(e.into()))?;
    if acked >= i64::from(n) {
        Ok(())
    } else {
        Err(StoreError::new(
            StoreErrorKind::Unavailable,
            BACKEND,
            format!(
                "DONE acknowledged by {acked} of {n} replica(s) within {millis} ms; not trusted yet"
            ),
        ))
    }
}

/// The number of replicas in a master's `ROLE` reply (0 for a replica's
/// reply or anything unexpected).
fn connected_replicas(role: &Value) -> usize {
    match role {
        Value::Array(parts) => match (parts.first(), parts.get(2)) {
            (Some(Value::BulkString(kind)), Some(Value::Array(replicas)))
                if kind.as_slice() == b"master" =>
            {
                replicas.len()
            }
            _ => 0,
        },
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wait_replicas_parses_auto_and_numbers_only() {
        assert_eq!(WaitReplicas::parse("auto"), Ok(WaitReplicas::Auto));
        assert_eq!(WaitReplicas::parse("AUTO"), Ok(WaitReplicas::Auto));
        assert_eq!(WaitReplicas::parse("2"), Ok(WaitReplicas::Count(2)));
        assert_eq!(WaitReplicas::parse("0"), Ok(WaitReplicas::Count(0)));
        for bad in ["", "-1", "one", "1.5"] {
            let e = WaitReplicas::parse(bad).expect_err(bad);
            assert!(e.contains("wait_replicas"), "{e}");
        }
    }

    #[test]
    fn replicas_are_counted_from_a_masters_role_only() {
        let replica = |port: &str| {
            Value::Array(vec![
                Value::BulkString(b"127.0.0.1".to_vec()),
                Value::BulkString(port.as_bytes().to_vec()),
                Value::BulkString(b"0".to_vec()),
            ])
        };
        let master = |n: usize| {
            Value::Array(vec![
                Value::BulkString(b"master".to_vec()),
                Value::Int(0),
                Value::Array((0..n).map(|i| replica(&format!("700{i}"))).collect()),
            ])
        };
        assert_eq!(connected_replicas(&master(0)), 0);
        assert_eq!(connected_replicas(&master(2)), 2);
        let slave = Value::Array(vec![
            Value::BulkString(b"slave".to_vec()),
            Value::BulkString(b"127.0.0.1".to_vec()),
            Value::Int(7000),
        ]);
        assert_eq!(connected_replicas(&slave), 0);
        assert_eq!(connected_replicas(&Value::Nil), 0);
    }
}
