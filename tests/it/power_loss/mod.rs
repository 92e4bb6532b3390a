//! Power loss: the real `sessionstore` binary on a SQLite file whose
//! directory is a filesystem that keeps unsynced writes in memory and loses
//! them when the power is cut ([`fs`]: a FUSE filesystem served by this
//! test binary). Eight clients append exchanges (with request ids) to a few
//! sessions, and at a random point the power goes, losing everything
//! unsynced or a random part of it with torn sectors ([`Cut`]). The point
//! is one of two kinds ([`Trigger`]): after a random number of
//! acknowledgements (the server is killed with SIGKILL, then the power
//! cut), or at a random write, size change or sync of the filesystem,
//! wherever the server is (mid-transaction, between a commit's writes and
//! its sync, in a checkpoint; it sees only `EIO` from then on until it is
//! killed). The server then starts again on what survived, on a fresh
//! mount, and:
//!
//! - both database files (`sessions.db` and its `-search` file) pass
//!   `PRAGMA integrity_check` (read-only, before the server starts on them);
//! - every acknowledged exchange is there, exactly once, as acknowledged,
//!   and nothing else is (no exchange never sent, none twice), in whole
//!   exchanges, with sequences gap-free from 0 and the session's revision
//!   counting them;
//! - each exchange sent but not acknowledged (in flight at the cut), sent
//!   again with its request id, is answered either as a first append (it
//!   was lost) or with exactly what was stored (it survived), never
//!   appended twice; a sample of acknowledged ones, sent again, get their
//!   first answer;
//! - the search index agrees: each session's word of the cut's cycle finds
//!   exactly that cycle's exchanges, and words of the newest and of an older
//!   exchange find them.
//!
//! [`CUTS`] cuts a run for each `--sqlite-wal-writes` mode (one test each),
//! about ten seconds each. The run's seed is printed and is in every
//! failure message; `SESSIONSTORE_POWER_LOSS_SEED` runs a seed again (the
//! cut lands where the concurrent appends happen to be, so a seed repeats
//! the choices, not the exact timing). The servers' logs are kept, until
//! the next run, in `target/tmp/power-loss-MODE/`. Needs FUSE
//! (`support::prereq`, `fuse`: `bash .ci/fuse.sh`).

mod fs;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use sessionstore_client::SessionStoreClient;
use sessionstore_client::v1 as pb;
use tonic::transport::Channel;

use crate::support::prereq::{self, Prerequisite};
use crate::support::{
    ServerProcess, assistant, call, messages_in_pages, sessionstore_binary, user,
};
use fs::{Cut, CutReport, Disk, Mount};

/// Power cuts a test makes.
const CUTS: usize = 30;
/// Concurrent appending clients.
const WRITERS: usize = 8;
/// Sessions they append to.
const SESSIONS: usize = 4;
/// The most acknowledgements a cycle waits for before the cut (the number
/// is drawn from 0 to this).
const MAX_ACKS_BEFORE_CUT: u64 = 120;
/// How long anything that should happen promptly may take.
const PATIENCE: Duration = Duration::from_secs(60);

/// The most changes (writes, size changes, syncs) a cycle's filesystem
/// sees before a cut it makes itself (drawn from 1 to this), by
/// `--sqlite-wal-writes` mode: gathered, a commit takes a few writes;
/// direct, two a page. About the same number of appends either way.
fn max_changes_before_cut(wal_writes: &str) -> u64 {
    if wal_writes == "gathered" { 500 } else { 1500 }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gathered_wal_writes() {
    power_loss("gathered").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_wal_writes() {
    power_loss("direct").await;
}

/// A small seeded generator (SplitMix64).
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number below `n` (> 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// True `a` times in `b`.
    pub fn chance(&mut self, a: u64, b: u64) -> bool {
        self.below(b) < a
    }

    fn index(&mut self, len: usize) -> usize {
        usize::try_from(self.below(len as u64)).expect("an index fits usize")
    }
}

/// The run's seed: `SESSIONSTORE_POWER_LOSS_SEED`, or the clock.
fn seed() -> u64 {
    match std::env::var("SESSIONSTORE_POWER_LOSS_SEED") {
        Ok(seed) => seed
            .trim()
            .parse()
            .expect("SESSIONSTORE_POWER_LOSS_SEED is a number"),
        Err(_) => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| since.as_nanos() as u64),
    }
}

/// One exchange ever sent, and its acknowledgement once there is one.
struct Sent {
    key: String,
    session: usize,
    cycle: usize,
    writer: usize,
    request: pb::AppendExchangeRequest,
    ack: Option<pb::AppendExchangeResponse>,
}

/// Everything sent in a test, by key.
#[derive(Default)]
struct Ledger {
    sessions: Vec<String>,
    sent: Vec<Sent>,
    by_key: HashMap<String, usize>,
}

impl Ledger {
    fn add(&mut self, sent: Sent) {
        self.by_key.insert(sent.key.clone(), self.sent.len());
        self.sent.push(sent);
    }
}

/// What a test says about itself in every failure.
struct Context {
    test: String,
    seed: u64,
    cut: usize,
    /// The cut's kind and when it comes, once chosen.
    how: Option<(Cut, Trigger)>,
    /// Where the servers' logs are (`server-N.log`: started after cut N).
    logs: PathBuf,
}

impl std::fmt::Display for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "[{} seed {} (SESSIONSTORE_POWER_LOSS_SEED={}), cut {}",
            self.test, self.seed, self.seed, self.cut
        )?;
        if let Some((how, trigger)) = self.how {
            write!(f, " ({how:?}, {trigger})")?;
        }
        write!(f, "; server logs in {}]", self.logs.display())
    }
}

