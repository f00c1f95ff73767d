//! [`RedisStore`]: the `Store` trait over one Redis node or a Redis Cluster.
//!
//! It sits on top of the crate: it names the keys of a record, runs the Lua
//! scripts (`scripts`) on the connection (`conn`), hands best-effort
//! timeline entries to the background writer (`timeline`) and decodes the
//! replies, so that each `Store` call is one round trip.

use std::fmt;
use std::time::Duration;

use bytes::Bytes;
use idemgate_engine::backend::KeyedNotify;
use idemgate_engine::backend::ms;
use idemgate_engine::{
    Attempt, BoxFuture, Claim, Fenced, Fingerprint, Lease, MAX_TIMELINE, Record, RecordState,
    ScopedKey, Store, StoreError, StoreErrorKind,
};
use redis::{FromRedisValue, RedisError, ScriptInvocation, Value};
use sha2::{Digest, Sha256};

use crate::conn::Conn;
use crate::error::{BACKEND, corrupt, map_error};
use crate::replication::{self, ReplicaCounts};
use crate::scripts::Scripts;
use crate::timeline::{Entry, TimelineWriter};

/// The Redis store. Cheap to clone: clones share the connection.
///
/// Keys of one record share a hash slot through a hash tag holding a hex
/// hash of the scoped key's storage id:
/// `<prefix>:{<32 hex>}:rec` (the record, one string: its layout is in
/// `scripts`), `…:tl` (timeline list, only for keys with more than one
/// attempt) and `…:fence` (last fence, only after a takeover, a release or
/// a forget). User
/// text never appears in key names, so it can neither break the tagging
/// nor leak through `KEYS`/`SCAN`.
///
/// Waiters ([`Store::changed`]) are woken at once by completions made through
/// this store instance, and otherwise poll every 50 ms (the trait's default
/// slice): no blocking command ever runs on the shared connection.
#[derive(Clone)]
pub struct RedisStore {
    conn: Conn,
    opts: RedisOptions,
    scripts: std::sync::Arc<Scripts>,
    notify: std::sync::Arc<KeyedNotify>,
    /// Background writer of timeline entries that change no record.
    timeline: Option<std::sync::Arc<TimelineWriter>>,
    /// What the masters said about their replicas, recently.
    replicas: std::sync::Arc<ReplicaCounts>,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("conn", &self.conn)
            .field("opts", &self.opts)
            .finish_non_exhaustive()
    }
}

/// The keys of one record.
struct Keys {
    rec: String,
    tl: String,
    fence: String,
}

impl RedisStore {
    /// Connects with default options. See [`RedisStore::connect_with`].
    ///
    /// # Errors
    /// As [`RedisStore::connect_with`].
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        Self::connect_with(url, RedisOptions::default()).await
    }

    /// Connects to `redis://host:port[/db]` (one node) or
    /// `redis+cluster://host:port[,host:port…]` (a cluster; any reachable
    /// node is enough to discover the rest).
    ///
    /// # Errors
    /// `Rejected` for a malformed URL or prefix; `Unavailable` when the
    /// server cannot be reached.
    pub async fn connect_with(url: &str, opts: RedisOptions) -> Result<Self, StoreError> {
        if opts.prefix.is_empty() || opts.prefix.contains(['{', '}']) {
            return Err(StoreError::new(
                StoreErrorKind::Rejected,
                BACKEND,
                format!(
                    "key prefix {:?} must be non-empty and free of '{{' and '}}'",
                    opts.prefix
                ),
            ));
        }
        let connecting = Conn::open(url, opts.connection_timeout, opts.response_timeout);
        let conn =
            tokio::time::timeout(opts.connection_timeout + opts.operation_timeout, connecting)
                .await
                .map_err(|_| timed_out("connect"))?
                .map_err(map_error)?;
        let scripts = std::sync::Arc::new(Scripts::new());
        let timeline = if opts.background_timeline {
            TimelineWriter::start(
                conn.clone(),
                std::sync::Arc::clone(&scripts),
                MAX_TIMELINE,
                opts.operation_timeout,
            )
            .map(std::sync::Arc::new)
        } else {
            None
        };
        Ok(Self {
            conn,
            opts,
            scripts,
            notify: std::sync::Arc::new(KeyedNotify::new()),
            replicas: std::sync::Arc::default(),
            timeline,
        })
    }

    /// The options in force.
    pub fn options(&self) -> &RedisOptions {
        &self.opts
    }

    /// Whether this store talks to a cluster.
    pub fn is_cluster(&self) -> bool {
        self.conn.is_cluster()
    }

    fn keys(&self, key: &ScopedKey) -> Keys {
        record_keys(&self.opts.prefix, key)
    }

    async fn invoke<T: FromRedisValue>(
        &self,
        what: &'static str,
        inv: &ScriptInvocation<'_>,
    ) -> Result<T, StoreError> {
        let mut conn = self.conn.clone();
        self.bounded(what, conn.invoke(inv)).await
    }

    async fn bounded<T>(
        &self,
        what: &'static str,
        run: impl Future<Output = Result<T, RedisError>>,
    ) -> Result<T, StoreError> {
        tokio::time::timeout(self.opts.operation_timeout, run)
            .await
            .map_err(|_| timed_out(what))?
            .map_err(map_error)
    }
}

