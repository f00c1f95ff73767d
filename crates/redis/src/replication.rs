//! Waiting for replicas before a DONE record counts as written.
//!
//! Redis replicates asynchronously: a master acknowledges a write before
//! any replica has it. If the master dies and a replica that never received
//! a DONE record is promoted, the record is gone, and the retry that needed
//! the stored answer (the one that follows a timeout) runs the work again.
//! So the store sends `WAIT n timeout` right behind the completion script,
//! in one pipeline on the same connection to the same master, and a DONE that fewer than `n` replicas acknowledged
//! is reported as a temporary failure: the owner holds the result in
//! memory and writes it again (the script recognises its own DONE), until
//! it is acknowledged or the lease runs out. Nothing unacknowledged is
//! trusted.
//!
//! `n` comes from the store URL (`wait_replicas=N`), or by default from the
//! master itself: 1 when it reports a connected replica, 0 (no wait) when
//! it has none, so a single development node pays nothing. What the master
//! reports is cached for a second. In a cluster, the topology names each
//! master's replicas (`CLUSTER NODES`, read at most once a second), stalled
//! or not, until a failover promotes one. On a single node, a replica that
//! stalls or dies is exactly
//! when a master stops reporting it, and exactly when a DONE must not be
//! trusted unreplicated: so once a master has been seen with a replica, 1
//! is kept for [`REPLICA_REMEMBERED_FOR`] after it was last seen. A master
//! that really lost its replicas for good waits (and holds results) for
//! that long, then trusts itself alone.
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
    /// 1 when the master reports a connected replica (or did within
    /// [`REPLICA_REMEMBERED_FOR`]), else 0.
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

/// How long a master once seen with a replica is still expected to have
/// one.
pub const REPLICA_REMEMBERED_FOR: Duration = Duration::from_secs(60);

/// What the masters reported about their replicas, by the key's route
/// (`None`: a single node): the count wanted, when it was asked, and when
/// a replica was last seen.
#[derive(Debug, Default)]
pub(crate) struct ReplicaCounts {
    seen: Mutex<Vec<Seen>>,
    /// A cluster's `CLUSTER NODES` and when it was read.
    topology: Mutex<Option<(Instant, String)>>,
}

#[derive(Debug)]
struct Seen {
    route: Option<Route>,
    wanted: u32,
    asked: Instant,
    replica_seen: Option<Instant>,
}

impl ReplicaCounts {
    fn seen(&self) -> std::sync::MutexGuard<'_, Vec<Seen>> {
        self.seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn cached(&self, route: Option<Route>) -> Option<u32> {
        let now = Instant::now();
        let mut seen = self.seen();
        // Forget what nobody needs remembered: an answer past its second
        // whose replica (if any) is past remembering.
        seen.retain(|s| {
            now.duration_since(s.asked) < REPLICAS_SEEN_FOR
                || s.replica_seen
                    .is_some_and(|at| now.duration_since(at) < REPLICA_REMEMBERED_FOR)
        });
        seen.iter()
            .find(|s| s.route == route && now.duration_since(s.asked) < REPLICAS_SEEN_FOR)
            .map(|s| s.wanted)
    }

    /// Notes that the master of `route` reports `replicas` now; returns the
    /// count to wait for.
    fn note(&self, route: Option<Route>, replicas: usize) -> u32 {
        let now = Instant::now();
        let mut seen = self.seen();
        let remembered = seen
            .iter()
            .filter(|s| s.route == route)
            .filter_map(|s| s.replica_seen)
            .max()
            .filter(|at| now.duration_since(*at) < REPLICA_REMEMBERED_FOR);
        let replica_seen = if replicas > 0 { Some(now) } else { remembered };
        let wanted = u32::from(replica_seen.is_some());
        seen.retain(|s| s.route != route);
        // Bounded: an entry per route asked (a few per cluster slot in use)
        // lives at most a minute.
        if seen.len() < 4096 {
            seen.push(Seen {
                route,
                wanted,
                asked: now,
                replica_seen,
            });
        }
        wanted
    }
}

impl ReplicaCounts {
    /// `CLUSTER NODES` as the master of `route` sees it, read at most once
    /// a second.
    async fn cluster_nodes(&self, conn: &mut Conn, route: Route) -> Result<String, StoreError> {
        let fresh = |t: &Option<(Instant, String)>| {
            t.as_ref()
                .filter(|(at, _)| at.elapsed() < REPLICAS_SEEN_FOR)
                .map(|(_, text)| text.clone())
        };
        if let Some(text) = fresh(&self.topology_lock()) {
            return Ok(text);
        }
        let reply = conn
            .query_on_master(redis::cmd("CLUSTER").arg("NODES"), Some(route))
            .await
            .map_err(crate::map_error)?;
        let text: String =
            redis::from_redis_value(reply).map_err(|e| crate::map_error(e.into()))?;
        *self.topology_lock() = Some((Instant::now(), text.clone()));
        Ok(text)
    }

