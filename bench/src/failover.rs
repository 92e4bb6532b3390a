//! A PostgreSQL failover under the append load (`--only failover`; not in
//! the default run).
//!
//! A primary and its synchronous standby, made for the run on free ports
//! of 127.0.0.1 in a temporary directory by the failover test's own recipe
//! (`tests/it/support/cluster.rs`, included below as it is; the shared
//! server of `--postgres-url` is not used), two `sessionstore` replicas on
//! the multi-host URL (the standby first, `target_session_attrs=read-write`),
//! and 16 clients appending the append benchmark's exchange, each to a
//! session of its own through one of the replicas (client `i` through
//! replica `i mod 2`), as fast as they are answered. A failed call is sent
//! again, with the same request id, through the same replica after 100 ms.
//!
//! The primary is killed (`pg_ctl -m immediate stop`); once both replicas
//! answer health NOT_SERVING the standby is promoted at once (the test
//! waits a fixed 12 s instead). Measured: the append rate in a steady
//! window before the kill, how long the replicas took to turn NOT_SERVING,
//! how long after `pg_ctl promote` returned each replica acknowledged its
//! first write, the append rate in a steady window once both write again
//! (on the promoted standby alone: its commits wait for no standby), and
//! every failed call by code, of which only UNAVAILABLE is expected.
//! Afterwards every session must hold each acknowledged exchange once.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use sessionstore_client::SessionStoreClient;
use sessionstore_client::v1 as pb;
use sqlx::Connection as _;
use tonic::transport::{Channel, Endpoint};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use crate::report::{Figure, Report};
use crate::server::Server;
use crate::stats::{Latency, Spread};
use crate::workload;

/// The failover test's PostgreSQL nodes, the very file; the bench uses
/// only part of what the tests use.
#[allow(dead_code)]
#[path = "../../tests/it/support/cluster.rs"]
mod cluster;

use cluster::{Cluster, multi_host_url};

/// Concurrent appending clients, as the append benchmark's middle case.
const CLIENTS: usize = 16;
const REPLICAS: usize = 2;
/// Exchanges in each session before the run (then `ANALYZE`).
const PREFILL: usize = 10;
/// A client's pause before sending a failed call again.
const RETRY_PAUSE: Duration = Duration::from_millis(100);
/// A call not answered by then counts as failed ("no answer").
const CALL_PATIENCE: Duration = Duration::from_secs(10);
/// How long the replicas may take to turn NOT_SERVING after the kill, and
/// to write again after the promotion, before the bench gives up.
const FOLLOW_WITHIN: Duration = Duration::from_secs(30);

/// The windows of one run.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    /// Load before each measured window (also after the replicas write
    /// again).
    pub warmup: Duration,
    /// Each measured window.
    pub window: Duration,
}

/// One acknowledged exchange.
struct Ack {
    replica: usize,
    /// When its successful call was sent, and answered.
    began: Instant,
    at: Instant,
    /// Sent more than once (the same request id).
    retried: bool,
}

/// What the clients report.
#[derive(Default)]
struct Tally {
    acks: Vec<Ack>,
    /// Failed calls by code and ErrorInfo reason.
    failed: BTreeMap<(String, String), usize>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// `UNAVAILABLE` for `Code::Unavailable`.
fn code_name(code: tonic::Code) -> String {
    let mut name = String::new();
    for (i, c) in format!("{code:?}").chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            name.push('_');
        }
        name.push(c.to_ascii_uppercase());
    }
    name
}