async fn power_loss(wal_writes: &'static str) {
    let test = prereq::current_test();
    if let Some(missing) = Prerequisite::Fuse.missing_here().await {
        prereq::missing(Prerequisite::Fuse, &test, &missing);
        return;
    }
    let backing = tempfile::tempdir().expect("a temporary directory for the disk");
    let mountpoints = tempfile::tempdir().expect("a temporary directory to mount in");
    // The servers' logs stay after a failure, until the next run.
    let logs = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("power-loss-{wal_writes}"));
    let _ = std::fs::remove_dir_all(&logs);
    std::fs::create_dir_all(&logs).expect("a directory for server logs");
    let mut mount = match mount(backing.path(), mountpoints.path(), 0).await {
        Ok(mount) => mount,
        Err(error) => {
            prereq::missing(
                Prerequisite::Fuse,
                &test,
                &format!("cannot mount a FUSE filesystem: {error}"),
            );
            return;
        }
    };
    let binary = tokio::task::spawn_blocking(sessionstore_binary)
        .await
        .expect("build sessionstore");
    let seed = seed();
    let tag = &wal_writes[..1];
    let mut rng = Rng::new(seed ^ u64::from(tag.as_bytes()[0]));
    let mut ctx = Context {
        test: test.clone(),
        seed,
        cut: 0,
        how: None,
        logs: logs.clone(),
    };
    println!("{test}: seed {seed} (SESSIONSTORE_POWER_LOSS_SEED={seed} runs it again)");
    let started = Instant::now();

    let extra = ["--sqlite-wal-writes", wal_writes];
    let mut server = ServerProcess::start(
        &binary,
        &database_url(&mount),
        "127.0.0.1:0",
        logs.join("server-0.log"),
        &extra,
    )
    .await;
    let mut ledger = Ledger::default();
    let mut client = client_of(&server).await;
    for s in 0..SESSIONS {
        let session = client
            .create_session(pb::CreateSessionRequest {
                session_id: format!("ses_power_{tag}{s}"),
                title: format!("power loss {s}"),
                ..Default::default()
            })
            .await
            .unwrap_or_else(|status| panic!("{ctx}: create session {s}: {status:?}"))
            .into_inner();
        ledger.sessions.push(session.id);
    }

    let mut totals = Totals::default();
    for cut in 1..=CUTS {
        ctx.cut = cut;
        let how = if rng.chance(1, 2) {
            Cut::LoseAll
        } else {
            Cut::Torn
        };
        let trigger = if rng.chance(1, 2) {
            Trigger::AfterAcks(rng.below(MAX_ACKS_BEFORE_CUT + 1))
        } else {
            Trigger::AtChange(1 + rng.below(max_changes_before_cut(wal_writes)))
        };
        ctx.how = Some((how, trigger));
        let (cycle, report) = append_until_killed(
            &mut server,
            &mount.disk,
            &mut ledger,
            cut,
            tag,
            &mut rng,
            &ctx,
        )
        .await;
        let syncs = mount.disk.syncs();
        unmount(mount, &ctx).await;
        mount = self::mount(backing.path(), mountpoints.path(), cut)
            .await
            .unwrap_or_else(|error| panic!("{ctx}: mount again: {error}"));

        integrity_check(&database(&mount), &ctx).await;
        server = ServerProcess::start(
            &binary,
            &database_url(&mount),
            "127.0.0.1:0",
            logs.join(format!("server-{cut}.log")),
            &extra,
        )
        .await;
        let checked = verify(&server, &mut ledger, cut, tag, &mut rng, &ctx).await;
        println!(
            "cut {cut} ({how:?}, {trigger}): {} acknowledged, {} in flight ({} survived, {} lost); \
             {syncs} syncs since the mount; unsynced sectors at the cut: {}, of which {} written, \
             {} lost, {} torn; sizes {} kept, {} lost; {} exchanges stored",
            cycle.acked,
            cycle.in_flight,
            checked.survived,
            checked.lost,
            report
                .files
                .iter()
                .map(|(name, sectors)| format!("{name} {sectors}"))
                .collect::<Vec<_>>()
                .join(", "),
            report.written,
            report.lost,
            report.torn,
            report.sizes_kept,
            report.sizes_lost,
            checked.stored
        );
        totals.acked += cycle.acked;
        totals.in_flight += cycle.in_flight;
        totals.survived += checked.survived;
        totals.torn += report.torn;
        totals.dirty_sectors += report.written + report.lost + report.torn;
    }

    // A graceful stop leaves whole files too.
    ctx.how = None;
    let status = server.terminate().await;
    assert!(
        status.success(),
        "{ctx}: sessionstore exited {status} on SIGTERM"
    );
    integrity_check(&database(&mount), &ctx).await;
    unmount(mount, &ctx).await;
    println!(
        "{test}: {CUTS} power cuts in {:.1?}: {} exchanges acknowledged, {} in flight at a cut \
         ({} of them survived), {} unsynced sectors at the cuts ({} torn); seed {seed}",
        started.elapsed(),
        totals.acked,
        totals.in_flight,
        totals.survived,
        totals.dirty_sectors,
        totals.torn
    );
}

