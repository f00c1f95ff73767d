//! A fault-injecting TCP proxy for tests: [`FaultProxy`].
//!
//! Put it between a store client and its server (Redis, PostgreSQL, …) by
//! pointing the store's URL at [`FaultProxy::addr`] instead of the server.
//! Bytes are forwarded unchanged until the test injects a fault, at any
//! moment and from any task:
//!
//! - [`cut`](FaultProxy::cut): close every live connection now (FIN), as a
//!   server closing its sockets would;
//! - [`reset`](FaultProxy::reset): abort every live connection now (RST,
//!   `SO_LINGER` 0), as a crashed host or a middlebox would;
//! - [`set_refusing`](FaultProxy::set_refusing) /
//!   [`refuse_for`](FaultProxy::refuse_for): new connections are accepted and
//!   closed at once, as by a restarting server (live ones are untouched: add a
//!   `cut` to model the restart itself);
//! - [`stall`](FaultProxy::stall) / [`stall_direction`](FaultProxy::stall_direction):
//!   stop forwarding bytes, in both or one direction, without closing
//!   anything — a frozen peer. Stalling only the replies
//!   ([`Direction::ToClient`]) lets requests reach the server while their
//!   answers are held;
//! - [`stall_replies_from_next_request`](FaultProxy::stall_replies_from_next_request):
//!   let the next request through and hold everything after it from the
//!   server — with a `cut`, the deterministic way to lose exactly one reply
//!   even when the previous reply's last bytes are still in flight;
//! - [`freeze_live`](FaultProxy::freeze_live): stall only the connections
//!   open now, while new ones work — a black-holed connection (lost NAT or
//!   firewall state) next to a healthy server;
//! - [`delay`](FaultProxy::delay): added latency before each forwarded chunk;
//! - [`stats`](FaultProxy::stats): connections accepted and refused, live
//!   connections, bytes forwarded each way.
//!
//! The controls are deterministic: `cut` and `reset` return once the sockets
//! of the connections live at the call are closed; a stall holds every
//! chunk whose forwarding has not begun when it is set (bytes already
//! forwarded stay forwarded), and bytes held are discarded if the
//! connection is then cut.
//! There is no global state: each proxy has its own listener, counters and
//! tasks, and dropping it stops them all and closes its connections.
//!
//! ```no_run
//! # async fn demo() -> std::io::Result<()> {
//! use idemgate_testkit::fault::FaultProxy;
//! let proxy = FaultProxy::start("127.0.0.1:6379".parse().expect("an address")).await?;
//! let url = format!("redis://{}", proxy.addr());
//! // … open the store on `url`, claim …
//! proxy.cut().await; // the claim's connection is gone
//! # let _ = url; Ok(()) }
//! ```

#![deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{ReadHalf, WriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

/// Size of one forwarded chunk (the unit of [`FaultProxy::delay`]).
const CHUNK: usize = 16 * 1024;

/// A direction of traffic through the proxy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Direction {
    /// From the client (the store) to the server: requests.
    ToServer,
    /// From the server to the client: replies.
    ToClient,
}

impl Direction {
    fn index(self) -> usize {
        match self {
            Self::ToServer => 0,
            Self::ToClient => 1,
        }
    }
}

/// A snapshot of a proxy's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Connections accepted, refused ones included.
    pub accepted: u64,
    /// Connections accepted and closed at once while refusing.
    pub refused: u64,
    /// Connections open now (forwarding, stalled or connecting upstream).
    pub live: usize,
    /// Bytes forwarded from clients to the server.
    pub bytes_to_server: u64,
    /// Bytes forwarded from the server to clients.
    pub bytes_to_client: u64,
}

/// How a connection is ended on request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Close {
    /// FIN: shut down both sockets, then close them.
    Fin,
    /// RST: `SO_LINGER` 0, then close.
    Rst,
}

/// A request to end one connection; `ack` fires once its sockets are closed.
#[derive(Debug)]
struct Kill {
    how: Close,
    ack: oneshot::Sender<()>,
}

/// The proxy's handle on one live connection.
#[derive(Debug)]
struct ConnCtl {
    kill: oneshot::Sender<Kill>,
    frozen: watch::Sender<bool>,
}

/// State shared by the proxy handle and its tasks.
#[derive(Debug)]
struct Shared {
    target: SocketAddr,
    refusing: Mutex<Refusing>,
    /// Stall flag per [`Direction::index`].
    stall: [watch::Sender<bool>; 2],
    delay_ns: AtomicU64,
    /// Set by [`FaultProxy::stall_replies_from_next_request`].
    stall_replies_armed: AtomicBool,
    conns: Mutex<HashMap<u64, ConnCtl>>,
    next_id: AtomicU64,
    accepted: AtomicU64,
    refused: AtomicU64,
    bytes: [AtomicU64; 2],
}

#[derive(Debug, Default)]
struct Refusing {
    on: bool,
    until: Option<Instant>,
}

