//! Rolling upgrades on PostgreSQL: the previous release (commit
//! 647c5088, schema 19, built by `.ci/previous-release.sh`) keeps serving,
//! under load, while this build starts beside it on the same database and
//! applies its expand migrations; both serve one gap-free transcript; the
//! old one restarts; the replica registry lists who runs; `migrate
//! --finalize` waits for replicas below its schema; a database finalized
//! past a binary is refused by it. Also the URL forms: libpq's multi-host
//! URL for `migrate`, and `target_session_attrs` values refused at start.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use sessionstore_client::SessionStoreClient;
use sessionstore_client::v1 as pb;
use sessionstore_client::v1::session_event::Event;
use sqlx::Connection as _;
use tokio::sync::watch;
use tonic::transport::Channel;

use crate::support::cluster::{Cluster, multi_host_url};
use crate::support::{
    PgDatabase, ServerProcess, all_messages, assert_appended, assistant, call, connect, content,
    create, get, sessionstore_binary, user,
};

type Client = SessionStoreClient<Channel>;

/// The previous release's schema: `_sqlx_migrations` keeps 1–19.
const PREVIOUS_SCHEMA: i64 = 19;
/// Sessions both binaries write to.
const SESSIONS: usize = 2;
/// Each writer appends at most once per this (a load, not a flood).
const WRITE_EVERY: Duration = Duration::from_millis(40);
/// Acknowledged writes to wait for between steps.
const WRITES_PER_STEP: usize = 30;
/// Safety net for one call, or for "the next step happens".
const WAIT: Duration = Duration::from_secs(30);

/// The previous release's binary: `.ci/previous-release.sh` prints its
/// path, building it first if it is not cached (minutes, once).
fn previous_release_binary() -> PathBuf {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../.ci/previous-release.sh");
    let mut command = std::process::Command::new("bash");
    command.arg(script);
    // Nor is the workspace's target directory: the old release builds in
    // a directory of its own.
    crate::support::without_cargo_test_env(&mut command);
    command.env_remove("CARGO_TARGET_DIR");
    let output = command
        .stderr(std::process::Stdio::inherit())
        .output()
        .expect("run .ci/previous-release.sh");
    assert!(
        output.status.success(),
        ".ci/previous-release.sh failed ({})",
        output.status
    );
    let path = PathBuf::from(String::from_utf8(output.stdout).expect("UTF-8").trim());
    assert!(
        path.is_file(),
        "no previous release binary at {}",
        path.display()
    );
    path
}

/// Runs `binary ARGS` to its end (at most [`WAIT`]) with no
/// `SESSIONSTORE_*` settings from the environment.
async fn run(binary: &Path, args: &[&str]) -> Output {
    let mut command = tokio::process::Command::new(binary);
    command
        .args(args)
        .env_remove("SESSIONSTORE_DATABASE_URL")
        .env_remove("SESSIONSTORE_AUTH_TOKENS")
        .env("NO_COLOR", "1")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    tokio::time::timeout(WAIT, command.output())
        .await
        .unwrap_or_else(|_| panic!("{} {args:?} still runs after {WAIT:?}", binary.display()))
        .expect("run sessionstore")
}

