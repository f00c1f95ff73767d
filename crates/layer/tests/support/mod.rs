//! What several test binaries of the layer share: [`app`], the app behind
//! the layer that the HTTP tests drive, and [`DownStore`], a store that is
//! never reachable.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used)]

pub mod app;

use std::time::Duration;

use bytes::Bytes;
use idemgate_engine::{
    Attempt, BoxFuture, Claim, Fenced, Fingerprint, Lease, Record, ScopedKey, Store, StoreError,
    StoreErrorKind,
};

/// A store whose every operation fails as an unreachable server would.
#[derive(Debug)]
pub struct DownStore;

fn down() -> StoreError {
    StoreError::new(StoreErrorKind::Unavailable, "down", "connection refused")
}

impl Store for DownStore {
    fn backend(&self) -> &'static str {
        "down"
    }
    fn claim<'a>(
        &'a self,
        _: &'a ScopedKey,
        _: &'a Fingerprint,
        _: Duration,
    ) -> BoxFuture<'a, Result<Claim, StoreError>> {
        Box::pin(async move { Err(down()) })
    }
    fn renew<'a>(
        &'a self,
        _: &'a mut Lease,
        _: Duration,
    ) -> BoxFuture<'a, Result<Fenced, StoreError>> {
        Box::pin(async move { Err(down()) })
    }
    fn complete<'a>(
        &'a self,
        _: &'a Lease,
        _: Bytes,
        _: Duration,
        _: &'a Attempt,
    ) -> BoxFuture<'a, Result<Fenced, StoreError>> {
        Box::pin(async move { Err(down()) })
    }
    fn release<'a>(
        &'a self,
        _: &'a Lease,
        _: &'a Attempt,
        _: Duration,
    ) -> BoxFuture<'a, Result<Fenced, StoreError>> {
        Box::pin(async move { Err(down()) })
    }
    fn forget<'a>(
        &'a self,
        _: &'a ScopedKey,
        _: &'a Attempt,
        _: Duration,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move { Err(down()) })
    }
    fn get<'a>(&'a self, _: &'a ScopedKey) -> BoxFuture<'a, Result<Option<Record>, StoreError>> {
        Box::pin(async move { Err(down()) })
    }
    fn record_attempt<'a>(
        &'a self,
        _: &'a ScopedKey,
        _: &'a Attempt,
        _: Duration,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move { Err(down()) })
    }
    fn timeline<'a>(&'a self, _: &'a ScopedKey) -> BoxFuture<'a, Result<Vec<Attempt>, StoreError>> {
        Box::pin(async move { Err(down()) })
    }
}
