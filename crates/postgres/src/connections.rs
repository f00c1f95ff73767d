//! [`Connections`]: the connections the store's own operations run on, lent
//! out one operation at a time and taken back with no extra round trip.
//!
//! Why not sqlx's pool: it pings every connection it gets back before
//! anyone may use it again, to flush what a cancelled statement may have
//! left behind. That made every store operation two round trips, and the
//! ping's write, wake-up and read cost the gateway about as much CPU as the
//! statement itself (a sixth of its CPU per fresh key on PostgreSQL, in a
//! profile), and the server a second wake-up per operation. Here a
//! connection goes straight back to the idle list when its operation read
//! its whole answer: nothing is left on the wire, so there is nothing to
//! check. Only a connection whose operation was abandoned mid-way (the
//! caller stopped waiting) is checked with a ping, within the operation
//! bound, before it is used again; one whose operation overran the bound,
//! or failed anywhere but in the database itself, is closed.
//!
//! A connection that went silent while idle (a firewall that dropped it)
//! fails the next operation within its bound and is replaced; the pool did
//! the same, as it ran no check before lending a connection either. Idle
//! connections are closed after [`IDLE_TIMEOUT`] and every connection
//! after [`MAX_LIFETIME`], as sqlx's pool does by default, so server-side
//! per-connection memory does not build up and a dropped connection is
//! rarely the one lent.
//!
//! sqlx's pool (`PostgresStore::pool`) stays for the rest: migrations, the
//! background timeline writer, the purge and the caller's own transactions.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use sqlx::postgres::PgConnectOptions;
use sqlx::{Connection, PgConnection};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Idle connections older than this are closed rather than lent.
pub(crate) const IDLE_TIMEOUT: Duration = Duration::from_secs(10 * 60);
/// Connections older than this are closed when they come back.
pub(crate) const MAX_LIFETIME: Duration = Duration::from_secs(30 * 60);

/// Why an operation could not get a connection.
#[derive(Debug)]
pub(crate) enum Unlent {
    /// None came free, or none could be opened, before the deadline.
    TimedOut,
    /// Opening a new connection failed.
    Connect(sqlx::Error),
}

/// Up to `max` connections to one server, opened on demand. Its `Debug`
/// leaves the connect options out: they hold the password.
pub(crate) struct Connections {
    connect: Arc<PgConnectOptions>,
    slots: Arc<Semaphore>,
    max: usize,
    idle: Mutex<VecDeque<Idle>>,
    /// How long an abandoned operation's connection may take to settle.
    bound: Duration,
}

impl std::fmt::Debug for Connections {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connections")
            .field("max", &self.max)
            .field("busy", &self.busy())
            .finish_non_exhaustive()
    }
}

#[derive(Debug)]
struct Idle {
    conn: PgConnection,
    opened: Instant,
    since: Instant,
}

impl Connections {
    pub(crate) fn new(connect: Arc<PgConnectOptions>, max: u32, bound: Duration) -> Arc<Self> {
        let max = usize::try_from(max.max(1)).unwrap_or(1);
        Arc::new(Self {
            connect,
            slots: Arc::new(Semaphore::new(max)),
            max,
            idle: Mutex::new(VecDeque::new()),
            bound,
        })
    }

    /// A connection for one operation, waiting for a free slot and opening
    /// a connection if no idle one is fresh enough, both by `deadline`.
    pub(crate) async fn lend(
        self: &Arc<Self>,
        deadline: tokio::time::Instant,
    ) -> Result<Lent, Unlent> {
        let permit = tokio::time::timeout_at(deadline, Arc::clone(&self.slots).acquire_owned())
            .await
            .map_err(|_| Unlent::TimedOut)?
            // The semaphore is never closed.
            .map_err(|_| Unlent::TimedOut)?;
        let (conn, opened) = match self.take_idle() {
            Some(idle) => (idle.conn, idle.opened),
            None => {
                let conn = tokio::time::timeout_at(deadline, open(&self.connect))
                    .await
                    .map_err(|_| Unlent::TimedOut)?
                    .map_err(Unlent::Connect)?;
                (conn, Instant::now())
            }
        };
        Ok(Lent {
            conn: Some(conn),
            opened,
            owner: Arc::clone(self),
            permit: Some(permit),
            state: State::Running,
        })
    }

    /// The most recently used idle connection; older ones past
    /// [`IDLE_TIMEOUT`] are dropped (which closes them) on the way.
    fn take_idle(&self) -> Option<Idle> {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        while idle
            .front()
            .is_some_and(|i| i.since.elapsed() >= IDLE_TIMEOUT)
        {
            idle.pop_front();
        }
        idle.pop_back()
    }

    fn give_back(&self, conn: PgConnection, opened: Instant) {
        if opened.elapsed() >= MAX_LIFETIME {
            return;
        }
        self.idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push_back(Idle {
                conn,
                opened,
                since: Instant::now(),
            });
    }