#[derive(Default)]
struct Totals {
    acked: usize,
    in_flight: usize,
    survived: usize,
    dirty_sectors: usize,
    torn: usize,
}

/// Mounts the power-loss filesystem over `backing`, at a new directory
/// `n` in `mountpoints` (see [`Mount::new`]).
async fn mount(backing: &Path, mountpoints: &Path, n: usize) -> std::io::Result<Mount> {
    let backing = backing.to_owned();
    let mountpoint = mountpoints.join(n.to_string());
    tokio::task::spawn_blocking(move || {
        std::fs::create_dir(&mountpoint)?;
        Mount::new(&backing, &mountpoint)
    })
    .await
    .expect("the mount task runs")
}

/// Unmounts, failing if the filesystem is still held after [`PATIENCE`]
/// (nothing should hold it: the server is dead, the checks' connections
/// closed).
async fn unmount(mount: Mount, ctx: &Context) {
    let path = mount.path().to_owned();
    tokio::time::timeout(
        PATIENCE,
        tokio::task::spawn_blocking(move || mount.unmount()),
    )
    .await
    .unwrap_or_else(|_| {
        panic!(
            "{ctx}: {} still held {PATIENCE:?} after unmounting it",
            path.display()
        )
    })
    .expect("the unmount task runs")
    .unwrap_or_else(|error| panic!("{ctx}: unmount {}: {error}", path.display()));
}

/// The database file in a mount.
fn database(mount: &Mount) -> PathBuf {
    mount.path().join("sessions.db")
}

fn database_url(mount: &Mount) -> String {
    format!("sqlite://{}", database(mount).display())
}

/// A client of `server`: 5 s to connect, 30 s a call.
async fn client_of(server: &ServerProcess) -> SessionStoreClient<Channel> {
    server
        .client_with_timeouts(Duration::from_secs(5), Duration::from_secs(30))
        .await
}

/// Words the messages are padded with, so that they fill several sectors.
const FILLER: [&str; 8] = [
    "alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel",
];

fn filler(rng: &mut Rng) -> String {
    let words = rng.below(120);
    (0..words)
        .map(|_| FILLER[rng.index(FILLER.len())])
        .collect::<Vec<_>>()
        .join(" ")
}

/// The words that find an exchange: its key, a cycle's word for a session.
fn cycle_word(tag: &str, cycle: usize, session: usize) -> String {
    format!("cyc{tag}{cycle}s{session}")
}

