//! The Lua scripts behind every write: each runs atomically on the server,
//! so a claim or a fenced write is one round trip (`EVALSHA`) with no
//! read-then-write race between replicas.
//!
//! Time comes from the server (`TIME`), never from the client: every replica
//! sharing the store then agrees on lease and record expiry. Numbers are
//! formatted with `%.0f` because Lua 5.1's `tostring` switches to exponent
//! notation above 1e14, and µs timestamps are larger than that.
//!
//! Record hash fields: `st` (`P` or `D`), `fp` (32 raw fingerprint bytes),
//! `tok` (owner token, 32 hex digits), `fence` (decimal), `exp` (lease or
//! record expiry, ms since the epoch, decimal), `body` (payload, DONE only),
//! `att` (the executed attempt's timeline entry, DONE only, while the key
//! has no timeline list).
//!
//! # Why the first timeline entry lives in the record
//! Most keys run once and are never retried. Their timeline is the one
//! entry of the completion, and a list of its own would be a third Redis
//! key per key (after the record and the fence counter): an entry in the
//! main and the expiry dictionaries, their rehashing as the keyspace grows,
//! and two more calls in the completion. So a completion that finds no
//! list keeps its entry in the record (`att`), where it lives and expires
//! with the record. The first later append to the key's timeline creates
//! the list and moves the entry into it (`adopt`), so the entry then lives
//! as long as the list, as it did before. `att` is in the record only
//! while the key has no list; the timeline is read by one script (`TIMELINE`)
//! so that a read never sees the entry in both places or in neither.

use redis::Script;

/// Shared helpers prepended to the scripts that append to a timeline.
///
/// `push(key, entry, max, ttl, rec)`: append, keep the newest `max`, and
/// make the list live at least `ttl` ms. `keep(key, n, created, max, ttl,
/// rec)` is its second half: `n` is the list's length after the append,
/// `created` whether the append made the list, `rec` the record whose
/// executed attempt a list just made adopts (nil: none to adopt).
///
/// Each `redis.call` costs the server 1 to 2 µs (a script of the claim's
/// six calls takes about 10 µs of server time, an empty one 1.3), so the
/// common cases skip the calls that would change nothing: a list no longer
/// than `max` is not trimmed, and a list the append just created (its
/// length is what was appended, and it has no TTL yet) gets its TTL
/// without asking for the old one.
///
/// `adopt(key, rec)` moves the executed attempt a record holds (`att`, see
/// the module docs) to the head of the timeline list `key` just created: it
/// is older than the entries that created the list (which keeps the order
/// of entries stamped in the same millisecond).
const PUSH: &str = r"
local function adopt(key, rec)
  local att = redis.call('HGET', rec, 'att')
  if not att then return 0 end
  redis.call('HDEL', rec, 'att')
  return redis.call('LPUSH', key, att) - 1
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
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function owned(rec, tok, fence)
  local cur = redis.call('HMGET', rec, 'st', 'tok', 'fence')
  return cur[1] == 'P' and cur[2] == tok and cur[3] == fence
end
";

/// Claim-or-read.
///
/// KEYS: record, fence counter. ARGV: fingerprint, token, pending_ttl ms,
/// fence memory ms.
///
/// Returns `{1, fence, lease_expiry}` when acquired, or
/// `{0, st, fp, fence, exp, body}` for the live record found. The fence is
/// `max(last fence + 1, server time in µs)`: it grows across claims while the
/// counter key is remembered, and keeps growing after it is forgotten as long
/// as the server clock does not go back.
const CLAIM: &str = r"
local cur = redis.call('HMGET', KEYS[1], 'st', 'fp', 'fence', 'exp', 'body')
if cur[1] then
  return {0, cur[1], cur[2], cur[3], cur[4], cur[5]}
end
local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local fence = (tonumber(redis.call('GET', KEYS[2]) or '0') or 0) + 1
if now_us > fence then fence = now_us end
local ttl = tonumber(ARGV[3])
local fs = string.format('%.0f', fence)
local es = string.format('%.0f', math.floor(now_us / 1000) + ttl)
redis.call('HSET', KEYS[1], 'st', 'P', 'fp', ARGV[1], 'tok', ARGV[2], 'fence', fs, 'exp', es)
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('SET', KEYS[2], fs, 'PX', ARGV[4])
return {1, fs, es}
";

/// Heartbeat. KEYS: record. ARGV: token, fence, pending_ttl ms.
/// Returns the new lease expiry, or nil when the lease is not current.
const RENEW: &str = r"
if not owned(KEYS[1], ARGV[1], ARGV[2]) then return false end
local es = string.format('%.0f', now_ms() + tonumber(ARGV[3]))
redis.call('HSET', KEYS[1], 'exp', es)
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return es
";

