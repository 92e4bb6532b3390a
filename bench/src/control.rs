//! The run control plane (`--only control`): input queued while a run holds
//! the lease and taken by that run (SubmitInput + TakeQueuedInput), an
//! approval decided on one replica reaching a watcher on another
//! (DecideApproval → `approval_decided`), and what idle approvals and
//! queued inputs in other sessions cost AppendExchange.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use futures_util::StreamExt as _;
use sessionstore_client::SessionStoreClient;
use sessionstore_client::v1 as pb;
use sqlx::Connection as _;
use tokio::sync::mpsc;
use tonic::transport::Channel;

use crate::append::{self, Spread as Writers};
use crate::report::{Figure, Report};
use crate::server::{Database, Server};
use crate::stats::{Latency, Run, Spread, Throughput, Worker, run_load};
use crate::{Plan, fresh_database, workload};

/// Concurrent clients of the queued-input round trips, and of the appends
/// beside idle rows.
pub const CLIENTS: usize = 16;

/// How long a decision may take to reach the watcher before the run fails.
const DECISION_TIMEOUT: Duration = Duration::from_secs(10);

/// The sizes of the control-plane cases.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    /// Decisions timed on each path (a tenth as many again warm up first).
    pub decisions: usize,
    /// The idle rows of the "after" database: sessions holding pending
    /// approvals, and approvals in each; sessions whose run holds the
    /// lease, and inputs waiting in each.
    pub approval_sessions: usize,
    pub approvals_each: usize,
    pub queue_sessions: usize,
    pub inputs_each: usize,
    /// Rounds of the appends, each measuring "before" and "after" once,
    /// the order flipped from one round to the next.
    pub rounds: usize,
}

impl Shape {
    fn approvals(&self) -> usize {
        self.approval_sessions * self.approvals_each
    }

    fn inputs(&self) -> usize {
        self.queue_sessions * self.inputs_each
    }
}

/// The three cases on `db` (the idle-row appends on two databases of
/// their own beside it; `postgres` is the admin URL when `db` is on
/// PostgreSQL). The decision across replicas is measured on PostgreSQL
/// only.
pub async fn benchmarks(
    plan: &Plan,
    binary: &Path,
    db: &Database,
    postgres: Option<&str>,
    report: &mut Report,
) -> anyhow::Result<()> {
    let backend = db.backend();
    let a = Server::start(binary, &db.url(), &[]).await?;
    let b = if db.is_postgres() {
        match Server::start(binary, &db.url(), &[]).await {
            Ok(b) => Some(b),
            Err(error) => {
                a.stop().await;
                return Err(error);
            }
        }
    } else {
        None
    };
    let outcome = async {
        queue_case(plan, &a, backend, report).await?;
        decision_cases(plan, &a, b.as_ref(), backend, report).await
    }
    .await;
    if let Some(b) = b {
        b.stop().await;
    }
    a.stop().await;
    outcome?;
    idle_rows(plan, binary, backend, postgres, report).await
}

/// The lease a measured run holds: longer than any run of the bench.
fn lease(seconds: i64) -> Option<prost_types::Duration> {
    Some(prost_types::Duration { seconds, nanos: 0 })
}

/// Creates `session` and has `run_id` take its lease.
async fn leased_session(
    client: &mut SessionStoreClient<Channel>,
    session: &str,
    run_id: &str,
    seconds: i64,
) -> anyhow::Result<()> {
    workload::create_session(client, session, "bench", 0, 0).await?;
    client
        .begin_run(pb::BeginRunRequest {
            session_id: session.to_owned(),
            run_id: run_id.to_owned(),
            lease: lease(seconds),
        })
        .await
        .with_context(|| format!("BeginRun on {session}"))?;
    Ok(())
}