/// A new exchange: its user message starts with `KEYq`, its answer with
/// `KEYa`; the user message holds its cycle's word.
fn exchange(
    ledger: &Ledger,
    tag: &str,
    cycle: usize,
    writer: usize,
    n: usize,
    rng: &mut Rng,
) -> Sent {
    let key = format!("{tag}c{cycle}w{writer}n{n}");
    let session = rng.index(SESSIONS);
    let request = pb::AppendExchangeRequest {
        session_id: ledger.sessions[session].clone(),
        messages: vec![user(&format!(
            "{key}q {} {}",
            cycle_word(tag, cycle, session),
            filler(rng)
        ))],
        provider_call: Some(call("gpt-power", 3, 4, 5)),
        response_messages: vec![assistant(&format!("{key}a {}", filler(rng)))],
        request_id: format!("req-{key}"),
        ..Default::default()
    };
    Sent {
        key,
        session,
        cycle,
        writer,
        request,
        ack: None,
    }
}

/// When a cycle's power cut comes.
#[derive(Clone, Copy, Debug)]
enum Trigger {
    /// After this many acknowledgements, the server killed first.
    AfterAcks(u64),
    /// Instead of the filesystem's this-many-th change (a write, a size
    /// change or a sync), wherever the server is; then it is killed.
    AtChange(u64),
}

impl std::fmt::Display for Trigger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Trigger::AfterAcks(acks) => write!(f, "killed after {acks} acknowledgements"),
            Trigger::AtChange(changes) => write!(f, "at change {changes}"),
        }
    }
}

/// What one cycle of appends came to.
struct Cycle {
    acked: usize,
    in_flight: usize,
}

/// Runs the writers against `server` until `target` acknowledgements (or
/// at once, for 0), then kills the server with SIGKILL. Every exchange sent
/// goes into the ledger, with its acknowledgement if it got one.
async fn append_until_killed(
    server: &mut ServerProcess,
    disk: &Disk,
    ledger: &mut Ledger,
    cycle: usize,
    tag: &'static str,
    rng: &mut Rng,
    ctx: &Context,
) -> (Cycle, CutReport) {
    let (how, trigger) = ctx.how.expect("the cycle's cut is chosen");
    let killing = Arc::new(AtomicBool::new(false));
    let (acks_tx, mut acks_rx) = tokio::sync::watch::channel(0_u64);
    let acks_tx = Arc::new(acks_tx);
    // Requests are made here (they need the ledger's sessions) and handed
    // to the writers in order; each writer makes its own.
    let sessions = Arc::new(Ledger {
        sessions: ledger.sessions.clone(),
        ..Default::default()
    });
    let tripped = match trigger {
        Trigger::AtChange(changes) => Some(disk.arm(changes, how, Rng::new(rng.next()))),
        Trigger::AfterAcks(_) => None,
    };
    let results: Arc<Mutex<Vec<Sent>>> = Arc::default();
    let mut writers = Vec::new();
    for writer in 0..WRITERS {
        let mut client = client_of(server).await;
        let mut rng = Rng::new(rng.next());
        let (killing, acks_tx, sessions, results, disk) = (
            Arc::clone(&killing),
            Arc::clone(&acks_tx),
            Arc::clone(&sessions),
            Arc::clone(&results),
            disk.clone(),
        );
        let ctx = ctx.to_string();
        writers.push(tokio::spawn(async move {
            for n in 0.. {
                let mut sent = exchange(&sessions, tag, cycle, writer, n, &mut rng);
                let answer = client.append_exchange(sent.request.clone()).await;
                let done = match answer {
                    Ok(response) => {
                        sent.ack = Some(response.into_inner());
                        false
                    }
                    Err(status) => {
                        assert!(
                            killing.load(Ordering::SeqCst) || disk.is_cut(),
                            "{ctx}: append {} failed while the server was up: {status:?}",
                            sent.key
                        );
                        true
                    }
                };
                let acked = sent.ack.is_some();
                results
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(sent);
                if done {
                    return;
                }
                if acked {
                    acks_tx.send_modify(|count| *count += 1);
                }
                assert!(n < 100_000, "{ctx}: the server was never killed");
            }
        }));
    }
    let report = match trigger {
        Trigger::AtChange(changes) => {
            let tripped = tripped.expect("armed above");
            // The power goes first; the server, seeing only EIO since,
            // is killed after.
            let report = tokio::time::timeout(PATIENCE, tripped)
                .await
                .unwrap_or_else(|_| panic!("{ctx}: {changes} changes within {PATIENCE:?}"))
                .unwrap_or_else(|_| panic!("{ctx}: the filesystem dropped its armed cut"))
                .unwrap_or_else(|error| panic!("{ctx}: cutting the power: {error}"));
            killing.store(true, Ordering::SeqCst);
            server.kill().await;
            report
        }
        Trigger::AfterAcks(target) => {
            tokio::time::timeout(PATIENCE, acks_rx.wait_for(|count| *count >= target))
                .await
                .unwrap_or_else(|_| panic!("{ctx}: {target} acknowledgements within {PATIENCE:?}"))
                .unwrap_or_else(|_| {
                    panic!("{ctx}: every writer stopped before {target} acknowledgements")
                });
            // The server dies first: nothing it does reaches the disk after.
            killing.store(true, Ordering::SeqCst);
            server.kill().await;
            disk.cut(how, rng)
                .unwrap_or_else(|error| panic!("{ctx}: cutting the power: {error}"))
        }
    };
    for writer in writers {
        tokio::time::timeout(PATIENCE, writer)
            .await
            .unwrap_or_else(|_| panic!("{ctx}: a writer did not notice the dead server"))
            .unwrap_or_else(|error| panic!("{ctx}: a writer failed: {error}"));
    }
    let results = std::mem::take(&mut *results.lock().unwrap_or_else(PoisonError::into_inner));
    let acked = results.iter().filter(|sent| sent.ack.is_some()).count();
    let in_flight = results.len() - acked;
    for sent in results {
        ledger.add(sent);
    }
    (Cycle { acked, in_flight }, report)
}

