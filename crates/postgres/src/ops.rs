//! The `Store` operations of [`PostgresStore`]: each one statement on a
//! pooled connection, and the row decoding they share.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use idemgate_engine::{
    Attempt, BoxFuture, Claim, Fenced, Fingerprint, Lease, Record, ScopedKey, Store, StoreError,
    StoreErrorKind,
};
use sqlx::{AssertSqlSafe, PgConnection, Row};

use crate::error::{BACKEND, map_error};
use crate::timeline::Entry;

use crate::store::{ClaimJob, Claimed, CompleteJob, PostgresStore, RenewJob, Write};

use crate::rows::*;

impl Store for PostgresStore {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn claim<'a>(
        &'a self,
        key: &'a ScopedKey,
        fingerprint: &'a Fingerprint,
        pending_ttl: Duration,
    ) -> BoxFuture<'a, Result<Claim, StoreError>> {
        Box::pin(async move {
            let token = Lease::new_token();
            // Under READ COMMITTED the statement's read of the existing row uses
            // the snapshot taken when it started: a row inserted by a claim that
            // committed just after makes the insert conflict (so this claim
            // cannot win) yet is invisible to the read. The statement then
            // returns nothing; running it again, with a fresh snapshot, sees it.
            let job = ClaimJob::new(key, fingerprint, token, pending_ttl);
            for _ in 0..5 {
                match self.claim_once(&job).await? {
                    Claimed::Acquired {
                        fence,
                        expires_at_ms,
                    } => {
                        return Ok(Claim::Acquired(Lease {
                            key: key.clone(),
                            token,
                            fence,
                            expires_at_ms,
                            fingerprint: *fingerprint,
                        }));
                    }
                    Claimed::Existing(record) => return Ok(Claim::Existing(record)),
                    Claimed::Raced => {}
                }
            }
            Err(StoreError::new(
                StoreErrorKind::Unavailable,
                BACKEND,
                "claim kept racing with concurrent changes to the key",
            ))
        })
    }

    fn renew<'a>(
        &'a self,
        lease: &'a mut Lease,
        pending_ttl: Duration,
    ) -> BoxFuture<'a, Result<Fenced, StoreError>> {
        Box::pin(async move {
            let Some(job) = RenewJob::new(lease, pending_ttl) else {
                return Ok(Fenced::Stale);
            };
            let renewed = match &self.inner.renewals {
                Some(batches) => batches.run(job).await??,
                None => self.renew_alone(&job).await??,
            };
            match renewed {
                Some(expires_at_ms) => {
                    lease.expires_at_ms = expires_at_ms;
                    Ok(Fenced::Applied)
                }
                None => Ok(Fenced::Stale),
            }
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
            let Some(job) = CompleteJob::new(lease, payload, done_ttl, attempt)? else {
                return Ok(Fenced::Stale);
            };
            let written = match &self.inner.writes {
                Some(batches) => batches.run(Write::Complete(job)).await?.completed()?,
                None => self.complete_alone(&job).await?,
            };
            if written == Fenced::Applied {
                self.inner.notify.notify(&lease.key.storage_id());
            }
            Ok(written)
        })
    }

    fn release<'a>(
        &'a self,
        lease: &'a Lease,
        attempt: &'a Attempt,
        timeline_ttl: Duration,
    ) -> BoxFuture<'a, Result<Fenced, StoreError>> {
        Box::pin(async move {
            let Some(fence) = fence_param(lease) else {
                return Ok(Fenced::Stale);
            };
            let entry = attempt_json(attempt)?;
            let row = self
                .bounded("release", async |c: &mut PgConnection| {
                    sqlx::query(AssertSqlSafe(Arc::clone(&self.inner.sql.release)))
                        .bind(lease.key.storage_id())
                        .bind(lease.token.to_be_bytes().to_vec())
                        .bind(fence)
                        .bind(entry)
                        .bind(ttl_param(timeline_ttl))
                        .fetch_one(&mut *c)
                        .await
                })
                .await?;
            let written = applied(&row)?;
            if written == Fenced::Applied {
                self.inner.notify.notify(&lease.key.storage_id());
            }
            Ok(written)
        })
    }

    fn forget<'a>(
        &'a self,
        key: &'a ScopedKey,
        attempt: &'a Attempt,
        timeline_ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let entry = attempt_json(attempt)?;
            let row = self
                .bounded("forget", async |c: &mut PgConnection| {
                    sqlx::query(AssertSqlSafe(Arc::clone(&self.inner.sql.forget)))
                        .bind(key.storage_id())
                        .bind(entry)
                        .bind(ttl_param(timeline_ttl))
                        .fetch_one(c)
                        .await
                })
                .await?;
            let removed = applied(&row)? == Fenced::Applied;
            if removed {
                self.inner.notify.notify(&key.storage_id());
            }
            Ok(removed)
        })
    }

    fn get<'a>(&'a self, key: &'a ScopedKey) -> BoxFuture<'a, Result<Option<Record>, StoreError>> {
        Box::pin(async move {
            let row = self
                .bounded("get", async |c: &mut PgConnection| {
                    sqlx::query(AssertSqlSafe(Arc::clone(&self.inner.sql.get)))
                        .bind(key.storage_id())
                        .fetch_optional(&mut *c)
                        .await
                })
                .await?;
            row.as_ref().map(decode_record).transpose()
        })
    }

    fn record_attempt<'a>(
        &'a self,
        key: &'a ScopedKey,
        attempt: &'a Attempt,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let entry = attempt_json(attempt)?;
            if let Some(writer) = &self.inner.timeline {
                writer.push(Entry {
                    id: key.storage_id(),
                    json: entry,
                    keep_ms: ttl_param(ttl),
                });
                return Ok(());
            }
            self.bounded("record_attempt", async |c: &mut PgConnection| {
                sqlx::query(AssertSqlSafe(Arc::clone(&self.inner.sql.record_attempt)))
                    .bind(key.storage_id())
                    .bind(entry)
                    .bind(ttl_param(ttl))
                    .execute(&mut *c)
                    .await
            })
            .await?;
            Ok(())
        })
    }

    fn timeline<'a>(
        &'a self,
        key: &'a ScopedKey,
    ) -> BoxFuture<'a, Result<Vec<Attempt>, StoreError>> {
        Box::pin(async move {
            let rows = self
                .bounded("timeline", async |c: &mut PgConnection| {
                    sqlx::query(AssertSqlSafe(Arc::clone(&self.inner.sql.timeline)))
                        .bind(key.storage_id())
                        .fetch_all(&mut *c)
                        .await
                })
                .await?;
            rows.iter()
                .map(|row| {
                    let entry: String = row.try_get("entry").map_err(map_error)?;
                    attempt_from_entry(&entry)
                })
                .collect()
        })
    }

    fn changed<'a>(&'a self, key: &'a ScopedKey, max: Duration) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            self.inner
                .notify
                .wait(&key.storage_id(), max.min(Duration::from_millis(50)))
                .await;
        })
    }
}
