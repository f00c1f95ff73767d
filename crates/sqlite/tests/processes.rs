//! Several OS processes on one file: claims stay atomic across processes,
//! and an acknowledged write survives `kill -9`.
//!
//! The test binary re-executes itself: a child runs the same test (selected
//! with `--exact`) with [`ROLE`] set and plays its part instead of the
//! parent's.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use idemgate_engine::{
    Attempt, AttemptOutcome, Claim, ClientKey, Fenced, RecordState, ScopedKey, Store,
};
use idemgate_sqlite::SqliteStore;
use idemgate_testkit::{acquired, fp, key_n};

/// Set in a child process: which part it plays.
const ROLE: &str = "IDEMGATE_SQLITE_TEST_ROLE";
/// The store file, for a child.
const DB: &str = "IDEMGATE_SQLITE_TEST_DB";
/// A directory for barrier files, for a child.
const DIR: &str = "IDEMGATE_SQLITE_TEST_DIR";
/// The child's number.
const INDEX: &str = "IDEMGATE_SQLITE_TEST_INDEX";

const CHILDREN: usize = 6;
const KEYS: usize = 200;
/// Concurrent sequential claimers in each child process.
const CLAIMERS: usize = 4;
const LONG: Duration = Duration::from_secs(300);
/// How long any wait in these tests may take before it counts as a hang.
const HANG: Duration = Duration::from_secs(120);