/// `PRAGMA integrity_check` of the database and its search file, read-only
/// (a read-only connection recovers from the WAL in memory and never
/// checkpoints), with no server running.
async fn integrity_check(db: &Path, ctx: &Context) {
    use sqlx::{ConnectOptions as _, Connection as _};
    let mut search = db.as_os_str().to_owned();
    search.push("-search");
    for path in [db.to_owned(), PathBuf::from(search)] {
        if !path.exists() {
            assert_ne!(path, db, "{ctx}: the database file is gone");
            continue;
        }
        let mut conn = sqlx::sqlite::SqliteConnectOptions::new()
            .filename(&path)
            .read_only(true)
            .connect()
            .await
            .unwrap_or_else(|error| panic!("{ctx}: open {} read-only: {error}", path.display()));
        let rows: Vec<String> = sqlx::query_scalar("PRAGMA integrity_check")
            .fetch_all(&mut conn)
            .await
            .unwrap_or_else(|error| {
                panic!("{ctx}: integrity_check of {}: {error}", path.display())
            });
        conn.close()
            .await
            .unwrap_or_else(|error| panic!("{ctx}: close {}: {error}", path.display()));
        assert_eq!(
            rows,
            ["ok"],
            "{ctx}: PRAGMA integrity_check of {} after the power cut",
            path.display()
        );
    }
}

/// What a check after a restart found.
struct Checked {
    /// Exchanges in flight at the kill that were stored / lost.
    survived: usize,
    lost: usize,
    /// Exchanges stored in all, after the retries.
    stored: usize,
}

/// Every stored message of each session.
async fn read_sessions(
    client: &mut SessionStoreClient<Channel>,
    ledger: &Ledger,
) -> Vec<Vec<pb::StoredMessage>> {
    let mut stored = Vec::new();
    for id in &ledger.sessions {
        stored.push(messages_in_pages(client, id, 500).await);
    }
    stored
}

/// The key of an exchange from its stored user message.
fn key_of(message: &pb::StoredMessage) -> Option<&str> {
    let content = &message.message.as_ref()?.content;
    content.split_whitespace().next()?.strip_suffix('q')
}

fn content(message: &pb::StoredMessage) -> &str {
    message.message.as_ref().map_or("", |m| m.content.as_str())
}