/// The hash tag of `key`'s Redis keys, braces included: 32 hex digits of
/// SHA-256 of the storage id. Every key kept for one record (and anything
/// another component keeps next to it, such as its live event stream) is
/// named `<prefix>:<tag>:<suffix>`, so all land in one cluster slot whatever
/// the user text.
///
/// Built without formatting or an intermediate string: it is computed on
/// every store operation.
pub fn hash_tag(key: &ScopedKey) -> String {
    let mut hasher = Sha256::new();
    key.write_storage_id(|part| hasher.update(part.as_bytes()));
    let hex = hex::encode(&hasher.finalize()[..16]);
    let mut tag = String::with_capacity(hex.len() + 2);
    tag.push('{');
    tag.push_str(&hex);
    tag.push('}');
    tag
}

/// The keys of `key`'s record, all under one hash tag.
fn record_keys(prefix: &str, key: &ScopedKey) -> Keys {
    let tag = hash_tag(key);
    let name = |suffix: &str| {
        let mut name = String::with_capacity(prefix.len() + tag.len() + suffix.len() + 2);
        for part in [prefix, ":", &tag, ":", suffix] {
            name.push_str(part);
        }
        name
    };
    Keys {
        rec: name("rec"),
        tl: name("tl"),
        fence: name("fence"),
    }
}

fn timed_out(what: &str) -> StoreError {
    StoreError::new(
        StoreErrorKind::Unavailable,
        BACKEND,
        format!("{what} did not finish in time"),
    )
}

fn token_hex(token: u128) -> String {
    format!("{token:032x}")
}

/// A fence as the record keeps it: 20 decimal digits, zero-padded, so
/// that the scripts compare it with the record's as a string.
fn fence_arg(fence: u64) -> String {
    format!("{fence:020}")
}

/// A duration in ms for `PEXPIRE`: at least 1 (0 would delete the key).
fn ttl_ms(d: Duration) -> u64 {
    ms(d).max(1)
}

fn attempt_json(attempt: &Attempt) -> Result<Vec<u8>, StoreError> {
    serde_json::to_vec(attempt).map_err(|e| {
        StoreError::new(StoreErrorKind::Rejected, BACKEND, "attempt not encodable").with_source(e)
    })
}

fn as_bytes(v: &Value) -> Option<&[u8]> {
    match v {
        Value::BulkString(b) => Some(b),
        Value::SimpleString(s) => Some(s.as_bytes()),
        _ => None,
    }
}

fn as_u64(v: &Value) -> Option<u64> {
    match v {
        Value::Int(i) => u64::try_from(*i).ok(),
        other => digits(as_bytes(other)?),
    }
}

/// An unsigned decimal, leading zeros allowed.
fn digits(b: &[u8]) -> Option<u64> {
    std::str::from_utf8(b).ok()?.parse().ok()
}

/// Where the header of a record's value ends (see `scripts`): state,
/// fingerprint, token, fence and expiry.
pub(crate) const HEADER: usize = 105;

/// Decodes a record's value (the layout is in `scripts`). A DONE record's
/// payload is a slice of the value, not a copy.
pub(crate) fn decode_record(raw: Vec<u8>) -> Result<Record, StoreError> {
    let field = |range: std::ops::Range<usize>| {
        raw.get(range)
            .ok_or_else(|| corrupt("record value is shorter than its header"))
    };
    let fingerprint = <[u8; 32]>::try_from(field(1..33)?)
        .map(Fingerprint::from_bytes)
        .map_err(|_| corrupt("record fingerprint is not 32 bytes"))?;
    let fence = digits(field(65..85)?).ok_or_else(|| corrupt("record fence is not a number"))?;
    let exp = digits(field(85..HEADER)?).ok_or_else(|| corrupt("record expiry is not a number"))?;
    let tail = field(HEADER..raw.len())?;
    let colon = tail
        .iter()
        .position(|&b| b == b':')
        .ok_or_else(|| corrupt("record value has no attempt length"))?;
    let attempt_len = tail
        .get(..colon)
        .and_then(digits)
        .and_then(|n| usize::try_from(n).ok())
        .ok_or_else(|| corrupt("record attempt length is not a number"))?;
    let body_start = (HEADER + colon + 1)
        .checked_add(attempt_len)
        .filter(|&start| start <= raw.len())
        .ok_or_else(|| corrupt("record attempt runs past the value"))?;
    let state = match raw.first() {
        Some(b'P') => RecordState::Pending {
            fence,
            lease_expires_at_ms: exp,
        },
        Some(b'D') => RecordState::Done {
            payload: Bytes::from(raw).slice(body_start..),
            expires_at_ms: exp,
        },
        _ => return Err(corrupt("record state is neither P nor D")),
    };
    Ok(Record { fingerprint, state })
}

