//! The races: many concurrent duplicates of one key, released together,
//! under each in-flight mode and across two replicas sharing a store,
//! execute the work once. The app and its harness are in
//! `support/app.rs`.
#![allow(clippy::unwrap_used)] // tests: failing loudly is their job

mod support;

use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use idemgate_engine::{MemoryStore, Store};
use idemgate_layer::OnInflight;
use support::app::{Harness, config, duplicates, event_ids};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_duplicates_under_reject_execute_once() {
    let h = Harness::start(config(OnInflight::Reject)).await;
    for round in 0..5 {
        let answers = duplicates(&[&h], "/json", &format!("race-{round}"), 32).await;
        assert_eq!(h.executions(), round + 1);
        let ok: Vec<_> = answers
            .iter()
            .filter(|a| a.status == StatusCode::CREATED)
            .collect();
        assert!(!ok.is_empty());
        assert!(ok.iter().all(|a| a.body == ok[0].body));
        assert_eq!(
            ok.iter().filter(|a| a.replayed() == Some("false")).count(),
            1
        );
        for a in &answers {
            assert!(
                a.status == StatusCode::CREATED || a.status == StatusCode::CONFLICT,
                "{}",
                a.status
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_duplicates_under_wait_execute_once_and_all_get_the_result() {
    let h = Harness::start(config(OnInflight::Wait(Duration::from_secs(30)))).await;
    for round in 0..5 {
        let answers = duplicates(&[&h], "/json", &format!("race-{round}"), 32).await;
        assert_eq!(h.executions(), round + 1);
        for a in &answers {
            assert_eq!(a.status, StatusCode::CREATED);
            assert_eq!(a.body, answers[0].body);
        }
        assert_eq!(
            answers
                .iter()
                .filter(|a| a.replayed() == Some("false"))
                .count(),
            1
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_duplicates_under_attach_execute_once_and_all_get_the_stream() {
    let h = Harness::start(config(OnInflight::Attach(Duration::from_secs(30)))).await;
    for round in 0..5 {
        let answers = duplicates(&[&h], "/sse", &format!("race-{round}"), 32).await;
        assert_eq!(h.executions(), 2 * round + 1);
        for a in &answers {
            assert_eq!(a.status, StatusCode::OK);
            assert_eq!(a.body, answers[0].body);
        }
        assert_eq!(event_ids(&answers[0].body), (1..=8).collect::<Vec<_>>());
        let json = duplicates(&[&h], "/json", &format!("json-race-{round}"), 32).await;
        assert_eq!(h.executions(), 2 * round + 2);
        assert!(
            json.iter()
                .all(|a| a.status == StatusCode::CREATED && a.body == json[0].body)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_duplicates_across_two_replicas_execute_once() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let mode = config(OnInflight::Attach(Duration::from_secs(30)));
    let a = Harness::start_with(Arc::clone(&store), mode.clone()).await;
    let b = Harness::start_with(store, mode).await;
    for round in 0..5 {
        let answers = duplicates(&[&a, &b], "/sse", &format!("multi-{round}"), 32).await;
        assert_eq!(a.executions() + b.executions(), round + 1);
        for ans in &answers {
            assert_eq!(ans.status, StatusCode::OK);
            assert_eq!(ans.body, answers[0].body);
        }
    }
}