/// Client `w`: appends exchange after exchange to its session through
/// `replica` until told to stop, each sent again with its request id
/// until acknowledged. Returns the exchanges it acknowledged and those it
/// gave up on when told to stop (either may be stored).
async fn client(
    mut client: SessionStoreClient<Channel>,
    replica: usize,
    session: String,
    mut seed: u64,
    tally: Arc<Mutex<Tally>>,
    stop: tokio::sync::watch::Receiver<bool>,
) -> (usize, usize) {
    let (mut acknowledged, mut abandoned) = (0, 0);
    'exchanges: while !*stop.borrow() {
        seed += 1;
        // One request id (a fresh UUID) for every try of this exchange.
        let request = workload::exchange(&session, seed);
        let mut retried = false;
        loop {
            let began = Instant::now();
            let answer =
                tokio::time::timeout(CALL_PATIENCE, client.append_exchange(request.clone())).await;
            let at = Instant::now();
            let failure = match answer {
                Ok(Ok(_)) => {
                    lock(&tally).acks.push(Ack {
                        replica,
                        began,
                        at,
                        retried,
                    });
                    acknowledged += 1;
                    continue 'exchanges;
                }
                Ok(Err(status)) => {
                    let details = tonic_types::StatusExt::get_error_details(&status);
                    let reason = details
                        .error_info()
                        .map_or_else(|| "(no ErrorInfo)".to_owned(), |i| i.reason.clone());
                    (code_name(status.code()), reason)
                }
                Err(_) => (
                    "NO ANSWER".to_owned(),
                    format!("within {} s", CALL_PATIENCE.as_secs()),
                ),
            };
            *lock(&tally).failed.entry(failure).or_default() += 1;
            retried = true;
            if *stop.borrow() {
                abandoned += 1;
                break 'exchanges;
            }
            tokio::time::sleep(RETRY_PAUSE).await;
        }
    }
    (acknowledged, abandoned)
}

/// Whether the replica answers `wanted` for the server and for the
/// SessionStore service.
async fn health_is(health: &mut HealthClient<Channel>, wanted: ServingStatus) -> bool {
    for service in ["", "sessionstore.v1.SessionStore"] {
        let request = HealthCheckRequest {
            service: service.to_owned(),
        };
        let answer = tokio::time::timeout(Duration::from_secs(2), health.check(request)).await;
        match answer {
            Ok(Ok(response)) if response.get_ref().status == i32::from(wanted) => {}
            _ => return false,
        }
    }
    true
}

/// How long after `since` each replica first answered `wanted`, polled
/// every 20 ms.
async fn health_becomes(
    healths: &mut [HealthClient<Channel>],
    wanted: ServingStatus,
    since: Instant,
) -> anyhow::Result<Vec<Duration>> {
    let mut found: Vec<Option<Duration>> = vec![None; healths.len()];
    let mut interval = tokio::time::interval(Duration::from_millis(20));
    loop {
        interval.tick().await;
        for (r, health) in healths.iter_mut().enumerate() {
            if found[r].is_none() && health_is(health, wanted).await {
                found[r] = Some(since.elapsed());
            }
        }
        if let Some(all) = found.iter().copied().collect::<Option<Vec<_>>>() {
            return Ok(all);
        }
        anyhow::ensure!(
            since.elapsed() < FOLLOW_WITHIN,
            "health of replicas {:?} not {wanted:?} within {FOLLOW_WITHIN:?}",
            found
                .iter()
                .enumerate()
                .filter(|(_, f)| f.is_none())
                .map(|(r, _)| r)
                .collect::<Vec<_>>()
        );
    }
}

/// Each replica's first acknowledged write after `after`.
fn first_writes(tally: &Tally, after: Instant) -> Vec<Option<Instant>> {
    (0..REPLICAS)
        .map(|r| {
            tally
                .acks
                .iter()
                .filter(|ack| ack.replica == r && ack.at > after)
                .map(|ack| ack.at)
                .min()
        })
        .collect()
}

/// `a - b` in seconds, negative when `a` came first.
fn seconds_between(a: Instant, b: Instant) -> f64 {
    if a >= b {
        (a - b).as_secs_f64()
    } else {
        -(b - a).as_secs_f64()
    }
}

