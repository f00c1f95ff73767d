//! The statements a fresh key costs, as a pgbench script: the floor
//! `bench/gateway.sh` measures beside the gateway on PostgreSQL. Not part
//! of the API (hidden from the docs): it exists so the floor follows the
//! statements this build sends, never a copy of them.
//!
//! A fresh key is a claim and a completion, each its own commit. The
//! claim's timeline entry goes to the background writer, in batches, so
//! it is not here; the completion's is kept in the record's row by its
//! statement. The check a completion runs when its UPDATE matched nothing
//! (a retry) is not here either: a fresh key never needs it.

use crate::options::PostgresOptions;
use crate::sql::Sql;

/// The variables the script reads, besides the ones it sets itself; the
/// caller defines them with `pgbench -D NAME=VALUE`.
pub const VARIABLES: [&str; 8] = [
    "tenant",
    "namespace",
    "fingerprint",
    "token",
    "payload",
    "entry",
    "pending_ms",
    "done_ms",
];

/// A pgbench script of one fresh key under `opts`' schema and tables: the
/// claim exactly as the store sends it (its fence kept with `\gset` as
/// `claim_fence`: the prefix keeps its other columns from overwriting the
/// caller's variables), then
/// the completion exactly as the store sends it. The key's id is a number
/// (pgbench variables are numbers), `client × 10¹² + random`, fresh with
/// near certainty; [`VARIABLES`] come from the caller.
pub fn fresh_key_script(opts: &PostgresOptions) -> String {
    let sql = Sql::for_options(opts);
    let claim = with_variables(
        &sql.claim,
        &[
            ":id",
            ":tenant",
            ":namespace",
            ":id",
            ":fingerprint",
            ":token",
            ":pending_ms",
        ],
    );
    let complete = with_variables(
        &sql.complete,
        &[
            ":id",
            ":token",
            ":claim_fence",
            ":payload",
            ":done_ms",
            ":entry",
        ],
    );
    format!(
        "\\set id :client_id * 1000000000000 + random(1, 999999999999)\n\
         {claim} \\gset claim_\n\
         {complete};\n"
    )
}

/// A pgbench script of one lease renewal exactly as the store sends it, on
/// a random one of `keys` PENDING records that [`renewal_rows`] wrote:
/// record `n` has id `n`, fence `n` and the token `\x0102030405060708`.
/// The caller defines `pending_ms` with `pgbench -D`.
pub fn renewal_script(opts: &PostgresOptions, keys: u64) -> String {
    let sql = Sql::for_options(opts);
    let renew = with_variables(&sql.renew, &[":n", RENEWAL_TOKEN, ":n", ":pending_ms"]);
    format!("\\set n random(1, {})\n{renew};\n", keys.max(1))
}

/// The token of every record [`renewal_rows`] writes, as an SQL literal.
const RENEWAL_TOKEN: &str = "'\\x0102030405060708'::bytea";

/// The statement that writes `keys` PENDING records for
/// [`renewal_script`], leased for an hour.
pub fn renewal_rows(opts: &PostgresOptions, keys: u64) -> String {
    format!(
        "INSERT INTO {schema}.{records} (id, tenant, namespace, client_key, fingerprint, state, \
           token, fence, expires_at) \
         SELECT n::text, 'bench', '/', n::text, decode(repeat('ab', 32), 'hex'), 'P', \
           {RENEWAL_TOKEN}, n, now() + interval '1 hour' \
         FROM generate_series(1, {keys}) n",
        schema = opts.schema,
        records = opts.records_table,
    )
}

/// `statement` with its parameters `$1`, `$2`… replaced by pgbench
/// variables, the highest number first so `$1` never eats `$10`'s digit.
fn with_variables(statement: &str, variables: &[&str]) -> String {
    let mut out = statement.to_owned();
    for (i, var) in variables.iter().enumerate().rev() {
        out = out.replace(&format!("${}", i + 1), var);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_parameter_becomes_a_variable() {
        let script = fresh_key_script(&PostgresOptions::default());
        assert!(!script.contains('$'), "{script}");
        for var in VARIABLES.iter().chain(&["id", "claim_fence"]) {
            assert!(
                script.contains(&format!(":{var}")),
                "{var} unused: {script}"
            );
        }
        assert!(script.contains("\\gset"));
    }

    #[test]
    fn the_renewal_script_binds_every_parameter() {
        let script = renewal_script(&PostgresOptions::default(), 500);
        assert!(!script.contains('$'), "{script}");
        assert!(script.starts_with("\\set n random(1, 500)\n"), "{script}");
        for needle in [":n", ":pending_ms", RENEWAL_TOKEN] {
            assert!(script.contains(needle), "{needle} missing: {script}");
        }
    }
}
