//! [`SessionEvents`]: a `WatchSession` stream that outlives connections and
//! server restarts, delivering every revision once and in order.

use std::collections::HashMap;
use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use futures_core::Stream;
use tonic::{Code, Status};

use crate::auth::RawClient;
use crate::error::{Error, Result};
use crate::retry::RetryPolicy;
use crate::v1;
use crate::v1::session_event::Event;

/// How a watch connects and reconnects.
#[derive(Clone, Copy, Debug)]
pub(crate) struct WatchSettings {
    pub(crate) open_timeout: Option<Duration>,
    pub(crate) idle_timeout: Option<Duration>,
    pub(crate) retry: RetryPolicy,
}

/// The events of one session, from [`Client::watch`](crate::Client::watch):
/// a [`Stream`] of [`v1::SessionEvent`]s that resumes by itself.
///
/// **Revisions: exactly once, in order.** When the stream fails with a
/// transient error (`UNAVAILABLE`, including the server's `SHUTTING_DOWN`;
/// a broken or reset connection; a rate limit; nothing received for the
/// idle timeout) or ends without `session_deleted` (a server shutting down
/// gracefully), it reconnects with capped exponential backoff and asks for
/// the events after the last revision it delivered. A revision it already
/// delivered is never delivered again, so a caller sees each revision
/// once, in increasing order. (Revisions may skip numbers only where the
/// server's log does: a session deleted while the stream was still
/// replaying jumps to `session_deleted`.)
///
/// **Markers.** `caught_up` is delivered once, after the first replay;
/// after a reconnect the events that happened meanwhile simply follow.
/// `progress` (the server's keep-alive on an idle stream) is passed on
/// as-is.
///
/// **Deltas resume by cursor.** Ephemeral `delta` and `run_discarded`
/// events carry the current revision without making one. On reconnecting,
/// the stream asks for each open run's deltas after the last index it
/// delivered (`delta_cursors`); with `include_active_deltas` the server
/// sends those it holds, so a run's text arrives whole and once, followed
/// by the committed `exchange_appended` that ends the run. A merged delta
/// (`first_index < index`) reaching back before what was delivered is cut
/// to its new part, with `first_index` moved past the last index
/// delivered. (Without `include_active_deltas`, deltas published while
/// the stream was reconnecting are not sent again.)
///
/// **The end.** `session_deleted` is the last item. A permanent error
/// (e.g. [`Error::NotFound`] — also when the session was deleted while
/// the stream was disconnected —, [`Error::Unauthenticated`],
/// [`Error::RevisionOutOfRange`]), or more failed reconnections in a row
/// than the client's watch [`RetryPolicy`] allows, is delivered as the
/// last item.
///
/// ```no_run
/// use futures_util::StreamExt as _;
/// use sessionstore_client::Client;
///
/// # async fn demo(client: Client) -> Result<(), sessionstore_client::Error> {
/// // Resume where a previous run of this process stopped.
/// let saved_revision = 0;
/// let mut events = client.watch("ses_1", saved_revision);
/// while let Some(event) = events.next().await {
///     let event = event?;
///     println!("{} at revision {}", event.kind(), event.revision);
/// }
/// println!("stopped after revision {}", events.last_revision());
/// # Ok(()) }
/// ```
pub struct SessionEvents {
    inner: Pin<Box<dyn Stream<Item = Result<v1::SessionEvent>> + Send>>,
    last_revision: Arc<AtomicI64>,
    reconnects: Arc<AtomicU64>,
    connected: tokio::sync::watch::Receiver<bool>,
}

impl fmt::Debug for SessionEvents {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SessionEvents")
            .field("last_revision", &self.last_revision())
            .field("reconnects", &self.reconnects())
            .finish_non_exhaustive()
    }
}

impl SessionEvents {
    pub(crate) fn start(
        raw: RawClient,
        request: v1::WatchSessionRequest,
        settings: WatchSettings,
    ) -> SessionEvents {
        let last_revision = Arc::new(AtomicI64::new(request.after_revision));
        let reconnects = Arc::new(AtomicU64::new(0));
        let (connected_tx, connected) = tokio::sync::watch::channel(false);
        let watcher = Watcher {
            connected: connected_tx,
            raw,
            last: request.after_revision,
            request,
            settings,
            stream: None,
            wait: None,
            failures: 0,
            opened: false,
            caught_up_sent: false,
            deltas: HashMap::new(),
            done: false,
            shared_last: Arc::clone(&last_revision),
            reconnects: Arc::clone(&reconnects),
        };
        let inner = futures_util::stream::unfold(watcher, |mut watcher| async move {
            let item = watcher.next().await?;
            Some((item, watcher))
        });
        SessionEvents {
            inner: Box::pin(inner),
            last_revision,
            reconnects,
            connected,
        }
    }