/// Checks what the sessions hold against the ledger: whole exchanges,
/// sequences from 0 without a gap, each exchange one that was sent, once,
/// in its session, with the content sent; every acknowledged one there as
/// acknowledged. Returns where each stored exchange is (session, index of
/// its first message).
fn check_stored(
    stored: &[Vec<pb::StoredMessage>],
    ledger: &Ledger,
    ctx: &Context,
) -> HashMap<String, (usize, usize)> {
    let mut found: HashMap<String, (usize, usize)> = HashMap::new();
    for (s, messages) in stored.iter().enumerate() {
        for (i, message) in messages.iter().enumerate() {
            assert_eq!(
                message.sequence,
                i64::try_from(i).expect("fits"),
                "{ctx}: session {s}: sequences must run from 0 without a gap"
            );
        }
        assert_eq!(
            messages.len() % 2,
            0,
            "{ctx}: session {s}: a torn exchange (an odd number of messages)"
        );
        for (pair, exchange) in messages.chunks(2).enumerate() {
            let at = pair * 2;
            let key = key_of(&exchange[0]).unwrap_or_else(|| {
                panic!("{ctx}: session {s}, sequence {at}: not a sent exchange: {exchange:?}")
            });
            let index = *ledger.by_key.get(key).unwrap_or_else(|| {
                panic!("{ctx}: session {s}, sequence {at}: exchange {key} was never sent")
            });
            let sent = &ledger.sent[index];
            assert_eq!(
                sent.session, s,
                "{ctx}: exchange {key} stored in the wrong session"
            );
            let role = |m: &pb::StoredMessage| m.message.as_ref().map(|m| m.role);
            assert_eq!(
                role(&exchange[0]),
                Some(pb::Role::User.into()),
                "{ctx}: {key}"
            );
            assert_eq!(
                role(&exchange[1]),
                Some(pb::Role::Assistant.into()),
                "{ctx}: {key}"
            );
            assert_eq!(
                content(&exchange[0]),
                sent.request.messages[0].content,
                "{ctx}: exchange {key}: the user message's content changed"
            );
            assert_eq!(
                content(&exchange[1]),
                sent.request.response_messages[0].content,
                "{ctx}: exchange {key}: the answer's content changed"
            );
            assert!(
                !exchange[1].produced_by_call_id.is_empty(),
                "{ctx}: exchange {key}: the answer lost its provider call"
            );
            if let Some(earlier) = found.insert(key.to_owned(), (s, at)) {
                panic!(
                    "{ctx}: exchange {key} stored twice: session {}, sequence {} and session {s}, sequence {at}",
                    earlier.0, earlier.1
                );
            }
        }
    }
    for sent in &ledger.sent {
        let Some(ack) = &sent.ack else { continue };
        let Some(&(s, at)) = found.get(&sent.key) else {
            panic!(
                "{ctx}: LOST: exchange {} (session {}, sequences {:?}, revision {}), acknowledged in cycle {}, is not stored",
                sent.key,
                sent.session,
                ack.messages.iter().map(|m| m.sequence).collect::<Vec<_>>(),
                ack.revision,
                sent.cycle
            );
        };
        assert_eq!(
            &stored[s][at..at + 2],
            ack.messages.as_slice(),
            "{ctx}: acknowledged exchange {} is stored other than acknowledged",
            sent.key
        );
    }
    found
}

/// Every hit of a search.
async fn search(
    client: &mut SessionStoreClient<Channel>,
    query: &str,
    ctx: &Context,
) -> Vec<pb::SearchHit> {
    let mut hits = Vec::new();
    let mut page_token = String::new();
    loop {
        let page = client
            .search_messages(pb::SearchMessagesRequest {
                query: query.to_owned(),
                page_size: 1000,
                page_token,
                ..Default::default()
            })
            .await
            .unwrap_or_else(|status| panic!("{ctx}: search {query}: {status:?}"))
            .into_inner();
        hits.extend(page.hits);
        if page.next_page_token.is_empty() {
            return hits;
        }
        page_token = page.next_page_token;
    }
}