/// The rate of the exchanges sent and acknowledged within `[start, end]`,
/// and their latency.
fn window_rate(tally: &Tally, start: Instant, end: Instant) -> (f64, Latency) {
    let mut took: Vec<Duration> = tally
        .acks
        .iter()
        .filter(|ack| ack.began >= start && ack.at <= end)
        .map(|ack| ack.at - ack.began)
        .collect();
    let rate = took.len() as f64 / (end - start).as_secs_f64();
    (rate, Latency::of(&mut took))
}

fn session_id(w: usize) -> String {
    format!("bench-failover-{w}")
}

pub async fn benchmark(shape: &Shape, binary: &Path, report: &mut Report) -> anyhow::Result<()> {
    eprintln!(
        "== failover: a PostgreSQL primary and its synchronous standby (made for the run), \
         two replicas, {CLIENTS} clients appending"
    );
    let made = Instant::now();
    let mut primary = Cluster::init_primary().await;
    let standby = primary.standby().await;
    primary.require_synchronous_standby().await;
    // A promoted node that named a synchronous standby would wait for one
    // on every commit: the standby names none.
    standby.set_synchronous_standby_names("").await;
    anyhow::ensure!(standby.in_recovery().await, "the standby is not a standby");
    let version: String = {
        let mut conn = sqlx::PgConnection::connect(&primary.url()).await?;
        let version = sqlx::query_scalar("SHOW server_version")
            .fetch_one(&mut conn)
            .await?;
        conn.close().await?;
        version
    };
    eprintln!(
        "   PostgreSQL {version}: primary on {}, synchronous standby on {} ({:.1} s)",
        primary.port,
        standby.port,
        made.elapsed().as_secs_f64()
    );
    report
        .machine
        .postgres
        .get_or_insert_with(|| format!("PostgreSQL {version}"));
    report.settings["failover"] = serde_json::json!({
        "postgres": version,
        "clients": CLIENTS,
        "replicas": REPLICAS,
        "warmup_seconds": shape.warmup.as_secs_f64(),
        "window_seconds": shape.window.as_secs_f64(),
        "retry_pause_ms": RETRY_PAUSE.as_millis(),
        "promote": "once both replicas answer health NOT_SERVING",
    });

    // The standby first: a replica must find the primary behind it.
    let url = multi_host_url(&[&standby, &primary], "read-write");
    let mut servers = Vec::new();
    for _ in 0..REPLICAS {
        servers.push(Server::start(binary, &url, &[]).await?);
    }
    let outcome = run(shape, &mut primary, &standby, &servers, &version, report).await;
    for server in servers {
        server.stop().await;
    }
    outcome
}