/// Queues one input of ~1 KB in `session` (whose lease a run holds) and
/// answers its id.
async fn queue_input(
    client: &mut SessionStoreClient<Channel>,
    session: &str,
    seed: u64,
) -> anyhow::Result<String> {
    let submitted = client
        .submit_input(pb::SubmitInputRequest {
            session_id: session.to_owned(),
            messages: vec![workload::user(seed)],
            mode: pb::InputMode::Queue.into(),
            request_id: uuid::Uuid::now_v7().to_string(),
        })
        .await
        .context("SubmitInput")?
        .into_inner();
    let input = submitted
        .input
        .filter(|_| submitted.queued)
        .with_context(|| format!("SubmitInput on {session} appended at once: no lease held"))?;
    Ok(input.input_id)
}

/// One client of the round trips: queues an input in its session, then
/// takes it as the run holding the lease.
struct QueueClient {
    client: SessionStoreClient<Channel>,
    session: String,
    run_id: String,
    seed: u64,
}

impl Worker for QueueClient {
    async fn op(&mut self) -> anyhow::Result<()> {
        self.seed += 1;
        let queued = queue_input(&mut self.client, &self.session, self.seed).await?;
        let taken = self
            .client
            .take_queued_input(pb::TakeQueuedInputRequest {
                session_id: self.session.clone(),
                run_id: self.run_id.clone(),
            })
            .await
            .context("TakeQueuedInput")?
            .into_inner();
        let taken = taken.input.map(|input| input.input_id).unwrap_or_default();
        anyhow::ensure!(
            taken == queued,
            "TakeQueuedInput on {} took {taken}, {queued} was queued",
            self.session
        );
        Ok(())
    }
}

/// SubmitInput (QUEUE) then TakeQueuedInput, [`CLIENTS`] clients on
/// connections of their own, each in a session of its own whose run holds
/// the lease: pairs per second, and each pair's time.
async fn queue_case(
    plan: &Plan,
    server: &Server,
    backend: &'static str,
    report: &mut Report,
) -> anyhow::Result<()> {
    eprintln!("== control on {backend}: SubmitInput + TakeQueuedInput, {CLIENTS} clients");
    let mut clients = Vec::with_capacity(CLIENTS);
    for n in 0..CLIENTS {
        let mut client = server.connect().await?;
        let (session, run_id) = (format!("bench-queue-{n}"), format!("bench-run-{n}"));
        leased_session(&mut client, &session, &run_id, 3600).await?;
        clients.push((client, session, run_id));
    }
    let mut runs = Vec::with_capacity(plan.repeat);
    for repetition in 0..plan.repeat {
        let workers = clients
            .iter()
            .enumerate()
            .map(|(n, (client, session, run_id))| QueueClient {
                client: client.clone(),
                session: session.clone(),
                run_id: run_id.clone(),
                seed: ((repetition * CLIENTS + n) as u64) << 32,
            })
            .collect();
        runs.push(with_server_cpu(server, run_load(workers, plan.timing), plan).await?);
    }
    let pairs = Throughput::of(runs);
    let cpu = pairs
        .cpu_micros
        .map(|cpu| format!("server CPU {:.0} µs/pair", cpu.median))
        .unwrap_or_default();
    report.push(
        Figure::new(
            "control queue",
            backend,
            "SubmitInput (QUEUE) + TakeQueuedInput",
            &format!(
                "{CLIENTS} clients, a session each whose run holds the lease, one input of 1 KB"
            ),
            "pairs/s",
            pairs.per_second,
        )
        .latency(pairs.latency)
        .detail(&cpu),
    );
    Ok(())
}

/// `load`'s run, with the server's CPU over its measured window.
async fn with_server_cpu(
    server: &Server,
    load: impl Future<Output = anyhow::Result<Run>>,
    plan: &Plan,
) -> anyhow::Result<Run> {
    let cpu_at_window = async {
        tokio::time::sleep(plan.timing.warmup).await;
        server.cpu_time()
    };
    let (run, before) = tokio::join!(load, cpu_at_window);
    let mut run = run?;
    run.server_cpu = Some(server.cpu_time()?.saturating_sub(before?));
    Ok(run)
}