fn describe(output: &Output) -> String {
    format!(
        "exit {:?}\n--- stdout ---\n{}\n--- stderr ---\n{}",
        output.status.code(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

fn stderr_lines(output: &Output) -> Vec<String> {
    String::from_utf8_lossy(&output.stderr)
        .lines()
        .map(str::to_owned)
        .collect()
}

/// `sessionstore migrate [EXTRA] --database-url URL`.
async fn migrate(binary: &Path, url: &str, extra: &[&str]) -> Output {
    let mut args = vec!["migrate"];
    args.extend(extra);
    args.extend(["--database-url", url]);
    run(binary, &args).await
}

/// The pending migrations `migrate --check` printed: `VERSION KIND DESCRIPTION`.
fn pending(output: &Output) -> Vec<(i64, String)> {
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| {
            let mut words = line.split_whitespace();
            let version = words
                .next()
                .and_then(|v| v.parse::<i64>().ok())
                .unwrap_or_else(|| panic!("not `VERSION KIND DESCRIPTION`: {line:?}"));
            let kind = words.next().unwrap_or_default().to_owned();
            assert!(
                kind == "expand" || kind == "finalize",
                "kind of {line:?} is expand or finalize"
            );
            assert!(words.next().is_some(), "a description in {line:?}");
            (version, kind)
        })
        .collect()
}

/// `sessionstore replicas --format json`: the live replicas.
async fn live_replicas(
    binary: &Path,
    url: &str,
) -> Vec<serde_json::Map<String, serde_json::Value>> {
    let output = run(
        binary,
        &["replicas", "--database-url", url, "--format", "json"],
    )
    .await;
    assert_eq!(
        output.status.code(),
        Some(0),
        "replicas: {}",
        describe(&output)
    );
    let value: serde_json::Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|error| panic!("replicas --format json: {error}: {}", describe(&output)));
    let rows = value.as_array().expect("one JSON array").clone();
    let keys: HashSet<&str> = [
        "replica_id",
        "version",
        "schema",
        "address",
        "start_time",
        "heartbeat_time",
    ]
    .into();
    rows.into_iter()
        .map(|row| {
            let object = row.as_object().expect("an object per replica").clone();
            let got: HashSet<&str> = object.keys().map(String::as_str).collect();
            assert_eq!(got, keys, "exactly the six keys: {object:?}");
            object
        })
        .collect()
}

/// The row of the replica listening on `port`, if listed.
fn replica_on(
    rows: &[serde_json::Map<String, serde_json::Value>],
    port: u16,
) -> Option<&serde_json::Map<String, serde_json::Value>> {
    rows.iter().find(|row| {
        row["address"]
            .as_str()
            .is_some_and(|address| address.ends_with(&format!(":{port}")))
    })
}

fn is_rfc3339(value: &serde_json::Value) -> bool {
    // YYYY-MM-DDTHH:MM:SS, fractions optional, then Z or ±HH:MM.
    let Some(text) = value.as_str() else {
        return false;
    };
    let bytes = text.as_bytes();
    let digits = |range: std::ops::Range<usize>| {
        bytes
            .get(range)
            .is_some_and(|part| part.iter().all(u8::is_ascii_digit))
    };
    bytes.len() >= 20
        && digits(0..4)
        && bytes[4] == b'-'
        && digits(5..7)
        && bytes[7] == b'-'
        && digits(8..10)
        && (bytes[10] == b'T' || bytes[10] == b't')
        && digits(11..13)
        && bytes[13] == b':'
        && digits(14..16)
        && bytes[16] == b':'
        && digits(17..19)
        && (text.ends_with('Z')
            || text.ends_with('z')
            || text[19..].contains('+')
            || text[19..].contains('-'))
}

async fn sql(url: &str) -> sqlx::PgConnection {
    sqlx::PgConnection::connect(url)
        .await
        .expect("connect to the test database")
}

/// The applied `_sqlx_migrations` versions.
async fn sqlx_versions(conn: &mut sqlx::PgConnection) -> Vec<i64> {
    sqlx::query_scalar("SELECT version FROM _sqlx_migrations ORDER BY version")
        .fetch_all(conn)
        .await
        .expect("read _sqlx_migrations")
}

/// The `sessionstore_migrations` rows: (version, kind).
async fn later_migrations(conn: &mut sqlx::PgConnection) -> Vec<(i64, String)> {
    sqlx::query_as("SELECT version, kind FROM sessionstore_migrations ORDER BY version")
        .fetch_all(conn)
        .await
        .expect("read sessionstore_migrations")
}

fn session_id(s: usize) -> String {
    format!("ses_upgrade_{s}")
}

fn exchange(session: usize, request_id: &str) -> pb::AppendExchangeRequest {
    pb::AppendExchangeRequest {
        session_id: session_id(session),
        request_id: request_id.to_owned(),
        messages: vec![user(&format!("request {request_id}"))],
        provider_call: Some(call("gpt-upgrade", 10, 5, 42)),
        response_messages: vec![assistant(&format!("answer to {request_id}"))],
        ..Default::default()
    }
}

/// One binary's writers and watchers; every failed call or ended watch is
/// recorded (none is allowed).
struct Load {
    name: &'static str,
    stop: watch::Sender<bool>,
    writers: Vec<tokio::task::JoinHandle<(Vec<Acked>, Vec<String>)>>,
    watchers: Vec<tokio::task::JoinHandle<Watched>>,
    /// Where each watcher should stop: the heads once the writes are done.
    heads: watch::Sender<Option<Vec<i64>>>,
    acks: watch::Receiver<usize>,
}

/// An acknowledged exchange: (session, request id, answer).
type Acked = (usize, String, pb::AppendExchangeResponse);

struct Watched {
    name: String,
    session: usize,
    after: i64,
    events: Vec<pb::SessionEvent>,
    failures: Vec<String>,
}

impl Load {
    /// A writer per session and a watcher per session (from the current
    /// head) on the replica at `endpoint`.
    async fn start(name: &'static str, endpoint: &str) -> Load {
        let (stop, stop_rx) = watch::channel(false);
        let (heads, heads_rx) = watch::channel(None::<Vec<i64>>);
        let (acked, acks) = watch::channel(0_usize);
        let acked = std::sync::Arc::new(acked);
        let mut watchers = Vec::new();
        for session in 0..SESSIONS {
            let mut client = connect(endpoint).await;
            let after = get(&mut client, &session_id(session)).await.revision;
            let stream = client
                .watch_session(pb::WatchSessionRequest {
                    session_id: session_id(session),
                    after_revision: after,
                    ..Default::default()
                })
                .await
                .unwrap_or_else(|status| panic!("{name}: watch {session}: {status:?}"))
                .into_inner();
            watchers.push(tokio::spawn(watch_until_head(
                format!("{name}'s watcher of {}", session_id(session)),
                stream,
                session,
                after,
                heads_rx.clone(),
            )));
        }
        let mut writers = Vec::new();
        for session in 0..SESSIONS {
            let mut client: Client = connect(endpoint).await;
            let mut stop = stop_rx.clone();
            let acked = acked.clone();
            writers.push(tokio::spawn(async move {
                let mut acks = Vec::new();
                let mut failures = Vec::new();
                let mut pace = tokio::time::interval(WRITE_EVERY);
                for i in 0.. {
                    tokio::select! {
                        _ = pace.tick() => {}
                        _ = stop.wait_for(|stop| *stop) => break,
                    }
                    let request_id = format!("{name}-s{session}-{i:05}");
                    let call = client.append_exchange(exchange(session, &request_id));
                    match tokio::time::timeout(WAIT, call).await {
                        Ok(Ok(response)) => {
                            acks.push((session, request_id, response.into_inner()));
                            acked.send_modify(|n| *n += 1);
                        }
                        Ok(Err(status)) => failures.push(format!("{request_id}: {status:?}")),
                        Err(_) => failures.push(format!("{request_id}: no answer within {WAIT:?}")),
                    }
                }
                (acks, failures)
            }));
        }
        Load {
            name,
            stop,
            writers,
            watchers,
            heads,
            acks,
        }
    }

    /// Waits for `more` acknowledged writes of this load.
    async fn writes_go_on(&mut self, more: usize) {
        let target = *self.acks.borrow() + more;
        tokio::time::timeout(WAIT, self.acks.wait_for(|n| *n >= target))
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "{}: {more} more acknowledged writes within {WAIT:?}",
                    self.name
                )
            })
            .expect("writers report progress");
    }

    /// Stops the writers, returning their acknowledged writes; asserts none
    /// of their calls failed.
    async fn stop_writing(&mut self) -> Vec<Acked> {
        self.stop.send_replace(true);
        let mut all = Vec::new();
        for writer in self.writers.drain(..) {
            let (acks, failures) = tokio::time::timeout(WAIT, writer)
                .await
                .expect("a writer stops")
                .expect("writer task");
            assert!(
                failures.is_empty(),
                "{}: failed calls: {failures:#?}",
                self.name
            );
            all.extend(acks);
        }
        all
    }

    /// Tells the watchers the heads to read up to and collects what they saw.
    async fn finish_watching(&mut self, heads: Vec<i64>) -> Vec<Watched> {
        self.heads.send_replace(Some(heads));
        let mut all = Vec::new();
        for watcher in self.watchers.drain(..) {
            let watched = tokio::time::timeout(WAIT, watcher)
                .await
                .expect("a watcher reaches the head")
                .expect("watcher task");
            assert!(
                watched.failures.is_empty(),
                "{}: {:#?}",
                watched.name,
                watched.failures
            );
            all.push(watched);
        }
        all
    }
}