    /// The latest revision delivered (the `after_revision` given at first):
    /// watch again from here to continue without gaps or repeats.
    pub fn last_revision(&self) -> i64 {
        self.last_revision.load(Ordering::Acquire)
    }

    /// How many times the stream has reconnected and resumed.
    pub fn reconnects(&self) -> u64 {
        self.reconnects.load(Ordering::Acquire)
    }

    /// Whether a stream to the server is open right now: `false` before the
    /// first one opens and while reconnecting. Follow it with
    /// [`changed`](tokio::sync::watch::Receiver::changed) to tell a person
    /// "reconnecting…" while the server is away (it only changes while the
    /// events are being polled).
    pub fn connected(&self) -> tokio::sync::watch::Receiver<bool> {
        self.connected.clone()
    }
}

impl Stream for SessionEvents {
    type Item = Result<v1::SessionEvent>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.inner.as_mut().poll_next(cx)
    }
}

/// The state behind a [`SessionEvents`].
struct Watcher {
    raw: RawClient,
    request: v1::WatchSessionRequest,
    settings: WatchSettings,
    stream: Option<tonic::Streaming<v1::SessionEvent>>,
    /// How long to wait before the next (re)connection.
    wait: Option<Duration>,
    /// Failed attempts since the last event received.
    failures: u32,
    opened: bool,
    /// The latest revision delivered.
    last: i64,
    caught_up_sent: bool,
    /// What was delivered of each open run's deltas.
    deltas: HashMap<String, Delivered>,
    done: bool,
    shared_last: Arc<AtomicI64>,
    reconnects: Arc<AtomicU64>,
    /// Whether a stream is open, for [`SessionEvents::connected`].
    connected: tokio::sync::watch::Sender<bool>,
}

impl Watcher {
    async fn next(&mut self) -> Option<Result<v1::SessionEvent>> {
        loop {
            if self.done {
                return None;
            }
            let Some(stream) = self.stream.as_mut() else {
                if let Some(wait) = self.wait.take() {
                    tokio::time::sleep(wait).await;
                }
                match self.open().await {
                    Ok(stream) => {
                        if self.opened {
                            self.reconnects.fetch_add(1, Ordering::AcqRel);
                        }
                        self.opened = true;
                        self.stream = Some(stream);
                        self.connected.send_replace(true);
                    }
                    Err(error) => {
                        if let Some(error) = self.failed(error) {
                            return Some(Err(error));
                        }
                    }
                }
                continue;
            };
            let received = match self.settings.idle_timeout {
                None => stream.message().await,
                Some(limit) => match tokio::time::timeout(limit, stream.message()).await {
                    Ok(received) => received,
                    Err(_) => Err(Status::unavailable(format!(
                        "no watch event for {limit:?}; reconnecting"
                    ))),
                },
            };
            match received {
                Ok(Some(event)) => {
                    self.failures = 0;
                    if let Some(event) = self.admit(event) {
                        return Some(Ok(event));
                    }
                }
                Ok(None) => {
                    // Ended without session_deleted: the server is going away.
                    self.stream = None;
                    let error = Error::Unavailable {
                        shutting_down: true,
                        status: Status::unavailable(
                            "the watch stream ended without session_deleted",
                        ),
                    };
                    if let Some(error) = self.failed(error) {
                        return Some(Err(error));
                    }
                }
                Err(status) => {
                    self.stream = None;
                    if let Some(error) = self.failed(Error::from(status)) {
                        return Some(Err(error));
                    }
                }
            }
        }
    }