/// An approval's event as the watcher saw it: the approval, whether it
/// was decided (else requested), and when it arrived.
type Seen = (String, bool, Instant);

/// Decisions seen by a watcher: on the same replica (both backends), and
/// on PostgreSQL, made on replica B and watched on replica A.
async fn decision_cases(
    plan: &Plan,
    a: &Server,
    b: Option<&Server>,
    backend: &'static str,
    report: &mut Report,
) -> anyhow::Result<()> {
    let samples = plan.control.decisions;
    let mut paths = vec![("the same replica", a, a)];
    if let Some(b) = b {
        paths.push(("two replicas", a, b));
    }
    for (n, (label, watched, decider)) in paths.into_iter().enumerate() {
        eprintln!("== control on {backend}: {samples} approvals decided, {label}");
        let session = format!("bench-approvals-{n}");
        let timed = decisions(watched, decider, &session, samples).await?;
        let (mut seen, mut calls) = (timed.seen, timed.calls);
        let ms: Vec<f64> = seen.iter().map(|d| d.as_secs_f64() * 1e3).collect();
        let call = Latency::of(&mut calls);
        let latency = Latency::of(&mut seen);
        let subject = if n == 0 {
            "DecideApproval sent → approval_decided at a watcher on the same replica"
        } else {
            "DecideApproval sent on B → approval_decided at a watcher on A"
        };
        let mut figure = Figure::new(
            "control approval",
            backend,
            subject,
            &format!(
                "{samples} approvals, one at a time, approve and deny alternately, one watcher"
            ),
            "ms",
            Spread::of(&ms),
        )
        .latency(latency)
        .detail(&format!(
            "the DecideApproval call p50 {:.2} ms, p99 {:.2} ms",
            call.p50_ms, call.p99_ms
        ));
        // The goal is for the decision across replicas, in a full run.
        if n == 1 && samples >= 100 {
            figure = figure.target("p99 < 100 ms", latency.p99_ms < 100.0);
        }
        report.push(figure);
    }
    Ok(())
}

/// What [`decisions`] timed, one of each per decision.
struct Decisions {
    /// From sending DecideApproval to the watcher's `approval_decided`.
    seen: Vec<Duration>,
    /// DecideApproval's round trip.
    calls: Vec<Duration>,
}

