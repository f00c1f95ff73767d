//! Execute-once in Rust: a client whose timeout is shorter
//! than the work retries, and the work still runs once.
//!
//! Run with: `cargo run -p idemgate-engine --example execute_once`
//!
//! A "generation" takes 300 ms and bills tokens; the client gives up after
//! 100 ms and retries with the same key (minted once, before the first
//! attempt). The first attempt's work is not cancelled by the client's
//! timeout — it runs in its own task, as a server's would — so the retries
//! wait for it and get its stored result instead of generating again.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use idemgate_engine::{
    ClientKey, Engine, ExecuteError, Fingerprint, MemoryStore, OnInflight, Policy, ScopedKey,
};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let engine = Engine::new(Arc::new(MemoryStore::new()))
        .with_policy(Policy::default().on_inflight(OnInflight::Wait(Duration::from_millis(80))));
    let generations = Arc::new(AtomicU64::new(0));
    let billed_tokens = Arc::new(AtomicU64::new(0));

    let request =
        serde_json::json!({"model": "m", "messages": [{"role": "user", "content": "report"}]});
    let fingerprint = Fingerprint::of_value(&request)?;
    // Minted once, before the first attempt, and carried through every retry.
    let key = ScopedKey::new("user-42", "reports", ClientKey::mint());

    let mut answer = None;
    for attempt in 1..=5 {
        let (engine, key, generations, billed) = (
            engine.clone(),
            key.clone(),
            Arc::clone(&generations),
            Arc::clone(&billed_tokens),
        );
        // The server side: runs to completion whether or not the client waits.
        let server = tokio::spawn(async move {
            engine
                .execute(&key, &fingerprint, || async move {
                    generations.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    billed.fetch_add(1_200, Ordering::SeqCst);
                    Ok::<_, std::io::Error>("a 1,200-token report".to_string())
                })
                .await
        });
        // The client side: a 100 ms timeout.
        match tokio::time::timeout(Duration::from_millis(100), server).await {
            Err(_) => println!("attempt {attempt}: client timeout, retrying with the same key"),
            Ok(Ok(Ok(done))) => {
                println!(
                    "attempt {attempt}: answer received (replayed: {})",
                    done.replayed()
                );
                answer = Some(done.value);
                break;
            }
            Ok(Ok(Err(ExecuteError::Inflight(_)))) => {
                println!("attempt {attempt}: still in flight elsewhere, retrying");
            }
            Ok(Ok(Err(e))) => return Err(e.into()),
            Ok(Err(join)) => return Err(join.into()),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let runs = generations.load(Ordering::SeqCst);
    println!(
        "answer: {answer:?}\ngenerations run: {runs}\ntokens billed: {}",
        billed_tokens.load(Ordering::SeqCst)
    );
    if runs != 1 || answer.is_none() {
        return Err(format!("expected exactly one generation and an answer, got {runs}").into());
    }
    Ok(())
}
