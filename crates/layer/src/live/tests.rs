//! Unit tests of the parent module.

use super::*;

fn deadline() -> Instant {
    Instant::now() + Duration::from_secs(5)
}

#[tokio::test]
async fn subscriber_sees_events_so_far_then_live_ones_then_the_end() {
    let reg = LiveRegistry::default();
    let p = Box::new(reg.publish("k".into(), 1));
    p.streaming(StatusCode::OK, HeaderMap::new());
    p.event(Bytes::from_static(b"a"));
    p.event(Bytes::from_static(b"b"));
    let Head::Streaming { mut follow, .. } = reg.get("k", 1).unwrap().head(deadline()).await else {
        panic!("expected a stream");
    };
    let mut cursor = 1;
    assert_eq!(
        follow.next(&mut cursor).await,
        Next::Events(Bytes::from_static(b"b"))
    );
    let waiter = tokio::spawn(async move {
        let mut got = Vec::new();
        loop {
            match follow.next(&mut cursor).await {
                Next::Events(b) => got.push(b),
                other => return (got, other),
            }
        }
    });
    p.event(Bytes::from_static(b"c"));
    p.complete();
    let (got, end) = waiter.await.unwrap();
    assert_eq!(got.concat(), b"c");
    assert_eq!(end, Next::End);
    assert!(reg.get("k", 1).is_none());
    assert_eq!(reg.len(), 0);
}

#[tokio::test]
async fn a_dropped_publisher_fails_its_subscribers_and_leaves() {
    let reg = LiveRegistry::default();
    let p = Box::new(reg.publish("k".into(), 1));
    p.streaming(StatusCode::OK, HeaderMap::new());
    let Head::Streaming { mut follow, .. } = reg.get("k", 1).unwrap().head(deadline()).await else {
        panic!("expected a stream");
    };
    drop(p);
    let mut cursor = 0;
    assert_eq!(follow.next(&mut cursor).await, Next::Failed);
    assert!(reg.get("k", 1).is_none());
}

#[tokio::test]
async fn non_streaming_and_failed_heads() {
    let reg = LiveRegistry::default();
    let p = Box::new(reg.publish("a".into(), 1));
    let sub = reg.get("a", 1).unwrap();
    p.not_streaming();
    assert!(matches!(sub.head(deadline()).await, Head::NotStreaming));
    let q = Box::new(reg.publish("b".into(), 1));
    let sub = reg.get("b", 1).unwrap();
    q.fail();
    assert!(matches!(sub.head(deadline()).await, Head::Gone));
    let _r = Box::new(reg.publish("c".into(), 1));
    let sub = reg.get("c", 1).unwrap();
    let soon = Instant::now() + Duration::from_millis(10);
    assert!(matches!(sub.head(soon).await, Head::Gone));
}

#[tokio::test]
async fn a_replaced_entry_is_not_removed_by_the_old_publisher() {
    let reg = LiveRegistry::default();
    let old = Box::new(reg.publish("k".into(), 1));
    let new = Box::new(reg.publish("k".into(), 2));
    old.fail();
    assert!(reg.get("k", 2).is_some());
    new.complete();
    assert!(reg.get("k", 2).is_none());
}

#[tokio::test]
async fn a_duplicate_joins_only_the_owner_holding_the_current_fence() {
    let reg = LiveRegistry::default();
    // The owner whose lease was taken over (fence 1) is still relaying
    // here; the record is PENDING under fence 2, run elsewhere.
    let stale = Box::new(reg.publish("k".into(), 1));
    stale.streaming(StatusCode::OK, HeaderMap::new());
    assert!(reg.get("k", 2).is_none(), "joined a stale owner's stream");
    assert!(reg.get("k", 1).is_some());
    // The new owner runs here too: its stream replaces the stale one,
    // and a stale owner starting late does not replace it back.
    let current = Box::new(reg.publish("k".into(), 2));
    let late = Box::new(reg.publish("k".into(), 1));
    assert!(reg.get("k", 1).is_none());
    assert!(reg.get("k", 2).is_some());
    late.fail();
    stale.fail();
    assert!(
        reg.get("k", 2).is_some(),
        "a stale owner removed the current stream"
    );
    current.complete();
    assert!(reg.get("k", 2).is_none());
}
