//! The fault proxy itself, against small echo servers: each control does
//! what it says, deterministically.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use idemgate_testkit::fault::{CHUNK, Direction, FaultProxy, Stats};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A server on a free port: `run` is spawned with its listener. Its
/// address; it stops when the runtime does.
async fn server<Fut>(run: impl FnOnce(TcpListener) -> Fut) -> SocketAddr
where
    Fut: Future<Output = ()> + Send + 'static,
{
    let listener = TcpListener::bind(("127.0.0.1", 0))
        .await
        .expect("bind a server");
    let addr = listener.local_addr().expect("server addr");
    tokio::spawn(run(listener));
    addr
}

/// An echo server on a free port; it stops when the runtime does.
async fn echo() -> SocketAddr {
    server(|listener| async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    })
    .await
}

/// Asserts that the connection `s` was closed or aborted: a read gets the
/// end of the stream or an error.
async fn assert_closed(s: &mut TcpStream) {
    let mut buf = [0u8; 8];
    assert!(matches!(s.read(&mut buf).await, Ok(0) | Err(_)));
}

async fn proxy() -> FaultProxy {
    FaultProxy::start(echo().await).await.expect("start proxy")
}

async fn connect(p: &FaultProxy) -> TcpStream {
    TcpStream::connect(p.addr())
        .await
        .expect("connect to proxy")
}

async fn roundtrip(s: &mut TcpStream, msg: &[u8]) {
    s.write_all(msg).await.expect("write");
    let mut got = vec![0; msg.len()];
    s.read_exact(&mut got).await.expect("read echo");
    assert_eq!(got, msg);
}

/// A connection through `p`, checked with a round trip of `msg`.
async fn connected(p: &FaultProxy, msg: &[u8]) -> TcpStream {
    let mut s = connect(p).await;
    roundtrip(&mut s, msg).await;
    s
}

/// Whether a read on `s` gets nothing within 200 ms (the connection is
/// open but silent).
async fn silent(s: &mut TcpStream) -> bool {
    let mut b = [0u8; 1];
    tokio::time::timeout(Duration::from_millis(200), s.read(&mut b))
        .await
        .is_err()
}

