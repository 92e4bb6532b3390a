//! A PostgreSQL primary fails over to its synchronous standby, and later
//! back: two sessionstore replicas on a multi-host URL (the standby listed
//! first) keep their promises through both. Sixteen writers retry with
//! their request ids until acknowledged; watchers on both replicas resume
//! from the last revision they received. Afterwards: every acknowledged
//! exchange is stored exactly once, sequences are gap-free, every watcher
//! saw every revision once and in order, and only OK and UNAVAILABLE
//! (`STORAGE_UNAVAILABLE`, with RetryInfo) were ever answered.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sessionstore_client::SessionStoreClient;
use sessionstore_client::v1 as pb;
use sessionstore_client::v1::session_event::Event;
use tonic::Code;
use tonic::transport::Channel;
use tonic_health::pb::health_check_response::ServingStatus;

use crate::faults::health_becomes;
use crate::support::cluster::{Cluster, multi_host_url};
use crate::support::{
    ServerProcess, all_messages, assert_appended, assistant, call, connect, content, create,
    error_details, sessionstore_binary, user,
};

type Client = SessionStoreClient<Channel>;

const REPLICAS: usize = 2;
const SESSIONS: usize = 4;
const WRITERS: usize = 16;
/// The spec's pause between the primary's death and the promotion.
const PROMOTE_AFTER: Duration = Duration::from_secs(12);
/// Every call is answered within this, also with no primary.
const ANSWER_WITHIN: Duration = Duration::from_secs(5);
/// Health NOT_SERVING after the primary goes away; SERVING, and writes
/// accepted, after a promotion; events at every watcher after a commit.
const FOLLOW_WITHIN: Duration = Duration::from_secs(10);
/// A call not answered by then is recorded as a hang (a failure).
const CALL_PATIENCE: Duration = Duration::from_secs(30);
/// A writer's or watcher's pause before trying again after UNAVAILABLE
/// (retry pacing, as a client's backoff: it waits for nothing).
const RETRY_PAUSE: Duration = Duration::from_millis(100);
/// Each writer appends at most once per this (a load rate, so that the
/// two cores also serve the health watches and PostgreSQL's own work).
const WRITE_EVERY: Duration = Duration::from_millis(50);
/// Acknowledged writes to wait for between the steps of the test.
const WRITES_PER_STEP: usize = 150;
/// Every this many acknowledged writes, a writer sends its last one again
/// through the other replica: the retry must answer the first result.
const RETRY_EVERY: usize = 10;

fn session_id(s: usize) -> String {
    format!("ses_failover_{s}")
}

/// A writer's request: the user message holds the request id.
fn exchange(session: usize, request_id: &str) -> pb::AppendExchangeRequest {
    pb::AppendExchangeRequest {
        session_id: session_id(session),
        request_id: request_id.to_owned(),
        messages: vec![user(&format!("request {request_id}"))],
        provider_call: Some(call("gpt-failover", 10, 5, 42)),
        response_messages: vec![assistant(&format!("answer to {request_id}"))],
        ..Default::default()
    }
}

/// One answer other than OK, as a writer or watcher saw it.
struct Refusal {
    what: String,
    replica: usize,
    code: Code,
    reason: Option<String>,
    retry_info: bool,
    took: Duration,
    message: String,
}

impl Refusal {
    fn of(what: String, replica: usize, status: &tonic::Status, took: Duration) -> Refusal {
        let details = tonic_types::StatusExt::get_error_details(status);
        Refusal {
            what,
            replica,
            code: status.code(),
            reason: error_details(status).0,
            retry_info: details.retry_info().is_some(),
            took,
            message: status.message().to_owned(),
        }
    }

    fn describe(&self) -> String {
        format!(
            "{} through replica {}: {:?} {} retry_info={} after {:?}: {:?}",
            self.what,
            self.replica,
            self.code,
            self.reason.as_deref().unwrap_or("(no ErrorInfo)"),
            self.retry_info,
            self.took,
            self.message
        )
    }

    /// UNAVAILABLE / STORAGE_UNAVAILABLE with RetryInfo, answered in time:
    /// the one refusal the contract allows while there is no primary.
    fn allowed(&self) -> bool {
        self.code == Code::Unavailable
            && self.reason.as_deref() == Some("STORAGE_UNAVAILABLE")
            && self.retry_info
            && self.took <= ANSWER_WITHIN
    }
}

/// An acknowledged exchange.
#[derive(Debug, Clone)]
struct Ack {
    request_id: String,
    session: usize,
    replica: usize,
    response: pb::AppendExchangeResponse,
    at: Instant,
}

