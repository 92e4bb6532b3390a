//! What a chat UI does live: open a long session at its newest page
//! (ListMessages newest first), and stop a run from another replica than
//! the one its producer publishes through (CancelRun, seen by the producer
//! on PublishDelta).

use std::time::{Duration, Instant};

use anyhow::Context as _;
use sessionstore_client::v1 as pb;
use tokio::sync::oneshot;
use tonic::Code;

use crate::server::Server;
use crate::{stats, workload};

/// Messages per AppendExchange while filling the long session: the
/// server's default `--max-messages-per-exchange`.
pub const FILL_BATCH: usize = 1000;

/// Messages per ListMessages page.
pub const PAGE_SIZE: i32 = 50;

/// How often the producer publishes a text delta.
pub const DELTA_INTERVAL: Duration = Duration::from_millis(20);

/// Deltas the producer has published (and had answered) before the
/// benchmark cancels its run.
pub const DELTAS_BEFORE_CANCEL: usize = 3;

/// Creates session `id` and appends `messages` messages of ~1 KB,
/// [`FILL_BATCH`] per AppendExchange (no provider call), one call at a
/// time. Answers the session's next sequence.
pub async fn fill(server: &Server, id: &str, messages: usize) -> anyhow::Result<i64> {
    let mut client = server.connect().await?;
    workload::create_session(&mut client, id, "bench", 0, 0).await?;
    let mut written = 0;
    let mut next_sequence = 0;
    while written < messages {
        let n = FILL_BATCH.min(messages - written);
        let batch = (written..written + n)
            .map(|i| {
                if i % 2 == 0 {
                    workload::user(i as u64)
                } else {
                    workload::assistant(i as u64)
                }
            })
            .collect();
        next_sequence = client
            .append_exchange(pb::AppendExchangeRequest {
                session_id: id.to_owned(),
                messages: batch,
                request_id: uuid::Uuid::now_v7().to_string(),
                ..Default::default()
            })
            .await
            .with_context(|| format!("fill {id}"))?
            .into_inner()
            .next_sequence;
        written += n;
    }
    Ok(next_sequence)
}

/// Waits until the server's search index holds everything appended so far
/// (on SQLite it is written beside the appends, and a backlog would run
/// during the measurements): a search waits for it, up to the server's
/// own timeout, and is asked again while the index is behind.
pub async fn index_caught_up(server: &Server) -> anyhow::Result<()> {
    let mut client = server.connect().await?;
    loop {
        let searched = client
            .search_messages(pb::SearchMessagesRequest {
                query: "catchup".to_owned(),
                page_size: 1,
                ..Default::default()
            })
            .await;
        match searched {
            Ok(_) => return Ok(()),
            Err(status) if status.code() == Code::Unavailable => continue,
            Err(status) => return Err(status).context("SearchMessages after the fill"),
        }
    }
}

/// `samples` sequential ListMessages calls for the newest-first page of
/// session `id` below `before` (none: the session's newest page), whose
/// first message must be `first`; a tenth as many calls again warm up
/// first. Each call's time includes decoding every row of the page, as a
/// client does, and every row is checked to hold its full text.
pub async fn newest_pages(
    server: &Server,
    id: &str,
    before: Option<i64>,
    first: i64,
    samples: usize,
) -> anyhow::Result<Vec<Duration>> {
    let mut client = server.connect().await?;
    let expected = (first + 1).min(i64::from(PAGE_SIZE)) as usize;
    stats::sampled(
        samples,
        async || {
            Ok(client
                .list_messages(pb::ListMessagesRequest {
                    session_id: id.to_owned(),
                    page_size: PAGE_SIZE,
                    order_by: "sequence desc".to_owned(),
                    before_sequence: before,
                    ..Default::default()
                })
                .await
                .context("ListMessages")?
                .into_inner())
        },
        |page| {
            anyhow::ensure!(
                page.messages.len() == expected,
                "a page of {id} held {} messages, expected {expected}",
                page.messages.len()
            );
            for (n, stored) in page.messages.iter().enumerate() {
                anyhow::ensure!(
                    stored.sequence == first - n as i64,
                    "message {n} of a page of {id} has sequence {}, expected {}",
                    stored.sequence,
                    first - n as i64
                );
                let text = stored.message.as_ref().map_or(0, |m| m.content.len());
                anyhow::ensure!(
                    text == workload::MESSAGE_BYTES,
                    "message {} of {id} came with {text} bytes of text",
                    stored.sequence
                );
            }
            Ok(())
        },
    )
    .await
}