async fn until(mut ok: impl FnMut() -> bool) {
    for _ in 0..500 {
        if ok() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("condition not reached in 5 s");
}

#[tokio::test]
async fn forwards_both_ways_and_counts() {
    let p = proxy().await;
    let mut s = connected(&p, b"hello").await;
    let big = vec![7u8; 3 * CHUNK + 5];
    roundtrip(&mut s, &big).await;
    let total = 5 + big.len() as u64;
    let expected = Stats {
        accepted: 1,
        refused: 0,
        live: 1,
        bytes_to_server: total,
        bytes_to_client: total,
        replies_dropped: 0,
    };
    // Counters move once a write returns, which may be just after the
    // peer has read the bytes.
    until(|| p.stats() == expected).await;
    drop(s);
    until(|| p.stats().live == 0).await;
}

#[tokio::test]
async fn half_close_is_passed_on() {
    let p = proxy().await;
    let mut s = connect(&p).await;
    s.write_all(b"bye").await.unwrap();
    s.shutdown().await.unwrap();
    let mut got = Vec::new();
    s.read_to_end(&mut got).await.unwrap();
    assert_eq!(got, b"bye");
}

#[tokio::test]
async fn cut_closes_live_connections_with_fin() {
    let p = proxy().await;
    let mut a = connect(&p).await;
    let mut b = connect(&p).await;
    roundtrip(&mut a, b"a").await;
    roundtrip(&mut b, b"b").await;
    assert_eq!(p.cut().await, 2);
    assert_eq!(p.stats().live, 0);
    let mut buf = [0u8; 1];
    assert_eq!(a.read(&mut buf).await.unwrap(), 0, "FIN, not an error");
    assert_eq!(b.read(&mut buf).await.unwrap(), 0);
    // New connections work at once.
    let _c = connected(&p, b"c").await;
    assert_eq!(p.cut().await, 1);
    assert_eq!(p.cut().await, 0);
}

#[tokio::test]
async fn reset_aborts_live_connections_with_rst() {
    let p = proxy().await;
    let mut a = connected(&p, b"a").await;
    assert_eq!(p.reset().await, 1);
    let mut buf = [0u8; 1];
    let err = a.read(&mut buf).await.expect_err("RST");
    assert_eq!(err.kind(), io::ErrorKind::ConnectionReset);
    let _b = connected(&p, b"b").await;
}

#[tokio::test]
async fn refusing_accepts_and_closes_new_connections_only() {
    let p = proxy().await;
    let mut live = connect(&p).await;
    // Accepted by the proxy (not just by the kernel) once it forwards.
    roundtrip(&mut live, b"open").await;
    p.set_refusing(true);
    assert!(p.is_refusing());
    let mut refused = connect(&p).await;
    // Closed at once; a write racing the close may turn it into a reset.
    let _ = refused.write_all(b"x").await;
    assert_closed(&mut refused).await;
    roundtrip(&mut live, b"still here").await;
    p.set_refusing(false);
    let _again = connected(&p, b"back").await;
    let st = p.stats();
    assert_eq!((st.accepted, st.refused, st.live), (3, 1, 2));
}

#[tokio::test]
async fn refuse_for_ends_by_itself_or_when_told() {
    let p = proxy().await;
    p.refuse_for(Duration::from_secs(3600));
    assert!(p.is_refusing());
    p.set_refusing(false);
    assert!(!p.is_refusing());
    p.refuse_for(Duration::from_millis(100));
    assert!(p.is_refusing());
    until(|| !p.is_refusing()).await;
    let _s = connected(&p, b"ok").await;
}

#[tokio::test]
async fn stall_holds_bytes_without_closing() {
    let p = proxy().await;
    let mut s = connected(&p, b"before").await;
    until(|| p.stats().bytes_to_server == 6).await;
    p.stall(true);
    s.write_all(b"held").await.unwrap();
    assert!(silent(&mut s).await, "bytes went through a stall");
    assert_eq!(p.stats().bytes_to_server, 6);
    assert_eq!(p.stats().live, 1);
    p.stall(false);
    let mut got = [0u8; 4];
    s.read_exact(&mut got).await.unwrap();
    assert_eq!(&got, b"held");
}

#[tokio::test]
async fn stalled_replies_then_cut_lose_the_reply_only() {
    let p = proxy().await;
    let mut s = connect(&p).await;
    p.stall_direction(Direction::ToClient, true);
    s.write_all(b"request").await.unwrap();
    // The request reaches the server; its echo is held.
    until(|| p.stats().bytes_to_server == 7).await;
    assert!(silent(&mut s).await);
    assert_eq!(p.cut().await, 1);
    assert_closed(&mut s).await;
    assert_eq!(p.stats().bytes_to_client, 0);
    p.stall(false);
    let _s = connected(&p, b"next").await;
}

#[tokio::test]
async fn stall_from_next_request_spares_earlier_replies() {
    // A server whose reply to each byte ends 100 ms after it starts: the
    // tail of a reply is still in flight when the client has its head.
    let (got_tx, mut got) = tokio::sync::mpsc::unbounded_channel();
    let server = server(|listener| async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut b = [0u8; 1];
        while s.read_exact(&mut b).await.is_ok() {
            got_tx.send(b[0]).unwrap();
            s.write_all(b"head").await.unwrap();
            tokio::time::sleep(Duration::from_millis(100)).await;
            s.write_all(b"tail").await.unwrap();
        }
    })
    .await;
    let p = FaultProxy::start(server).await.unwrap();
    let mut c = connect(&p).await;
    c.write_all(b"1").await.unwrap();
    let mut head = [0u8; 4];
    c.read_exact(&mut head).await.unwrap();
    p.stall_replies_from_next_request();
    // The tail of the earlier reply still gets through…
    let mut tail = [0u8; 4];
    c.read_exact(&mut tail).await.unwrap();
    assert_eq!(&tail, b"tail");
    // …the next request reaches the server, and its reply is held.
    c.write_all(b"2").await.unwrap();
    assert_eq!(got.recv().await, Some(b'1'));
    assert_eq!(got.recv().await, Some(b'2'));
    assert!(silent(&mut c).await);
    assert_eq!(p.cut().await, 1);
    assert_closed(&mut c).await;
    assert_eq!(p.stats().bytes_to_client, 8);
}

#[tokio::test]
async fn freeze_live_spares_new_connections() {
    let p = proxy().await;
    let mut old = connected(&p, b"x").await;
    assert_eq!(p.freeze_live(), 1);
    old.write_all(b"y").await.unwrap();
    assert!(silent(&mut old).await);
    let _new = connected(&p, b"fresh").await;
    p.heal();
    assert!(
        silent(&mut old).await,
        "heal does not thaw a frozen connection"
    );
    assert_eq!(p.cut().await, 2);
}

