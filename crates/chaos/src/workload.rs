//! The clients: random requests over a small pool of keys, so that
//! duplicates meet across replicas, tenants and routes; each request and
//! what it got is recorded as an [`Op`].
//!
//! A key always carries the same request (the same body, JSON or a
//! stream), as a retry does; a few requests send another body under a
//! used key (a client bug the gateway must refuse). Generation lengths,
//! client timeouts shorter than them, upstream cuts (`x-sim-fail`),
//! `Last-Event-ID` resumptions of broken streams and operator forgets are
//! mixed in at random, from the run's seed.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use rand::Rng;
use rand::rngs::StdRng;
use sha2::{Digest, Sha256};

use crate::history::{Answer, EventSeen, Forget, KeyId, Op, now_ms};
use crate::routes::{ADMIN_TOKEN, Route};

/// Requests between two slides of the key pool.
const SLIDE: usize = 100;

/// Tenants of a run (their credentials).
const TENANTS: [&str; 2] = ["Bearer tenant-a", "Bearer tenant-b"];

/// What every client task shares: where the replicas are, the key pool,
/// and the history being recorded.
#[derive(Debug)]
pub struct Workload {
    /// Client ports of the replicas, by index.
    ports: Vec<u16>,
    /// Admin ports of the replicas, by index.
    admin_ports: Vec<u16>,
    /// Every key a request may address (before the pool slides).
    keys: Vec<KeyId>,
    /// Keys per route and tenant at any time.
    keys_per_route: usize,
    /// The share of requests that ask the upstream to cut its answer.
    upstream_cuts: f64,
    client: reqwest::Client,
    next_id: AtomicU64,
    /// Held only to push, never across an `.await`.
    ops: Mutex<Vec<Op>>,
    /// Held only to push, never across an `.await`.
    forgets: Mutex<Vec<Forget>>,
}

/// One request to send.
#[derive(Clone, Debug)]
pub struct Request {
    /// The record addressed.
    pub key: KeyId,
    /// Another body than the key's own.
    pub variant: bool,
    /// Which replica.
    pub replica: usize,
    /// `Last-Event-ID` (the run and the event number) and the request it
    /// resumes.
    pub resume: Option<(Option<u64>, u64, u64)>,
    /// `x-sim-fail`.
    pub upstream_fault: Option<String>,
    /// The client's timeout.
    pub timeout: Duration,
    /// Sent after the faults stopped.
    pub final_read: bool,
}

impl Workload {
    /// A workload over `keys_per_route` keys on each route and tenant, a
    /// share `upstream_cuts` of whose requests ask the upstream to cut its
    /// answer after a few tokens (or bytes).
    ///
    /// # Errors
    /// The HTTP client cannot be built.
    pub fn new(
        ports: Vec<u16>,
        admin_ports: Vec<u16>,
        routes: &[Route],
        keys_per_route: usize,
        upstream_cuts: f64,
    ) -> Result<Self, reqwest::Error> {
        let mut keys = Vec::new();
        for route in routes {
            for credential in TENANTS {
                for k in 0..keys_per_route {
                    keys.push(KeyId {
                        credential: credential.to_owned(),
                        route: route.name.clone(),
                        key: format!("k{k}"),
                    });
                }
            }
        }
        Ok(Self {
            ports,
            admin_ports,
            keys,
            keys_per_route,
            upstream_cuts: upstream_cuts.clamp(0.0, 1.0),
            client: reqwest::Client::builder()
                .pool_max_idle_per_host(4)
                .build()?,
            next_id: AtomicU64::new(1),
            ops: Mutex::new(Vec::new()),
            forgets: Mutex::new(Vec::new()),
        })
    }