/// Reads one stream until the head it is given; any end or failure of
/// the stream before then is recorded.
async fn watch_until_head(
    name: String,
    mut stream: tonic::Streaming<pb::SessionEvent>,
    session: usize,
    after: i64,
    mut heads: watch::Receiver<Option<Vec<i64>>>,
) -> Watched {
    let mut watched = Watched {
        name,
        session,
        after,
        events: Vec::new(),
        failures: Vec::new(),
    };
    let mut last = after;
    let done =
        |last: i64, heads: &Option<Vec<i64>>| heads.as_ref().is_some_and(|h| last >= h[session]);
    loop {
        if done(last, &heads.borrow()) {
            break;
        }
        tokio::select! {
            message = stream.message() => match message {
                Ok(Some(event)) => {
                    if !matches!(event.event, Some(Event::Progress(_)) | Some(Event::CaughtUp(_))) {
                        last = event.revision;
                        watched.events.push(event);
                    }
                }
                Ok(None) => {
                    watched.failures.push(format!("the stream ended after revision {last}"));
                    break;
                }
                Err(status) => {
                    watched.failures.push(format!("the stream failed after revision {last}: {status:?}"));
                    break;
                }
            },
            changed = heads.changed() => {
                if changed.is_err() {
                    watched.failures.push("the load was dropped".to_owned());
                    break;
                }
            }
        }
    }
    watched
}

