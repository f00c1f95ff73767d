//! The Lua scripts behind every write: each runs atomically on the server,
//! so a claim or a fenced write is one round trip (`EVALSHA`) with no
//! read-then-write race between replicas.
//!
//! Time comes from the server (`TIME`), never from the client: every replica
//! sharing the store then agrees on lease and record expiry. Numbers are
//! formatted with `%.0f` because Lua 5.1's `tostring` switches to exponent
//! notation above 1e14, and µs timestamps are larger than that.
//!
//! # The record: one string
//! A record is one Redis string, so that creating it, rewriting it and
//! setting its expiry is one `SET … PX` and a replay reads it with one
//! `GET`. The value is a fixed header, then the executed attempt, then the
//! body (byte offsets from 0; Lua's `string.sub` counts from 1):
//!
//! | bytes | field |
//! |---|---|
//! | 0 | state: `P` (PENDING) or `D` (DONE) |
//! | 1–32 | fingerprint, 32 raw bytes |
//! | 33–64 | owner token, 32 hex digits |
//! | 65–84 | fence, 20 decimal digits, zero-padded |
//! | 85–104 | lease expiry (PENDING) or record expiry (DONE), ms since the epoch, 20 decimal digits |
//! | 105… | the attempt's length in decimal, `:`, the executed attempt's timeline entry (DONE only, while the key has no timeline list; length 0 otherwise), then the payload (DONE only) |
//!
//! Fixed-width numbers let a script compare a lease's token and fence with
//! one `string.sub` (the store sends the fence zero-padded to 20 digits).
//!
//! # Why a string and not a hash
//! Versions before kept the record as a hash of those fields. A DONE
//! record's body is longer than Redis's `hash-max-listpack-value` (64 bytes
//! by default), so the server turned each such hash from its compact
//! listpack into a hash table at the completion: 1,041 bytes of memory for
//! a record with a 270-byte body, and a `PEXPIRE` after every `HSET`. As a
//! string the same record is one allocation the size of its value, written
//! with its TTL in one call.
//!
//! # Why the first timeline entry lives in the record
//! Most keys run once and are never retried. Their timeline is the one
//! entry of the completion, and a list of its own would be a second Redis
//! key per key: an entry in the
//! main and the expiry dictionaries, their rehashing as the keyspace grows,
//! and two more calls in the completion. So a completion that finds no
//! list keeps its entry in the record (the attempt part of the value),
//! where it lives and expires with the record. The first later append to
//! the key's timeline creates the list and moves the entry into it
//! (`adopt`), so the entry then lives as long as the list, as it did
//! before. The record holds the entry only while the key has no list; the
//! timeline is read by one script (`TIMELINE`) so that a read never sees
//! the entry in both places or in neither.
//!
//! # Where a key's last fence is remembered
//! A fence must be greater than any an owner who could still write holds.
//! Such an owner is one whose lease lapsed, or who released the key, or
//! whose key an operator forgot. Its last fence is kept in one of two
//! places:
//!
//! - **The PENDING record itself.** Its Redis TTL is the lease plus the
//!   fence memory, and the lease expiry (bytes 85–104) is what the scripts
//!   check, by the server's clock, as the SQL stores keep an expired row
//!   until their purge. A lapsed lease that nobody took over is therefore
//!   still its owner's: its renew or complete applies, as in the other
//!   stores.
//! - **The fence counter** (`…:fence`, kept for the fence memory). It is
//!   written only where the record can no longer hold the fence: a claim
//!   that takes over a lapsed lease (the new owner's DONE record expires
//!   after `done_ttl`, while the old owner may still try to complete), a
//!   release and a forget (the record is deleted).
//!
//! A key claimed while absent has no other owner to fence, so the claim
//! of a fresh key, the common case, writes one Redis key and not two.
//! Versions before wrote the counter on every claim: a second key per
//! key, in the main and the expiry dictionaries, and about 3.5 µs more of
//! the server's time per claim.

use redis::Script;

/// The record's reader, prepended to every script.
///
/// `load(rec)`: the record's value, or `false` when there is none. Kept
/// apart from [`FIELDS`] so that the claim, the script of every request,
/// defines no function it does not call.
const LOAD: &str = r"
local function load(rec)
  return redis.call('GET', rec)
end
";

/// Helpers over a record's value (after [`LOAD`]).
///
/// `att_end(raw)`: the position of the `:` that ends the attempt's length,
/// and that length. `owned(rec, tok, fence)`: the record's value when it is
/// PENDING under that token and (padded) fence, else `false` (a lease that
/// lapsed is still owned until another claim takes the key over, as in
/// the SQL stores). `now_ms()`: the server's clock.
const FIELDS: &str = r"
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function att_end(raw)
  local c = string.find(raw, ':', 106, true)
  if not c then error('idemgate: a record value in an unknown layout') end
  return c, tonumber(string.sub(raw, 106, c - 1))