/// Locks `m`, ignoring poisoning: the guarded data stays consistent because
/// no code panics while holding one of these locks.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Shared {
    fn refusing(&self) -> bool {
        let r = lock(&self.refusing);
        r.on || r.until.is_some_and(|until| Instant::now() < until)
    }

    fn delay(&self) -> Duration {
        Duration::from_nanos(self.delay_ns.load(Ordering::SeqCst))
    }

    fn forget(&self, id: u64) {
        lock(&self.conns).remove(&id);
    }

    /// Ends every live connection `how`; returns how many were closed by
    /// this call, once their sockets are closed.
    async fn close_all(&self, how: Close) -> usize {
        let live: Vec<ConnCtl> = lock(&self.conns).drain().map(|(_, c)| c).collect();
        let mut acks = Vec::with_capacity(live.len());
        for ctl in live {
            let (ack, done) = oneshot::channel();
            // A connection that ended meanwhile has dropped its receiver.
            if ctl.kill.send(Kill { how, ack }).is_ok() {
                acks.push(done);
            }
        }
        let mut closed = 0;
        for done in acks {
            if done.await.is_ok() {
                closed += 1;
            }
        }
        closed
    }
}

/// A TCP proxy on `127.0.0.1` that forwards to one target and injects
/// faults on demand. See the [module documentation](self).
///
/// Dropping it stops accepting, stops every forwarding task and closes
/// every connection it holds.
#[derive(Debug)]
pub struct FaultProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: JoinHandle<()>,
    /// Dropped with the proxy: every task watches it and stops.
    _shutdown: watch::Sender<()>,
}