/// The current head revision of every session.
async fn heads(client: &mut Client) -> Vec<i64> {
    let mut heads = Vec::new();
    for s in 0..SESSIONS {
        heads.push(get(client, &session_id(s)).await.revision);
    }
    heads
}

/// Each watcher saw every revision after its start up to its head (and
/// maybe some after it, written while it read), once and in order, each as
/// it was acknowledged (by whichever binary).
fn assert_watched(
    watched: &[Watched],
    heads: &[i64],
    acks: &[BTreeMap<i64, pb::AppendExchangeResponse>],
) {
    for w in watched {
        let revisions: Vec<i64> = w.events.iter().map(|e| e.revision).collect();
        let last = revisions.last().copied().unwrap_or(w.after);
        assert!(last >= heads[w.session], "{}: reached the head", w.name);
        assert_eq!(
            revisions,
            (w.after + 1..=last).collect::<Vec<_>>(),
            "{}: every revision once, in order",
            w.name
        );
        for event in &w.events {
            let ack = acks[w.session].get(&event.revision).unwrap_or_else(|| {
                panic!("{}: revision {} was acknowledged", w.name, event.revision)
            });
            assert_appended(event, ack);
        }
    }
}

async fn old_and_new_binaries_serve_side_by_side_then_finalize() {
    let old = tokio::task::spawn_blocking(previous_release_binary)
        .await
        .expect("build the previous release");
    let new = tokio::task::spawn_blocking(sessionstore_binary)
        .await
        .expect("build sessionstore");
    let database = PgDatabase::create().await;
    let url = database.url.clone();
    let logs = tempfile::tempdir().unwrap();
    let log = |name: &str| logs.path().join(format!("{name}.log"));
    let mut conn = sql(&url).await;

    // The previous release migrates the database to its schema, 19.
    let mut old_server = ServerProcess::start(&old, &url, "127.0.0.1:0", log("old"), &[]).await;
    let sqlx_applied = sqlx_versions(&mut conn).await;
    assert_eq!(
        sqlx_applied.last(),
        Some(&PREVIOUS_SCHEMA),
        "{sqlx_applied:?}"
    );
    // This build has expand migrations pending there.
    let check = migrate(&new, &url, &["--check"]).await;
    assert_eq!(
        check.status.code(),
        Some(10),
        "migrate --check: {}",
        describe(&check)
    );
    let pending_before = pending(&check);
    assert!(
        pending_before
            .iter()
            .all(|(version, _)| *version > PREVIOUS_SCHEMA),
        "{pending_before:?}"
    );
    assert!(
        pending_before.iter().any(|(_, kind)| kind == "expand"),
        "{pending_before:?}"
    );

    let mut old_client = connect(&old_server.endpoint()).await;
    for s in 0..SESSIONS {
        create(&mut old_client, &session_id(s)).await;
    }
    let mut old_load = Load::start("old", &old_server.endpoint()).await;
    old_load.writes_go_on(WRITES_PER_STEP).await;

    // This build starts beside it and applies its expand migrations, while
    // the old one is under load.
    let mut new_server = ServerProcess::start(&new, &url, "127.0.0.1:0", log("new"), &[]).await;
    let mut new_client = connect(&new_server.endpoint()).await;
    let mut new_load = Load::start("new", &new_server.endpoint()).await;
    old_load.writes_go_on(WRITES_PER_STEP).await;
    new_load.writes_go_on(WRITES_PER_STEP).await;
    assert_eq!(
        sqlx_versions(&mut conn).await,
        sqlx_applied,
        "_sqlx_migrations keeps exactly the previous release's versions"
    );
    let applied = later_migrations(&mut conn).await;
    assert!(
        applied
            .iter()
            .all(|(version, kind)| *version > PREVIOUS_SCHEMA && kind == "expand"),
        "serve applies expand migrations only: {applied:?}"
    );
    let check = migrate(&new, &url, &["--check"]).await;
    assert_eq!(
        check.status.code(),
        Some(
            if pending_before.iter().any(|(_, kind)| kind == "finalize") {
                11
            } else {
                0
            }
        ),
        "migrate --check after the new binary started: {}",
        describe(&check)
    );
    assert!(
        pending(&check).iter().all(|(_, kind)| kind == "finalize"),
        "no expand migration pending: {}",
        describe(&check)
    );

    // The registry lists the new replica, not the old one (which predates it).
    let rows = live_replicas(&new, &url).await;
    let row = replica_on(&rows, new_server.port)
        .unwrap_or_else(|| panic!("the new replica is listed: {rows:?}"))
        .clone();
    assert!(replica_on(&rows, old_server.port).is_none(), "{rows:?}");
    let version_line = String::from_utf8(run(&new, &["--version"]).await.stdout).unwrap();
    let version_line = version_line.trim();
    let version = row["version"].as_str().expect("version is text");
    assert!(
        version == version_line || format!("sessionstore {version}") == version_line,
        "version {version:?} as --version prints it: {version_line:?}"
    );
    let schema = row["schema"].as_i64().expect("schema is a number");
    assert!(schema > PREVIOUS_SCHEMA, "the new schema {schema}");
    assert!(is_rfc3339(&row["start_time"]), "{row:?}");
    assert!(is_rfc3339(&row["heartbeat_time"]), "{row:?}");
    let replica_id = row["replica_id"]
        .as_str()
        .expect("replica_id is text")
        .to_owned();
    assert!(!replica_id.is_empty());
    let text = run(
        &new,
        &["replicas", "--database-url", &url, "--format", "text"],
    )
    .await;
    assert_eq!(text.status.code(), Some(0), "{}", describe(&text));
    assert!(
        String::from_utf8_lossy(&text.stdout).contains(&replica_id),
        "{}",
        describe(&text)
    );
    // It heartbeats (at least every 5 s).
    let first_beat = heartbeat_micros(&url, &replica_id).await;
    crate::support::poll_until("a newer heartbeat", Duration::from_secs(10), || async {
        (heartbeat_micros(&url, &replica_id).await > first_beat).then_some(())
    })
    .await;

    // An idempotent retry answered by the other binary: the first result.
    let mut acked_by_hand = Vec::new();
    for (mut first, mut second, key) in [
        (old_client.clone(), new_client.clone(), "cross-old-first"),
        (new_client.clone(), old_client.clone(), "cross-new-first"),
    ] {
        let request = exchange(0, key);
        let answered = first
            .append_exchange(request.clone())
            .await
            .expect("append")
            .into_inner();
        let retried = second
            .append_exchange(request)
            .await
            .expect("retry through the other binary")
            .into_inner();
        assert_eq!(
            retried, answered,
            "{key}: the retry answers the first result"
        );
        acked_by_hand.push((0, key.to_owned(), answered));
    }

    // The old one restarts (SIGTERM, start again) while the new one serves.
    old_load.writes_go_on(WRITES_PER_STEP).await;
    let mut old_acks = old_load.stop_writing().await;
    let heads_now = heads(&mut new_client).await;
    let old_watched = old_load.finish_watching(heads_now.clone()).await;
    drop(old_client);
    let exit = old_server.terminate().await;
    assert!(exit.success(), "the old one stops cleanly: {exit:?}");
    let mut old_server =
        ServerProcess::start(&old, &url, "127.0.0.1:0", log("old-again"), &[]).await;
    let mut old_again = Load::start("old-again", &old_server.endpoint()).await;
    old_again.writes_go_on(WRITES_PER_STEP).await;
    new_load.writes_go_on(WRITES_PER_STEP).await;

    // Done writing: one gap-free transcript per session, each exchange once.
    old_acks.extend(old_again.stop_writing().await);
    let new_acks = new_load.stop_writing().await;
    let final_heads = heads(&mut new_client).await;
    let old_again_watched = old_again.finish_watching(final_heads.clone()).await;
    let new_watched = new_load.finish_watching(final_heads.clone()).await;
    let mut by_revision: Vec<BTreeMap<i64, pb::AppendExchangeResponse>> =
        vec![BTreeMap::new(); SESSIONS];
    let mut request_ids: Vec<HashSet<String>> = vec![HashSet::new(); SESSIONS];
    for (session, request_id, response) in old_acks.iter().chain(&new_acks).chain(&acked_by_hand) {
        let session = *session;
        let earlier = by_revision[session].insert(response.revision, response.clone());
        assert!(
            earlier.is_none(),
            "revision {} acknowledged twice",
            response.revision
        );
        assert!(request_ids[session].insert(request_id.clone()));
    }
    let mut reader = connect(&old_server.endpoint()).await;
    for s in 0..SESSIONS {
        let id = session_id(s);
        let revisions: Vec<i64> = by_revision[s].keys().copied().collect();
        assert_eq!(revisions, (2..=final_heads[s]).collect::<Vec<_>>(), "{id}");
        let stored = all_messages(&mut reader, &id).await;
        let sequences: Vec<i64> = stored.iter().map(|m| m.sequence).collect();
        assert_eq!(
            sequences,
            (0..2 * (final_heads[s] - 1)).collect::<Vec<_>>(),
            "{id}: gap-free through both binaries"
        );
        let stored_ids: Vec<&str> = stored
            .iter()
            .filter_map(|m| content(m).strip_prefix("request "))
            .collect();
        assert_eq!(
            stored_ids.len(),
            request_ids[s].len(),
            "{id}: each exchange once"
        );
        assert_eq!(
            stored_ids
                .iter()
                .map(|s| (*s).to_owned())
                .collect::<HashSet<_>>(),
            request_ids[s],
            "{id}"
        );
        for response in by_revision[s].values() {
            let first = usize::try_from(response.messages[0].sequence).unwrap();
            assert_eq!(&stored[first..first + 2], &response.messages[..], "{id}");
        }
        assert_eq!(
            all_messages(&mut new_client, &id).await,
            stored,
            "{id} through the new one"
        );
    }
    // Each binary's watchers saw the other's writes: every revision.
    assert_watched(&old_watched, &heads_now, &by_revision);
    assert_watched(&old_again_watched, &final_heads, &by_revision);
    assert_watched(&new_watched, &final_heads, &by_revision);

    // The old one goes for good; then finalizing. A stale registry row
    // (no heartbeat for a minute) is not live and holds nothing up.
    drop(reader);
    assert!(old_server.terminate().await.success());
    sqlx::query(
        "INSERT INTO sessionstore_replicas \
         (replica_id, version, schema, address, start_time, heartbeat_time) \
         VALUES ('stale-old', 'sessionstore 0.0.9 (stale)', 19, '127.0.0.1:9', \
                 now() - interval '2 minutes', now() - interval '1 minute')",
    )
    .execute(&mut conn)
    .await
    .expect("insert a stale registry row");
    let rows = live_replicas(&new, &url).await;
    assert!(
        rows.iter().all(|row| row["replica_id"] != "stale-old"),
        "a row without a heartbeat for a minute is not live: {rows:?}"
    );

    // A live replica below this schema: `migrate --finalize` applies
    // nothing and exits 13, naming it.
    let fake_live = async |conn: &mut sqlx::PgConnection| {
        sqlx::query(
            "INSERT INTO sessionstore_replicas \
             (replica_id, version, schema, address, start_time, heartbeat_time) \
             VALUES ('fake-old-replica', 'sessionstore 0.0.9 (fake)', 19, '127.0.0.1:7', now(), now())",
        )
        .execute(conn)
        .await
        .expect("insert a live registry row");
    };
    let assert_held_up = |output: &Output| {
        assert_eq!(
            output.status.code(),
            Some(13),
            "migrate --finalize: {}",
            describe(output)
        );
        assert!(
            stderr_lines(output)
                .iter()
                .any(|line| line.contains("fake-old-replica")
                    && line.contains("127.0.0.1:7")
                    && line.contains("sessionstore 0.0.9 (fake)")),
            "one stderr line names the replica's id, address and version: {}",
            describe(output)
        );
    };
    fake_live(&mut conn).await;
    let before = later_migrations(&mut conn).await;
    let held = migrate(&new, &url, &["--finalize"]).await;
    assert_held_up(&held);
    assert_eq!(
        later_migrations(&mut conn).await,
        before,
        "exit 13 applies nothing"
    );
    sqlx::query("DELETE FROM sessionstore_replicas WHERE replica_id = 'fake-old-replica'")
        .execute(&mut conn)
        .await
        .expect("delete the fake row");

    // Only replicas of this schema live (the new one): finalized.
    let rows = live_replicas(&new, &url).await;
    assert!(
        rows.iter()
            .all(|row| row["schema"].as_i64() == Some(schema)),
        "{rows:?}"
    );
    let finalized = migrate(&new, &url, &["--finalize"]).await;
    assert_eq!(finalized.status.code(), Some(0), "{}", describe(&finalized));
    let check = migrate(&new, &url, &["--check"]).await;
    assert_eq!(
        check.status.code(),
        Some(0),
        "nothing pending: {}",
        describe(&check)
    );
    assert!(pending(&check).is_empty(), "{}", describe(&check));
    // Held up also when nothing is pending.
    fake_live(&mut conn).await;
    assert_held_up(&migrate(&new, &url, &["--finalize"]).await);
    sqlx::query("DELETE FROM sessionstore_replicas WHERE replica_id = 'fake-old-replica'")
        .execute(&mut conn)
        .await
        .expect("delete the fake row");

    // SIGTERM: the new replica deletes its row.
    drop(new_client);
    assert!(new_server.terminate().await.success());
    let rows = live_replicas(&new, &url).await;
    assert!(replica_on(&rows, new_server.port).is_none(), "{rows:?}");
    let left: i64 =
        sqlx::query_scalar("SELECT count(*) FROM sessionstore_replicas WHERE replica_id = $1")
            .bind(&replica_id)
            .fetch_one(&mut conn)
            .await
            .expect("count registry rows");
    assert_eq!(left, 0, "the row of {replica_id} is deleted on SIGTERM");

    // An unknown applied expand migration (a later release's) is fine.
    sqlx::query(
        "INSERT INTO sessionstore_migrations (version, kind, description, applied_at) \
         VALUES (9998, 'expand', 'a later release adds a column', now())",
    )
    .execute(&mut conn)
    .await
    .expect("insert an unknown expand migration");
    let check = migrate(&new, &url, &["--check"]).await;
    assert_eq!(check.status.code(), Some(0), "{}", describe(&check));
    let plain = migrate(&new, &url, &[]).await;
    assert_eq!(plain.status.code(), Some(0), "{}", describe(&plain));
    let mut tolerant = ServerProcess::start(&new, &url, "127.0.0.1:0", log("tolerant"), &[]).await;
    let mut client = connect(&tolerant.endpoint()).await;
    assert_eq!(
        get(&mut client, &session_id(0)).await.revision,
        final_heads[0]
    );
    drop(client);
    assert!(tolerant.terminate().await.success());

    // An applied finalize migration past this binary's schema: refused.
    sqlx::query(
        "INSERT INTO sessionstore_migrations (version, kind, description, applied_at) \
         VALUES (9999, 'finalize', 'a later release drops a column', now())",
    )
    .execute(&mut conn)
    .await
    .expect("insert an unknown finalize migration");
    let schema_text = schema.to_string();
    let refused = |output: &Output, what: &str| {
        assert_eq!(
            output.status.code(),
            Some(12),
            "{what}: {}",
            describe(output)
        );
        assert!(
            stderr_lines(output)
                .iter()
                .any(|line| line.contains("9999") && line.contains(&schema_text)),
            "{what}: one stderr line names version 9999 and the schema {schema}: {}",
            describe(output)
        );
    };
    let serve = run(
        &new,
        &["serve", "--listen", "127.0.0.1:0", "--database-url", &url],
    )
    .await;
    refused(&serve, "serve");
    assert!(
        !String::from_utf8_lossy(&serve.stdout).contains("sessionstore serving"),
        "refused before serving: {}",
        describe(&serve)
    );
    refused(&migrate(&new, &url, &[]).await, "migrate");
    let check = migrate(&new, &url, &["--check"]).await;
    assert_eq!(
        check.status.code(),
        Some(12),
        "migrate --check: {}",
        describe(&check)
    );

    eprintln!(
        "rolling upgrade: pending on the previous release's database {pending_before:?}; \
         this build's schema {schema}; {} exchanges through the old binary, {} through the new",
        old_acks.len(),
        new_acks.len()
    );
    let _ = conn.close().await;
    drop(database);
}