/// Decodes one timeline entry (JSON, as `attempt_json` writes it).
pub(crate) fn decode_attempt(entry: &[u8]) -> Result<Attempt, StoreError> {
    serde_json::from_slice(entry)
        .map_err(|err| corrupt("timeline entry is not an attempt").with_source(err))
}

/// A record's value from a reply: `Ok(None)` for nil.
fn record_value(v: Value) -> Result<Option<Record>, StoreError> {
    match v {
        Value::Nil => Ok(None),
        Value::BulkString(raw) => decode_record(raw).map(Some),
        _ => Err(corrupt("record value is not a string")),
    }
}

impl RedisStore {
    /// The claim with the owner token `token`, which the script writes: a
    /// call re-sent with the same token (its reply lost) gets the same
    /// lease back.
    async fn claim_as(
        &self,
        key: &ScopedKey,
        fingerprint: &Fingerprint,
        pending_ttl: Duration,
        token: u128,
    ) -> Result<Claim, StoreError> {
        let k = self.keys(key);
        let mut reply: Vec<Value> = self
            .invoke(
                "claim",
                self.scripts
                    .claim
                    .key(&k.rec)
                    .key(&k.fence)
                    .arg(&fingerprint.as_bytes()[..])
                    .arg(token_hex(token))
                    .arg(ttl_ms(pending_ttl))
                    .arg(ttl_ms(self.opts.fence_memory)),
            )
            .await?;
        match reply.as_mut_slice() {
            [Value::Int(1), fence, exp] => Ok(Claim::Acquired(Lease {
                key: key.clone(),
                token,
                fence: as_u64(fence).ok_or_else(|| corrupt("claim fence is not a number"))?,
                expires_at_ms: as_u64(exp)
                    .ok_or_else(|| corrupt("claim expiry is not a number"))?,
                fingerprint: *fingerprint,
            })),
            [Value::Int(0), value] => match record_value(std::mem::replace(value, Value::Nil))? {
                Some(record) => Ok(Claim::Existing(record)),
                None => Err(corrupt("claim found a record without a value")),
            },
            _ => Err(corrupt("claim reply has the wrong shape")),
        }
    }
}