/// `samples` decisions (a tenth as many again first, unmeasured), one at a
/// time: an assistant message making a new tool call and RequestApproval
/// for it on `watched`; once the watcher (on `watched`, open throughout)
/// has seen the request, DecideApproval on `decider`, approving and
/// denying alternately, and the time until the watcher sees it decided.
async fn decisions(
    watched: &Server,
    decider: &Server,
    session: &str,
    samples: usize,
) -> anyhow::Result<Decisions> {
    let mut writer = watched.connect().await?;
    let mut deciding = decider.connect().await?;
    workload::create_session(&mut writer, session, "bench", 0, 0).await?;
    let mut stream = watched
        .connect()
        .await?
        .watch_session(pb::WatchSessionRequest {
            session_id: session.to_owned(),
            ..Default::default()
        })
        .await
        .context("WatchSession")?
        .into_inner();
    loop {
        let event = stream
            .next()
            .await
            .context("the watch ended before catching up")??;
        if matches!(event.event, Some(pb::session_event::Event::CaughtUp(_))) {
            break;
        }
    }
    // The watcher reads on a task of its own, so that each event is timed
    // as it arrives, not when the bench gets round to it.
    let (sender, mut seen) = mpsc::unbounded_channel::<Seen>();
    let watcher = tokio::spawn(async move {
        while let Some(event) = stream.next().await {
            let now = Instant::now();
            let approval = match event.context("the watch failed")?.event {
                Some(pb::session_event::Event::ApprovalRequested(requested)) => {
                    requested.approval.map(|a| (a.approval_id, false))
                }
                Some(pb::session_event::Event::ApprovalDecided(decided)) => {
                    decided.approval.map(|a| (a.approval_id, true))
                }
                _ => None,
            };
            if let Some((id, decided)) = approval
                && sender.send((id, decided, now)).is_err()
            {
                break;
            }
        }
        anyhow::Ok(())
    });
    let warmup = samples / 10;
    let mut timed = Decisions {
        seen: Vec::with_capacity(samples),
        calls: Vec::with_capacity(samples),
    };
    let outcome = async {
        for i in 0..warmup + samples {
            let call_id = format!("call_{i}");
            writer
                .append_exchange(pb::AppendExchangeRequest {
                    session_id: session.to_owned(),
                    messages: vec![
                        pb::Message {
                            role: pb::Role::User.into(),
                            content: format!("list the files, take {i}"),
                            ..Default::default()
                        },
                        tool_calls(std::slice::from_ref(&call_id)),
                    ],
                    request_id: uuid::Uuid::now_v7().to_string(),
                    ..Default::default()
                })
                .await
                .context("AppendExchange of a tool call")?;
            let approval_id = writer
                .request_approval(pb::RequestApprovalRequest {
                    session_id: session.to_owned(),
                    tool_call_id: call_id,
                    title: "Run run_command?".to_owned(),
                    detail_json: DETAIL_JSON.to_owned(),
                    ..Default::default()
                })
                .await
                .context("RequestApproval")?
                .into_inner()
                .approval
                .context("RequestApproval answered no approval")?
                .approval_id;
            wait_for(&mut seen, &approval_id, false).await?;
            let decision = if i % 2 == 0 {
                pb::ApprovalDecision::Approve
            } else {
                pb::ApprovalDecision::Deny
            };
            let sent = Instant::now();
            deciding
                .decide_approval(pb::DecideApprovalRequest {
                    session_id: session.to_owned(),
                    approval_id: approval_id.clone(),
                    decision: decision.into(),
                    reason: "bench".to_owned(),
                    decided_by: "bench".to_owned(),
                    request_id: uuid::Uuid::now_v7().to_string(),
                })
                .await
                .context("DecideApproval")?;
            let answered = Instant::now();
            let arrived = wait_for(&mut seen, &approval_id, true).await?;
            if i >= warmup {
                timed.seen.push(arrived.saturating_duration_since(sent));
                timed.calls.push(answered - sent);
            }
        }
        anyhow::Ok(())
    }
    .await;
    watcher.abort();
    outcome?;
    Ok(timed)
}

/// What each approval asks about.
const DETAIL_JSON: &str = r#"{"command":"ls -la /srv/data"}"#;

