//! WatchSession: how long after an AppendExchange is acknowledged its event
//! reaches every watcher, and what an idle watch stream costs the server.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use futures_util::StreamExt as _;
use sessionstore_client::SessionStoreClient;
use sessionstore_client::v1 as pb;
use tokio::sync::mpsc;
use tonic::transport::Channel;

use crate::server::Server;
use crate::workload;

/// Watch streams opened per HTTP/2 connection, as a gateway multiplexing
/// its users' streams would (under the server's stream limit per
/// connection).
pub const STREAMS_PER_CONNECTION: usize = 100;

/// Opens `count` watch streams on `session` across connections of
/// [`STREAMS_PER_CONNECTION`] and returns them once every one has caught up.
async fn open_streams(
    server: &Server,
    session: &str,
    count: usize,
) -> anyhow::Result<Vec<tonic::Streaming<pb::SessionEvent>>> {
    let mut streams = Vec::with_capacity(count);
    let mut client: Option<SessionStoreClient<Channel>> = None;
    for i in 0..count {
        if i % STREAMS_PER_CONNECTION == 0 {
            client = Some(server.connect().await?);
        }
        let client = client.as_mut().context("a connection")?;
        let mut stream = client
            .watch_session(pb::WatchSessionRequest {
                session_id: session.to_owned(),
                ..Default::default()
            })
            .await
            .context("WatchSession")?
            .into_inner();
        // Replay, then caught_up: the stream is live.
        loop {
            let event = stream
                .next()
                .await
                .context("the watch ended before catching up")??;
            if matches!(event.event, Some(pb::session_event::Event::CaughtUp(_))) {
                break;
            }
        }
        streams.push(stream);
    }
    Ok(streams)
}

/// How long after their acknowledgement `appends` exchanges reached the
/// watchers: every delivery, and per exchange its first and its last.
pub struct Deliveries {
    /// One per (exchange, watcher).
    pub all: Vec<Duration>,
    /// Per exchange, its first delivery: what passed before any watcher
    /// heard of it (on another replica: the commit hint and the log read).
    pub first: Vec<Duration>,
    /// Per exchange, its last delivery: the first plus the fan-out.
    pub last: Vec<Duration>,
    /// From the first append to the last delivery: the watchers' server's
    /// CPU, the bench's own (the watchers' client), and the wall time.
    pub reader_cpu: Duration,
    pub client_cpu: Duration,
    pub wall: Duration,
}

impl Deliveries {
    /// CPU per delivery, in µs.
    pub fn micros_per_delivery(&self, cpu: Duration) -> f64 {
        cpu.as_secs_f64() * 1e6 / self.all.len().max(1) as f64
    }

    /// The cores the watchers' server and the bench kept busy, on average.
    pub fn cores_busy(&self) -> f64 {
        (self.reader_cpu + self.client_cpu).as_secs_f64() / self.wall.as_secs_f64().max(1e-9)
    }
}

/// Delivery latencies from acknowledgement to receipt of `appends`
/// exchanges, appended through `writer` one at a time every `interval` to a
/// session that `watchers` streams watch through `reader` (the same server,
/// or another replica).
pub async fn delivery(
    writer: &Server,
    reader: &Server,
    session: &str,
    watchers: usize,
    appends: usize,
    interval: Duration,
) -> anyhow::Result<Deliveries> {
    let streams = open_streams(reader, session, watchers).await?;
    let (received, mut receipts) = mpsc::unbounded_channel::<(i64, Instant)>();
    let mut tasks = tokio::task::JoinSet::new();
    for mut stream in streams {
        let received = received.clone();
        tasks.spawn(async move {
            let mut seen = 0;
            while seen < appends {
                let event = stream.next().await.context("the watch ended early")??;
                let now = Instant::now();
                // Progress heartbeats and other changes are not deliveries.
                if matches!(
                    event.event,
                    Some(pb::session_event::Event::ExchangeAppended(_))
                ) {
                    seen += 1;
                    let _ = received.send((event.revision, now));
                }
            }
            Ok::<_, anyhow::Error>(())
        });
    }
    drop(received);

    let mut client = writer.connect().await?;
    let mut acknowledged = HashMap::with_capacity(appends);
    let started = (
        Instant::now(),
        reader.cpu_time()?,
        crate::server::cpu_time_of("/proc/self/stat")?,
    );
    let mut ticks = tokio::time::interval(interval);
    for seed in 0..appends as u64 {
        ticks.tick().await;
        let reply = client
            .append_exchange(workload::exchange(session, seed))
            .await
            .context("AppendExchange")?
            .into_inner();
        acknowledged.insert(reply.revision, Instant::now());
    }
    let mut latencies = Vec::with_capacity(appends * watchers);
    // Per revision: its first and last delivery.
    let mut spans: HashMap<i64, (Duration, Duration)> = HashMap::with_capacity(appends);
    let wait = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some((revision, at)) = receipts.recv().await {
            if let Some(ack) = acknowledged.get(&revision) {
                // A watcher may hear of a commit before its writer does.
                let latency = at.saturating_duration_since(*ack);
                latencies.push(latency);
                let span = spans.entry(revision).or_insert((latency, latency));
                span.0 = span.0.min(latency);
                span.1 = span.1.max(latency);
            }
        }
    })
    .await;
    wait.context("watchers did not receive every event within 60 s")?;
    let wall = started.0.elapsed();
    let reader_cpu = reader.cpu_time()?.saturating_sub(started.1);
    let client_cpu = crate::server::cpu_time_of("/proc/self/stat")?.saturating_sub(started.2);
    while let Some(done) = tasks.join_next().await {
        done??;
    }
    anyhow::ensure!(
        latencies.len() == appends * watchers,
        "{} of {} deliveries arrived",
        latencies.len(),
        appends * watchers
    );
    let (first, last) = spans.into_values().unzip();
    Ok(Deliveries {
        all: latencies,
        first,
        last,
        reader_cpu,
        client_cpu,
        wall,
    })
}