end
local function owned(rec, tok, fence)
  local raw = load(rec)
  if raw and string.sub(raw, 1, 1) == 'P' and string.sub(raw, 34, 85) == tok .. fence then
    return raw
  end
  return false
end
";

/// Shared helpers prepended to the scripts that append to a timeline
/// (after [`LOAD`] and [`FIELDS`]).
///
/// `push(key, entry, max, ttl, rec)`: append, keep the newest `max`, and
/// make the list live at least `ttl` ms. `keep(key, n, created, max, ttl,
/// rec)` is its second half: `n` is the list's length after the append,
/// `created` whether the append made the list, `rec` the record whose
/// executed attempt a list just made adopts (nil: none to adopt).
///
/// Each `redis.call` costs the server 1 to 2 µs (the claim's script, when
/// it still made six calls on a hash, took about 10 µs of server time, an
/// empty script 1.3), so the common cases skip the calls that would change
/// nothing: a list no longer than `max` is not trimmed, and a list the append just created (its
/// length is what was appended, and it has no TTL yet) gets its TTL
/// without asking for the old one.
///
/// `adopt(key, rec)` moves the executed attempt a record holds (see the
/// module docs) to the head of the timeline list `key` just created: it
/// is older than the entries that created the list (which keeps the order
/// of entries stamped in the same millisecond). The record is written
/// again without it, its TTL kept.
const PUSH: &str = r"
local function adopt(key, rec)
  local raw = load(rec)
  if not raw then return 0 end
  local c, n = att_end(raw)
  if n == 0 then return 0 end
  redis.call('SET', rec, string.sub(raw, 1, 105) .. '0:' .. string.sub(raw, c + 1 + n), 'KEEPTTL')
  return redis.call('LPUSH', key, string.sub(raw, c + 1, c + n)) - 1
end
local function keep(key, n, created, max, ttl, rec)
  if created and rec then n = n + adopt(key, rec) end
  max = tonumber(max)
  if n > max then redis.call('LTRIM', key, -max, -1) end
  ttl = tonumber(ttl)
  if created or redis.call('PTTL', key) < ttl then
    redis.call('PEXPIRE', key, ttl)
  end
end
local function push(key, entry, max, ttl, rec)
  local n = redis.call('RPUSH', key, entry)
  keep(key, n, n == 1, max, ttl, rec)
end
";

