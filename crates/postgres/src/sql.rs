//! Every SQL statement the store runs, built once per store from the
//! validated schema and table names, and the migrations.
//!
//! Time is the **database clock** (`now()`) everywhere: lease and record
//! expiry are decided by one clock that every replica shares. Times leave the
//! database as ms since the epoch (`ms(…)` below), the unit of
//! `Lease::expires_at_ms`.

use std::sync::Arc;

use idemgate_engine::MAX_TIMELINE;

/// How long a batch statement waits for a row lock before it gives up and
/// its jobs run one statement each (`batch`): long enough for another
/// batch's commit, short enough that no job waits long on a lock another
/// job of its batch needed.
pub(crate) const BATCH_LOCK_TIMEOUT_MS: u32 = 200;

/// Newest schema version this build knows.
pub(crate) const SCHEMA_VERSION: i32 = 3;

/// Checks that `name` is a plain lower-case SQL identifier, so it can be
/// spliced into statements without quoting or injection.
pub(crate) fn valid_identifier(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 48
        && name.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

fn ms(expr: &str) -> String {
    format!("floor(extract(epoch FROM {expr}) * 1000)::bigint")
}

fn after_ms(param: &str) -> String {
    format!("now() + {param}::float8 * interval '1 millisecond'")
}

/// The statements of one store.
#[derive(Debug)]
pub(crate) struct Sql {
    pub(crate) schema: String,
    pub(crate) claim: Arc<str>,
    /// The claims of many keys (distinct) in one statement: `$1` ids, `$2`
    /// tenants, `$3` namespaces, `$4` client keys, `$5` fingerprints, `$6`
    /// tokens, `$7` lease ms; rows as `claim`'s plus `id`.
    pub(crate) claim_batch: Arc<str>,
    pub(crate) renew: Arc<str>,
    /// `renew` for many keys: `$1` ids, `$2` tokens, `$3` fences, `$4`
    /// lease ms; a row (`id`, `exp_ms`) per lease still current.
    pub(crate) renew_batch: Arc<str>,
    /// Locks the owned PENDING row until the caller's transaction ends:
    /// `$1` id, `$2` token, `$3` fence.
    pub(crate) lock: Arc<str>,
    /// PENDING → DONE, the attempt kept in the row: `$1` id, `$2` token,
    /// `$3` fence, `$4` payload, `$5` keep-for ms, `$6` entry.
    pub(crate) complete: Arc<str>,
    /// The completions of many keys (distinct) in one statement: `$1` ids,
    /// `$2` tokens, `$3` fences, `$4` payloads, `$5` keep-for ms, `$6`
    /// entries (JSON text); returns the ids it completed.
    pub(crate) complete_batch: Arc<str>,
    /// Claims and completions of distinct keys in one statement: `$1`…`$7`
    /// as `claim_batch`'s, `$8`…`$13` as `complete_batch`'s; the claims'
    /// rows as `claim_batch`'s, and an `id` row per completion applied.
    pub(crate) write_batch: Arc<str>,
    /// Whether the DONE row is the one this lease wrote with this payload
    /// (a completion retried after its reply was lost): `$1` id, `$2`
    /// token, `$3` fence, `$4` payload. Run only when `complete` matched
    /// nothing.
    pub(crate) completed: Arc<str>,
    pub(crate) release: Arc<str>,
    /// Deletes the record whatever its state: `$1` id, `$2` entry, `$3`
    /// keep-for ms.
    pub(crate) forget: Arc<str>,
    pub(crate) get: Arc<str>,
    pub(crate) record_attempt: Arc<str>,
    /// Appends many entries (of any keys) in one statement: the background
    /// timeline writer's batch. `$1` ids, `$2` entries (JSON text), `$3`
    /// keep-for ms, in order.
    pub(crate) record_attempts: Arc<str>,
    pub(crate) timeline: Arc<str>,
    pub(crate) purge_records: Arc<str>,
    pub(crate) purge_timeline: Arc<str>,
    pub(crate) version: Arc<str>,
    pub(crate) bootstrap: Arc<str>,
    /// Migrations: `migrations[i]` takes the schema from version `i` to `i + 1`.
    pub(crate) migrations: Vec<Arc<str>>,
}

impl Sql {
    /// The statements for a store configured by `opts`.
    pub(crate) fn for_options(opts: &crate::options::PostgresOptions) -> Self {
        Self::new(
            &opts.schema,
            &opts.records_table,
            &opts.timeline_table,
            opts.purge_batch.max(1),
            opts.synchronous_claims,
        )
    }

    pub(crate) fn new(
        schema: &str,
        records: &str,
        timeline: &str,
        purge_batch: u32,
        synchronous_claims: bool,
    ) -> Self {
        let rec = format!("{schema}.{records}");
        let tl = format!("{schema}.{timeline}");
        let seq = format!("{schema}.{records}_fence");
        let keep = MAX_TIMELINE;
        let skip = MAX_TIMELINE.saturating_sub(1);
        // Keeps the newest `MAX_TIMELINE - 1` older entries of a key, making
        // room for the one the same statement inserts (a statement's CTEs
        // share one snapshot, so the new row is not seen here).
        let trim = |id: &str| {
            format!(
                "trimmed AS (DELETE FROM {tl} WHERE id = {id} AND seq <= \
                 (SELECT seq FROM {tl} WHERE id = {id} ORDER BY seq DESC OFFSET {skip} LIMIT 1))"
            )
        };
        // A live record is read and returned without writing anything (no
        // row lock, no WAL, no fence consumed), so a replay is a pure read.
        // Otherwise the insert runs; the primary key picks one winner among
        // concurrent claimers, and the conflict update revives only an
        // expired row.
        //
        // Without synchronous claims, the insert first sets
        // `synchronous_commit = off` for the statement's own (implicit)
        // transaction: `set_config(…, true)` lasts until that transaction
        // ends, and its commit reads the setting. A replay writes nothing,
        // so it commits nothing to wait for either way.
        let (cfg, from_cfg) = if synchronous_claims {
            ("", "")
        } else {
            (
                "cfg AS MATERIALIZED (SELECT set_config('synchronous_commit', 'off', true)), ",
                "FROM cfg ",
            )
        };
        // The fence is the sequence's next value, and at least the server's
        // clock in µs (as on Redis). A crash can take an unsynchronised
        // claim's sequence advance with it, and the sequence would then hand
        // out again a fence an owner on a live replica still holds; the
        // clock has moved past it by the time the server is back. It also
        // keeps fences growing across a switch between the two claim modes.
        // While the key's row exists, the new fence is above the row's.
        let fence = format!(
            "greatest(nextval('{seq}'), \
             floor(extract(epoch FROM clock_timestamp()) * 1000000)::bigint)"
        );
        let claim = format!(
            "WITH {cfg}cur AS (\
               SELECT fence, expires_at, fingerprint, state, payload FROM {rec} \
               WHERE id = $1 AND expires_at > now()), \
             ins AS (\
               INSERT INTO {rec} AS r (id, tenant, namespace, client_key, fingerprint, state, \
                                       token, fence, expires_at, payload) \
               SELECT $1::text, $2::text, $3::text, $4::text, $5::bytea, 'P', $6::bytea, \
                      {fence}, {exp}, NULL \
               {from_cfg}WHERE NOT EXISTS (SELECT 1 FROM cur) \
               ON CONFLICT (id) DO UPDATE SET \
                 fingerprint = EXCLUDED.fingerprint, state = 'P', token = EXCLUDED.token, \
                 fence = greatest(EXCLUDED.fence, r.fence + 1), \
                 expires_at = EXCLUDED.expires_at, payload = NULL, entry = NULL \
               WHERE r.expires_at <= now() \
               RETURNING r.fence, r.expires_at) \
             SELECT true AS acquired, fence, {ins_ms} AS exp_ms, NULL::bytea AS fingerprint, \
                    NULL::text AS state, NULL::bytea AS payload FROM ins \
             UNION ALL \
             SELECT false, fence, {cur_ms}, fingerprint, state, payload FROM cur",
            exp = after_ms("$7"),
            ins_ms = ms("expires_at"),
            cur_ms = ms("expires_at"),
        );
        // The batch: the same statement over `unnest` of the jobs'
        // parameters. The keys' rows are read by key alone (`cur`, kept
        // apart from the expiry test by `MATERIALIZED`): the plan is made
        // once per connection, and one made while the table was small
        // would otherwise pick the expiry index and read every live row. Rows are inserted in key order, so two batches that
        // share keys lock them in the same order and never wait on each
        // other in a cycle. `cfg` bounds its lock waits (and, without
        // synchronous claims, turns off its commit's flush wait); every
        // inserted row joins it, so it is set before the first insert.
        let batch_cfg = format!(
            "cfg AS MATERIALIZED (SELECT set_config('lock_timeout', '{BATCH_LOCK_TIMEOUT_MS}ms', true) AS lock_timeout{sync})",
            sync = if synchronous_claims {
                ""
            } else {
                ", set_config('synchronous_commit', 'off', true) AS sync"
            }
        );
        // The claim batch's CTEs (its rows: `ins` and `live`) and its
        // answer, over the parameters `$1`…`$7`: alone or beside
        // completions (`write_batch`).
        let claim_ctes = format!(
            "n AS (SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], \
                                        $5::bytea[], $6::bytea[], $7::bigint[]) \
                   AS n(id, tenant, namespace, client_key, fingerprint, token, ttl_ms)), \
             cur AS MATERIALIZED (\
               SELECT id, fence, expires_at, fingerprint, state, payload FROM {rec} \
               WHERE id = ANY($1::text[])), \
             live AS (SELECT * FROM cur WHERE expires_at > now()), \
             ins AS (\
               INSERT INTO {rec} AS r (id, tenant, namespace, client_key, fingerprint, state, \
                                       token, fence, expires_at, payload) \
               SELECT n.id, n.tenant, n.namespace, n.client_key, n.fingerprint, 'P', n.token, \
                      {fence}, {exp}, NULL \
               FROM n CROSS JOIN cfg WHERE NOT EXISTS (SELECT 1 FROM live WHERE live.id = n.id) \
               ORDER BY n.id \
               ON CONFLICT (id) DO UPDATE SET \
                 fingerprint = EXCLUDED.fingerprint, state = 'P', token = EXCLUDED.token, \
                 fence = greatest(EXCLUDED.fence, r.fence + 1), \
                 expires_at = EXCLUDED.expires_at, payload = NULL, entry = NULL \
               WHERE r.expires_at <= now() \
               RETURNING r.id, r.fence, r.expires_at)",
            exp = after_ms("n.ttl_ms"),
        );
        let claim_answer = format!(
            "SELECT id, true AS acquired, fence, {ins_ms} AS exp_ms, NULL::bytea AS fingerprint, \
                    NULL::text AS state, NULL::bytea AS payload FROM ins \
             UNION ALL \
             SELECT id, false, fence, {cur_ms}, fingerprint, state, payload FROM live",
            ins_ms = ms("expires_at"),
            cur_ms = ms("expires_at"),
        );
        let claim_batch = format!("WITH {batch_cfg}, {claim_ctes} {claim_answer}");
        let owned = "id = $1 AND token = $2 AND fence = $3 AND state = 'P'";
        let renew = format!(
            "UPDATE {rec} SET expires_at = {exp} WHERE {owned} RETURNING {m} AS exp_ms",
            exp = after_ms("$4"),
            m = ms("expires_at"),
        );
        // NO KEY UPDATE: the lock an UPDATE of non-key columns takes, so it
        // blocks exactly the claims, renewals and completions of this key.
        let lock = format!(
            "SELECT count(*) AS applied FROM (SELECT 1 FROM {rec} WHERE {owned}              FOR NO KEY UPDATE) owned"
        );
        // The completion's timeline entry is kept in the record's row
        // (`entry`), not as a timeline row: it lives exactly as long as the
        // DONE record, so a row of its own bought nothing but a second heap
        // tuple and two index entries per fresh key. Timeline reads add it
        // to the key's timeline rows; a forget moves it there.
        //
        // The common path is this one plain UPDATE. A retry of a
        // completion whose reply was lost matches nothing here; the store
        // then asks `completed` whether the DONE row is this lease's, with
        // this payload, and counts that as applied.
        let complete = format!(
            "UPDATE {rec} SET state = 'D', payload = $4, expires_at = {exp}, entry = $6::jsonb \
             WHERE {owned}",
            exp = after_ms("$5"),
        );
        // No join: a join of the jobs with the table is planned once per
        // connection, maybe while the table is still small, and the cached
        // plan (a scan of the whole table) would then be kept as the table
        // grows. Each row finds its job's values by its id's position.
        let job = "array_position($1::text[], r.id)";
        let lock_cfg = format!(
            "cfg AS MATERIALIZED (\
               SELECT set_config('lock_timeout', '{BATCH_LOCK_TIMEOUT_MS}ms', true) AS lock_timeout)"
        );
        // The completions' UPDATE over six parameters from `$first` on.
        let complete_update = |first: usize| {
            let p = |i: usize| format!("${}", first + i);
            let job = format!("array_position({}::text[], r.id)", p(0));
            format!(
                "UPDATE {rec} r SET state = 'D', payload = ({payloads}::bytea[])[{job}], \
                                    expires_at = {exp}, entry = (({entries}::text[])[{job}])::jsonb \
                 FROM cfg \
                 WHERE r.id = ANY({ids}::text[]) AND r.token = ({tokens}::bytea[])[{job}] \
                   AND r.fence = ({fences}::bigint[])[{job}] AND r.state = 'P' \
                 RETURNING r.id",
                ids = p(0),
                tokens = p(1),
                fences = p(2),
                payloads = p(3),
                entries = p(5),
                exp = after_ms(&format!("({}::bigint[])[{job}]", p(4))),
            )
        };
        let complete_batch = format!("WITH {lock_cfg} {}", complete_update(1));
        // Claims and completions (of other keys) in one statement: the
        // claim batch's parameters, then the completion batch's from `$8`;
        // the claims' rows as `claim_batch`'s, then one row (`id` only) per
        // completion applied. Its commit is synchronous whatever the claim
        // mode: the completions need it, and the claims lose nothing by it.
        let write_batch = format!(
            "WITH {lock_cfg}, {claim_ctes}, done AS ({update}) \
             {claim_answer} \
             UNION ALL \
             SELECT id, NULL::boolean, NULL::bigint, NULL::bigint, NULL::bytea, NULL::text, \
                    NULL::bytea FROM done",
            update = complete_update(8),
        );
        let renew_batch = format!(
            "WITH {lock_cfg} \
             UPDATE {rec} r SET expires_at = {exp} \
             FROM cfg \
             WHERE r.id = ANY($1::text[]) AND r.token = ($2::bytea[])[{job}] \
               AND r.fence = ($3::bigint[])[{job}] AND r.state = 'P' \
             RETURNING r.id, {m} AS exp_ms",
            exp = after_ms(&format!("($4::bigint[])[{job}]")),
            m = ms("r.expires_at"),
        );
        let completed = format!(
            "SELECT count(*) AS applied FROM {rec} WHERE id = $1 AND token = $2 AND fence = $3 \
             AND state = 'D' AND payload = $4 AND expires_at > now()"
        );
        let release = format!(
            "WITH gone AS (DELETE FROM {rec} WHERE {owned} RETURNING id), \
             tl AS (INSERT INTO {tl} (id, entry, keep_until) \
                    SELECT id, $4::jsonb, {keep_until} FROM gone), \
             {trim} \
             SELECT count(*) AS applied FROM gone",
            keep_until = after_ms("$5"),
            trim = trim("(SELECT id FROM gone)"),
        );
        // The record's own entry (its completion) goes to the timeline
        // first, kept as long as the record would have been, then the
        // forget's; identities follow the insert's order.
        let forget = format!(
            "WITH gone AS (DELETE FROM {rec} WHERE id = $1 RETURNING id, entry, expires_at), \
             tl AS (INSERT INTO {tl} (id, entry, keep_until) \
                    SELECT id, entry, keep_until FROM (\
                      SELECT id, entry, expires_at AS keep_until, 1 AS o FROM gone \
                      WHERE entry IS NOT NULL \
                      UNION ALL \
                      SELECT id, $2::jsonb, {keep_until}, 2 FROM gone) moved ORDER BY o), \
             {trim} \
             SELECT count(*) AS applied FROM gone",
            keep_until = after_ms("$3"),
            trim = trim("(SELECT id FROM gone)"),
        );
        let get = format!(
            "SELECT fingerprint, state, fence, {m} AS exp_ms, payload FROM {rec} \
             WHERE id = $1 AND expires_at > now()",
            m = ms("expires_at"),
        );
        let record_attempt = format!(
            "WITH {trim} INSERT INTO {tl} (id, entry, keep_until) VALUES ($1, $2::jsonb, {k})",
            trim = trim("$1"),
            k = after_ms("$3"),
        );
        // Several new entries of one key make the trim keep a few more than
        // `MAX_TIMELINE` rows until the key's next append; reads return the
        // newest `MAX_TIMELINE` only. Each key's cut is found once (one
        // short index scan; `MATERIALIZED` keeps the planner from folding
        // it back into the delete), then its old entries go by a range of
        // the primary key. A cut per timeline row made a batch of 100 hot
        // keys 5,000 index scans: about 200 ms per batch in a timeline of
        // 1M rows, against 4 ms now (EXPLAIN ANALYZE).
        let record_attempts = format!(
            "WITH new AS (\
               SELECT n.id, n.entry, n.keep_ms, n.ord \
               FROM unnest($1::text[], $2::text[], $3::bigint[]) WITH ORDINALITY \
                 AS n(id, entry, keep_ms, ord)), \
             cut AS MATERIALIZED (\
               SELECT k.id, (SELECT s.seq FROM {tl} s WHERE s.id = k.id \
                             ORDER BY s.seq DESC OFFSET {skip} LIMIT 1) AS seq \
               FROM (SELECT DISTINCT id FROM new) k), \
             trimmed AS (DELETE FROM {tl} t USING cut \
               WHERE t.id = cut.id AND t.seq <= cut.seq) \
             INSERT INTO {tl} (id, entry, keep_until) \
             SELECT id, entry::jsonb, {k} FROM new ORDER BY ord",
            k = after_ms("keep_ms"),
        );
        // Entries written in the background may land after a later
        // completion's: the newest entries by the attempts' own time, the
        // timeline rows' and the live record's own (its completion, kept
        // in the row) together.
        let read_timeline = format!(
            "SELECT entry::text AS entry FROM (\
               SELECT seq, entry FROM (\
                 (SELECT seq, entry FROM {tl} WHERE id = $1 AND keep_until > now() \
                  ORDER BY seq DESC LIMIT {keep}) \
                 UNION ALL \
                 (SELECT 0, entry FROM {rec} WHERE id = $1 AND entry IS NOT NULL \
                  AND expires_at > now())) every \
               ORDER BY (entry->>'at_ms')::bigint DESC, seq DESC LIMIT {keep}) newest \
             ORDER BY (entry->>'at_ms')::bigint, seq"
        );
        // The outer `expires_at` test is re-checked on the latest row version
        // should a claim revive the row meanwhile, so a live record is never
        // purged.
        let purge_records = format!(
            "DELETE FROM {rec} WHERE id IN (\
               SELECT id FROM {rec} WHERE expires_at < now() \
               LIMIT {purge_batch} FOR UPDATE SKIP LOCKED) \
             AND expires_at < now()"
        );
        let purge_timeline = format!(
            "DELETE FROM {tl} WHERE (id, seq) IN (\
               SELECT id, seq FROM {tl} WHERE keep_until < now() \
               LIMIT {purge_batch} FOR UPDATE SKIP LOCKED)"
        );
        let version =
            format!("SELECT max(version) AS version FROM {schema}.idemgate_schema_version");
        let bootstrap = format!(
            "CREATE SCHEMA IF NOT EXISTS {schema}; \
             CREATE TABLE IF NOT EXISTS {schema}.idemgate_schema_version (\
               version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now());"
        );
        let v1 = format!(
            "CREATE SEQUENCE {seq}; \
             CREATE TABLE {rec} (\
               id text PRIMARY KEY, \
               tenant text NOT NULL, \
               namespace text NOT NULL, \
               client_key text NOT NULL, \
               fingerprint bytea NOT NULL, \
               state text NOT NULL CHECK (state IN ('P', 'D')), \
               token bytea NOT NULL, \
               fence bigint NOT NULL, \
               expires_at timestamptz NOT NULL, \
               payload bytea, \
               CHECK (state = 'P' OR payload IS NOT NULL)); \
             CREATE INDEX {records}_expires_at ON {rec} (expires_at); \
             CREATE TABLE {tl} (\
               id text NOT NULL, \
               seq bigint GENERATED ALWAYS AS IDENTITY, \
               entry jsonb NOT NULL, \
               keep_until timestamptz NOT NULL, \
               PRIMARY KEY (id, seq)); \
             CREATE INDEX {timeline}_keep_until ON {tl} (keep_until); \
             INSERT INTO {schema}.idemgate_schema_version (version) VALUES (1);"
        );
        // Version 2: the completion's timeline entry in the record's row.
        let v2 = format!(
            "ALTER TABLE {rec} ADD COLUMN entry jsonb; \
             INSERT INTO {schema}.idemgate_schema_version (version) VALUES (2);"
        );
        // Version 3: no CHECK constraints on the records. PostgreSQL reads
        // a table's CHECK expressions back from their stored text and
        // compiles them at the start of every statement that writes a row,
        // so the two of version 1 cost the server 9–13% of its CPU per
        // fresh key (pgbench on the store's own statements, alternated
        // rounds), for rows only this store writes: its statements set the
        // state to the literal 'P' or 'D', a DONE row's payload is always a
        // bound value, and reading a row that breaks either rule is a
        // corrupt-record error (`rows::record_from_columns`).
        let v3 = format!(
            "ALTER TABLE {rec} DROP CONSTRAINT IF EXISTS {records}_state_check, \
                               DROP CONSTRAINT IF EXISTS {records}_check; \
             INSERT INTO {schema}.idemgate_schema_version (version) VALUES (3);"
        );
        Self {
            schema: schema.to_owned(),
            claim: claim.into(),
            claim_batch: claim_batch.into(),
            renew: renew.into(),
            renew_batch: renew_batch.into(),
            lock: lock.into(),
            complete: complete.into(),
            complete_batch: complete_batch.into(),
            write_batch: write_batch.into(),
            completed: completed.into(),
            release: release.into(),
            forget: forget.into(),
            get: get.into(),
            record_attempt: record_attempt.into(),
            record_attempts: record_attempts.into(),
            timeline: read_timeline.into(),
            purge_records: purge_records.into(),
            purge_timeline: purge_timeline.into(),
            version: version.into(),
            bootstrap: bootstrap.into(),
            migrations: vec![v1.into(), v2.into(), v3.into()],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_are_plain() {
        assert!(valid_identifier("idemgate"));
        assert!(valid_identifier("_t1"));
        assert!(!valid_identifier(""));
        assert!(!valid_identifier("1abc"));
        assert!(!valid_identifier("Idemgate"));
        assert!(!valid_identifier("a;drop"));
        assert!(!valid_identifier("a.b"));
        assert!(!valid_identifier(&"a".repeat(49)));
    }

    #[test]
    fn migrations_reach_the_current_version() {
        let sql = Sql::new("s", "records", "timeline", 10, true);
        assert_eq!(
            sql.migrations.len(),
            usize::try_from(SCHEMA_VERSION).unwrap()
        );
    }
}