    /// Requests sent so far.
    pub fn op_count(&self) -> usize {
        self.ops
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// The recorded requests and forgets, taken out.
    pub fn take(&self) -> (Vec<Op>, Vec<Forget>) {
        let mut ops = std::mem::take(&mut *self.ops.lock().unwrap_or_else(PoisonError::into_inner));
        ops.sort_by_key(|o| o.id);
        let forgets =
            std::mem::take(&mut *self.forgets.lock().unwrap_or_else(PoisonError::into_inner));
        (ops, forgets)
    }

    /// Every key some request addressed, in order.
    pub fn touched(&self) -> Vec<KeyId> {
        let ops = self.ops.lock().unwrap_or_else(PoisonError::into_inner);
        let set: BTreeSet<&KeyId> = ops.iter().map(|o| &o.key).collect();
        set.into_iter().cloned().collect()
    }

    /// One random step of a client: a request (perhaps resumed once if
    /// its stream broke), or now and then an operator forget.
    pub async fn step(&self, rng: &mut StdRng) {
        let replica = rng.random_range(0..self.ports.len());
        let mut key = self.keys[rng.random_range(0..self.keys.len())].clone();
        // The pool slides: every `SLIDE` requests, one key of each route
        // and tenant is retired and a fresh one comes in, so that fresh
        // keys (first executions, races between first duplicates) keep
        // coming all run long while each key still sees duplicates.
        let window = self.op_count() / SLIDE;
        let index: usize = key.key.trim_start_matches('k').parse().unwrap_or(0);
        let per_route = self.keys_per_route.max(1);
        let slot = (index + per_route - window % per_route) % per_route;
        key.key = format!("k{}", window + slot);
        if rng.random_bool(0.01) {
            self.forget(&key, replica).await;
            return;
        }
        let timeout = if rng.random_bool(0.3) {
            Duration::from_millis(rng.random_range(300..3_000))
        } else {
            Duration::from_secs(15)
        };
        let upstream_fault = rng
            .random_bool(self.upstream_cuts)
            .then(|| format!("reset-after:{}", rng.random_range(1..5)));
        let req = Request {
            key,
            variant: rng.random_bool(0.03),
            replica,
            resume: None,
            upstream_fault,
            timeout,
            final_read: false,
        };
        let op = self.send(&req).await;
        let last = op.answer.events.iter().rfind(|e| e.id.is_some());
        if let Some(last) = last
            && let Some(n) = last.id
            && op.answer.status == Some(200)
            && !op.answer.complete
            && rng.random_bool(0.5)
        {
            let resume = Request {
                replica: rng.random_range(0..self.ports.len()),
                resume: Some((last.run, n, op.id)),
                upstream_fault: None,
                timeout: Duration::from_secs(15),
                ..req
            };
            self.send(&resume).await;
        }
    }

    /// Whether `key` asks for a stream (half the keys do).
    pub fn streams(key: &KeyId) -> bool {
        digest(&key.key)[0].is_multiple_of(2)
    }

    /// Sends `req`, reads the whole answer (or as much as comes before the
    /// client's timeout or a cut), records it and returns it.
    pub async fn send(&self, req: &Request) -> Op {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let stream = Self::streams(&req.key);
        let content = format!(
            "chaos {} {}{}",
            req.key.route,
            req.key.key,
            if req.variant {
                " (another request)"
            } else {
                ""
            }
        );
        let body = serde_json::json!({
            "model": "sim-1",
            "stream": stream,
            "messages": [{"role": "user", "content": content}],
        })
        .to_string();
        let h = digest(&format!("{}{}", req.key.route, req.key.key));
        let mut http = self
            .client
            .post(format!(
                "http://127.0.0.1:{}/{}/v1/chat/completions",
                self.ports[req.replica], req.key.route
            ))
            .timeout(req.timeout)
            .header("content-type", "application/json")
            .header("authorization", &req.key.credential)
            .header("idempotency-key", &req.key.key)
            .header(idemgate_llm_sim::TAG_HEADER, id.to_string());
        http = if stream {
            http.header(idemgate_llm_sim::TOKENS_HEADER, (5 + h[1] % 25).to_string())
                .header(
                    idemgate_llm_sim::TOKEN_INTERVAL_HEADER,
                    (20 + h[2] % 60).to_string(),
                )
        } else {
            let latency = 100 + u64::from(u16::from_be_bytes([h[1], h[2]])) % 2_500;
            http.header(idemgate_llm_sim::LATENCY_HEADER, latency.to_string())
        };
        if let Some((run, last, _)) = req.resume {
            let id = match run {
                Some(run) => format!("{run}-{last}"),
                None => last.to_string(),
            };
            http = http.header("last-event-id", id);
        }
        if let Some(fault) = &req.upstream_fault {
            http = http.header(idemgate_llm_sim::FAIL_HEADER, fault);
        }
        let body_sha256 = hex::encode(Sha256::digest(body.as_bytes()));
        let invoke_ms = now_ms();
        let answer = read(http.body(body)).await;
        let op = Op {
            id,
            key: req.key.clone(),
            body_sha256,
            stream,
            replica: req.replica,
            last_event_id: req.resume.map(|(_, last, _)| last),
            last_event_run: req.resume.and_then(|(run, _, _)| run),
            resumes: req.resume.map(|(_, _, prev)| prev),
            upstream_fault: req.upstream_fault.clone(),
            timeout_ms: u64::try_from(req.timeout.as_millis()).unwrap_or(u64::MAX),
            invoke_ms,
            complete_ms: now_ms(),
            answer,
            final_read: req.final_read,
        };
        self.ops
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(op.clone());
        op
    }

    /// An operator forgets `key` through `replica`'s admin listener.
    async fn forget(&self, key: &KeyId, replica: usize) {
        let invoke_ms = now_ms();
        let status = self
            .client
            .delete(format!(
                "http://127.0.0.1:{}/admin/keys/{}?namespace={}",
                self.admin_ports[replica], key.key, key.route
            ))
            .timeout(Duration::from_secs(10))
            .header("authorization", format!("Bearer {ADMIN_TOKEN}"))
            .header("x-idemgate-credential", &key.credential)
            .send()
            .await
            .ok()
            .map(|r| r.status().as_u16());
        self.forgets
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Forget {
                key: key.clone(),
                replica,
                invoke_ms,
                complete_ms: now_ms(),
                status,
            });
    }