#[tokio::test]
async fn delay_adds_latency_per_chunk() {
    let p = proxy().await;
    let mut s = connect(&p).await;
    p.delay(Duration::from_millis(100));
    let t = Instant::now();
    roundtrip(&mut s, b"slow").await;
    // Two chunks (there and back), each delayed: a lower bound only.
    assert!(t.elapsed() >= Duration::from_millis(200));
    p.delay(Duration::ZERO);
    roundtrip(&mut s, b"fast").await;
}

#[tokio::test]
async fn a_dropped_reply_reaches_the_server_and_aborts_only_its_connection() {
    // A server that records every byte it is sent, and echoes it.
    let (got_tx, mut got) = tokio::sync::mpsc::unbounded_channel();
    let server = server(|listener| async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let got_tx = got_tx.clone();
            tokio::spawn(async move {
                let mut b = [0u8; 1];
                while s.read_exact(&mut b).await.is_ok() {
                    got_tx.send(b[0]).unwrap();
                    if s.write_all(&b).await.is_err() {
                        return;
                    }
                }
            });
        }
    })
    .await;
    let p = FaultProxy::start(server).await.unwrap();
    let mut doomed = connected(&p, b"a").await;
    assert_eq!(got.recv().await, Some(b'a'));
    let mut other = connected(&p, b"b").await;
    assert_eq!(got.recv().await, Some(b'b'));
    p.drop_next_reply();
    doomed.write_all(b"c").await.unwrap();
    // The server applied it…
    assert_eq!(got.recv().await, Some(b'c'));
    // …and its answer never comes: the connection is aborted.
    assert_closed(&mut doomed).await;
    until(|| p.stats().replies_dropped == 1).await;
    // One shot: the other connection, and a new one, still work.
    roundtrip(&mut other, b"d").await;
    let _fresh = connected(&p, b"e").await;
    assert_eq!(p.stats().replies_dropped, 1);
}

#[tokio::test]
async fn heal_disarms_a_dropped_reply() {
    let p = proxy().await;
    p.drop_next_reply();
    p.heal();
    let _s = connected(&p, b"kept").await;
    assert_eq!(p.stats().replies_dropped, 0);
}

#[tokio::test]
async fn retarget_moves_new_connections_only() {
    // Two servers that greet with their name.
    async fn greeter(name: &'static [u8]) -> SocketAddr {
        server(|listener| async move {
            while let Ok((mut s, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let _ = s.write_all(name).await;
                    let mut b = [0u8; 1];
                    let _ = s.read(&mut b).await;
                });
            }
        })
        .await
    }
    let first = greeter(b"one").await;
    let second = greeter(b"two").await;
    let p = FaultProxy::start(first).await.unwrap();
    let greeting = |mut s: TcpStream| async move {
        let mut b = [0u8; 3];
        s.read_exact(&mut b).await.unwrap();
        (s, b)
    };
    let (old, b) = greeting(connect(&p).await).await;
    assert_eq!(&b, b"one");
    p.retarget(second);
    assert_eq!(p.target(), second);
    let (_new, b) = greeting(connect(&p).await).await;
    assert_eq!(&b, b"two");
    // The live connection still reaches the first server until reset.
    assert_eq!(p.stats().live, 2);
    assert_eq!(p.reset().await, 2);
    drop(old);
}

#[tokio::test]
async fn target_down_closes_the_client() {
    let port = TcpListener::bind(("127.0.0.1", 0))
        .await
        .unwrap()
        .local_addr()
        .unwrap();
    // The listener is dropped: nothing listens on `port` any more.
    let p = FaultProxy::start(port).await.unwrap();
    let mut s = connect(&p).await;
    assert_closed(&mut s).await;
    until(|| p.stats().live == 0).await;
}

#[tokio::test]
async fn drop_stops_everything() {
    let p = proxy().await;
    let addr = p.addr();
    let mut s = connected(&p, b"x").await;
    p.stall(true);
    drop(p);
    assert_closed(&mut s).await;
    let mut refused = false;
    for _ in 0..500 {
        if TcpStream::connect(addr).await.is_err() {
            refused = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(refused, "the listener outlived the proxy");
}