/// What the writers report as they go.
#[derive(Debug, Clone, Default)]
struct Progress {
    acks: usize,
}

/// What every writer and watcher shares.
struct Shared {
    clients: [Client; REPLICAS],
    refusals: Mutex<Vec<Refusal>>,
    /// Calls that got no answer at all within [`CALL_PATIENCE`].
    hangs: Mutex<Vec<String>>,
    /// Other failures (a retry answering something other than the first
    /// result, a watch that ended cleanly).
    problems: Mutex<Vec<String>>,
    /// Every acknowledged append, as (replica, when): also the retries.
    oks: Mutex<Vec<(usize, Instant)>>,
    progress: tokio::sync::watch::Sender<Progress>,
}

impl Shared {
    fn refused(&self, refusal: Refusal) {
        self.refusals.lock().unwrap().push(refusal);
    }

    fn problem(&self, problem: String) {
        self.problems.lock().unwrap().push(problem);
    }

    /// Appends `request` through `replica` until acknowledged, switching
    /// replica after each refusal. None if the writers were told to give
    /// up (the test is failing anyway: a refusal other than UNAVAILABLE
    /// repeated, or a hang, is recorded).
    async fn append_until_acknowledged(
        &self,
        what: &str,
        replica: &mut usize,
        request: &pb::AppendExchangeRequest,
    ) -> Option<(usize, pb::AppendExchangeResponse, Instant)> {
        let mut other_refusals = 0;
        loop {
            let mut client = self.clients[*replica].clone();
            let started = Instant::now();
            match tokio::time::timeout(CALL_PATIENCE, client.append_exchange(request.clone())).await
            {
                Ok(Ok(response)) => {
                    let at = Instant::now();
                    self.oks.lock().unwrap().push((*replica, at));
                    return Some((*replica, response.into_inner(), at));
                }
                Ok(Err(status)) => {
                    let refusal =
                        Refusal::of(what.to_owned(), *replica, &status, started.elapsed());
                    if status.code() != Code::Unavailable {
                        other_refusals += 1;
                    }
                    self.refused(refusal);
                    if other_refusals >= 20 {
                        return None;
                    }
                }
                Err(_) => {
                    self.hangs.lock().unwrap().push(format!(
                        "{what} through replica {replica}: no answer within {CALL_PATIENCE:?}"
                    ));
                    return None;
                }
            }
            *replica = (*replica + 1) % REPLICAS;
            tokio::time::sleep(RETRY_PAUSE).await;
        }
    }
}