    fn topology_lock(&self) -> std::sync::MutexGuard<'_, Option<(Instant, String)>> {
        self.topology
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The cluster slot of `key`: CRC16 (XMODEM) of its hash tag, mod 16384.
fn slot_of(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let tagged = bytes
        .iter()
        .position(|b| *b == b'{')
        .and_then(|open| {
            let rest = &bytes[open + 1..];
            let close = rest.iter().position(|b| *b == b'}')?;
            (close > 0).then(|| &rest[..close])
        })
        .unwrap_or(bytes);
    let mut crc: u16 = 0;
    for byte in tagged {
        crc ^= u16::from(*byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16384
}

/// How many replicas `CLUSTER NODES` lists for the master serving `slot`
/// (0 when no live master serves it).
fn replicas_of_slot(nodes: &str, slot: u16) -> usize {
    let lines: Vec<Vec<&str>> = nodes
        .lines()
        .map(|l| l.split_whitespace().collect())
        .filter(|f: &Vec<&str>| f.len() >= 8)
        .collect();
    let serves = |f: &Vec<&str>| {
        f[8..].iter().any(|range| {
            let mut ends = range.splitn(2, '-');
            match (
                ends.next().and_then(|a| a.parse::<u16>().ok()),
                ends.next().map(str::parse::<u16>),
            ) {
                (Some(a), None) => a == slot,
                (Some(a), Some(Ok(b))) => (a..=b).contains(&slot),
                _ => false,
            }
        })
    };
    let Some(master) = lines.iter().find(|f| {
        let flags = f[2];
        flags.contains("master") && !flags.contains("fail") && serves(f)
    }) else {
        return 0;
    };
    lines
        .iter()
        .filter(|f| f[3] == master[0] && (f[2].contains("slave") || f[2].contains("replica")))
        .count()
}

/// How many replicas must acknowledge a write of `key` now.
///
/// # Errors
/// The driver's error, asking the master about its replicas.
pub(crate) async fn replicas_wanted(
    conn: &mut Conn,
    counts: &ReplicaCounts,
    wanted: WaitReplicas,
    key: &str,
) -> Result<u32, StoreError> {
    let route = conn
        .is_cluster()
        .then(|| Route::with_key(key, SlotAddr::Master));
    Ok(match (wanted, route) {
        (WaitReplicas::Count(n), _) => n,
        // A cluster names each master's replicas, stalled or not, until a
        // failover or an operator changes them: the topology says it.
        (WaitReplicas::Auto, Some(route)) => {
            let nodes = counts.cluster_nodes(conn, route).await?;
            u32::from(replicas_of_slot(&nodes, slot_of(key)) > 0)
        }
        (WaitReplicas::Auto, None) => match counts.cached(None) {
            Some(n) => n,
            None => {
                let role = conn
                    .query_on_master(&redis::cmd("ROLE"), None)
                    .await
                    .map_err(crate::map_error)?;
                counts.note(None, connected_replicas(&role))
            }
        },
    })
}

/// `WAIT n timeout`. It must follow the write it waits for on the same
/// connection: a connection that wrote nothing has nothing to wait for,
/// and `WAIT` answers at once with every replica. So the store sends it in
/// one pipeline right after the completion script.
pub(crate) fn wait_cmd(n: u32, timeout: Duration) -> redis::Cmd {
    let millis = u64::try_from(timeout.as_millis())
        .unwrap_or(u64::MAX)
        .max(1);
    let mut cmd = redis::cmd("WAIT");
    cmd.arg(n).arg(millis);
    cmd
}

/// The error for a write that `acked` of `n` replicas acknowledged within
/// `timeout`; `Ok` when enough did.
///
/// # Errors
/// `Unavailable`: too few acknowledged, the write is not trusted yet.
pub(crate) fn check_acks(acked: i64, n: u32, timeout: Duration) -> Result<(), StoreError> {
    if acked >= i64::from(n) {
        return Ok(());
    }
    Err(StoreError::new(
        StoreErrorKind::Unavailable,
        BACKEND,
        format!(
            "DONE acknowledged by {acked} of {n} replica(s) within {} ms; not trusted yet",
            timeout.as_millis()
        ),
    ))
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
    fn a_replica_once_seen_is_still_waited_for_after_it_vanishes() {
        let counts = ReplicaCounts::default();
        let a = Some(Route::with_key("a", SlotAddr::Master));
        let b = Some(Route::with_key("zz", SlotAddr::Master));
        assert_eq!(counts.note(None, 0), 0, "a lone node waits for none");
        assert_eq!(counts.note(a, 2), 1);
        assert_eq!(counts.cached(a), Some(1));
        // The master stops reporting it (stalled, dead): still waited for.
        assert_eq!(counts.note(a, 0), 1);
        // Another master never had one.
        assert_eq!(counts.note(b, 0), 0);
        assert_eq!(counts.cached(b), Some(0));
    }

    #[test]
    fn slots_follow_the_hash_tag() {
        // Reference values of the cluster specification's CRC16.
        assert_eq!(slot_of("123456789"), 0x31C3);
        assert_eq!(slot_of("foo"), 12182);
        assert_eq!(slot_of("{user1000}.following"), slot_of("user1000"));
        assert_eq!(slot_of("a{}b"), slot_of("a{}b"));
    }

    #[test]
    fn a_masters_replicas_are_counted_from_the_topology_stalled_or_not() {
        let nodes = "\
m1 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-5460
m2 127.0.0.1:7001@17001 master - 0 0 2 connected 5461-10922
m3 127.0.0.1:7002@17002 master - 0 0 3 connected 10923-16383
r1 127.0.0.1:7003@17003 slave,fail? m1 0 0 1 connected
r2 127.0.0.1:7004@17004 slave m2 0 0 2 connected
old 127.0.0.1:7005@17005 master,fail - 0 0 0 disconnected
";
        assert_eq!(
            replicas_of_slot(nodes, 0),
            1,
            "a stalled replica still counts"
        );
        assert_eq!(replicas_of_slot(nodes, 6000), 1);
        assert_eq!(replicas_of_slot(nodes, 16383), 0, "m3 has none");
        assert_eq!(replicas_of_slot("", 5), 0);
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