/// A replica's last heartbeat, in microseconds since the epoch.
async fn heartbeat_micros(url: &str, replica_id: &str) -> i64 {
    let mut conn = sql(url).await;
    let micros = sqlx::query_scalar(
        "SELECT (extract(epoch FROM heartbeat_time) * 1000000)::bigint \
         FROM sessionstore_replicas WHERE replica_id = $1",
    )
    .bind(replica_id)
    .fetch_one(&mut conn)
    .await
    .expect("the replica's heartbeat");
    let _ = conn.close().await;
    micros
}

/// `target_session_attrs` other than `read-write` or `primary` is refused
/// at start, naming the setting.
async fn target_session_attrs_other_than_primary_is_refused_at_start() {
    let database = PgDatabase::create().await;
    let binary = sessionstore_binary();
    for value in ["standby", "any", "read-only"] {
        let url = format!("{}?target_session_attrs={value}", database.url);
        let output = run(
            &binary,
            &["serve", "--listen", "127.0.0.1:0", "--database-url", &url],
        )
        .await;
        assert!(!output.status.success(), "{value}: {}", describe(&output));
        assert!(
            stderr_lines(&output)
                .iter()
                .any(|line| line.contains("target_session_attrs")),
            "{value}: a stderr line names target_session_attrs: {}",
            describe(&output)
        );
        assert!(
            !String::from_utf8_lossy(&output.stdout).contains("sessionstore serving"),
            "{}",
            describe(&output)
        );
    }
    for value in ["read-write", "primary"] {
        let url = format!("{}?target_session_attrs={value}", database.url);
        let output = migrate(&binary, &url, &[]).await;
        assert_eq!(
            output.status.code(),
            Some(0),
            "{value}: {}",
            describe(&output)
        );
    }
}