/// An assistant message making a `run_command` tool call for each of `ids`.
fn tool_calls(ids: &[String]) -> pb::Message {
    pb::Message {
        role: pb::Role::Assistant.into(),
        tool_calls: ids
            .iter()
            .map(|id| pb::ToolCall {
                id: id.clone(),
                name: "run_command".to_owned(),
                arguments: r#"{"command":"ls -la /srv/data"}"#.to_owned(),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
}

/// When the watcher saw `approval_id` requested (`decided` false) or
/// decided.
async fn wait_for(
    seen: &mut mpsc::UnboundedReceiver<Seen>,
    approval_id: &str,
    decided: bool,
) -> anyhow::Result<Instant> {
    let give_up = Instant::now() + DECISION_TIMEOUT;
    loop {
        let left = give_up.saturating_duration_since(Instant::now());
        let (id, was_decided, at) = tokio::time::timeout(left, seen.recv())
            .await
            .with_context(|| {
                format!(
                    "the watcher did not see {approval_id} {} within {} s",
                    if decided { "decided" } else { "requested" },
                    DECISION_TIMEOUT.as_secs()
                )
            })?
            .context("the watch ended")?;
        if id == approval_id && was_decided == decided {
            return Ok(at);
        }
    }
}

/// AppendExchange at [`CLIENTS`] clients, many sessions, on two databases
/// made alike, the approval and queued-input tables of one empty
/// ("before") and of the other holding idle rows in other sessions
/// ("after"), alternating run by run.
async fn idle_rows(
    plan: &Plan,
    binary: &Path,
    backend: &'static str,
    postgres: Option<&str>,
    report: &mut Report,
) -> anyhow::Result<()> {
    let shape = plan.control;
    eprintln!(
        "== control on {backend}: appends, tables empty and beside {} pending approvals and {} \
         waiting inputs",
        shape.approvals(),
        shape.inputs()
    );
    let before = fresh_database(backend, postgres, "control_before").await?;
    let after = match fresh_database(backend, postgres, "control_after").await {
        Ok(after) => after,
        Err(error) => {
            before.remove().await?;
            return Err(error);
        }
    };
    let outcome = idle_rows_on(plan, binary, [&before, &after], report).await;
    before.remove().await?;
    after.remove().await?;
    outcome
}

async fn idle_rows_on(
    plan: &Plan,
    binary: &Path,
    dbs: [&Database; 2],
    report: &mut Report,
) -> anyhow::Result<()> {
    let mut servers = Vec::with_capacity(2);
    for db in dbs {
        match Server::start(binary, &db.url(), &[]).await {
            Ok(server) => servers.push(server),
            Err(error) => {
                for server in servers {
                    server.stop().await;
                }
                return Err(error);
            }
        }
    }
    let outcome = idle_rows_measured(plan, &servers, dbs, report).await;
    for server in servers {
        server.stop().await;
    }
    outcome
}

async fn idle_rows_measured(
    plan: &Plan,
    servers: &[Server],
    dbs: [&Database; 2],
    report: &mut Report,
) -> anyhow::Result<()> {
    let shape = plan.control;
    let backend = dbs[0].backend();
    let filling = Instant::now();
    for (side, (server, db)) in servers.iter().zip(dbs).enumerate() {
        append::prepare(server, db, CLIENTS, plan.prefill).await?;
        fill_idle(server, &shape, side == 1).await?;
        db.analyze().await?;
        let pending = count(db, "SELECT COUNT(*) FROM approvals WHERE state = 1").await?;
        let waiting = count(db, "SELECT COUNT(*) FROM queued_inputs WHERE state = 0").await?;
        let expected = if side == 1 {
            (shape.approvals(), shape.inputs())
        } else {
            (0, 0)
        };
        anyhow::ensure!(
            (pending as usize, waiting as usize) == expected,
            "{pending} approvals pending and {waiting} inputs waiting, expected {expected:?}"
        );
    }
    eprintln!("   filled in {:.1} s", filling.elapsed().as_secs_f64());
    let mut runs: [Vec<Run>; 2] = [Vec::new(), Vec::new()];
    for round in 0..shape.rounds {
        let order = if round.is_multiple_of(2) {
            [0, 1]
        } else {
            [1, 0]
        };
        for side in order {
            let run = append::service(&servers[side], CLIENTS, Writers::Many, plan.timing).await?;
            runs[side].push(run);
        }
    }
    let paired: Vec<f64> = runs[1]
        .iter()
        .zip(&runs[0])
        .map(|(after, before)| after.rate() / before.rate())
        .collect();
    let paired = Spread::of(&paired);
    let [before, after] = runs.map(Throughput::of);
    let case = format!(
        "{CLIENTS} clients, many sessions; beside them {} sessions of {} tool calls each and {} \
         whose run holds the lease",
        shape.approval_sessions, shape.approvals_each, shape.queue_sessions
    );
    let cpu = |run: &Throughput| {
        run.cpu_micros
            .map(|cpu| format!("server CPU {:.0} µs/exchange", cpu.median))
            .unwrap_or_default()
    };
    report.push(
        Figure::new(
            "control idle rows",
            backend,
            "sessionstore, approval and queue tables empty (before)",
            &case,
            "exchanges/s",
            before.per_second,
        )
        .latency(before.latency)
        .detail(&cpu(&before)),
    );
    let ratio = after.per_second.median / before.per_second.median;
    report.push(
        Figure::new(
            "control idle rows",
            backend,
            &format!(
                "sessionstore, {} approvals pending (half expiring in a day) and {} inputs \
                 waiting in those sessions (after)",
                shape.approvals(),
                shape.inputs()
            ),
            &case,
            "exchanges/s",
            after.per_second,
        )
        .latency(after.latency)
        .ratio(ratio, "before")
        .detail(&format!(
            "{}; each round's after ÷ before {}",
            cpu(&after),
            paired.show(2)
        )),
    );
    Ok(())
}

/// The sessions beside the appenders' (the same on both sides): with
/// `rows`, each approval session's tool calls each await a decision (every
/// other one expiring in a day, the rest never), and inputs wait in each
/// queue session, whose run holds the lease on both sides.
async fn fill_idle(server: &Server, shape: &Shape, rows: bool) -> anyhow::Result<()> {
    let mut fills = tokio::task::JoinSet::new();
    for worker in 0..CLIENTS {
        let mut client = server.connect().await?;
        let shape = *shape;
        fills.spawn(async move {
            for s in (worker..shape.approval_sessions).step_by(CLIENTS) {
                let session = format!("bench-idle-approvals-{s}");
                workload::create_session(&mut client, &session, "bench", 0, 0).await?;
                let ids: Vec<String> = (0..shape.approvals_each)
                    .map(|k| format!("call_{s}_{k}"))
                    .collect();
                client
                    .append_exchange(pb::AppendExchangeRequest {
                        session_id: session.clone(),
                        messages: vec![workload::user(s as u64), tool_calls(&ids)],
                        request_id: uuid::Uuid::now_v7().to_string(),
                        ..Default::default()
                    })
                    .await
                    .with_context(|| format!("AppendExchange of tool calls to {session}"))?;
                if !rows {
                    continue;
                }
                let in_a_day = workload::now_micros() + 86_400_000_000;
                for (k, id) in ids.into_iter().enumerate() {
                    client
                        .request_approval(pb::RequestApprovalRequest {
                            session_id: session.clone(),
                            tool_call_id: id,
                            title: "Run run_command?".to_owned(),
                            detail_json: DETAIL_JSON.to_owned(),
                            expire_time: (k % 2 == 0).then(|| workload::timestamp(in_a_day)),
                            ..Default::default()
                        })
                        .await
                        .with_context(|| format!("RequestApproval in {session}"))?;
                }
            }
            for q in (worker..shape.queue_sessions).step_by(CLIENTS) {
                let session = format!("bench-idle-queue-{q}");
                leased_session(
                    &mut client,
                    &session,
                    &format!("bench-idle-run-{q}"),
                    86_400,
                )
                .await?;
                if !rows {
                    continue;
                }
                for i in 0..shape.inputs_each {
                    queue_input(&mut client, &session, (q * shape.inputs_each + i) as u64).await?;
                }
            }
            anyhow::Ok(())
        });
    }
    while let Some(filled) = fills.join_next().await {
        filled??;
    }
    Ok(())
}

/// One number `sql` reads from `db`.
async fn count(db: &Database, sql: &str) -> anyhow::Result<i64> {
    let url = db.url();
    let n = if db.is_postgres() {
        let mut conn = sqlx::PgConnection::connect(&url).await?;
        let n = sqlx::query_scalar(sql).fetch_one(&mut conn).await?;
        conn.close().await?;
        n
    } else {
        let mut conn = sqlx::SqliteConnection::connect(&url).await?;
        let n = sqlx::query_scalar(sql).fetch_one(&mut conn).await?;
        conn.close().await?;
        n
    };
    Ok(n)
}