/// Claim-or-read.
///
/// KEYS: record, fence counter. ARGV: fingerprint (32 bytes), token (32
/// hex digits), pending_ttl ms, fence memory ms.
///
/// Returns `{1, fence, lease_expiry}` when acquired, or `{0, value}` with
/// the live record's value. A PENDING record whose lease has lapsed (by
/// the server's clock) is taken over. The fence is `max(last fence + 1,
/// server time in µs)`, where the last fence is the lapsed record's or the
/// counter's (see the module docs): it grows across the claims that could
/// still race, and keeps growing after they are forgotten as long as the
/// server clock does not go back.
///
/// The counter is written only by a takeover (as by a release or a
/// forget): the owner whose lease lapsed may still complete after the new
/// owner's DONE record expired, and the counter is what fences it then. A
/// claim of an absent key leaves no other owner to fence, so it writes one
/// key, the record.
///
/// A claim sent again with the same token after its reply was lost (the
/// cluster client re-sends a call that timed out) finds the PENDING record
/// it wrote and gets the same answer as the first time: that lease, not
/// someone else's record.
const CLAIM: &str = r"
local raw = load(KEYS[1])
local last = 0
local t
if raw then
  if string.sub(raw, 1, 1) ~= 'P' then return {0, raw} end
  if string.sub(raw, 34, 65) == ARGV[2] and string.sub(raw, 2, 33) == ARGV[1] then
    return {1, string.sub(raw, 66, 85), string.sub(raw, 86, 105)}
  end
  t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local lease_end = tonumber(string.sub(raw, 86, 105))
  last = tonumber(string.sub(raw, 66, 85))
  -- A live lease, or one this script cannot read: the caller gets the
  -- record (a damaged one is its decoder's error, never taken over).
  if not lease_end or not last or lease_end > now then return {0, raw} end
else
  t = redis.call('TIME')
end
if #ARGV[1] ~= 32 or #ARGV[2] ~= 32 then
  error('idemgate: a claim needs a 32-byte fingerprint and token')
end
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local remembered = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
if remembered > last then last = remembered end
local fence = last + 1
if now_us > fence then fence = now_us end
local ttl = tonumber(ARGV[3])
local fs = string.format('%020.0f', fence)
local es = string.format('%020.0f', math.floor(now_us / 1000) + ttl)
redis.call('SET', KEYS[1], 'P' .. ARGV[1] .. ARGV[2] .. fs .. es .. '0:',
  'PX', string.format('%.0f', ttl + tonumber(ARGV[4])))
if raw then redis.call('SET', KEYS[2], fs, 'PX', ARGV[4]) end
return {1, fs, es}
";

/// Heartbeat. KEYS: record. ARGV: token, fence (padded), pending_ttl ms,
/// fence memory ms. Returns the new lease expiry, or nil when the lease is
/// not the record's. The record is kept past the lease by the fence memory,
/// as the claim keeps it.
const RENEW: &str = r"
local raw = owned(KEYS[1], ARGV[1], ARGV[2])
if not raw then return false end
local ttl = tonumber(ARGV[3])
local es = string.format('%020.0f', now_ms() + ttl)
redis.call('SET', KEYS[1], string.sub(raw, 1, 85) .. es .. string.sub(raw, 106),
  'PX', string.format('%.0f', ttl + tonumber(ARGV[4])))
return es
";

/// Read. KEYS: record. Returns the record's value, or nil when there is
/// none or it is PENDING with a lapsed lease (see the module docs): the
/// server's clock decides, as in the claim. A record whose lease expiry or
/// fence cannot be read is returned as it is, for the decoder to report.
const GET_LIVE: &str = r"
local raw = load(KEYS[1])
if raw and string.sub(raw, 1, 1) == 'P' then
  -- Hidden only when lapsed and readable, as the claim takes it over: a
  -- damaged record goes to the caller's decoder, whose error it is.
  local lease_end = tonumber(string.sub(raw, 86, 105))
  if lease_end and tonumber(string.sub(raw, 66, 85)) and lease_end <= now_ms() then
    return false
  end
end
return raw
";

/// PENDING → DONE. KEYS: record, timeline, fence counter. ARGV: token,
/// fence (padded), payload, done_ttl ms, attempt JSON, timeline max,
/// fingerprint, fence memory ms. Returns 1 if applied, 0 if stale.
///
/// The attempt goes to the key's timeline list when it has one, and
/// otherwise into the record (see the module docs): a first execution's
/// complete makes 4 calls (`GET`, `TIME`, `EXISTS`, `SET … PX`) and writes
/// no third key.
///
/// The DONE record keeps the owner's token and fence, so that a retry of a
/// complete whose reply was lost is recognised: the same lease and the same
/// payload on the DONE record it wrote return 1 without writing again.
///
/// A record that vanished (lost in a failover to a replica that never had
/// it, or kept past its lease longer than the fence memory) is written
/// again as DONE: no other owner holds the key, and the work this lease did
/// stands, so its retry replays instead of running twice. Not after a
/// takeover, a release or a forget: each leaves the fence counter above
/// this lease's fence.
const COMPLETE: &str = r"
local raw = load(KEYS[1])
local fp = ARGV[7]
if raw then
  if string.sub(raw, 34, 85) ~= ARGV[1] .. ARGV[2] then return 0 end
  local st = string.sub(raw, 1, 1)
  if st == 'D' then
    local c, n = att_end(raw)
    if string.sub(raw, c + 1 + n) == ARGV[3] then return 1 end
    return 0
  end
  if st ~= 'P' then return 0 end
  fp = string.sub(raw, 2, 33)
else
  local last = tonumber(redis.call('GET', KEYS[3]) or '0') or 0
  if last > tonumber(ARGV[2]) then return 0 end
  if last < tonumber(ARGV[2]) then
    redis.call('SET', KEYS[3], ARGV[2], 'PX', ARGV[8])
  end
end
local ttl = tonumber(ARGV[4])
local es = string.format('%020.0f', now_ms() + ttl)
local listed = redis.call('EXISTS', KEYS[2]) == 1
local att = ARGV[5]
if listed then att = '' end
redis.call('SET', KEYS[1], 'D' .. fp .. ARGV[1] .. ARGV[2] .. es .. #att .. ':' .. att .. ARGV[3], 'PX', ttl)
if listed then push(KEYS[2], ARGV[5], ARGV[6], ttl) end
return 1
";

/// PENDING → absent. KEYS: record, timeline, fence counter. ARGV: token,
/// fence (padded), attempt JSON, timeline max, timeline ttl ms, fence
/// memory ms. Returns 1 if applied, 0 if stale. The fence counter is
/// raised past the lease's fence: the owner gave the key up, so its own
/// complete must not write the record again. (A PENDING record holds no
/// attempt: nothing to adopt.)
const RELEASE: &str = r"
if not owned(KEYS[1], ARGV[1], ARGV[2]) then return 0 end
redis.call('DEL', KEYS[1])
local fence = tonumber(ARGV[2])
if (tonumber(redis.call('GET', KEYS[3]) or '0') or 0) <= fence then
  redis.call('SET', KEYS[3], string.format('%020.0f', fence + 1), 'PX', ARGV[6])
end
push(KEYS[2], ARGV[3], ARGV[4], ARGV[5])
return 1
";

/// Any state → absent (an operator's forget). KEYS: record, timeline,
/// fence counter. ARGV: attempt JSON, timeline max, timeline ttl ms, fence
/// memory ms. Returns 1 if there was a record, 0 otherwise. The fence
/// counter is raised past the record's fence, so the next claim gets a
/// greater fence and the forgotten owner's complete cannot write the
/// record again. The timeline outlives the record: the forget's entry is
/// appended (adopting the record's attempt) before the record goes.
///
/// A forget sent again after its reply was lost finds no record, but its
/// own entry (the same attempt, to the millisecond and the replica) last in
/// the timeline: it returns 1, as the first time.
const FORGET: &str = r"
local raw = load(KEYS[1])
if not raw then
  if redis.call('LINDEX', KEYS[2], -1) == ARGV[1] then return 1 end
  return 0
end
local fence = tonumber(string.sub(raw, 66, 85)) or 0
push(KEYS[2], ARGV[1], ARGV[2], ARGV[3], KEYS[1])
redis.call('DEL', KEYS[1])
local last = tonumber(redis.call('GET', KEYS[3]) or '0') or 0
if last <= fence then
  redis.call('SET', KEYS[3], string.format('%020.0f', fence + 1), 'PX', ARGV[4])
end
return 1
";

/// Timeline append. KEYS: timeline, record. ARGV: attempt JSON, max, ttl
/// ms.
const RECORD_ONE: &str = r"
push(KEYS[1], ARGV[1], ARGV[2], ARGV[3], KEYS[2])
return 1
";

/// Timeline append of several entries of one key (the background writer).
/// KEYS: timeline, record. ARGV: max, ttl ms, entry JSON…
const RECORD_MANY: &str = r"
local n = 0
for i = 3, #ARGV do
  n = redis.call('RPUSH', KEYS[1], ARGV[i])
end
keep(KEYS[1], n, n == #ARGV - 2, ARGV[1], ARGV[2], KEYS[2])
return 1
";

/// The whole timeline of a key. KEYS: record, timeline. Returns
/// `{attempt or false, {entries…}}`: in one script, so that an `adopt`
/// cannot run between the two reads.
const TIMELINE: &str = r"
local raw = load(KEYS[1])
local att = false
if raw then
  local c, n = att_end(raw)
  if n > 0 then att = string.sub(raw, c + 1, c + n) end
end
return {att, redis.call('LRANGE', KEYS[2], 0, -1)}
";

/// The compiled scripts (their SHA1s are computed once).
#[derive(Debug)]
pub(crate) struct Scripts {
    pub(crate) claim: Script,
    pub(crate) renew: Script,
    pub(crate) get: Script,
    pub(crate) complete: Script,
    pub(crate) release: Script,
    pub(crate) forget: Script,
    pub(crate) record: Script,
    pub(crate) record_many: Script,
    pub(crate) timeline: Script,
}

impl Scripts {
    /// The completion script's source (for `SCRIPT LOAD` where a pipeline
    /// met `NOSCRIPT`).
    pub(crate) fn complete_code(&self) -> String {
        format!("{LOAD}{FIELDS}{PUSH}{COMPLETE}")
    }

    pub(crate) fn new() -> Self {
        let loading = |body: &str| Script::new(&format!("{LOAD}{body}"));
        let reading = |body: &str| Script::new(&format!("{LOAD}{FIELDS}{body}"));
        let appending = |body: &str| Script::new(&format!("{LOAD}{FIELDS}{PUSH}{body}"));
        Self {
            claim: loading(CLAIM),
            renew: reading(RENEW),
            get: reading(GET_LIVE),
            complete: appending(COMPLETE),
            release: appending(RELEASE),
            forget: appending(FORGET),
            record: appending(RECORD_ONE),
            record_many: appending(RECORD_MANY),
            timeline: reading(TIMELINE),
        }
    }
}