/// Writer `w`: appends exchange after exchange to its session until told
/// to stop, each retried with its request id until acknowledged.
async fn writer(
    shared: Arc<Shared>,
    w: usize,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> Vec<Ack> {
    let session = w % SESSIONS;
    let mut replica = w % REPLICAS;
    let mut acks: Vec<Ack> = Vec::new();
    let mut pace = tokio::time::interval(WRITE_EVERY);
    pace.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    for i in 0.. {
        tokio::select! {
            _ = pace.tick() => {}
            _ = stop.wait_for(|stop| *stop) => break,
        }
        if *stop.borrow() {
            break;
        }
        // Now and then the last acknowledged exchange again, through the
        // other replica: the first result, nothing written.
        if i > 0
            && i % RETRY_EVERY == 0
            && let Some(last) = acks.last().cloned()
        {
            let mut other = (last.replica + 1) % REPLICAS;
            let what = format!("retry of {}", last.request_id);
            let Some((_, again, _)) = shared
                .append_until_acknowledged(&what, &mut other, &exchange(session, &last.request_id))
                .await
            else {
                break;
            };
            if again != last.response {
                shared.problem(format!(
                    "{what}: answered {again:?}, the first result was {:?}",
                    last.response
                ));
            }
        }
        let request_id = format!("w{w:02}-{i:06}");
        let request = exchange(session, &request_id);
        let Some((by, response, at)) = shared
            .append_until_acknowledged(&request_id, &mut replica, &request)
            .await
        else {
            break;
        };
        acks.push(Ack {
            request_id,
            session,
            replica: by,
            response,
            at,
        });
        shared.progress.send_modify(|p| p.acks += 1);
    }
    acks
}

/// What one watcher received over all its streams.
struct Watched {
    replica: usize,
    session: usize,
    events: Vec<pb::SessionEvent>,
    /// How each of its streams ended (or failed to open), in order.
    ends: Vec<String>,
    /// When it received its last event (the head's, once it is done).
    last_event_at: Option<Instant>,
}

/// Watches session `session` through `replica` from the start, resuming
/// after the last revision received whenever a stream ends, until it has
/// the final head (sent through `heads` once the writers stopped).
async fn watcher(
    shared: Arc<Shared>,
    replica: usize,
    session: usize,
    mut heads: tokio::sync::watch::Receiver<Option<Vec<i64>>>,
) -> Watched {
    let mut watched = Watched {
        replica,
        session,
        events: Vec::new(),
        ends: Vec::new(),
        last_event_at: None,
    };
    let mut last = 0_i64;
    let done =
        |last: i64, heads: &Option<Vec<i64>>| heads.as_ref().is_some_and(|h| last >= h[session]);
    'resume: loop {
        if done(last, &heads.borrow()) {
            break;
        }
        let mut client = shared.clients[replica].clone();
        let started = Instant::now();
        let request = pb::WatchSessionRequest {
            session_id: session_id(session),
            after_revision: last,
            include_active_deltas: false,
            ..Default::default()
        };
        let mut stream = match tokio::time::timeout(CALL_PATIENCE, client.watch_session(request))
            .await
        {
            Ok(Ok(response)) => response.into_inner(),
            Ok(Err(status)) => {
                let what = format!("WatchSession({}) after {last}", session_id(session));
                watched
                    .ends
                    .push(format!("open refused: {:?}", status.code()));
                shared.refused(Refusal::of(what, replica, &status, started.elapsed()));
                tokio::time::sleep(RETRY_PAUSE).await;
                continue;
            }
            Err(_) => {
                shared.hangs.lock().unwrap().push(format!(
                    "WatchSession({}) through replica {replica}: not opened within {CALL_PATIENCE:?}",
                    session_id(session)
                ));
                break;
            }
        };
        loop {
            tokio::select! {
                message = stream.message() => match message {
                    Ok(Some(event)) => {
                        if matches!(event.event, Some(Event::Progress(_)) | Some(Event::CaughtUp(_))) {
                            continue;
                        }
                        last = event.revision;
                        watched.events.push(event);
                        watched.last_event_at = Some(Instant::now());
                        if done(last, &heads.borrow()) {
                            break 'resume;
                        }
                    }
                    Ok(None) => {
                        watched.ends.push(format!("ended cleanly after {last}"));
                        shared.problem(format!(
                            "watch of {} on replica {replica} ended cleanly after revision {last} \
                             (the contract: it stays open or ends UNAVAILABLE)",
                            session_id(session)
                        ));
                        continue 'resume;
                    }
                    Err(status) => {
                        watched.ends.push(format!("ended {:?} after {last}", status.code()));
                        if status.code() != Code::Unavailable {
                            shared.problem(format!(
                                "watch of {} on replica {replica} ended {status:?} after revision {last}",
                                session_id(session)
                            ));
                        }
                        tokio::time::sleep(RETRY_PAUSE).await;
                        continue 'resume;
                    }
                },
                changed = heads.changed() => {
                    assert!(changed.is_ok(), "the heads' sender lives until the watchers end");
                    if done(last, &heads.borrow()) {
                        break 'resume;
                    }
                }
            }
        }
    }
    watched
}

/// Prints the tails of the servers' and PostgreSQL's logs if the test fails.
struct LogsOnFailure(Vec<(String, PathBuf)>);

impl Drop for LogsOnFailure {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        for (name, path) in &self.0 {
            let text = std::fs::read_to_string(path).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let tail = lines[lines.len().saturating_sub(40)..].join("\n");
            eprintln!("--- {name} ({}), last lines ---\n{tail}", path.display());
        }
    }
}

/// Health of both replicas becomes `wanted` within `within` of `since`.
async fn both_become(
    endpoints: &[String],
    wanted: ServingStatus,
    since: Instant,
    within: Duration,
) {
    let remaining = within.saturating_sub(since.elapsed());
    let waits = endpoints
        .iter()
        .map(|endpoint| health_becomes(endpoint, wanted, remaining));
    futures_util::future::join_all(waits).await;
}

/// Waits until the writers have `more` acknowledged writes than now.
async fn writes_go_on(
    progress: &mut tokio::sync::watch::Receiver<Progress>,
    more: usize,
    what: &str,
) {
    let target = progress.borrow().acks + more;
    tokio::time::timeout(
        Duration::from_secs(120),
        progress.wait_for(|p| p.acks >= target),
    )
    .await
    .unwrap_or_else(|_| panic!("{what}: {more} more acknowledged writes within 120 s"))
    .expect("writers report progress");
}

