//! Run with: cargo run -p idemgate-layer --example credits
//!
//! A credits service whose `POST /charge` deducts credits and writes a
//! ledger row: the write after the model call (docs/design.md: "three layers"), where a retried
//! request must not charge twice. The idempotency layer in front of it makes
//! every charge happen once per `Idempotency-Key`, however often the client
//! retries, times out or sends duplicates at once.
//!
//! ```text
//! curl -s localhost:3000/charge -H 'idempotency-key: order-81' \
//!      -H 'content-type: application/json' -d '{"account":"alice","amount":30}'
//! curl -s localhost:3000/balance/alice
//! ```

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use idemgate_engine::{Engine, MemoryStore};
use idemgate_layer::{IdempotencyLayer, LayerConfig};
use serde::{Deserialize, Serialize};

/// Credits every new account starts with.
pub const OPENING_BALANCE: i64 = 100;

/// Balances and the ledger of charges.
#[derive(Debug, Default)]
pub struct Ledger {
    /// Balance per account (absent: [`OPENING_BALANCE`]).
    pub balances: HashMap<String, i64>,
    /// One row per charge applied.
    pub rows: Vec<Receipt>,
}

/// The shared ledger. A std `Mutex`: no lock is held across an `.await`.
pub type SharedLedger = Arc<Mutex<Ledger>>;

/// Body of `POST /charge`.
#[derive(Debug, Deserialize)]
pub struct ChargeRequest {
    /// Account to charge.
    pub account: String,
    /// Credits to deduct.
    pub amount: i64,
}

/// A ledger row, also the response of a successful charge.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Receipt {
    /// Sequence number of the row.
    pub row: usize,
    /// Account charged.
    pub account: String,
    /// Credits deducted.
    pub amount: i64,
    /// Balance after the charge.
    pub balance: i64,
}

async fn charge(State(ledger): State<SharedLedger>, Json(req): Json<ChargeRequest>) -> Response {
    if req.amount <= 0 {
        return (StatusCode::UNPROCESSABLE_ENTITY, "amount must be positive").into_response();
    }
    // A payment provider takes a while: long enough for a client to give
    // up and retry, or to send duplicates that overlap.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let mut l = ledger.lock().unwrap_or_else(PoisonError::into_inner);
    let balance = *l.balances.get(&req.account).unwrap_or(&OPENING_BALANCE);
    if balance < req.amount {
        // A 4xx is final: stored, and replayed to a retry.
        return (StatusCode::PAYMENT_REQUIRED, "insufficient credits").into_response();
    }
    let balance = balance - req.amount;
    l.balances.insert(req.account.clone(), balance);
    let receipt = Receipt {
        row: l.rows.len() + 1,
        account: req.account,
        amount: req.amount,
        balance,
    };
    l.rows.push(receipt.clone());
    (StatusCode::CREATED, Json(receipt)).into_response()
}

async fn balance(State(ledger): State<SharedLedger>, Path(account): Path<String>) -> Json<i64> {
    let l = ledger.lock().unwrap_or_else(PoisonError::into_inner);
    Json(*l.balances.get(&account).unwrap_or(&OPENING_BALANCE))
}

/// The service: `POST /charge` behind the idempotency layer (a key is
/// required), `GET /balance/{account}` unprotected.
pub fn app(engine: Engine, ledger: SharedLedger) -> Router {
    let idempotent = IdempotencyLayer::new(engine, LayerConfig::new("charges"));
    Router::new()
        .route("/charge", post(charge))
        .route("/balance/{account}", get(balance))
        .layer(idempotent)
        .with_state(ledger)
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let engine = Engine::new(Arc::new(MemoryStore::new()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    println!("credits service on http://{}", listener.local_addr()?);
    axum::serve(listener, app(engine, SharedLedger::default())).await
}