/// The checks after a restart (see the module's notes); retries what the
/// kill left unacknowledged, so that afterwards every exchange sent is
/// acknowledged.
async fn verify(
    server: &ServerProcess,
    ledger: &mut Ledger,
    cycle: usize,
    tag: &str,
    rng: &mut Rng,
    ctx: &Context,
) -> Checked {
    let mut client = client_of(server).await;
    let before = read_sessions(&mut client, ledger).await;
    let found = check_stored(&before, ledger, ctx);

    // What was in flight at the kill: sent again, it is either new or what
    // was stored.
    let (mut survived, mut lost) = (0, 0);
    for sent in ledger.sent.iter_mut().filter(|sent| sent.ack.is_none()) {
        let response = client
            .append_exchange(sent.request.clone())
            .await
            .unwrap_or_else(|status| {
                panic!("{ctx}: retry of unacknowledged {}: {status:?}", sent.key)
            })
            .into_inner();
        match found.get(&sent.key) {
            Some(&(s, at)) => {
                survived += 1;
                assert_eq!(
                    response.messages.as_slice(),
                    &before[s][at..at + 2],
                    "{ctx}: the retry of {}, stored though never acknowledged, must answer with what is stored",
                    sent.key
                );
            }
            None => {
                lost += 1;
                let first = response.messages.first().map_or(-1, |m| m.sequence);
                assert!(
                    first >= i64::try_from(before[sent.session].len()).expect("fits"),
                    "{ctx}: the retry of {} (lost at the cut) must append it at the end, not at {first}",
                    sent.key
                );
            }
        }
        sent.ack = Some(response);
    }

    // Acknowledged ones sent again get their first answer: each writer's
    // last of the cycle, and a few older ones.
    let mut again: BTreeMap<usize, usize> = BTreeMap::new();
    for (index, sent) in ledger.sent.iter().enumerate() {
        if sent.cycle == cycle {
            again.insert(sent.writer, index);
        }
    }
    let mut sample: Vec<usize> = again.into_values().collect();
    for _ in 0..4 {
        sample.push(rng.index(ledger.sent.len()));
    }
    for index in sample {
        let sent = &ledger.sent[index];
        let response = client
            .append_exchange(sent.request.clone())
            .await
            .unwrap_or_else(|status| {
                panic!("{ctx}: repeat of acknowledged {}: {status:?}", sent.key)
            })
            .into_inner();
        let ack = sent
            .ack
            .as_ref()
            .expect("every exchange is acknowledged by now");
        assert_eq!(
            (&response.messages, response.revision),
            (&ack.messages, ack.revision),
            "{ctx}: a repeat of acknowledged {} must get its first answer",
            sent.key
        );
    }

    // Now the sessions hold exactly what was sent, each once.
    let after = read_sessions(&mut client, ledger).await;
    let found = check_stored(&after, ledger, ctx);
    assert_eq!(
        found.len(),
        ledger.sent.len(),
        "{ctx}: every exchange sent is stored once"
    );
    for (s, id) in ledger.sessions.iter().enumerate() {
        let session = client
            .get_session(pb::GetSessionRequest {
                session_id: id.clone(),
                ..Default::default()
            })
            .await
            .unwrap_or_else(|status| panic!("{ctx}: get session {s}: {status:?}"))
            .into_inner();
        let exchanges = i64::try_from(after[s].len() / 2).expect("fits");
        assert_eq!(
            session.revision,
            1 + exchanges,
            "{ctx}: session {s}: its revision counts its creation and its exchanges"
        );
    }

    // The search index: the cycle's word finds exactly the cycle's
    // exchanges of each session; the newest exchange and an older one are
    // found by their own words.
    for (s, messages) in after.iter().enumerate() {
        let word = cycle_word(tag, cycle, s);
        let mut expected: Vec<&str> = ledger
            .sent
            .iter()
            .filter(|sent| sent.cycle == cycle && sent.session == s)
            .map(|sent| {
                let (at_s, at) = found[&sent.key];
                after[at_s][at].id.as_str()
            })
            .collect();
        expected.sort_unstable();
        let hits = search(&mut client, &word, ctx).await;
        let mut got: Vec<&str> = hits.iter().map(|hit| hit.message_id.as_str()).collect();
        got.sort_unstable();
        assert_eq!(
            got, expected,
            "{ctx}: session {s}: a search for {word} finds exactly the cycle's exchanges of the session"
        );
        if messages.is_empty() {
            continue;
        }
        let newest = messages.len() - 2;
        let older = 2 * rng.index(messages.len() / 2);
        for (at, suffix, offset) in [(newest, 'a', 1), (older, 'q', 0)] {
            let key = key_of(&messages[at]).expect("checked above");
            let word = format!("{key}{suffix}");
            let hits = search(&mut client, &word, ctx).await;
            let ids: Vec<&str> = hits.iter().map(|hit| hit.message_id.as_str()).collect();
            assert_eq!(
                ids,
                [messages[at + offset].id.as_str()],
                "{ctx}: session {s}: a search for {word} finds its message once"
            );
        }
    }
    Checked {
        survived,
        lost,
        stored: found.len(),
    }
}
