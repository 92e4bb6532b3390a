//! WatchSession: fan-out of committed events, with catch-up from storage.
//!
//! The store tells the [`Hub`] about every commit ([`CommitSink`]); the hub
//! forwards events to the session's watchers over a bounded broadcast
//! channel. A watcher never trusts that channel for completeness: it first
//! replays from the event log, and whenever it lags or sees a revision gap
//! it reads the log again from its last revision. So a slow watcher costs
//! the server a bounded buffer, never an event.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_core::Stream;
use tokio::sync::{broadcast, watch};

use crate::domain::{Change, Error, Result, SessionEvent};
use crate::store::{CommitSink, SessionHandle, Store};

/// Live events buffered per session before a slow watcher is sent back to storage.
const LIVE_BUFFER: usize = 256;
/// Events read from storage per query while replaying.
const REPLAY_PAGE: usize = 256;

/// What travels to a session's watchers.
#[derive(Clone, Debug)]
enum Live {
    /// A committed event, from this process.
    Event(Arc<SessionEvent>),
    /// The head is at least this revision (a commit hint): read the log.
    Head(i64),
}

/// Routes committed events to the watchers of each session.
pub struct Hub {
    sessions: Mutex<HashMap<i64, broadcast::Sender<Live>>>,
    closing: watch::Sender<bool>,
}

impl Default for Hub {
    fn default() -> Self {
        Hub {
            sessions: Mutex::new(HashMap::new()),
            closing: watch::Sender::new(false),
        }
    }
}

impl Hub {
    /// Ends every watch stream cleanly (graceful shutdown).
    pub fn close(&self) {
        self.closing.send_replace(true);
    }

    /// How many sessions currently have watchers.
    pub fn watched_sessions(&self) -> usize {
        self.sessions.lock().map(|s| s.len()).unwrap_or(0)
    }

    fn subscribe(self: &Arc<Self>, session_key: i64) -> Subscription {
        let mut sessions = self
            .sessions
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let receiver = sessions
            .entry(session_key)
            .or_insert_with(|| broadcast::channel(LIVE_BUFFER).0)
            .subscribe();
        Subscription {
            hub: Arc::clone(self),
            session_key,
            receiver,
        }
    }
}

impl Hub {
    fn send(&self, session_key: i64, items: impl IntoIterator<Item = Live>) {
        let mut sessions = self
            .sessions
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(sender) = sessions.get(&session_key) {
            for item in items {
                if sender.send(item).is_err() {
                    sessions.remove(&session_key);
                    return;
                }
            }
        }
    }
}

impl CommitSink for Hub {
    fn committed(&self, session_key: i64, events: &[Arc<SessionEvent>]) {
        self.send(session_key, events.iter().cloned().map(Live::Event));
    }

    fn head_moved(&self, session_key: i64, revision: i64) {
        self.send(session_key, [Live::Head(revision)]);
    }

    fn watched_sessions(&self) -> Vec<i64> {
        self.sessions
            .lock()
            .map(|s| s.keys().copied().collect())
            .unwrap_or_default()
    }
}

/// A watcher's receiver; removes the session's channel when the last one goes.
struct Subscription {
    hub: Arc<Hub>,
    session_key: i64,
    receiver: broadcast::Receiver<Live>,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut sessions = self
            .hub
            .sessions
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // Our own receiver is still counted while we are being dropped.
        if sessions
            .get(&self.session_key)
            .is_some_and(|s| s.receiver_count() <= 1)
        {
            sessions.remove(&self.session_key);
        }
    }
}

/// What a watch stream yields.
#[derive(Clone, Debug)]
pub enum WatchItem {
    /// A committed change.
    Event(Arc<SessionEvent>),
    /// Replay is done; `revision` is the last one replayed.
    CaughtUp { revision: i64 },
    /// The stream has been idle; `revision` is the head.
    Progress { revision: i64 },
}

/// Watch stream settings.
#[derive(Clone, Copy, Debug)]
pub struct WatchOptions {
    /// An idle stream gets a progress event this often.
    pub progress_interval: Duration,
}

enum Wake {
    Closing,
    Live(Result<Live, broadcast::error::RecvError>),
    Idle,
}

/// Streams `session`'s events after `after_revision`: replay, `CaughtUp`,
/// then live events, ending after `session_deleted` or on shutdown.
pub fn watch<S: Store>(
    store: S,
    hub: Arc<Hub>,
    session: SessionHandle,
    after_revision: i64,
    options: WatchOptions,
) -> Result<impl Stream<Item = Result<WatchItem>> + Send + 'static> {
    if after_revision < 0 {
        return Err(Error::invalid("after_revision", "must not be negative"));
    }
    if after_revision > session.revision {
        return Err(Error::RevisionOutOfRange {
            requested: after_revision,
            head: session.revision,
        });
    }
    // Subscribe before the first read, so nothing committed in between is missed.
    let mut subscription = hub.subscribe(session.key);
    let mut closing = hub.closing.subscribe();
    Ok(async_stream::try_stream! {
        let mut last = after_revision;
        let mut caught_up = false;
        let mut from_storage = true;
        loop {
            if *closing.borrow() {
                break;
            }
            if from_storage {
                let page = store.read_events(session.key, last, REPLAY_PAGE).await?;
                let more = page.len() == REPLAY_PAGE;
                for event in page {
                    last = event.revision;
                    let deleted = matches!(event.change, Change::SessionDeleted);
                    yield WatchItem::Event(Arc::new(event));
                    if deleted {
                        return;
                    }
                }
                if more {
                    continue;
                }
                from_storage = false;
                if !caught_up {
                    caught_up = true;
                    yield WatchItem::CaughtUp { revision: last };
                }
            }
            let wake = tokio::select! {
                biased;
                _ = closing.changed() => Wake::Closing,
                received = subscription.receiver.recv() => Wake::Live(received),
                () = tokio::time::sleep(options.progress_interval) => Wake::Idle,
            };
            match wake {
                Wake::Closing => break,
                Wake::Idle => yield WatchItem::Progress { revision: last },
                Wake::Live(Ok(Live::Head(head))) => {
                    if head > last {
                        from_storage = true;
                    }
                }
                Wake::Live(Ok(Live::Event(event))) => {
                    if event.revision <= last {
                        continue;
                    }
                    if event.revision > last + 1 {
                        // A gap: the log has what we missed, in order.
                        from_storage = true;
                        continue;
                    }
                    last = event.revision;
                    let deleted = matches!(event.change, Change::SessionDeleted);
                    yield WatchItem::Event(event);
                    if deleted {
                        return;
                    }
                }
                Wake::Live(Err(broadcast::error::RecvError::Lagged(skipped))) => {
                    tracing::debug!(skipped, "watcher lagged; catching up from storage");
                    from_storage = true;
                }
                Wake::Live(Err(broadcast::error::RecvError::Closed)) => break,
            }
        }
    })
}