/// Server memory per idle watch stream: resident memory with `connections`
/// connections open, then again once `streams` watch streams are open on
/// them (spread over `sessions` sessions). Returns bytes per stream.
pub async fn idle_stream_memory(
    server: &Server,
    streams: usize,
    sessions: usize,
) -> anyhow::Result<(f64, u64, u64)> {
    let mut client = server.connect().await?;
    for n in 0..sessions {
        workload::create_session(&mut client, &format!("bench-idle-{n}"), "bench", 0, 0).await?;
    }
    // Warm the server (allocator arenas, caches) with a short-lived stream.
    drop(open_streams(server, "bench-idle-0", 10).await?);
    let before = settled_rss(server).await?;
    let mut open = Vec::with_capacity(streams);
    for n in 0..sessions {
        let per_session = streams / sessions + usize::from(n < streams % sessions);
        open.extend(open_streams(server, &format!("bench-idle-{n}"), per_session).await?);
    }
    let after = settled_rss(server).await?;
    drop(open);
    Ok((
        after.saturating_sub(before) as f64 / streams as f64,
        before,
        after,
    ))
}

/// Resident memory once it stops moving (two readings 100 ms apart within
/// 64 KiB), or after 3 s.
async fn settled_rss(server: &Server) -> anyhow::Result<u64> {
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut last = server.rss_bytes()?;
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = server.rss_bytes()?;
        if now.abs_diff(last) < 64 * 1024 || Instant::now() > deadline {
            return Ok(now);
        }
        last = now;
    }
}

/// Server memory per stalled replay: resident memory before and after
/// `streams` WatchSession replays from revision 0 of a session of
/// `messages` messages of `message_bytes` each, opened by clients that
/// never read (a 64 KB HTTP/2 window, one connection each). Returns bytes
/// per stream, and the two readings.
pub async fn stalled_replay_memory(
    server: &Server,
    streams: usize,
    messages: usize,
    message_bytes: usize,
) -> anyhow::Result<(f64, u64, u64)> {
    let mut client = server.connect().await?;
    let session = "bench-stalled";
    workload::create_session(&mut client, session, "bench", 0, 0).await?;
    let text = "stalled reader ".repeat(message_bytes / 15 + 1);
    let message = |role: pb::Role| pb::Message {
        role: role.into(),
        content: text[..message_bytes].to_owned(),
        ..Default::default()
    };
    for _ in 0..messages / 2 {
        client
            .append_exchange(pb::AppendExchangeRequest {
                session_id: session.to_owned(),
                messages: vec![message(pb::Role::User), message(pb::Role::User)],
                ..Default::default()
            })
            .await
            .context("AppendExchange")?;
    }
    // One replay read to the end first (what the first reads of a session
    // cost once belongs in the baseline).
    let mut warm = watch_stream(server, session).await?;
    while let Some(event) = warm.next().await {
        if matches!(event?.event, Some(pb::session_event::Event::CaughtUp(_))) {
            break;
        }
    }
    drop(warm);
    let before = settled_rss(server).await?;
    let mut stalled = Vec::with_capacity(streams);
    for _ in 0..streams {
        stalled.push(watch_stream(server, session).await?);
    }
    // Each stream's replay runs until its window and the server's bounds
    // stop it; then RSS stops moving.
    let after = settled_rss(server).await?;
    drop(stalled);
    Ok((
        after.saturating_sub(before) as f64 / streams as f64,
        before,
        after,
    ))
}

/// A WatchSession replay from revision 0 on a connection of its own with
/// a 64 KB window, which is released only as the stream is read.
async fn watch_stream(
    server: &Server,
    session: &str,
) -> anyhow::Result<tonic::Streaming<pb::SessionEvent>> {
    let channel = tonic::transport::Endpoint::from_shared(server.endpoint())?
        .initial_stream_window_size(65_535)
        .initial_connection_window_size(65_535)
        .connect()
        .await?;
    let mut client = SessionStoreClient::new(channel).max_decoding_message_size(64 * 1024 * 1024);
    Ok(client
        .watch_session(pb::WatchSessionRequest {
            session_id: session.to_owned(),
            ..Default::default()
        })
        .await
        .context("WatchSession")?
        .into_inner())
}