/// Not the testkit's `executed()`: the replica is this process's id, so
/// the timeline says which of the racing processes wrote each attempt.
fn attempt() -> Attempt {
    Attempt {
        at_ms: idemgate_engine::backend::now_ms(),
        replica: format!("pid-{}", std::process::id()),
        outcome: AttemptOutcome::Executed,
        status: Some(200),
        latency_us: 1,
        repeated: None,
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

fn env_path(name: &str) -> PathBuf {
    PathBuf::from(std::env::var_os(name).expect("child env"))
}

/// Starts this test binary again as a child running `test` in `role`.
fn spawn_child(test: &str, role: &str, envs: &[(&str, &Path)], index: usize) -> Child {
    let exe = std::env::current_exe().expect("test binary path");
    let mut cmd = Command::new(exe);
    cmd.args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(ROLE, role)
        .env(INDEX, index.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    for (k, v) in envs {
        cmd.env(k, v);
    }
    cmd.spawn().expect("spawn child test process")
}

/// Reads a child's stdout on a thread; returns its lines once it closes.
fn collect_lines(child: &mut Child) -> std::thread::JoinHandle<Vec<String>> {
    let out = child.stdout.take().expect("piped stdout");
    std::thread::spawn(move || {
        BufReader::new(out)
            .lines()
            .map_while(Result::ok)
            .collect::<Vec<_>>()
    })
}

/// The number after `tag` in a child's output line. The test harness may
/// print its own text before ours on the same line ("test x ... WON 0").
fn tagged<T: std::str::FromStr>(line: &str, tag: &str) -> Option<T> {
    let mut words = line.split_whitespace();
    words.find(|w| *w == tag)?;
    words.next()?.parse().ok()
}

fn wait_for(path: &Path) {
    let deadline = Instant::now() + HANG;
    while !path.exists() {
        assert!(
            Instant::now() < deadline,
            "{} never appeared",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Six processes race to claim the same 200 keys on one file: every key has
/// exactly one winner across all processes, and each winner's result is
/// the one stored.
#[test]
fn race_across_processes() {
    if let Ok(role) = std::env::var(ROLE) {
        if role == "race" {
            race_child();
        }
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("race.db");
    // Create the file once, so the children race on claims, not on setup.
    drop(SqliteStore::open(&db).expect("create store"));

    let mut children = Vec::new();
    for i in 0..CHILDREN {
        let mut child = spawn_child(
            "race_across_processes",
            "race",
            &[(DB, &db), (DIR, dir.path())],
            i,
        );
        let lines = collect_lines(&mut child);
        children.push((child, lines));
    }
    for i in 0..CHILDREN {
        wait_for(&dir.path().join(format!("ready-{i}")));
    }
    std::fs::write(dir.path().join("start"), b"go").expect("start file");

    let mut winners: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    let mut done: BTreeMap<usize, usize> = BTreeMap::new();
    for (i, (mut child, lines)) in children.into_iter().enumerate() {
        let status = child.wait().expect("wait child");
        let lines = lines.join().expect("reader thread");
        assert!(status.success(), "child {i} failed: {status}");
        for line in lines {
            if let Some(k) = tagged(&line, "WON") {
                winners.entry(k).or_default().push(i);
            }
            if let Some(k) = tagged(&line, "DONE") {
                done.insert(k, i);
            }
        }
    }
    let mut per_child = [0usize; CHILDREN];
    winners.values().flatten().for_each(|&i| per_child[i] += 1);
    eprintln!("keys won per process: {per_child:?}");
    for k in 0..KEYS {
        let w = winners.get(&k).cloned().unwrap_or_default();
        assert_eq!(w.len(), 1, "key {k} won by processes {w:?}");
        assert_eq!(done.get(&k), Some(&w[0]), "key {k} completed by its winner");
    }

    let store = SqliteStore::open(&db).expect("reopen");
    runtime().block_on(async {
        for k in 0..KEYS {
            let rec = store.get(&key_n(k)).await.expect("get").expect("record");
            let want = format!("child-{}", winners[&k][0]);
            assert_eq!(rec.payload().map(|p| p.to_vec()), Some(want.into_bytes()));
        }
    });
}

fn race_child() {
    let db = env_path(DB);
    let dir = env_path(DIR);
    let index: usize = std::env::var(INDEX)
        .expect("index")
        .parse()
        .expect("number");
    runtime().block_on(async move {
        let store = Arc::new(SqliteStore::open(&db).expect("open in child"));
        std::fs::write(dir.join(format!("ready-{index}")), b"").expect("ready file");
        let start = dir.join("start");
        tokio::task::spawn_blocking(move || wait_for(&start))
            .await
            .expect("barrier");

        // A few sequential claimers per process, each starting at its own
        // offset and wrapping around: every key is claimed by every process,
        // in many separate transactions that interleave across processes.
        let claimers: Vec<_> = (0..CLAIMERS)
            .map(|t| {
                let store = Arc::clone(&store);
                let offset = (index * CLAIMERS + t) * KEYS / (CHILDREN * CLAIMERS);
                tokio::spawn(async move {
                    let mut won = Vec::new();
                    for k in (0..KEYS).map(|k| (k + offset) % KEYS) {
                        match store
                            .claim(&key_n(k), &fp("same body"), LONG)
                            .await
                            .expect("claim")
                        {
                            Claim::Acquired(lease) => won.push((k, lease)),
                            Claim::Existing(rec) => assert_eq!(rec.fingerprint, fp("same body")),
                        }
                    }
                    won
                })
            })
            .collect();
        let mut leases = Vec::new();
        for task in claimers {
            for (k, lease) in task.await.expect("claim task") {
                println!("WON {k}");
                leases.push((k, lease));
            }
        }
        let completes: Vec<_> = leases
            .into_iter()
            .map(|(k, lease)| {
                let store = Arc::clone(&store);
                tokio::spawn(async move {
                    let payload = Bytes::from(format!("child-{index}"));
                    let w = store.complete(&lease, payload, LONG, &attempt()).await;
                    (k, w)
                })
            })
            .collect();
        for task in completes {
            let (k, w) = task.await.expect("complete task");
            assert_eq!(w.expect("complete"), Fenced::Applied);
            println!("DONE {k}");
        }
    });
}

/// A child claims and completes keys, printing each key only after
/// `complete` returned; the parent kills it with SIGKILL mid-way. Every
/// acknowledged key must be DONE with its payload in the reopened file, and
/// the PENDING key the dead process left behind is claimable once its lease
/// runs out.
#[test]
fn kill_nine_keeps_acknowledged_writes() {
    const ACKS_BEFORE_KILL: usize = 300;
    const PENDING_TTL: Duration = Duration::from_millis(1500);
    if let Ok(role) = std::env::var(ROLE) {
        if role == "kill" {
            kill_child(PENDING_TTL);
        }
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("kill.db");
    let mut child = spawn_child(
        "kill_nine_keeps_acknowledged_writes",
        "kill",
        &[(DB, &db)],
        0,
    );
    let out = child.stdout.take().expect("piped stdout");
    let mut lines = BufReader::new(out).lines();
    let mut acked = Vec::new();
    let mut pending_fence = None;
    let deadline = Instant::now() + HANG;
    while acked.len() < ACKS_BEFORE_KILL {
        assert!(Instant::now() < deadline, "child too slow");
        let Some(Ok(line)) = lines.next() else {
            panic!("child exited early: {:?}", child.wait());
        };
        parse_kill_line(&line, &mut acked, &mut pending_fence);
    }
    child.kill().expect("SIGKILL the child");
    child.wait().expect("reap child");
    // Lines written before the kill were acknowledged too.
    for line in lines.map_while(Result::ok) {
        parse_kill_line(&line, &mut acked, &mut pending_fence);
    }
    let pending_fence = pending_fence.expect("child reported its PENDING claim");

    // The PENDING row is in the file (whether or not its lease ran out yet).
    {
        let raw = rusqlite::Connection::open(&db).expect("raw open");
        let (done, fence): (i64, i64) = raw
            .query_row(
                "SELECT done, fence FROM records WHERE id = ?1",
                [pending_key().storage_id()],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .expect("pending row survived the kill");
        assert_eq!((done, u64::try_from(fence).ok()), (0, Some(pending_fence)));
    }

    let store = SqliteStore::open(&db).expect("reopen after kill");
    runtime().block_on(async {
        for &k in &acked {
            let rec = store.get(&key_n(k)).await.expect("get").unwrap_or_else(|| {
                panic!("acknowledged key {k} lost ({} acknowledged)", acked.len())
            });
            let want = format!("payload-{k}").into_bytes();
            assert_eq!(rec.payload().map(|p| p.to_vec()), Some(want), "key {k}");
        }
        tokio::time::sleep(PENDING_TTL + Duration::from_millis(500)).await;
        match store
            .claim(&pending_key(), &fp("same body"), LONG)
            .await
            .expect("claim")
        {
            Claim::Acquired(lease) => assert!(lease.fence > pending_fence),
            Claim::Existing(rec) => panic!("orphaned PENDING still held: {rec:?}"),
        }
    });
}

fn pending_key() -> ScopedKey {
    ScopedKey::new(
        "processes",
        "kill",
        ClientKey::parse("orphan").expect("key"),
    )
}

fn parse_kill_line(line: &str, acked: &mut Vec<usize>, pending: &mut Option<u64>) {
    acked.extend(tagged::<usize>(line, "ACK"));
    if let Some(fence) = tagged(line, "PENDING") {
        *pending = Some(fence);
    }
}

fn kill_child(pending_ttl: Duration) {
    const WORKERS: usize = 16;
    let db = env_path(DB);
    runtime().block_on(async move {
        let store = Arc::new(SqliteStore::open(&db).expect("open in child"));
        match store
            .claim(&pending_key(), &fp("same body"), pending_ttl)
            .await
            .expect("claim")
        {
            Claim::Acquired(lease) => println!("PENDING {}", lease.fence),
            Claim::Existing(rec) => panic!("fresh file holds {rec:?}"),
        }
        let workers: Vec<_> = (0..WORKERS)
            .map(|w| {
                let store = Arc::clone(&store);
                tokio::spawn(async move {
                    // Runs until the parent kills the process.
                    for k in (w..).step_by(WORKERS) {
                        let Claim::Acquired(lease) = store
                            .claim(&key_n(k), &fp("same body"), LONG)
                            .await
                            .expect("claim")
                        else {
                            panic!("key {k} already claimed");
                        };
                        let payload = Bytes::from(format!("payload-{k}"));
                        let w = store.complete(&lease, payload, LONG, &attempt()).await;
                        assert_eq!(w.expect("complete"), Fenced::Applied);
                        println!("ACK {k}");
                    }
                })
            })
            .collect();
        for w in workers {
            w.await.expect("worker");
        }
    });
}

/// Sanity check of the helpers above: a record's state survives a reopen in
/// the same process too (the file, not memory, holds it).
#[test]
fn reopen_keeps_records() {
    if std::env::var(ROLE).is_ok() {
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("reopen.db");
    runtime().block_on(async {
        let store = SqliteStore::open(&db).expect("open");
        let lease = acquired(
            store
                .claim(&key_n(1), &fp("same body"), LONG)
                .await
                .expect("claim"),
        );
        let w = store
            .complete(&lease, Bytes::from_static(b"kept"), LONG, &attempt())
            .await
            .expect("complete");
        assert_eq!(w, Fenced::Applied);
        drop(store);
        let store = SqliteStore::open(&db).expect("reopen");
        let rec = store.get(&key_n(1)).await.expect("get").expect("record");
        assert!(
            matches!(rec.state, RecordState::Done { ref payload, .. } if &payload[..] == b"kept")
        );
        assert_eq!(store.timeline(&key_n(1)).await.expect("timeline").len(), 1);
    });
}