/// The primary `old` dies (`pg_ctl -m immediate stop`); both replicas turn
/// NOT_SERVING within 10 s; about 12 s after the death (the spec's delay:
/// the wait for NOT_SERVING is part of it, the remainder a plain pause)
/// the standby `new` is promoted; within 10 s of `pg_ctl promote`
/// returning, both replicas are SERVING and each acknowledged a write.
/// Returns, per replica, how long after the promotion its first write was
/// acknowledged.
async fn fail_over(
    label: &str,
    old: &mut Cluster,
    new: &Cluster,
    endpoints: &[String],
    shared: &Shared,
) -> Vec<Duration> {
    // A promoted node that named a synchronous standby would wait for one
    // on every commit: the standby names none.
    new.set_synchronous_standby_names("").await;
    assert!(new.in_recovery().await, "{label}: the standby is a standby");

    let died = Instant::now();
    old.stop_immediate().await;
    both_become(endpoints, ServingStatus::NotServing, died, FOLLOW_WITHIN).await;
    let not_serving = died.elapsed();
    tokio::time::sleep(PROMOTE_AFTER.saturating_sub(died.elapsed())).await;

    new.promote().await;
    let promoted = Instant::now();
    assert!(!new.in_recovery().await, "{label}: promoted");
    both_become(endpoints, ServingStatus::Serving, promoted, FOLLOW_WITHIN).await;
    let serving = promoted.elapsed();
    let writes = crate::support::poll_until(
        &format!("{label}: a write acknowledged by every replica after the promotion"),
        FOLLOW_WITHIN.saturating_sub(promoted.elapsed()),
        || async {
            let oks = shared.oks.lock().unwrap();
            let firsts: Vec<Option<Duration>> = (0..REPLICAS)
                .map(|r| {
                    oks.iter()
                        .filter(|(replica, at)| *replica == r && *at > promoted)
                        .map(|(_, at)| *at - promoted)
                        .min()
                })
                .collect();
            firsts.into_iter().collect::<Option<Vec<Duration>>>()
        },
    )
    .await;
    for (r, took) in writes.iter().enumerate() {
        assert!(
            *took <= FOLLOW_WITHIN,
            "{label}: replica {r}'s first write {took:?} after the promotion"
        );
    }
    eprintln!(
        "failover {label}: NOT_SERVING on both {not_serving:?} after the primary died; \
         promoted {:?} after it; SERVING on both {serving:?} after the promotion; \
         first acknowledged write per replica {writes:?} after the promotion",
        promoted - died
    );
    writes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_there_and_back_keeps_every_acknowledged_write_once() {
    let binary = sessionstore_binary();
    let mut a = Cluster::init_primary().await;
    let mut b = a.standby().await;
    a.require_synchronous_standby().await;
    // The standby first: a replica must find the primary behind it.
    let url = multi_host_url(&[&b, &a], "read-write");

    let logs = tempfile::tempdir().unwrap();
    let mut servers = Vec::new();
    for r in 0..REPLICAS {
        let log = logs.path().join(format!("replica{r}.log"));
        servers.push(ServerProcess::start(&binary, &url, "127.0.0.1:0", log, &[]).await);
    }
    let _logs_on_failure = LogsOnFailure(
        (0..REPLICAS)
            .map(|r| (format!("replica {r}"), servers[r].log.clone()))
            .chain([
                ("PostgreSQL a".to_owned(), a.log_path()),
                ("PostgreSQL b".to_owned(), b.log_path()),
            ])
            .collect(),
    );
    let endpoints: Vec<String> = servers.iter().map(ServerProcess::endpoint).collect();
    let clients = [connect(&endpoints[0]).await, connect(&endpoints[1]).await];
    both_become(
        &endpoints,
        ServingStatus::Serving,
        Instant::now(),
        FOLLOW_WITHIN,
    )
    .await;

    for s in 0..SESSIONS {
        let mut client = clients[s % REPLICAS].clone();
        let created = create(&mut client, &session_id(s)).await;
        assert_eq!(created.revision, 1);
    }

    let (progress, mut progress_rx) = tokio::sync::watch::channel(Progress::default());
    let shared = Arc::new(Shared {
        clients,
        refusals: Mutex::new(Vec::new()),
        hangs: Mutex::new(Vec::new()),
        problems: Mutex::new(Vec::new()),
        oks: Mutex::new(Vec::new()),
        progress,
    });
    let (heads, heads_rx) = tokio::sync::watch::channel(None::<Vec<i64>>);
    let mut watchers = Vec::new();
    for replica in 0..REPLICAS {
        for session in 0..SESSIONS {
            watchers.push(tokio::spawn(watcher(
                shared.clone(),
                replica,
                session,
                heads_rx.clone(),
            )));
        }
    }
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| tokio::spawn(writer(shared.clone(), w, stop_rx.clone())))
        .collect();
    writes_go_on(
        &mut progress_rx,
        WRITES_PER_STEP,
        "before the first failover",
    )
    .await;

    // There: a dies, b is promoted; a is rebuilt as b's synchronous standby.
    let there = fail_over("a→b", &mut a, &b, &endpoints, &shared).await;
    writes_go_on(&mut progress_rx, WRITES_PER_STEP, "on b alone").await;
    a.rebuild_as_standby_of(&b).await;
    b.require_synchronous_standby().await;
    writes_go_on(
        &mut progress_rx,
        WRITES_PER_STEP,
        "on b with a as its standby",
    )
    .await;

    // And back: b dies, a is promoted; b is rebuilt as a's synchronous standby.
    let back = fail_over("b→a", &mut b, &a, &endpoints, &shared).await;
    writes_go_on(&mut progress_rx, WRITES_PER_STEP, "on a alone").await;
    b.rebuild_as_standby_of(&a).await;
    a.require_synchronous_standby().await;
    writes_go_on(
        &mut progress_rx,
        WRITES_PER_STEP,
        "on a with b as its standby",
    )
    .await;

    stop.send_replace(true);
    let mut acks: Vec<Ack> = Vec::new();
    for writer in writers {
        let mine = tokio::time::timeout(Duration::from_secs(120), writer)
            .await
            .expect("a writer stops within 120 s of being told to")
            .expect("writer task");
        acks.extend(mine);
    }
    let last_ack = acks
        .iter()
        .map(|ack| ack.at)
        .max()
        .expect("acknowledged writes");

    // The answers: OK, or UNAVAILABLE / STORAGE_UNAVAILABLE with RetryInfo
    // within 5 s; no hangs.
    let hangs = shared.hangs.lock().unwrap().clone();
    assert!(hangs.is_empty(), "calls without an answer: {hangs:#?}");
    {
        let refusals = shared.refusals.lock().unwrap();
        let mut by_kind: BTreeMap<String, usize> = BTreeMap::new();
        for refusal in refusals.iter() {
            let kind = format!(
                "{:?} {} retry_info={}",
                refusal.code,
                refusal.reason.as_deref().unwrap_or("(no ErrorInfo)"),
                refusal.retry_info
            );
            *by_kind.entry(kind).or_default() += 1;
        }
        let slowest = refusals.iter().map(|r| r.took).max();
        eprintln!(
            "failover: {} acknowledged exchanges; refusals {by_kind:?}, the slowest answered in {slowest:?}",
            acks.len()
        );
        let bad: Vec<String> = refusals
            .iter()
            .filter(|r| !r.allowed())
            .map(Refusal::describe)
            .collect();
        assert!(
            bad.is_empty(),
            "{} answers other than OK or UNAVAILABLE/STORAGE_UNAVAILABLE with RetryInfo within \
             {ANSWER_WITHIN:?} (first 20): {:#?}",
            bad.len(),
            &bad[..bad.len().min(20)]
        );
    }

    // Each session's acknowledged exchanges, by revision.
    let mut by_session: Vec<BTreeMap<i64, &Ack>> = vec![BTreeMap::new(); SESSIONS];
    for ack in &acks {
        if let Some(earlier) = by_session[ack.session].insert(ack.response.revision, ack) {
            panic!(
                "{} and {} were both acknowledged as revision {} of {}",
                earlier.request_id,
                ack.request_id,
                ack.response.revision,
                session_id(ack.session)
            );
        }
    }
    let mut reader = shared.clients[0].clone();
    let mut final_heads = Vec::new();
    for (s, acked) in by_session.iter().enumerate() {
        let id = session_id(s);
        let revisions: Vec<i64> = acked.keys().copied().collect();
        let head = 1 + i64::try_from(acked.len()).unwrap();
        assert_eq!(
            revisions,
            (2..=head).collect::<Vec<_>>(),
            "{id}: every revision after the creation is one acknowledged exchange"
        );
        let session = crate::support::get(&mut reader, &id).await;
        assert_eq!(
            session.revision, head,
            "{id}: the head is the last acknowledged revision"
        );

        // Stored exactly once each, gap-free, as acknowledged.
        let stored = all_messages(&mut reader, &id).await;
        let sequences: Vec<i64> = stored.iter().map(|m| m.sequence).collect();
        assert_eq!(
            sequences,
            (0..2 * (head - 1)).collect::<Vec<_>>(),
            "{id}: sequences 0..n, gap-free, two per acknowledged exchange"
        );
        let mut requests: HashMap<&str, usize> = HashMap::new();
        for message in &stored {
            if let Some(request_id) = content(message).strip_prefix("request ") {
                *requests.entry(request_id).or_default() += 1;
            }
        }
        let twice: Vec<(&&str, &usize)> = requests.iter().filter(|(_, n)| **n > 1).collect();
        assert!(
            twice.is_empty(),
            "{id}: exchanges stored more than once: {twice:?}"
        );
        assert_eq!(
            requests.len(),
            acked.len(),
            "{id}: one stored exchange per acknowledged one"
        );
        for ack in acked.values() {
            assert_eq!(
                requests.get(ack.request_id.as_str()),
                Some(&1),
                "{id}: {} is stored",
                ack.request_id
            );
            let first = usize::try_from(ack.response.messages[0].sequence).unwrap();
            assert_eq!(
                &stored[first..first + 2],
                &ack.response.messages[..],
                "{id}: {} is stored as acknowledged",
                ack.request_id
            );
        }
        // The same transcript through the other replica.
        let mut other = shared.clients[1].clone();
        assert_eq!(
            all_messages(&mut other, &id).await,
            stored,
            "{id} through replica 1"
        );
        // One provider call per exchange.
        let mut calls = 0;
        let mut page_token = String::new();
        loop {
            let page = reader
                .list_provider_calls(pb::ListProviderCallsRequest {
                    session_id: id.clone(),
                    page_size: 1000,
                    page_token,
                })
                .await
                .expect("list provider calls")
                .into_inner();
            calls += page.provider_calls.len();
            if page.next_page_token.is_empty() {
                break;
            }
            page_token = page.next_page_token;
        }
        assert_eq!(calls, acked.len(), "{id}: one provider call per exchange");
        final_heads.push(head);
    }

    // The watchers: every revision once, in order, up to the head, within
    // 10 s of the last commit.
    heads.send_replace(Some(final_heads.clone()));
    let mut watched = Vec::new();
    for watcher in watchers {
        watched.push(
            tokio::time::timeout(Duration::from_secs(120), watcher)
                .await
                .expect("a watcher reaches the head within 120 s")
                .expect("watcher task"),
        );
    }
    drop(heads);
    for w in &watched {
        let id = session_id(w.session);
        let head = final_heads[w.session];
        let revisions: Vec<i64> = w.events.iter().map(|e| e.revision).collect();
        if revisions != (1..=head).collect::<Vec<_>>() {
            let mut sorted = revisions.clone();
            sorted.sort_unstable();
            let duplicates: Vec<i64> = sorted
                .windows(2)
                .filter(|p| p[0] == p[1])
                .map(|p| p[0])
                .collect();
            let missing: Vec<i64> = (1..=head)
                .filter(|r| sorted.binary_search(r).is_err())
                .collect();
            panic!(
                "watcher of {id} on replica {}: {} events for revisions 1..={head}; missing \
                 {missing:?}, duplicated {duplicates:?}; its streams ended: {:?}",
                w.replica,
                revisions.len(),
                w.ends
            );
        }
        assert_eq!(
            w.events.first().map(|e| e.kind()),
            Some("session_created"),
            "{id}: revision 1"
        );
        for event in &w.events[1..] {
            assert_appended(event, &by_session[w.session][&event.revision].response);
        }
        let reached = w.last_event_at.expect("received the head");
        let lag = reached.saturating_duration_since(last_ack);
        assert!(
            lag <= FOLLOW_WITHIN,
            "watcher of {id} on replica {} got the head {lag:?} after the last commit",
            w.replica
        );
    }
    let resumed: usize = watched.iter().map(|w| w.ends.len()).sum();
    let problems = shared.problems.lock().unwrap().clone();
    assert!(problems.is_empty(), "{problems:#?}");
    eprintln!(
        "failover: promotion → first acknowledged write per replica: there {there:?}, back {back:?}; \
         watchers resumed {resumed} times in all"
    );

    for server in &mut servers {
        server.kill().await;
    }
}