crate::postgres_tests!(
    old_and_new_binaries_serve_side_by_side_then_finalize,
    target_session_attrs_other_than_primary_is_refused_at_start,
);

/// `migrate` on libpq's multi-host URL with the standby listed first
/// migrates the primary; `migrate --check` then finds nothing pending.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_finds_the_primary_behind_a_standby_listed_first() {
    let binary = sessionstore_binary();
    let primary = Cluster::init_primary().await;
    let standby = primary.standby().await;
    primary.require_synchronous_standby().await;
    assert!(standby.in_recovery().await);
    let url = multi_host_url(&[&standby, &primary], "read-write");
    let output = migrate(&binary, &url, &[]).await;
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
    let mut conn = sql(&primary.url()).await;
    let versions = sqlx_versions(&mut conn).await;
    assert_eq!(versions.last(), Some(&PREVIOUS_SCHEMA), "{versions:?}");
    let later = later_migrations(&mut conn).await;
    assert!(later.iter().all(|(v, _)| *v > PREVIOUS_SCHEMA), "{later:?}");
    let _ = conn.close().await;
    // The standby has it too (synchronous replication), and primary-only URL
    // order makes no difference to what is pending.
    let check = migrate(&binary, &url, &["--check"]).await;
    assert!(
        matches!(check.status.code(), Some(0) | Some(11)),
        "only finalize migrations may be pending after `migrate`: {}",
        describe(&check)
    );
    let check_primary = migrate(&binary, &primary.url(), &["--check"]).await;
    assert_eq!(check_primary.status.code(), check.status.code());
    drop(standby);
    drop(primary);
}