    /// Opens a stream after the last delivered revision.
    async fn open(&mut self) -> Result<tonic::Streaming<v1::SessionEvent>> {
        let mut request = self.request.clone();
        request.after_revision = self.last;
        // Each open run resumes after the last delta delivered.
        request.delta_cursors = self
            .deltas
            .iter()
            .map(|(run_id, delivered)| v1::DeltaCursor {
                run_id: run_id.clone(),
                after_index: delivered.last,
            })
            .collect();
        let mut raw = self.raw.clone();
        let call = raw.watch_session(request);
        let response = match self.settings.open_timeout {
            None => call.await?,
            Some(limit) => match tokio::time::timeout(limit, call).await {
                Ok(response) => response?,
                Err(_) => return Err(Error::deadline("opening WatchSession", limit)),
            },
        };
        Ok(response.into_inner())
    }

    /// Records a failure; returns the error to deliver if the watch gives
    /// up, or schedules a reconnection.
    fn failed(&mut self, error: Error) -> Option<Error> {
        self.connected.send_replace(false);
        self.failures += 1;
        if !resumable(&error) || self.failures >= self.settings.retry.attempts() {
            self.done = true;
            return Some(error);
        }
        self.wait = Some(self.settings.retry.delay_after(&error, self.failures));
        None
    }

    /// Whether to deliver `event`, updating what has been delivered.
    fn admit(&mut self, mut event: v1::SessionEvent) -> Option<v1::SessionEvent> {
        match &mut event.event {
            Some(Event::CaughtUp(_)) => {
                if self.caught_up_sent {
                    return None;
                }
                self.caught_up_sent = true;
            }
            Some(Event::Progress(_)) => {}
            Some(Event::Delta(delta)) => {
                if event.revision < self.last {
                    return None;
                }
                let delivered = self.deltas.entry(delta.run_id.clone()).or_default();
                if !delivered.admit(delta) {
                    return None;
                }
            }
            Some(Event::RunDiscarded(discarded)) => {
                if event.revision < self.last {
                    return None;
                }
                self.deltas.remove(&discarded.run_id);
            }
            // A revision (including kinds newer than this client).
            _ => {
                if event.revision <= self.last {
                    return None;
                }
                self.last = event.revision;
                self.shared_last.store(event.revision, Ordering::Release);
                match &event.event {
                    Some(Event::ExchangeAppended(appended)) => {
                        self.deltas.remove(&appended.run_id);
                    }
                    Some(Event::RunEnded(ended)) => {
                        self.deltas.remove(&ended.run_id);
                    }
                    Some(Event::SessionDeleted(_)) => self.done = true,
                    _ => {}
                }
            }
        }
        Some(event)
    }
}

/// What a watch delivered of one run's deltas: the last index, and where
/// each delivered delta's text ended, so that a merged delta reaching back
/// past what was delivered is cut to its new part.
#[derive(Debug)]
struct Delivered {
    last: i64,
    /// (last index of a delivered delta, text bytes delivered through it).
    ends: Vec<(i64, usize)>,
}

impl Default for Delivered {
    fn default() -> Self {
        Delivered {
            last: -1,
            ends: Vec::new(),
        }
    }
}

impl Delivered {
    /// Whether `delta` brings anything new; a merged text delta that starts
    /// at or before the last index delivered is cut to the part after it.
    fn admit(&mut self, delta: &mut v1::Delta) -> bool {
        if delta.index <= self.last {
            return false;
        }
        let first = delta.first_index.min(delta.index);
        if first <= self.last
            && let Some(v1::delta::Delta::Text(text)) = &mut delta.delta
        {
            let start = self
                .ends
                .iter()
                .rev()
                .find(|(index, _)| *index < first)
                .map_or(0, |(_, end)| *end);
            let total = self.ends.last().map_or(0, |(_, end)| *end);
            let have = total.saturating_sub(start);
            *text = text.get(have..).unwrap_or_default().to_owned();
            delta.first_index = self.last + 1;
        }
        let added = match &delta.delta {
            Some(v1::delta::Delta::Text(text)) => text.len(),
            _ => 0,
        };
        let total = self.ends.last().map_or(0, |(_, end)| *end);
        self.ends.push((delta.index, total + added));
        self.last = delta.index;
        true
    }
}

/// Whether a watch should reconnect after `error`: transient failures, a
/// slow start, and internal server errors (e.g. a storage hiccup) — all
/// bounded by the retry policy.
fn resumable(error: &Error) -> bool {
    error.is_transient()
        || matches!(error, Error::DeadlineExceeded { .. })
        || matches!(error, Error::Other(status) if matches!(status.code(), Code::Internal | Code::Unknown))
}