impl FaultProxy {
    /// Binds `127.0.0.1:0` and starts forwarding every accepted connection
    /// to `target`. Must be called inside a tokio runtime.
    ///
    /// # Errors
    /// The listener could not be bound.
    pub async fn start(target: SocketAddr) -> io::Result<Self> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            target,
            refusing: Mutex::new(Refusing::default()),
            stall: [watch::Sender::new(false), watch::Sender::new(false)],
            delay_ns: AtomicU64::new(0),
            stall_replies_armed: AtomicBool::new(false),
            conns: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
            accepted: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            bytes: [AtomicU64::new(0), AtomicU64::new(0)],
        });
        let (shutdown, stop) = watch::channel(());
        let accept = tokio::spawn(accept_loop(listener, Arc::clone(&shared), stop));
        Ok(Self {
            addr,
            shared,
            accept,
            _shutdown: shutdown,
        })
    }

    /// The address clients connect to (`127.0.0.1:<port>`).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The proxy's port.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// The address connections are forwarded to.
    pub fn target(&self) -> SocketAddr {
        self.shared.target
    }

    /// Closes every live connection now with a FIN in both directions (to
    /// the client and to the server); bytes held by a stall are dropped.
    /// Returns how many connections were closed, once their sockets are.
    ///
    /// A socket closed with unread bytes in its receive buffer is answered
    /// by the kernel with a RST after the FIN; either way the peer sees the
    /// connection end.
    pub async fn cut(&self) -> usize {
        self.shared.close_all(Close::Fin).await
    }

    /// Aborts every live connection now with a RST in both directions
    /// (`SO_LINGER` 0, then close). Returns how many connections were
    /// aborted, once their sockets are closed.
    pub async fn reset(&self) -> usize {
        self.shared.close_all(Close::Rst).await
    }

    /// While `on`, new connections are accepted and closed at once (live
    /// ones are untouched). `false` also ends a [`refuse_for`](Self::refuse_for).
    ///
    /// A connection is new until the proxy accepts it: one whose `connect`
    /// returned just before this call (the kernel completes handshakes before
    /// `accept`) may still be refused. A connection that has forwarded bytes
    /// is live.
    pub fn set_refusing(&self, on: bool) {
        let mut r = lock(&self.shared.refusing);
        r.on = on;
        if !on {
            r.until = None;
        }
    }

    /// Refuses new connections (see [`set_refusing`](Self::set_refusing))
    /// for `dur` from now, then accepts them again by itself.
    pub fn refuse_for(&self, dur: Duration) {
        lock(&self.shared.refusing).until = Some(Instant::now() + dur);
    }

    /// Whether new connections are refused now.
    pub fn is_refusing(&self) -> bool {
        self.shared.refusing()
    }

    /// Stops (`true`) or resumes (`false`) forwarding in both directions on
    /// every connection, present and future, without closing any.
    pub fn stall(&self, on: bool) {
        self.stall_direction(Direction::ToServer, on);
        self.stall_direction(Direction::ToClient, on);
    }

    /// Stops or resumes forwarding in one direction. A chunk read while
    /// stalled is held (and further reads wait) until the stall ends or the
    /// connection is cut.
    pub fn stall_direction(&self, dir: Direction, on: bool) {
        self.shared.stall[dir.index()].send_replace(on);
    }

    /// Stalls replies ([`Direction::ToClient`], every connection) from the
    /// moment the next chunk from any client is forwarded, just before it is
    /// written to the server: its request reaches the server, and no byte
    /// the server sends after it gets through. Replies to earlier requests
    /// are unaffected, even those still on their way, so with a client that
    /// waits for each reply (or the end of it) before its next request this
    /// isolates exactly the next request's reply. A `cut` then loses it.
    /// Ends like any stall, with `stall(false)` or [`heal`](Self::heal).
    pub fn stall_replies_from_next_request(&self) {
        self.shared
            .stall_replies_armed
            .store(true, Ordering::SeqCst);
    }

    /// Freezes the connections open now, both directions, until they are
    /// cut or reset (or the proxy is dropped); new connections are not
    /// affected. Returns how many were frozen.
    pub fn freeze_live(&self) -> usize {
        let conns = lock(&self.shared.conns);
        for ctl in conns.values() {
            ctl.frozen.send_replace(true);
        }
        conns.len()
    }

    /// Waits `per_chunk` before forwarding each chunk read, in both
    /// directions; `Duration::ZERO` turns the delay off.
    pub fn delay(&self, per_chunk: Duration) {
        let ns = u64::try_from(per_chunk.as_nanos()).unwrap_or(u64::MAX);
        self.shared.delay_ns.store(ns, Ordering::SeqCst);
    }

    /// Ends refusing, stalls (armed or not; not
    /// [`freeze_live`](Self::freeze_live)) and delay: the proxy forwards normally again.
    pub fn heal(&self) {
        self.shared
            .stall_replies_armed
            .store(false, Ordering::SeqCst);
        self.set_refusing(false);
        self.stall(false);
        self.delay(Duration::ZERO);
    }

    /// The counters now.
    pub fn stats(&self) -> Stats {
        let s = &self.shared;
        Stats {
            accepted: s.accepted.load(Ordering::SeqCst),
            refused: s.refused.load(Ordering::SeqCst),
            live: lock(&s.conns).len(),
            bytes_to_server: s.bytes[Direction::ToServer.index()].load(Ordering::SeqCst),
            bytes_to_client: s.bytes[Direction::ToClient.index()].load(Ordering::SeqCst),
        }
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        // Connection tasks stop when `_shutdown` is dropped right after this.
        self.accept.abort();
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>, mut stop: watch::Receiver<()>) {
    loop {
        let accepted = tokio::select! {
            r = listener.accept() => r,
            _ = stop.changed() => return,
        };
        let client = match accepted {
            Ok((client, _)) => client,
            // Per-connection failures (aborted handshakes, fd limits) do not
            // stop the proxy; back off briefly so a persistent one cannot spin.
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        shared.accepted.fetch_add(1, Ordering::SeqCst);
        if shared.refusing() {
            shared.refused.fetch_add(1, Ordering::SeqCst);
            drop(client);
            continue;
        }
        let id = shared.next_id.fetch_add(1, Ordering::SeqCst);
        let (kill, killed) = oneshot::channel();
        let (frozen, frozen_rx) = watch::channel(false);
        lock(&shared.conns).insert(id, ConnCtl { kill, frozen });
        let conn = Conn {
            id,
            shared: Arc::clone(&shared),
            frozen: frozen_rx,
        };
        tokio::spawn(conn.serve(client, killed, stop.clone()));
    }
}

/// How a connection's forwarding ended.
enum End {
    /// Both sides closed, or one failed.
    Done,
    Kill(Kill),
    Shutdown,
}

struct Conn {
    id: u64,
    shared: Arc<Shared>,
    frozen: watch::Receiver<bool>,
}

impl Conn {
    async fn serve(
        self,
        mut client: TcpStream,
        mut killed: oneshot::Receiver<Kill>,
        mut stop: watch::Receiver<()>,
    ) {
        let connecting = tokio::select! {
            r = TcpStream::connect(self.shared.target) => r,
            k = &mut killed => {
                if let Ok(kill) = k {
                    close(&mut client, None, kill.how).await;
                    let _ = kill.ack.send(());
                }
                return;
            }
            _ = stop.changed() => return,
        };
        let Ok(mut server) = connecting else {
            // The target is down: the client sees its connection closed.
            self.shared.forget(self.id);
            return;
        };
        let _ = client.set_nodelay(true);
        let _ = server.set_nodelay(true);
        let end = {
            let (client_read, client_write) = client.split();
            let (server_read, server_write) = server.split();
            let up = self.pump(client_read, server_write, Direction::ToServer);
            let down = self.pump(server_read, client_write, Direction::ToClient);
            tokio::select! {
                // A kill wins over a pump that ended because the kill dropped
                // the connection's controls (a frozen pump wakes with an error).
                biased;
                k = &mut killed => k.map_or(End::Done, End::Kill),
                _ = async { tokio::try_join!(up, down) } => End::Done,
                _ = stop.changed() => End::Shutdown,
            }
        };
        match end {
            End::Kill(kill) => {
                close(&mut client, Some(&mut server), kill.how).await;
                drop((client, server));
                let _ = kill.ack.send(());
            }
            End::Done => self.shared.forget(self.id),
            End::Shutdown => {}
        }
    }

    /// Forwards `from` → `to` chunk by chunk, honouring stalls and delay;
    /// passes a half-close on. Ends at EOF (`Ok`) or on the first error.
    async fn pump(
        &self,
        mut from: ReadHalf<'_>,
        mut to: WriteHalf<'_>,
        dir: Direction,
    ) -> io::Result<()> {
        let mut stall = self.shared.stall[dir.index()].subscribe();
        let mut frozen = self.frozen.clone();
        let mut buf = vec![0u8; CHUNK];
        loop {
            let n = from.read(&mut buf).await?;
            self.hold(&mut stall, &mut frozen).await?;
            if n == 0 {
                to.shutdown().await?;
                return Ok(());
            }
            let delay = self.shared.delay();
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            if dir == Direction::ToServer
                && self
                    .shared
                    .stall_replies_armed
                    .swap(false, Ordering::SeqCst)
            {
                self.shared.stall[Direction::ToClient.index()].send_replace(true);
            }
            to.write_all(&buf[..n]).await?;
            self.shared.bytes[dir.index()].fetch_add(n as u64, Ordering::SeqCst);
        }
    }

    /// Waits while this direction is stalled or the connection is frozen.
    async fn hold(
        &self,
        stall: &mut watch::Receiver<bool>,
        frozen: &mut watch::Receiver<bool>,
    ) -> io::Result<()> {
        let gone = |_| io::Error::other("fault proxy stopped");
        loop {
            if *frozen.borrow_and_update() {
                // A frozen connection never thaws: wait for the cut.
                frozen.wait_for(|f| !*f).await.map_err(gone)?;
            } else if *stall.borrow_and_update() {
                stall.wait_for(|s| !*s).await.map_err(gone)?;
            } else {
                return Ok(());
            }
        }
    }
}

/// Closes the connection's sockets `how` (FIN or RST).
async fn close(client: &mut TcpStream, server: Option<&mut TcpStream>, how: Close) {
    for s in std::iter::once(client).chain(server) {
        match how {
            // Best effort: a socket the peer already closed cannot send FIN.
            Close::Fin => {
                let _ = s.shutdown().await;
            }
            Close::Rst => {
                let _ = s.set_zero_linger();
            }
        }
    }
}

pub mod scenarios {
    //! Store scenarios under injected faults, run by every networked store
    //! through [`fault_suite!`](crate::fault_suite).
    //!
    //! Each scenario gets a [`Rig`]: a store whose connections go through a
    //! fresh [`FaultProxy`], and a second store on the same server and
    //! keyspace that bypasses the proxy, to see what the server really holds.
    //! Scenarios assert on behaviour — which calls fail, whether errors are
    //! temporary, what the record and its timeline hold — never on how long
    //! anything takes; "recovers" means within [`RECOVERY`] of retries.

    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

    use std::future::Future;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use bytes::Bytes;
    use idemgate_engine::{
        Attempt, AttemptOutcome, Claim, Fenced, Lease, Record, RecordState, ScopedKey, Store,
        StoreError,
    };

    use super::FaultProxy;
    use crate::{PAST_SHORT_TTL, SHORT_TTL, eventually, fp, fresh_key};

    /// How long a store may keep failing with temporary errors after a fault
    /// is healed before a scenario calls it broken.
    pub const RECOVERY: Duration = Duration::from_secs(6);
    /// A lease long enough to outlast every outage a scenario injects.
    const LEASE: Duration = Duration::from_secs(5);
    const LONG: Duration = Duration::from_secs(300);

    /// A store behind a fault proxy, and a direct handle on the same data.
    pub struct Rig {
        /// The proxy every connection of `store` goes through.
        pub proxy: FaultProxy,
        /// The store under test: its URL points at the proxy. Give it the
        /// backend's usual reconnecting client, and a single connection where
        /// the backend pools them (so that warming it up prepares everything
        /// the scenario sends while replies are held).
        pub store: Arc<dyn Store>,
        /// The same server and keyspace (prefix, schema), without the proxy.
        pub direct: Arc<dyn Store>,
        /// Whether `store` has nothing of its own in flight on its
        /// connections — e.g. a pool checking a connection it just got back.
        /// Scenarios that hold the next request's reply wait for it first,
        /// so that the held request is theirs. `None`: always quiet.
        pub quiet: Option<Box<dyn Fn() -> bool + Send + Sync>>,
    }

    impl std::fmt::Debug for Rig {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("Rig")
                .field("proxy", &self.proxy)
                .field("store", &self.store)
                .field("direct", &self.direct)
                .finish_non_exhaustive()
        }
    }

    /// Waits until the store has nothing of its own in flight.
    async fn settle(rig: &Rig) {
        if let Some(quiet) = &rig.quiet {
            let settled = eventually(|| {
                let q = quiet();
                async move { q }
            })
            .await;
            assert!(settled, "the store never went quiet");
        }
    }

    /// Holds the reply to the store's next request (see
    /// [`FaultProxy::stall_replies_from_next_request`]) once the store is
    /// quiet.
    async fn hold_next_reply(rig: &Rig) {
        settle(rig).await;
        rig.proxy.stall_replies_from_next_request();
    }

    fn attempt() -> Attempt {
        Attempt {
            at_ms: idemgate_engine::record::now_ms(),
            replica: "faults".into(),
            outcome: AttemptOutcome::Executed,
            status: Some(200),
            latency_us: 1,
        }
    }

    fn acquired(c: Claim) -> Lease {
        match c {
            Claim::Acquired(l) => l,
            Claim::Existing(r) => panic!("expected Acquired, got Existing({r:?})"),
        }
    }

    fn existing(c: Claim) -> Record {
        match c {
            Claim::Existing(r) => r,
            Claim::Acquired(l) => panic!("expected Existing, got Acquired({l:?})"),
        }
    }

    /// Runs `op` again while it fails with a temporary error; panics on any
    /// other error, or when it still fails after [`RECOVERY`]. Returns the
    /// value and how many temporary errors came first.
    pub async fn until_ok<T, F, Fut>(what: &str, mut op: F) -> (T, usize)
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, StoreError>>,
    {
        let deadline = Instant::now() + RECOVERY;
        let mut failures = 0;
        loop {
            match op().await {
                Ok(v) => return (v, failures),
                Err(e) if e.is_temporary() => {
                    failures += 1;
                    assert!(
                        Instant::now() < deadline,
                        "{what}: still failing after {failures} tries: {e}"
                    );
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => panic!("{what}: failed with a non-temporary error: {e}"),
            }
        }
    }

    /// Runs every kind of operation once through the proxy, so that scripts
    /// are loaded and statements prepared before faults are injected.
    async fn warm_up(rig: &Rig) {
        let key = fresh_key();
        let s = &rig.store;
        let mut lease = acquired(
            s.claim(&key, &fp("warm"), LONG)
                .await
                .expect("warm-up claim"),
        );
        let w = s.renew(&mut lease, LONG).await.expect("warm-up renew");
        assert_eq!(w, Fenced::Applied);
        let w = s
            .complete(&lease, Bytes::from_static(b"w"), LONG, &attempt())
            .await
            .expect("warm-up complete");
        assert_eq!(w, Fenced::Applied);
        existing(
            s.claim(&key, &fp("warm"), LONG)
                .await
                .expect("warm-up replay"),
        );
        s.get(&key).await.expect("warm-up get");
        let other = fresh_key();
        let lease = acquired(
            s.claim(&other, &fp("warm"), LONG)
                .await
                .expect("warm-up claim"),
        );
        let w = s
            .release(&lease, &attempt(), LONG)
            .await
            .expect("warm-up release");
        assert_eq!(w, Fenced::Applied);
        assert!(
            rig.proxy.stats().live >= 1,
            "the store does not use the proxy"
        );
    }

    /// The payload of the DONE record at `key` (seen without the proxy) and
    /// how many `Executed` attempts its timeline holds.
    async fn done_once(rig: &Rig, key: &ScopedKey) -> (Bytes, usize) {
        let rec = rig
            .direct
            .get(key)
            .await
            .expect("direct get")
            .expect("a record");
        let payload = rec.payload().cloned().expect("a DONE record");
        let executed = rig
            .direct
            .timeline(key)
            .await
            .expect("direct timeline")
            .iter()
            .filter(|a| a.outcome == AttemptOutcome::Executed)
            .count();
        (payload, executed)
    }

    fn assert_pending(rec: &Record, lease: &Lease) {
        assert!(
            matches!(rec.state, RecordState::Pending { fence, .. } if fence == lease.fence),
            "expected PENDING under fence {}, got {rec:?}",
            lease.fence
        );
    }

    /// (1) Claims while the server cannot be reached fail with temporary
    /// errors and write nothing; once it is back, the same store handle
    /// reconnects by itself and works.
    pub async fn claim_refused_then_recovers(rig: Rig) {
        warm_up(&rig).await;
        let key = fresh_key();
        let fa = fp("a");
        rig.proxy.set_refusing(true);
        assert!(rig.proxy.cut().await >= 1, "no live connection to cut");
        for i in 0..3 {
            let err = rig
                .store
                .claim(&key, &fp("a"), LONG)
                .await
                .expect_err("a claim through a refusing proxy succeeded");
            assert!(err.is_temporary(), "claim #{i} while refused: {err}");
        }
        assert_eq!(rig.direct.get(&key).await.expect("direct get"), None);
        rig.proxy.set_refusing(false);
        let (claim, failures) =
            until_ok("claim after recovery", || rig.store.claim(&key, &fa, LONG)).await;
        let lease = acquired(claim);
        eprintln!("claim after recovery: {failures} temporary errors first");
        let w = rig
            .store
            .complete(&lease, Bytes::from_static(b"back"), LONG, &attempt())
            .await
            .expect("complete once reconnected");
        assert_eq!(w, Fenced::Applied);
        assert_eq!(
            done_once(&rig, &key).await,
            (Bytes::from_static(b"back"), 1)
        );
    }

    /// (2) The connection is cut between claim and complete, and the server
    /// stays unreachable for a while: the lease survives (the record stays
    /// PENDING under it), and complete with the original lease succeeds once
    /// the server is back, exactly once. A replay after another cut returns
    /// the stored result.
    pub async fn cut_between_claim_and_complete(rig: Rig) {
        warm_up(&rig).await;
        let key = fresh_key();
        let fa = fp("a");
        let executed = attempt();
        let lease = acquired(rig.store.claim(&key, &fp("a"), LONG).await.expect("claim"));
        rig.proxy.set_refusing(true);
        assert!(rig.proxy.cut().await >= 1);
        let payload = Bytes::from_static(b"{\"charged\":1}");
        let err = rig
            .store
            .complete(&lease, payload.clone(), LONG, &attempt())
            .await
            .expect_err("a complete through a refusing proxy succeeded");
        assert!(err.is_temporary(), "complete while refused: {err}");
        let rec = rig.direct.get(&key).await.expect("direct get");
        assert_pending(&rec.expect("the record survives the outage"), &lease);
        rig.proxy.set_refusing(false);
        let (w, _) = until_ok("complete after recovery", || {
            rig.store.complete(&lease, payload.clone(), LONG, &executed)
        })
        .await;
        assert_eq!(w, Fenced::Applied, "the original lease was lost");
        assert_eq!(done_once(&rig, &key).await, (payload.clone(), 1));
        // Replay, on a fresh connection.
        assert!(rig.proxy.cut().await >= 1);
        let (claim, _) = until_ok("replay after a cut", || rig.store.claim(&key, &fa, LONG)).await;
        assert_eq!(existing(claim).payload(), Some(&payload));
        assert_eq!(done_once(&rig, &key).await, (payload, 1));
    }

    /// (3) A complete reaches the server and is applied, but its reply is
    /// lost (replies stalled, then the connection cut). The caller saw a
    /// temporary error, so it retries with the same lease and payload: the
    /// retry must be idempotent — acknowledged as applied, the record DONE
    /// once with the first payload, one `Executed` attempt — not `Stale`,
    /// which would tell the caller that another owner took over.
    pub async fn complete_reply_lost_retry_is_idempotent(rig: Rig) {
        warm_up(&rig).await;
        let key = fresh_key();
        let executed = attempt();
        let lease = acquired(rig.store.claim(&key, &fp("a"), LONG).await.expect("claim"));
        let payload = Bytes::from_static(b"{\"charged\":1}");
        hold_next_reply(&rig).await;
        let first = {
            let (store, lease, payload, executed) = (
                Arc::clone(&rig.store),
                lease.clone(),
                payload.clone(),
                executed.clone(),
            );
            tokio::spawn(async move { store.complete(&lease, payload, LONG, &executed).await })
        };
        let applied = eventually(|| {
            let (direct, key) = (Arc::clone(&rig.direct), key.clone());
            async move {
                direct
                    .get(&key)
                    .await
                    .is_ok_and(|r| r.is_some_and(|r| r.is_done()))
            }
        })
        .await;
        assert!(applied, "the stalled complete never reached the server");
        assert!(rig.proxy.cut().await >= 1);
        rig.proxy.heal();
        let err = first
            .await
            .expect("complete task")
            .expect_err("a complete whose reply was lost succeeded");
        assert!(err.is_temporary(), "complete with a lost reply: {err}");
        let (retry, _) = until_ok("complete retried after a lost reply", || {
            rig.store.complete(&lease, payload.clone(), LONG, &executed)
        })
        .await;
        assert_eq!(done_once(&rig, &key).await, (payload, 1));
        assert_eq!(
            retry,
            Fenced::Applied,
            "retrying an applied complete with its own lease and payload must be \
             acknowledged, not reported as fenced by another owner"
        );
    }

    /// (4) Heartbeats fail while the server is unreachable (connections
    /// reset, new ones refused), for less than the lease: meanwhile nobody
    /// else can take the key, and once the server is back the heartbeat
    /// renews the same lease and the owner completes.
    pub async fn heartbeat_outage_within_the_lease(rig: Rig) {
        warm_up(&rig).await;
        let key = fresh_key();
        let mut lease = acquired(
            rig.store
                .claim(&key, &fp("hb"), LEASE)
                .await
                .expect("claim"),
        );
        let first_expiry = lease.expires_at_ms;
        rig.proxy.set_refusing(true);
        assert!(rig.proxy.reset().await >= 1);
        for i in 0..3 {
            let mut l = lease.clone();
            let err = rig
                .store
                .renew(&mut l, LEASE)
                .await
                .expect_err("a renew through a refusing proxy succeeded");
            assert!(err.is_temporary(), "renew #{i} during the outage: {err}");
            assert_eq!(l, lease, "a failed renew changed the lease");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // Another replica, unaffected by the outage, finds the key held.
        let rec = existing(
            rig.direct
                .claim(&key, &fp("hb"), LEASE)
                .await
                .expect("direct claim"),
        );
        assert_pending(&rec, &lease);
        rig.proxy.set_refusing(false);
        let ((w, renewed), _) = until_ok("renew after the outage", || {
            let (store, mut l) = (Arc::clone(&rig.store), lease.clone());
            async move {
                let w = store.renew(&mut l, LEASE).await?;
                Ok((w, l))
            }
        })
        .await;
        assert_eq!(w, Fenced::Applied, "the lease was lost during the outage");
        lease = renewed;
        assert!(lease.expires_at_ms > first_expiry, "renew did not extend");
        let w = rig
            .store
            .complete(&lease, Bytes::from_static(b"hb"), LONG, &attempt())
            .await
            .expect("complete after the outage");
        assert_eq!(w, Fenced::Applied);
        assert_eq!(done_once(&rig, &key).await, (Bytes::from_static(b"hb"), 1));
    }

    /// A claim's reply is lost: the retry (a new token) finds the key
    /// PENDING under a lease nobody holds — by the `Store` contract it gets
    /// `Existing` — and the key is free again once that lease expires.
    pub async fn claim_reply_lost_blocks_until_lease_expiry(rig: Rig) {
        warm_up(&rig).await;
        let key = fresh_key();
        let fa = fp("a");
        hold_next_reply(&rig).await;
        let first = {
            let (store, key) = (Arc::clone(&rig.store), key.clone());
            tokio::spawn(async move { store.claim(&key, &fp("a"), SHORT_TTL).await })
        };
        let claimed = eventually(|| {
            let (direct, key) = (Arc::clone(&rig.direct), key.clone());
            async move { direct.get(&key).await.is_ok_and(|r| r.is_some()) }
        })
        .await;
        assert!(claimed, "the stalled claim never reached the server");
        assert!(rig.proxy.cut().await >= 1);
        rig.proxy.heal();
        let err = first
            .await
            .expect("claim task")
            .expect_err("a claim whose reply was lost succeeded");
        assert!(err.is_temporary(), "claim with a lost reply: {err}");
        let (retry, _) = until_ok("claim retried after a lost reply", || {
            rig.store.claim(&key, &fa, SHORT_TTL)
        })
        .await;
        let rec = existing(retry);
        assert!(matches!(rec.state, RecordState::Pending { .. }), "{rec:?}");
        tokio::time::sleep(PAST_SHORT_TTL).await;
        let lease = acquired(rig.store.claim(&key, &fp("a"), LONG).await.expect("claim"));
        let w = rig
            .store
            .complete(&lease, Bytes::from_static(b"late"), LONG, &attempt())
            .await
            .expect("complete");
        assert_eq!(w, Fenced::Applied);
    }

    /// The store's connections go silent (frozen, never closed) while the
    /// server itself is fine: after operations on them fail with temporary
    /// errors, the store must stop using them and open new connections.
    pub async fn frozen_connection_is_replaced(rig: Rig) {
        warm_up(&rig).await;
        let key = fresh_key();
        let fa = fp("a");
        settle(&rig).await;
        assert!(rig.proxy.freeze_live() >= 1);
        let (claim, failures) = until_ok("claim after the connection froze", || {
            rig.store.claim(&key, &fa, LONG)
        })
        .await;
        eprintln!("claim after a freeze: {failures} temporary errors first");
        let lease = acquired(claim);
        let w = rig
            .store
            .complete(&lease, Bytes::from_static(b"thawed"), LONG, &attempt())
            .await
            .expect("complete on a new connection");
        assert_eq!(w, Fenced::Applied);
    }

    /// Every step of a record's life works, unchanged, over a slow link.
    pub async fn slow_link_full_lifecycle(rig: Rig) {
        warm_up(&rig).await;
        rig.proxy.delay(Duration::from_millis(20));
        let key = fresh_key();
        let s = &rig.store;
        let mut lease = acquired(s.claim(&key, &fp("a"), LONG).await.expect("claim"));
        assert_eq!(
            s.renew(&mut lease, LONG).await.expect("renew"),
            Fenced::Applied
        );
        let payload = Bytes::from_static(b"slow");
        let w = s
            .complete(&lease, payload.clone(), LONG, &attempt())
            .await
            .expect("complete");
        assert_eq!(w, Fenced::Applied);
        let rec = existing(s.claim(&key, &fp("a"), LONG).await.expect("replay"));
        assert_eq!(rec.payload(), Some(&payload));
        assert_eq!(done_once(&rig, &key).await, (payload, 1));
    }
}

/// Generates `mod $name` with one `#[tokio::test]` per fault scenario in
/// [`fault::scenarios`](crate::fault::scenarios), each calling
/// `super::$rig().await` for a fresh [`Rig`](crate::fault::scenarios::Rig).
#[macro_export]
macro_rules! fault_suite {
    ($name:ident, $rig:ident) => {
        mod $name {
            $crate::fault_suite!(@cases $rig;
                claim_refused_then_recovers, cut_between_claim_and_complete,
                complete_reply_lost_retry_is_idempotent, heartbeat_outage_within_the_lease,
                claim_reply_lost_blocks_until_lease_expiry, frozen_connection_is_replaced,
                slow_link_full_lifecycle);
        }
    };
    (@cases $rig:ident; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                $crate::fault::scenarios::$case(super::$rig().await).await;
            }
        )*
    };
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    /// An echo server on a free port; it stops when the runtime does.
    async fn echo() -> SocketAddr {
        let listener = TcpListener::bind(("127.0.0.1", 0))
            .await
            .expect("bind echo");
        let addr = listener.local_addr().expect("echo addr");
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = s.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        addr
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

    /// `fault_suite!` lists its cases by hand: every scenario must be there.
    #[test]
    fn every_scenario_is_in_the_suite() {
        let src = include_str!("fault.rs");
        let mut scenarios: Vec<&str> = src
            .lines()
            .filter_map(|l| l.trim_start().strip_prefix("pub async fn "))
            .filter_map(|rest| rest.split_once("(rig: Rig)").map(|(name, _)| name))
            .collect();
        let (_, list) = src
            .split_once("$crate::fault_suite!(@cases $rig;")
            .expect("the macro's case list");
        let (list, _) = list.split_once(");").expect("the end of the list");
        let mut listed: Vec<&str> = list
            .split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .collect();
        assert!(scenarios.len() >= 7, "{scenarios:?}");
        scenarios.sort_unstable();
        listed.sort_unstable();
        assert_eq!(scenarios, listed);
    }

    #[tokio::test]
    async fn forwards_both_ways_and_counts() {
        let p = proxy().await;
        let mut s = connect(&p).await;
        roundtrip(&mut s, b"hello").await;
        let big = vec![7u8; 3 * CHUNK + 5];
        roundtrip(&mut s, &big).await;
        let total = 5 + big.len() as u64;
        let expected = Stats {
            accepted: 1,
            refused: 0,
            live: 1,
            bytes_to_server: total,
            bytes_to_client: total,
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
        let mut c = connect(&p).await;
        roundtrip(&mut c, b"c").await;
        assert_eq!(p.cut().await, 1);
        assert_eq!(p.cut().await, 0);
    }

    #[tokio::test]
    async fn reset_aborts_live_connections_with_rst() {
        let p = proxy().await;
        let mut a = connect(&p).await;
        roundtrip(&mut a, b"a").await;
        assert_eq!(p.reset().await, 1);
        let mut buf = [0u8; 1];
        let err = a.read(&mut buf).await.expect_err("RST");
        assert_eq!(err.kind(), io::ErrorKind::ConnectionReset);
        let mut b = connect(&p).await;
        roundtrip(&mut b, b"b").await;
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
        let mut buf = [0u8; 1];
        // Closed at once; a write racing the close may turn it into a reset.
        let _ = refused.write_all(b"x").await;
        assert!(matches!(refused.read(&mut buf).await, Ok(0) | Err(_)));
        roundtrip(&mut live, b"still here").await;
        p.set_refusing(false);
        let mut again = connect(&p).await;
        roundtrip(&mut again, b"back").await;
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
        let mut s = connect(&p).await;
        roundtrip(&mut s, b"ok").await;
    }

    #[tokio::test]
    async fn stall_holds_bytes_without_closing() {
        let p = proxy().await;
        let mut s = connect(&p).await;
        roundtrip(&mut s, b"before").await;
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
        let mut buf = [0u8; 8];
        assert!(matches!(s.read(&mut buf).await, Ok(0) | Err(_)));
        assert_eq!(p.stats().bytes_to_client, 0);
        p.stall(false);
        let mut s = connect(&p).await;
        roundtrip(&mut s, b"next").await;
    }

    #[tokio::test]
    async fn stall_from_next_request_spares_earlier_replies() {
        // A server whose reply to each byte ends 100 ms after it starts: the
        // tail of a reply is still in flight when the client has its head.
        let listener = TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
        let server = listener.local_addr().unwrap();
        let (got_tx, mut got) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut b = [0u8; 1];
            while s.read_exact(&mut b).await.is_ok() {
                got_tx.send(b[0]).unwrap();
                s.write_all(b"head").await.unwrap();
                tokio::time::sleep(Duration::from_millis(100)).await;
                s.write_all(b"tail").await.unwrap();
            }
        });
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
        let mut buf = [0u8; 8];
        assert!(matches!(c.read(&mut buf).await, Ok(0) | Err(_)));
        assert_eq!(p.stats().bytes_to_client, 8);
    }

    #[tokio::test]
    async fn freeze_live_spares_new_connections() {
        let p = proxy().await;
        let mut old = connect(&p).await;
        roundtrip(&mut old, b"x").await;
        assert_eq!(p.freeze_live(), 1);
        old.write_all(b"y").await.unwrap();
        assert!(silent(&mut old).await);
        let mut new = connect(&p).await;
        roundtrip(&mut new, b"fresh").await;
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
    async fn target_down_closes_the_client() {
        let port = TcpListener::bind(("127.0.0.1", 0))
            .await
            .unwrap()
            .local_addr()
            .unwrap();
        // The listener is dropped: nothing listens on `port` any more.
        let p = FaultProxy::start(port).await.unwrap();
        let mut s = connect(&p).await;
        let mut buf = [0u8; 1];
        assert!(matches!(s.read(&mut buf).await, Ok(0) | Err(_)));
        until(|| p.stats().live == 0).await;
    }

    #[tokio::test]
    async fn drop_stops_everything() {
        let p = proxy().await;
        let addr = p.addr();
        let mut s = connect(&p).await;
        roundtrip(&mut s, b"x").await;
        p.stall(true);
        drop(p);
        let mut buf = [0u8; 1];
        assert!(matches!(s.read(&mut buf).await, Ok(0) | Err(_)));
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
}