/// One cancel across replicas, as the benchmark saw it.
pub struct CancelTrial {
    /// From CancelRun's answer arriving from B to the producer's first
    /// PublishDelta answer from A with `cancel_requested` (0 if the
    /// producer's came first).
    pub seen_after: Duration,
    /// CancelRun's round trip on B.
    pub cancel_call: Duration,
    /// Deltas the producer published, the one that saw the cancel included.
    pub deltas: usize,
    /// CancelRun calls B refused as RUN_NOT_ACTIVE (it had not yet heard
    /// of the run's deltas) before one was taken.
    pub retries: usize,
}

/// One trial: a producer publishes a text delta of run `run_id` every
/// [`DELTA_INTERVAL`] through `producer_side` (no lease) until a
/// PublishDelta answers `cancel_requested`; after [`DELTAS_BEFORE_CANCEL`]
/// deltas and a further `phase`, the benchmark calls CancelRun through
/// `canceller_side`. The producer then stores what it published as an
/// incomplete answer with the run id, as a producer told to stop does.
pub async fn cancel_trial(
    producer_side: &Server,
    canceller_side: &Server,
    session: &str,
    run_id: &str,
    phase: Duration,
) -> anyhow::Result<CancelTrial> {
    let mut producer = producer_side.connect().await?;
    let mut canceller = canceller_side.connect().await?;
    let (started, begun) = oneshot::channel::<()>();
    let task = {
        let (session, run_id) = (session.to_owned(), run_id.to_owned());
        let mut producer = producer.clone();
        tokio::spawn(async move {
            let mut started = Some(started);
            let mut text = String::new();
            let mut ticks = tokio::time::interval(DELTA_INTERVAL);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let give_up = Instant::now() + Duration::from_secs(30);
            let mut index = 0;
            loop {
                ticks.tick().await;
                anyhow::ensure!(Instant::now() < give_up, "no cancel_requested within 30 s");
                let piece = format!("token{index} ");
                let answer = producer
                    .publish_delta(pb::PublishDeltaRequest {
                        session_id: session.clone(),
                        run_id: run_id.clone(),
                        index: index as i64,
                        delta: Some(pb::publish_delta_request::Delta::Text(piece.clone())),
                    })
                    .await
                    .context("PublishDelta")?
                    .into_inner();
                let now = Instant::now();
                text.push_str(&piece);
                index += 1;
                if answer.cancel_requested {
                    return Ok::<_, anyhow::Error>((now, index, text));
                }
                if index == DELTAS_BEFORE_CANCEL
                    && let Some(started) = started.take()
                {
                    let _ = started.send(());
                }
            }
        })
    };
    begun
        .await
        .context("the producer stopped before publishing")?;
    tokio::time::sleep(phase).await;
    let mut retries = 0;
    let (called, answered) = loop {
        let called = Instant::now();
        let cancelled = canceller
            .cancel_run(pb::CancelRunRequest {
                session_id: session.to_owned(),
                run_id: run_id.to_owned(),
                reason: "bench".to_owned(),
            })
            .await;
        let answered = Instant::now();
        match cancelled {
            Ok(_) => break (called, answered),
            Err(status) if status.code() == Code::FailedPrecondition && retries < 50 => {
                retries += 1;
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            Err(status) => return Err(status).context("CancelRun"),
        }
    };
    let (seen, deltas, text) = task.await.context("the producer task")??;
    producer
        .append_exchange(pb::AppendExchangeRequest {
            session_id: session.to_owned(),
            messages: vec![workload::user(deltas as u64)],
            provider_call: Some(pb::ProviderCall {
                provider: "bench".to_owned(),
                model: "m".to_owned(),
                ..Default::default()
            }),
            response_messages: vec![pb::Message {
                role: pb::Role::Assistant.into(),
                content: text,
                incomplete: true,
                ..Default::default()
            }],
            request_id: uuid::Uuid::now_v7().to_string(),
            run_id: run_id.to_owned(),
            ..Default::default()
        })
        .await
        .context("AppendExchange of the incomplete answer")?;
    Ok(CancelTrial {
        seen_after: seen.saturating_duration_since(answered),
        cancel_call: answered - called,
        deltas,
        retries,
    })
}