    /// Connections lent out right now, or settling after an abandoned
    /// operation (for tests that wait for a quiet store).
    pub(crate) fn busy(&self) -> usize {
        self.max - self.slots.available_permits()
    }
}

/// Opens a connection for the store's operations.
///
/// Every statement the store runs on it finds rows by key (or the purge by
/// expiry), through an index. Statements are prepared once per connection,
/// and PostgreSQL keeps a generic plan for each after a few runs: one made
/// while the table was small (a new store, or statistics that autovacuum
/// has not refreshed) may scan the whole table for a batch's keys, and
/// would keep doing so as the table grows — measured at 1.9 ms a batch
/// where the index takes 0.1 ms. With sequential scans off, the planner
/// takes the index whatever its statistics say.
///
/// Since every plan is then the key's index, a statement's parameters
/// cannot change it, so the connection uses the generic plan from the
/// first run (`plan_cache_mode`, PostgreSQL 12). Left to choose, the
/// server plans a statement's first five runs for their parameters, and
/// afterwards keeps doing so for any statement whose generic plan it
/// estimates dearer: at a held 2,000 fresh keys/s, planning was about a
/// tenth of the server's CPU.
async fn open(connect: &PgConnectOptions) -> Result<PgConnection, sqlx::Error> {
    let mut conn = PgConnection::connect_with(connect).await?;
    sqlx::raw_sql("SET enable_seqscan = off; SET plan_cache_mode = force_generic_plan")
        .execute(&mut conn)
        .await?;
    Ok(conn)
}

/// What became of a lent connection's operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Still running, or abandoned mid-way when the [`Lent`] drops.
    Running,
    /// Its whole answer was read: the connection is ready for the next.
    Finished,
    /// It overran its bound or the connection failed: close it.
    Broken,
}

/// One lent connection; it goes back (or is closed) when dropped.
#[derive(Debug)]
pub(crate) struct Lent {
    conn: Option<PgConnection>,
    opened: Instant,
    owner: Arc<Connections>,
    permit: Option<OwnedSemaphorePermit>,
    state: State,
}

impl Lent {
    pub(crate) fn conn(&mut self) -> &mut PgConnection {
        // Present until drop.
        self.conn
            .as_mut()
            .expect("a lent connection until it is dropped")
    }

    /// Notes how the operation's `result` left the connection — ready for
    /// the next when it succeeded or the server answered with an error
    /// that leaves the session open, else to be closed — and sorts it:
    /// `Ok` holds the answer, the server's own error included; `Err` is a
    /// failure of the connection.
    pub(crate) fn finish<T>(
        &mut self,
        result: Result<T, sqlx::Error>,
    ) -> Result<Result<T, sqlx::Error>, sqlx::Error> {
        match result {
            Ok(v) => {
                self.state = State::Finished;
                Ok(Ok(v))
            }
            Err(e) if leaves_connection_usable(&e) => {
                self.state = State::Finished;
                Ok(Err(e))
            }
            Err(e) => {
                self.state = State::Broken;
                Err(e)
            }
        }
    }

    /// Notes that the operation overran its bound: the connection may have
    /// gone silent, so it is closed.
    pub(crate) fn overran(&mut self) {
        self.state = State::Broken;
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        let (Some(mut conn), Some(permit)) = (self.conn.take(), self.permit.take()) else {
            return;
        };
        match self.state {
            State::Finished => self.owner.give_back(conn, self.opened),
            // Dropping the connection closes its socket; the slot frees
            // with the permit.
            State::Broken => {}
            State::Running => {
                // Abandoned mid-statement: its answer may still be on its
                // way. A ping reads past it; the slot stays taken until then.
                let (owner, opened, bound) =
                    (Arc::clone(&self.owner), self.opened, self.owner.bound);
                if let Ok(rt) = tokio::runtime::Handle::try_current() {
                    rt.spawn(async move {
                        match tokio::time::timeout(bound, conn.ping()).await {
                            Ok(Ok(())) => owner.give_back(conn, opened),
                            _ => tracing::warn!(
                                "a PostgreSQL connection left mid-operation did not settle in time; it was closed"
                            ),
                        }
                        drop(permit);
                    });
                }
            }
        }
    }
}

/// Whether a failed statement leaves its connection ready for the next:
/// the server's own error comes with the rest of its answer, unless it is
/// ending the session (class 57P: shutdown, crash, or the backend
/// terminated) or the connection itself failed (class 08). Any other
/// failure (I/O, protocol, decoding) may have left bytes on the wire.
fn leaves_connection_usable(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Database(db) => !db
            .code()
            .is_some_and(|code| code.starts_with("57P") || code.starts_with("08")),
        _ => false,
    }
}