async fn run(
    shape: &Shape,
    primary: &mut Cluster,
    standby: &Cluster,
    servers: &[Server],
    version: &str,
    report: &mut Report,
) -> anyhow::Result<()> {
    let mut healths = Vec::new();
    for server in servers {
        let channel = Endpoint::from_shared(server.endpoint())?.connect().await?;
        healths.push(HealthClient::new(channel));
    }
    health_becomes(&mut healths, ServingStatus::Serving, Instant::now()).await?;

    // Each client's session, filled as the append benchmark fills its own,
    // then ANALYZE.
    let mut clients = Vec::new();
    for w in 0..CLIENTS {
        clients.push(servers[w % REPLICAS].connect().await?);
    }
    let mut fills = tokio::task::JoinSet::new();
    for (w, client) in clients.iter().enumerate() {
        let mut client = client.clone();
        fills.spawn(async move {
            let id = session_id(w);
            workload::create_session(&mut client, &id, "bench", 0, 0).await?;
            for i in 0..PREFILL {
                client
                    .append_exchange(workload::exchange(&id, (w as u64) << 32 | i as u64))
                    .await
                    .with_context(|| format!("pre-fill {id}"))?;
            }
            anyhow::Ok(())
        });
    }
    while let Some(filled) = fills.join_next().await {
        filled??;
    }
    {
        let mut conn = sqlx::PgConnection::connect(&primary.url()).await?;
        sqlx::query("ANALYZE").execute(&mut conn).await?;
        conn.close().await?;
    }

    let tally = Arc::new(Mutex::new(Tally::default()));
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    let started = Instant::now();
    let writers: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(w, c)| {
            let seed = (w as u64 + 1) << 40;
            tokio::spawn(client(
                c,
                w % REPLICAS,
                session_id(w),
                seed,
                tally.clone(),
                stop_rx.clone(),
            ))
        })
        .collect();

    // Before: the primary and its synchronous standby.
    let before_start = started + shape.warmup;
    let before_end = before_start + shape.window;
    tokio::time::sleep_until(before_end.into()).await;

    // The primary dies; both replicas turn NOT_SERVING; the standby is
    // promoted at once.
    let killed = Instant::now();
    primary.stop_immediate().await;
    let stop_took = killed.elapsed();
    let not_serving = health_becomes(&mut healths, ServingStatus::NotServing, killed).await?;
    let promote_called = Instant::now();
    standby.promote().await;
    let promoted = Instant::now();
    anyhow::ensure!(!standby.in_recovery().await, "the standby was not promoted");

    // Until both replicas write again (and answer SERVING).
    let writes_again = async {
        let mut interval = tokio::time::interval(Duration::from_millis(10));
        loop {
            interval.tick().await;
            let firsts = first_writes(&lock(&tally), promote_called);
            if firsts.iter().all(Option::is_some) {
                return Ok(());
            }
            anyhow::ensure!(
                promoted.elapsed() < FOLLOW_WITHIN,
                "no acknowledged write through replicas {:?} within {FOLLOW_WITHIN:?} of the \
                 promotion",
                firsts
                    .iter()
                    .enumerate()
                    .filter(|(_, f)| f.is_none())
                    .map(|(r, _)| r)
                    .collect::<Vec<_>>()
            );
        }
    };
    let (serving, written) = tokio::join!(
        health_becomes(&mut healths, ServingStatus::Serving, promoted),
        writes_again
    );
    let serving = serving?;
    written?;

    // After: the promoted standby alone.
    let after_start = Instant::now() + shape.warmup;
    let after_end = after_start + shape.window;
    tokio::time::sleep_until(after_end.into()).await;
    stop.send_replace(true);
    let (mut acknowledged, mut abandoned) = (Vec::new(), 0);
    for writer in writers {
        let (acked, gave_up) = tokio::time::timeout(CALL_PATIENCE * 2, writer)
            .await
            .context("a client did not stop")??;
        acknowledged.push(acked);
        abandoned += gave_up;
    }
    // Every client has stopped: what they reported, out of the lock.
    let tally = std::mem::take(&mut *lock(&tally));

    let firsts: Vec<Instant> = first_writes(&tally, promote_called)
        .into_iter()
        .collect::<Option<_>>()
        .context("a replica's first write after the promotion")?;
    let last_before = tally
        .acks
        .iter()
        .filter(|ack| ack.at < killed + stop_took)
        .map(|ack| ack.at)
        .max()
        .context("no write before the kill")?;
    let first_after = firsts.iter().copied().min().unwrap_or(promoted);
    let retried = tally
        .acks
        .iter()
        .filter(|ack| ack.retried && ack.at > killed)
        .count();
    eprintln!(
        "   the kill took {:.2} s; NOT_SERVING {:.2} / {:.2} s after it; pg_ctl promote took \
         {:.2} s; SERVING {:.2} / {:.2} s and the first write {:+.2} / {:+.2} s after it \
         returned (replica 0 / 1); {retried} exchanges acknowledged after a retry",
        stop_took.as_secs_f64(),
        not_serving[0].as_secs_f64(),
        not_serving[1].as_secs_f64(),
        (promoted - promote_called).as_secs_f64(),
        serving[0].as_secs_f64(),
        serving[1].as_secs_f64(),
        seconds_between(firsts[0], promoted),
        seconds_between(firsts[1], promoted),
    );

    let backend = "postgres";
    let load = format!("{CLIENTS} clients (many sessions) over {REPLICAS} replicas");
    let window = format!("AppendExchange, {:.1} s window", shape.window.as_secs_f64());
    let (before_rate, before_latency) = window_rate(&tally, before_start, before_end);
    let (after_rate, after_latency) = window_rate(&tally, after_start, after_end);
    report.push(
        Figure::new(
            "failover",
            backend,
            &format!("{window}, before: the primary and its synchronous standby"),
            &load,
            "exchanges/s",
            Spread::of(&[before_rate]),
        )
        .latency(before_latency),
    );
    report.push(
        Figure::new(
            "failover",
            backend,
            &format!("{window}, after: the promoted standby alone"),
            &load,
            "exchanges/s",
            Spread::of(&[after_rate]),
        )
        .latency(after_latency)
        .ratio(after_rate / before_rate, "÷ before"),
    );
    let kill = format!("PostgreSQL {version}, primary killed (pg_ctl -m immediate stop)");
    let slowest = not_serving.iter().copied().max().unwrap_or_default();
    report.push(Figure::new(
        "failover",
        backend,
        "both replicas answer health NOT_SERVING, after the kill began",
        &kill,
        "s",
        Spread::of(&[slowest.as_secs_f64()]),
    ));
    let promotion = "standby promoted once both replicas NOT_SERVING";
    for (r, first) in firsts.iter().enumerate() {
        report.push(Figure::new(
            "failover",
            backend,
            &format!("first acknowledged write through replica {r}, after pg_ctl promote returned"),
            promotion,
            "s",
            Spread::of(&[seconds_between(*first, promoted)]),
        ));
    }
    report.push(Figure::new(
        "failover",
        backend,
        "no write acknowledged: the last before the kill to the first after the promotion",
        promotion,
        "s",
        Spread::of(&[seconds_between(first_after, last_before)]),
    ));

    let mut other = 0;
    for ((code, reason), calls) in &tally.failed {
        if code != "UNAVAILABLE" {
            other += calls;
            eprintln!(
                "!! failover: {calls} calls failed {code} {reason}: only UNAVAILABLE is expected"
            );
        }
        report.push(Figure::new(
            "failover",
            backend,
            &format!("failed AppendExchange calls: {code} {reason}"),
            &load,
            "calls",
            Spread::of(&[*calls as f64]),
        ));
    }
    report.push(
        Figure::new(
            "failover",
            backend,
            "failed AppendExchange calls other than UNAVAILABLE",
            &load,
            "calls",
            Spread::of(&[other as f64]),
        )
        .target("0", other == 0),
    );

    // Every acknowledged exchange stored once: each session's revision is
    // its creation, the pre-fill and the exchanges acknowledged (and
    // perhaps one the client gave up on when told to stop).
    let mut reader = servers[0].connect().await?;
    let mut mismatched = Vec::new();
    for (w, acked) in acknowledged.iter().enumerate() {
        let id = session_id(w);
        let session = reader
            .get_session(pb::GetSessionRequest {
                session_id: id.clone(),
                ..Default::default()
            })
            .await
            .with_context(|| format!("GetSession {id}"))?
            .into_inner();
        let stored = usize::try_from(session.revision - 1)? - PREFILL;
        if stored < *acked || stored > acked + abandoned {
            mismatched.push(format!("{id}: {stored} stored, {acked} acknowledged"));
        }
    }
    anyhow::ensure!(
        mismatched.is_empty(),
        "failover: sessions that do not hold each acknowledged exchange once: {mismatched:?}"
    );
    eprintln!(
        "   every session holds each of its {} acknowledged exchanges once",
        acknowledged.iter().sum::<usize>()
    );
    Ok(())
}