impl Store for RedisStore {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn claim<'a>(
        &'a self,
        key: &'a ScopedKey,
        fingerprint: &'a Fingerprint,
        pending_ttl: Duration,
    ) -> BoxFuture<'a, Result<Claim, StoreError>> {
        let token = idemgate_engine::Lease::new_token();
        Box::pin(self.claim_as(key, fingerprint, pending_ttl, token))
    }

    fn renew<'a>(
        &'a self,
        lease: &'a mut Lease,
        pending_ttl: Duration,
    ) -> BoxFuture<'a, Result<Fenced, StoreError>> {
        Box::pin(async move {
            let k = self.keys(&lease.key);
            let reply: Option<u64> = self
                .invoke(
                    "renew",
                    self.scripts
                        .renew
                        .key(&k.rec)
                        .arg(token_hex(lease.token))
                        .arg(fence_arg(lease.fence))
                        .arg(ttl_ms(pending_ttl))
                        .arg(ttl_ms(self.opts.fence_memory)),
                )
                .await?;
            Ok(match reply {
                Some(expires) => {
                    lease.expires_at_ms = expires;
                    Fenced::Applied
                }
                None => Fenced::Stale,
            })
        })
    }

    fn complete<'a>(
        &'a self,
        lease: &'a Lease,
        payload: Bytes,
        done_ttl: Duration,
        attempt: &'a Attempt,
    ) -> BoxFuture<'a, Result<Fenced, StoreError>> {
        Box::pin(async move {
            let k = self.keys(&lease.key);
            let mut conn = self.conn.clone();
            let asking = replication::replicas_wanted(
                &mut conn,
                &self.replicas,
                self.opts.wait_replicas,
                &k.rec,
            );
            let n = tokio::time::timeout(self.opts.operation_timeout, asking)
                .await
                .map_err(|_| timed_out("ask about replicas"))??;
            let args = complete::CompleteArgs {
                keys: [&k.rec, &k.tl, &k.fence],
                token: token_hex(lease.token),
                fence: fence_arg(lease.fence),
                payload: &payload,
                done_ttl: ttl_ms(done_ttl),
                attempt: attempt_json(attempt)?,
                fingerprint: lease.fingerprint.as_bytes(),
                fence_memory: ttl_ms(self.opts.fence_memory),
            };
            let applied: i64 = if n == 0 {
                let mut inv = self.scripts.complete.prepare_invoke();
                args.apply(&mut inv);
                self.invoke("complete", &inv).await?
            } else {
                // The script and WAIT in one pipeline: WAIT must follow the
                // write on its connection (see `replication`).
                let (applied, acked) = self.complete_and_wait(&args, n).await?;
                if applied == 1 {
                    replication::check_acks(acked, n, self.opts.wait_timeout)?;
                }
                applied
            };
            if applied != 1 {
                return Ok(Fenced::Stale);
            }
            self.notify.notify(&lease.key.storage_id());
            Ok(Fenced::Applied)
        })
    }

    fn release<'a>(
        &'a self,
        lease: &'a Lease,
        attempt: &'a Attempt,
        timeline_ttl: Duration,
    ) -> BoxFuture<'a, Result<Fenced, StoreError>> {
        Box::pin(async move {
            let k = self.keys(&lease.key);
            let applied: i64 = self
                .invoke(
                    "release",
                    self.scripts
                        .release
                        .key(&k.rec)
                        .key(&k.tl)
                        .key(&k.fence)
                        .arg(token_hex(lease.token))
                        .arg(fence_arg(lease.fence))
                        .arg(attempt_json(attempt)?)
                        .arg(MAX_TIMELINE)
                        .arg(ttl_ms(timeline_ttl))
                        .arg(ttl_ms(self.opts.fence_memory)),
                )
                .await?;
            if applied == 1 {
                self.notify.notify(&lease.key.storage_id());
                Ok(Fenced::Applied)
            } else {
                Ok(Fenced::Stale)
            }
        })
    }

    fn forget<'a>(
        &'a self,
        key: &'a ScopedKey,
        attempt: &'a Attempt,
        timeline_ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let k = self.keys(key);
            let removed: i64 = self
                .invoke(
                    "forget",
                    self.scripts
                        .forget
                        .key(&k.rec)
                        .key(&k.tl)
                        .key(&k.fence)
                        .arg(attempt_json(attempt)?)
                        .arg(MAX_TIMELINE)
                        .arg(ttl_ms(timeline_ttl))
                        .arg(ttl_ms(self.opts.fence_memory)),
                )
                .await?;
            if removed == 1 {
                self.notify.notify(&key.storage_id());
            }
            Ok(removed == 1)
        })
    }

    fn get<'a>(&'a self, key: &'a ScopedKey) -> BoxFuture<'a, Result<Option<Record>, StoreError>> {
        Box::pin(async move {
            let k = self.keys(key);
            // A script, not a `GET`: a PENDING record outlives its lease
            // (see `scripts`), and the server's clock says whether it lapsed.
            let value: Value = self.invoke("get", &self.scripts.get.key(&k.rec)).await?;
            record_value(value)
        })
    }

    fn record_attempt<'a>(
        &'a self,
        key: &'a ScopedKey,
        attempt: &'a Attempt,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let k = self.keys(key);
            if let Some(writer) = &self.timeline {
                writer.push(Entry {
                    key: k.tl,
                    rec: k.rec,
                    json: attempt_json(attempt)?,
                    ttl_ms: ttl_ms(ttl),
                });
                return Ok(());
            }
            let _: i64 = self
                .invoke(
                    "record_attempt",
                    self.scripts
                        .record
                        .key(&k.tl)
                        .key(&k.rec)
                        .arg(attempt_json(attempt)?)
                        .arg(MAX_TIMELINE)
                        .arg(ttl_ms(ttl)),
                )
                .await?;
            Ok(())
        })
    }

    fn timeline<'a>(
        &'a self,
        key: &'a ScopedKey,
    ) -> BoxFuture<'a, Result<Vec<Attempt>, StoreError>> {
        Box::pin(async move {
            let k = self.keys(key);
            // The executed attempt the record holds while the key has no
            // list (see `scripts`), and the list.
            let (held, listed): (Option<Vec<u8>>, Vec<Vec<u8>>) = self
                .invoke("timeline", self.scripts.timeline.key(&k.rec).key(&k.tl))
                .await?;
            let mut attempts = held
                .iter()
                .chain(&listed)
                .map(|e| decode_attempt(e))
                .collect::<Result<Vec<Attempt>, StoreError>>()?;
            // Entries written in the background may land after a later
            // completion's: order by time (stable, so ties keep list order).
            attempts.sort_by_key(|a| a.at_ms);
            Ok(attempts)
        })
    }

    fn changed<'a>(&'a self, key: &'a ScopedKey, max: Duration) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            self.notify
                .wait(&key.storage_id(), max.min(Duration::from_millis(50)))
                .await;
        })
    }
}

mod complete;
mod options;

pub use options::RedisOptions;

#[cfg(test)]
mod tests;