/// PENDING → DONE. KEYS: record, timeline, fence counter. ARGV: token,
/// fence, payload, done_ttl ms, attempt JSON, timeline max, fingerprint,
/// fence memory ms. Returns 1 if applied, 0 if stale.
///
/// The attempt goes to the key's timeline list when it has one, and
/// otherwise into the record (`att`; see the module docs): a first
/// execution's complete makes 5 calls and writes no third key.
///
/// The DONE record keeps the owner's token and fence, so that a retry of a
/// complete whose reply was lost is recognised: the same lease and the same
/// payload on the DONE record it wrote return 1 without writing again.
///
/// A record that vanished (lost in a failover to a replica that never had
/// it, or expired and claimed by nobody) is written again as DONE: no other
/// owner holds the key, and the work this lease did stands, so its retry
/// replays instead of running twice. Not after a newer claim or a forget:
/// both leave the fence counter above this lease's fence.
const COMPLETE: &str = r"
local cur = redis.call('HMGET', KEYS[1], 'st', 'tok', 'fence', 'body')
if cur[1] == 'D' and cur[2] == ARGV[1] and cur[3] == ARGV[2] and cur[4] == ARGV[3] then
  return 1
end
local ttl = tonumber(ARGV[4])
local es = string.format('%.0f', now_ms() + ttl)
local fields = {'st', 'D', 'exp', es, 'body', ARGV[3]}
if not cur[1] then
  local last = tonumber(redis.call('GET', KEYS[3]) or '0') or 0
  if last > tonumber(ARGV[2]) then return 0 end
  if last < tonumber(ARGV[2]) then
    redis.call('SET', KEYS[3], ARGV[2], 'PX', ARGV[8])
  end
  for _, f in ipairs({'fp', ARGV[7], 'tok', ARGV[1], 'fence', ARGV[2]}) do
    fields[#fields + 1] = f
  end
elseif not (cur[1] == 'P' and cur[2] == ARGV[1] and cur[3] == ARGV[2]) then
  return 0
end
local listed = redis.call('EXISTS', KEYS[2]) == 1
if not listed then
  fields[#fields + 1] = 'att'
  fields[#fields + 1] = ARGV[5]
end
redis.call('HSET', KEYS[1], unpack(fields))
redis.call('PEXPIRE', KEYS[1], ttl)
if listed then push(KEYS[2], ARGV[5], ARGV[6], ttl) end
return 1
";

/// PENDING → absent. KEYS: record, timeline, fence counter. ARGV: token,
/// fence, attempt JSON, timeline max, timeline ttl ms, fence memory ms.
/// Returns 1 if applied, 0 if stale. The fence counter is raised past the
/// lease's fence: the owner gave the key up, so its own complete must not
/// write the record again. (A PENDING record holds no `att`: nothing to
/// adopt.)
const RELEASE: &str = r"
if not owned(KEYS[1], ARGV[1], ARGV[2]) then return 0 end
redis.call('DEL', KEYS[1])
local fence = tonumber(ARGV[2])
if (tonumber(redis.call('GET', KEYS[3]) or '0') or 0) <= fence then
  redis.call('SET', KEYS[3], string.format('%.0f', fence + 1), 'PX', ARGV[6])
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
/// appended (adopting the record's `att`) before the record goes.
const FORGET: &str = r"
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local fence = tonumber(redis.call('HGET', KEYS[1], 'fence') or '0') or 0
push(KEYS[2], ARGV[1], ARGV[2], ARGV[3], KEYS[1])
redis.call('DEL', KEYS[1])
local last = tonumber(redis.call('GET', KEYS[3]) or '0') or 0
if last <= fence then
  redis.call('SET', KEYS[3], string.format('%.0f', fence + 1), 'PX', ARGV[4])
end
return 1
";

/// Timeline append. KEYS: timeline, record. ARGV: attempt JSON, max, ttl
/// ms.
const RECORD: &str = r"
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
/// `{att or false, {entries…}}`: in one script, so that an `adopt` cannot
/// run between the two reads.
const TIMELINE: &str = r"
return {redis.call('HGET', KEYS[1], 'att'), redis.call('LRANGE', KEYS[2], 0, -1)}
";

/// The compiled scripts (their SHA1s are computed once).
#[derive(Debug)]
pub(crate) struct Scripts {
    pub(crate) claim: Script,
    pub(crate) renew: Script,
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
        format!("{PUSH}{COMPLETE}")
    }

    pub(crate) fn new() -> Self {
        let with_helpers = |body: &str| Script::new(&format!("{PUSH}{body}"));
        Self {
            claim: Script::new(CLAIM),
            renew: with_helpers(RENEW),
            complete: with_helpers(COMPLETE),
            release: with_helpers(RELEASE),
            forget: with_helpers(FORGET),
            record: with_helpers(RECORD),
            record_many: with_helpers(RECORD_MANY),
            timeline: Script::new(TIMELINE),
        }
    }
}