    /// Reads `key` until it is answered (a final answer, or the refusal of
    /// a key another body holds) or `deadline_ms` passes: the final reads
    /// that judge I6, I5 and I1 once the faults have stopped.
    pub async fn settle(&self, key: &KeyId, deadline_ms: u64) {
        let mut replica = digest(&key.key)[3] as usize % self.ports.len();
        loop {
            let req = Request {
                key: key.clone(),
                variant: false,
                replica,
                resume: None,
                upstream_fault: None,
                timeout: Duration::from_secs(20),
                final_read: true,
            };
            let op = self.send(&req).await;
            let answered = op.answer.is_final()
                || (op.answer.complete && op.answer.problem.as_deref() == Some("key-mismatch"));
            if answered || now_ms() > deadline_ms {
                return;
            }
            replica = (replica + 1) % self.ports.len();
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }
}

fn digest(s: &str) -> [u8; 32] {
    Sha256::digest(s.as_bytes()).into()
}

/// Sends a request and reads its answer.
async fn read(req: reqwest::RequestBuilder) -> Answer {
    let mut res = match req.send().await {
        Ok(res) => res,
        Err(e) => {
            return Answer {
                error: Some(describe(&e)),
                body_sha256: hex::encode(Sha256::digest(b"")),
                ..Answer::default()
            };
        }
    };
    let status = res.status().as_u16();
    let headers = res.headers().clone();
    let mut body = Vec::new();
    let mut error = None;
    loop {
        match res.chunk().await {
            Ok(Some(chunk)) => body.extend_from_slice(&chunk),
            Ok(None) => break,
            Err(e) => {
                error = Some(describe(&e));
                break;
            }
        }
    }
    let replayed = headers
        .get("idempotent-replayed")
        .and_then(|v| v.to_str().ok())
        .map(|v| v == "true");
    let stored = headers
        .get("idempotent-stored")
        .and_then(|v| v.to_str().ok())
        .map(|v| v == "true");
    let is_problem = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/problem+json"));
    let problem = is_problem
        .then(|| serde_json::from_slice::<serde_json::Value>(&body).ok())
        .flatten()
        .and_then(|v| {
            v.get("type")
                .and_then(|t| t.as_str())
                .and_then(|t| t.rsplit('/').next())
                .map(str::to_owned)
        });
    let is_stream = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    Answer {
        status: Some(status),
        replayed,
        stored,
        problem,
        complete: error.is_none(),
        body_sha256: hex::encode(Sha256::digest(&body)),
        executions: executions_named(&body),
        events: if is_stream { events(&body) } else { Vec::new() },
        restarted: headers
            .get("idempotent-stream-restarted")
            .is_some_and(|v| v.as_bytes() == b"true"),
        error,
    }
}

fn describe(e: &reqwest::Error) -> String {
    if e.is_timeout() {
        "client timeout".to_owned()
    } else if e.is_connect() {
        "connect failed".to_owned()
    } else {
        format!("broken: {e}")
    }
}

/// The upstream executions `bytes` names (`chatcmpl-N`), in order, once
/// each.
pub fn executions_named(bytes: &[u8]) -> Vec<u64> {
    const MARK: &[u8] = b"chatcmpl-";
    let mut found = Vec::new();
    let mut i = 0;
    while let Some(at) = bytes
        .get(i..)
        .and_then(|rest| rest.windows(MARK.len()).position(|w| w == MARK))
    {
        let start = i + at + MARK.len();
        let digits = bytes
            .get(start..)
            .unwrap_or_default()
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .count();
        if let Some(n) = bytes
            .get(start..start + digits)
            .and_then(|d| std::str::from_utf8(d).ok())
            .and_then(|d| d.parse::<u64>().ok())
            && !found.contains(&n)
        {
            found.push(n);
        }
        i = start + digits;
    }
    found
}

/// The complete events of a stream's bytes (an unfinished last event is
/// not one).
pub fn events(bytes: &[u8]) -> Vec<EventSeen> {
    let text = String::from_utf8_lossy(bytes);
    let mut out = Vec::new();
    let mut rest: &str = &text;
    while let Some(end) = rest.find("\n\n") {
        let block = &rest[..end + 2];
        rest = &rest[end + 2..];
        if block.trim().is_empty() {
            continue;
        }
        let (run, id) = block
            .lines()
            .find_map(|l| l.strip_prefix("id:"))
            .map(|v| match v.trim().split_once('-') {
                Some((run, n)) => (run.parse().ok(), n.parse().ok()),
                None => (None, v.trim().parse().ok()),
            })
            .unwrap_or((None, None));
        out.push(EventSeen {
            id,
            run,
            sha256: hex::encode(Sha256::digest(block.as_bytes())),
            execution: executions_named(block.as_bytes()).first().copied(),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn executions_and_events_are_read_from_a_stream() {
        let body = b"id: 9-1\ndata: {\"id\":\"chatcmpl-12\",\"x\":1}\n\nid: 9-2\ndata: {\"id\":\"chatcmpl-12\"}\n\nid: 9-3\ndata: [DONE]\n\nid: 9-4\ndata: {\"id\":\"chatcmpl-13";
        assert_eq!(executions_named(body), vec![12, 13]);
        let evs = events(body);
        assert_eq!(
            evs.iter().map(|e| e.id).collect::<Vec<_>>(),
            vec![Some(1), Some(2), Some(3)]
        );
        assert!(evs.iter().all(|e| e.run == Some(9)), "{evs:?}");
        assert_eq!(evs[0].execution, Some(12));
        assert_eq!(evs[2].execution, None);
    }
}
