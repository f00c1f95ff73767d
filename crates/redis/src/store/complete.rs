//! The completion's script and `WAIT` in one pipeline: `WAIT` counts only
//! the writes of its own connection, so it must follow the script on the
//! same connection to the key's master (see `crate::replication`).

use bytes::Bytes;
use redis::{Cmd, ScriptInvocation};

use super::{MAX_TIMELINE, RedisStore, timed_out};
use crate::error::map_error;
use crate::replication;
use idemgate_engine::StoreError;

/// The completion script's keys and arguments, for `EVALSHA` alone or in
/// a pipeline with `WAIT`.
pub(super) struct CompleteArgs<'a> {
    pub(super) keys: [&'a String; 3],
    pub(super) token: String,
    /// Zero-padded to 20 digits, as the record keeps it.
    pub(super) fence: String,
    pub(super) payload: &'a Bytes,
    pub(super) done_ttl: u64,
    pub(super) attempt: Vec<u8>,
    pub(super) fingerprint: &'a [u8; 32],
    pub(super) fence_memory: u64,
}

impl CompleteArgs<'_> {
    pub(super) fn apply(&self, inv: &mut ScriptInvocation<'_>) {
        for key in self.keys {
            inv.key(key);
        }
        inv.arg(&self.token)
            .arg(&self.fence)
            .arg(&self.payload[..])
            .arg(self.done_ttl)
            .arg(&self.attempt)
            .arg(MAX_TIMELINE)
            .arg(&self.fingerprint[..])
            .arg(self.fence_memory);
    }

    fn evalsha(&self, hash: &str) -> Cmd {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(hash).arg(self.keys.len());
        for key in self.keys {
            cmd.arg(key);
        }
        cmd.arg(&self.token)
            .arg(&self.fence)
            .arg(&self.payload[..])
            .arg(self.done_ttl)
            .arg(&self.attempt)
            .arg(MAX_TIMELINE)
            .arg(&self.fingerprint[..])
            .arg(self.fence_memory);
        cmd
    }
}

impl RedisStore {
    /// The completion script then `WAIT n`, one pipeline on the key's
    /// master; loads the script once on `NOSCRIPT`. Returns the script's
    /// answer and the replicas that acknowledged.
    pub(super) async fn complete_and_wait(
        &self,
        args: &CompleteArgs<'_>,
        n: u32,
    ) -> Result<(i64, i64), StoreError> {
        let hash = self.scripts.complete.get_hash();
        let mut pipe = redis::pipe();
        pipe.add_command(args.evalsha(hash))
            .add_command(replication::wait_cmd(n, self.opts.wait_timeout));
        let bound = self.opts.operation_timeout + self.opts.wait_timeout;
        let run = |pipe: redis::Pipeline| {
            let mut conn = self.conn.clone();
            async move {
                match tokio::time::timeout(bound, conn.query_pipe::<(i64, i64)>(&pipe)).await {
                    Ok(r) => Ok(r),
                    Err(_) => Err(timed_out("complete")),
                }
            }
        };
        match run(pipe.clone()).await? {
            Ok(answer) => Ok(answer),
            Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                // Load it where the key lives, then once more.
                let mut load = redis::cmd("SCRIPT");
                load.arg("LOAD").arg(self.scripts.complete_code());
                let route = self.conn.is_cluster().then(|| {
                    redis::cluster_routing::Route::with_key(
                        args.keys[0],
                        redis::cluster_routing::SlotAddr::Master,
                    )
                });
                let mut conn = self.conn.clone();
                self.bounded(
                    "load the completion script",
                    conn.query_on_master(&load, route),
                )
                .await?;
                run(pipe).await?.map_err(map_error)
            }
            Err(e) => Err(map_error(e)),
        }
    }
}
