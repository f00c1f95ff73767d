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
//! - [`drop_next_reply`](FaultProxy::drop_next_reply): let the next request
//!   through, discard the server's answer to it and abort its connection —
//!   a call the server applied whose reply the client never gets, on one
//!   connection while the others work;
//! - [`retarget`](FaultProxy::retarget): forward new connections to another
//!   server (a promoted replica), as a virtual IP or a DNS name moved over
//!   would (add a `reset` to end the live ones);
//! - [`delay`](FaultProxy::delay): added latency before each forwarded chunk;
//! - [`stats`](FaultProxy::stats): connections accepted and refused, live
//!   connections, bytes forwarded each way, replies dropped.
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

use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

/// Size of one forwarded chunk (the unit of [`FaultProxy::delay`]).
pub const CHUNK: usize = 16 * 1024;

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
    /// Replies discarded by [`FaultProxy::drop_next_reply`].
    pub replies_dropped: u64,
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
    /// Where new connections go ([`FaultProxy::retarget`]).
    target: Mutex<SocketAddr>,
    refusing: Mutex<Refusing>,
    /// Stall flag per [`Direction::index`].
    stall: [watch::Sender<bool>; 2],
    delay_ns: AtomicU64,
    /// Set by [`FaultProxy::stall_replies_from_next_request`].
    stall_replies_armed: AtomicBool,
    /// Set by [`FaultProxy::drop_next_reply`].
    drop_reply_armed: AtomicBool,
    replies_dropped: AtomicU64,
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
    fn target(&self) -> SocketAddr {
        *lock(&self.target)
    }

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
            target: Mutex::new(target),
            refusing: Mutex::new(Refusing::default()),
            stall: [watch::Sender::new(false), watch::Sender::new(false)],
            delay_ns: AtomicU64::new(0),
            stall_replies_armed: AtomicBool::new(false),
            drop_reply_armed: AtomicBool::new(false),
            replies_dropped: AtomicU64::new(0),
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

    /// The address new connections are forwarded to.
    pub fn target(&self) -> SocketAddr {
        self.shared.target()
    }

    /// Forwards new connections to `target` from now on; live ones stay
    /// with the server they reached (a [`reset`](Self::reset) ends them).
    pub fn retarget(&self, target: SocketAddr) {
        *lock(&self.shared.target) = target;
    }

    /// Lets the next chunk from any client through to the server, then
    /// discards whatever the server sends back on that connection and
    /// aborts it (RST both ways) as soon as the first byte of the answer
    /// arrives: the server applied the call, the client never learns how.
    /// Other connections are unaffected. One shot: it disarms once taken;
    /// [`heal`](Self::heal) disarms it before it is.
    pub fn drop_next_reply(&self) {
        self.shared.drop_reply_armed.store(true, Ordering::SeqCst);
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
        self.shared.drop_reply_armed.store(false, Ordering::SeqCst);
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
            replies_dropped: s.replies_dropped.load(Ordering::SeqCst),
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
            doomed: AtomicBool::new(false),
        };
        tokio::spawn(conn.serve(client, killed, stop.clone()));
    }
}

mod conn;
use conn::Conn;

pub mod scenarios;

// `fault_suite!`, generated by build.rs from the scenarios in
// fault/scenarios.rs.
include!(concat!(env!("OUT_DIR"), "/fault_suite.rs"));
