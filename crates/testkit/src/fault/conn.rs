//! One proxied connection: its two forwarding pumps, the stalls and the
//! dropped reply they honour, and how it is closed on request.
//!
//! Kept apart from the proxy's handle ([`super::FaultProxy`]) so that the
//! controls a test calls and the per-connection machinery they steer can
//! each be read on their own.

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::{ReadHalf, WriteHalf};
use tokio::sync::{oneshot, watch};

use super::{CHUNK, Close, Direction, Kill, Shared};

/// How a connection's forwarding ended.
enum End {
    /// Both sides closed, or one failed.
    Done,
    Kill(Kill),
    Shutdown,
}

pub(super) struct Conn {
    pub(super) id: u64,
    pub(super) shared: Arc<Shared>,
    pub(super) frozen: watch::Receiver<bool>,
    /// Set when a request of this connection took an armed
    /// [`super::FaultProxy::drop_next_reply`]: the next bytes from the
    /// server are discarded and the connection is aborted.
    pub(super) doomed: AtomicBool,
}

impl Conn {
    pub(super) async fn serve(
        self,
        mut client: TcpStream,
        mut killed: oneshot::Receiver<Kill>,
        mut stop: watch::Receiver<()>,
    ) {
        let target = self.shared.target();
        let connecting = tokio::select! {
            r = TcpStream::connect(target) => r,
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
            End::Done => {
                if self.doomed.load(Ordering::SeqCst) {
                    // The reply was dropped: abort, as a lost link would.
                    close(&mut client, Some(&mut server), Close::Rst).await;
                }
                self.shared.forget(self.id);
            }
            End::Shutdown => {}
        }
    }

    /// Forwards `from` → `to` chunk by chunk, honouring stalls, delay and
    /// a dropped reply; passes a half-close on. Ends at EOF (`Ok`) or on
    /// the first error.
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
            match dir {
                Direction::ToServer => {
                    if self
                        .shared
                        .stall_replies_armed
                        .swap(false, Ordering::SeqCst)
                    {
                        self.shared.stall[Direction::ToClient.index()].send_replace(true);
                    }
                    if self.shared.drop_reply_armed.swap(false, Ordering::SeqCst) {
                        self.doomed.store(true, Ordering::SeqCst);
                    }
                }
                Direction::ToClient => {
                    if self.doomed.load(Ordering::SeqCst) {
                        // The server applied the request and answered: the
                        // answer is discarded, and the connection ends.
                        self.shared.replies_dropped.fetch_add(1, Ordering::SeqCst);
                        return Err(io::Error::other("reply dropped"));
                    }
                }
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
