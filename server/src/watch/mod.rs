//! WatchSession: fan-out of committed events, with catch-up from storage.
//!
//! The store tells the [`Hub`] about every commit ([`CommitSink`]); the hub
//! forwards events to the session's watchers over a bounded broadcast
//! channel. A watcher never trusts that channel for completeness: it first
//! replays from the event log, and whenever it lags or sees a revision gap
//! it reads the log again from its last revision. So a slow watcher costs
//! the server a bounded buffer, never an event.
//!
//! The hub keeps each channel gap-free itself. A commit hint from another
//! replica, or a local commit that arrives ahead of an earlier one, makes
//! the hub's fetcher read the missing events from the log once and put
//! them on the channel in order: one query per session, however many
//! watchers it has. Deltas arriving meanwhile wait for those events, so a
//! watcher sees a run's closing commit before the deltas published after it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures_core::Stream;
use tokio::sync::{Semaphore, broadcast, mpsc, watch};

use crate::domain::{Ephemeral, EphemeralKind, Error, Result};
use crate::read_ahead::{PAGE_BYTES, ReadAhead, ReadPage, Share, StreamBudget};
use crate::store::{CommitSink, ReadBound, SessionHandle, Store};
use crate::wire::{Effect, EncodedEvent};

mod runs;

pub use runs::RunLimits;
use runs::Runs;

/// Live events buffered per session before a slow watcher is sent back to storage.
const LIVE_BUFFER: usize = 256;
/// Events read from storage per query by the hub's fetcher and the
/// open-runs check (a replay reads through [`ReadAhead`]).
const REPLAY_PAGE: usize = 256;
/// Sessions whose missing events the fetcher reads at once.
const FETCH_CONCURRENCY: usize = 8;
/// Watchers of one session from which the fetcher wakes them from a
/// blocking thread rather than from a runtime worker ([`Hub::fetch`]).
const MANY_WATCHERS: usize = 64;

/// What travels to a session's watchers.
#[derive(Clone, Debug)]
enum Live {
    /// A committed event, from this process.
    Event(Arc<EncodedEvent>),
    /// The head is at least this revision (a commit hint): read the log.
    Head(i64),
    /// A delta or discarded run.
    Ephemeral(Arc<Ephemeral>),
    /// The server is shutting down: end the stream.
    Closing,
}

/// One watched session's channel.
struct Channel {
    sender: broadcast::Sender<Live>,
    /// Every watcher has each event up to this revision, from the log or
    /// from this channel; the next event the channel carries is the one after.
    published: i64,
    /// The log holds events up to at least this revision (a commit hint, or
    /// a commit that arrived ahead of an earlier one).
    wanted: i64,
    /// The fetcher has been asked to read `published..wanted`.
    fetching: bool,
    /// Deltas that arrived while the fetcher reads: they go out after the
    /// events it reads ([`Channel::fetched`]), so that watchers get what
    /// happened in the order the hints and deltas arrived (a run's closing
    /// exchange, then its next turn's first delta, which starts the
    /// indexes over).
    held: Vec<Arc<Ephemeral>>,
}

impl Channel {
    /// The fetcher is done reading: the deltas held meanwhile go out.
    /// `false` if the channel has no receiver left.
    fn fetched(&mut self) -> bool {
        self.fetching = false;
        self.held
            .drain(..)
            .all(|ephemeral| self.sender.send(Live::Ephemeral(ephemeral)).is_ok())
    }
}

/// Routes committed events to the watchers of each session.
pub struct Hub {
    sessions: Mutex<HashMap<i64, Channel>>,
    runs: Mutex<Runs>,
    closing: watch::Sender<bool>,
    /// Sessions whose channel is behind the log; see [`Hub::start_fetcher`].
    fetcher: std::sync::OnceLock<mpsc::UnboundedSender<i64>>,
}

impl Default for Hub {
    fn default() -> Self {
        Hub::new(RunLimits::default())
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Hub {
    /// A hub keeping active runs' partial output within `limits`.
    pub fn new(limits: RunLimits) -> Self {
        Hub {
            sessions: Mutex::new(HashMap::new()),
            runs: Mutex::new(Runs::new(limits)),
            closing: watch::Sender::new(false),
            fetcher: std::sync::OnceLock::new(),
        }
    }

    /// Forgets buffered runs with no delta for `max_idle` (a publisher
    /// that died without committing or discarding).
    pub fn prune_runs(&self, max_idle: Duration) {
        lock(&self.runs).prune(max_idle);
    }

    /// Bytes the partial output of active runs holds here.
    pub fn active_run_bytes(&self) -> usize {
        lock(&self.runs).held()
    }

    /// Whether a run of this session has published deltas this replica
    /// still holds (it is active even without a lease).
    pub fn run_is_publishing(&self, session_key: i64, run_id: &str) -> bool {
        lock(&self.runs).is_open(session_key, run_id)
    }

    /// Refuses (RESOURCE_EXHAUSTED) a delta of `size` bytes that would pass
    /// the run's output limit or the server's bound on all runs.
    pub fn check_run_room(&self, session_key: i64, run_id: &str, size: usize) -> Result<()> {
        lock(&self.runs).check_room(session_key, run_id, size)
    }

    /// The deltas so far of every open run of a session, run by run.
    fn active_deltas(&self, session_key: i64) -> Vec<Arc<Ephemeral>> {
        lock(&self.runs).deltas(session_key)
    }

    fn buffer(&self, session_key: i64, ephemeral: &Arc<Ephemeral>) {
        let mut runs = lock(&self.runs);
        match &ephemeral.kind {
            EphemeralKind::Delta { .. } => runs.add(session_key, ephemeral),
            EphemeralKind::RunDiscarded { run_id } => runs.close(session_key, run_id),
        }
    }
}

impl Hub {
    /// Ends every watch stream cleanly (graceful shutdown).
    ///
    /// A watcher waiting for live events learns of it on its session's
    /// channel, so its loop needs no second future for shutdown; one reading
    /// the log checks the flag before each step.
    pub fn close(&self) {
        self.closing.send_replace(true);
        let sessions = lock(&self.sessions);
        for channel in sessions.values() {
            let _ = channel.sender.send(Live::Closing);
        }
    }

    /// How many sessions currently have watchers.
    pub fn watched_sessions(&self) -> usize {
        self.sessions.lock().map(|s| s.len()).unwrap_or(0)
    }

    /// Subscribes to a session whose head was `head` before this call (each
    /// watcher reads the log after subscribing, so a new channel starts there).
    fn subscribe(self: &Arc<Self>, session_key: i64, head: i64) -> Subscription {
        let mut sessions = lock(&self.sessions);
        let receiver = sessions
            .entry(session_key)
            .or_insert_with(|| Channel {
                sender: broadcast::channel(LIVE_BUFFER).0,
                published: head,
                wanted: head,
                fetching: false,
                held: Vec::new(),
            })
            .sender
            .subscribe();
        Subscription {
            hub: Arc::clone(self),
            session_key,
            receiver,
        }
    }
}

impl Hub {
    /// Puts `events` (in revision order) on the session's channel, skipping
    /// what it already carried. At a gap the rest waits for the fetcher,
    /// which reads the log from the last revision carried.
    fn deliver(&self, session_key: i64, events: &[Arc<EncodedEvent>]) {
        let mut sessions = lock(&self.sessions);
        let Some(channel) = sessions.get_mut(&session_key) else {
            return;
        };
        for event in events {
            if event.revision <= channel.published {
                continue;
            }
            if event.revision > channel.published + 1 && self.fetcher.get().is_some() {
                let last = events.last().map_or(event.revision, |e| e.revision);
                self.want(channel, session_key, last);
                return;
            }
            channel.published = event.revision;
            if channel.sender.send(Live::Event(Arc::clone(event))).is_err() {
                sessions.remove(&session_key);
                return;
            }
        }
    }

    /// Records that the log holds events up to `revision` that the channel
    /// has not carried, and asks the fetcher for them (once per session).
    fn want(&self, channel: &mut Channel, session_key: i64, revision: i64) {
        channel.wanted = channel.wanted.max(revision);
        if channel.fetching {
            return;
        }
        let asked = self
            .fetcher
            .get()
            .is_some_and(|fetcher| fetcher.send(session_key).is_ok());
        if asked {
            channel.fetching = true;
        } else {
            // No fetcher: every watcher reads the log itself.
            let _ = channel.sender.send(Live::Head(channel.wanted));
        }
    }

    /// Starts the task that reads, once per session, the events a channel
    /// is missing (see the module notes). Without it every watcher reads
    /// the log itself.
    pub fn start_fetcher<S: Store>(self: &Arc<Self>, store: S) -> tokio::task::JoinHandle<()> {
        let (sender, mut keys) = mpsc::unbounded_channel();
        let started = self.fetcher.set(sender).is_ok();
        let hub = Arc::clone(self);
        tokio::spawn(async move {
            if !started {
                return;
            }
            let mut closing = hub.closing.subscribe();
            let limit = Arc::new(Semaphore::new(FETCH_CONCURRENCY));
            loop {
                let key = tokio::select! {
                    _ = closing.changed() => return,
                    key = keys.recv() => key,
                };
                let (Some(key), Ok(permit)) = (key, Arc::clone(&limit).acquire_owned().await)
                else {
                    return;
                };
                let (hub, store) = (Arc::clone(&hub), store.clone());
                tokio::spawn(async move {
                    hub.fetch(&store, key).await;
                    drop(permit);
                });
            }
        })
    }

    /// Where the fetcher reads the session's log next: after the channel's
    /// last event. `None` once the channel has carried every revision asked
    /// for (the deltas held meanwhile then go out) or has no watcher left.
    fn still_wanted(&self, session_key: i64) -> Option<i64> {
        let mut sessions = lock(&self.sessions);
        let channel = sessions.get_mut(&session_key)?;
        if channel.wanted > channel.published {
            return Some(channel.published);
        }
        if !channel.fetched() {
            sessions.remove(&session_key);
        }
        None
    }

    /// Reads a session's events after the channel's last one until it has
    /// carried every revision asked for. A session with
    /// [`MANY_WATCHERS`] or more gets each page from a blocking thread, not
    /// from this runtime worker: the tasks a worker wakes queue on that
    /// worker, behind the task that woke them, where woken from another
    /// thread they go to the shared queue that every worker takes from (as
    /// `store::writer::Publisher` answers local commits). With fewer, the
    /// hop to that thread would cost more than it spreads.
    async fn fetch<S: Store>(self: &Arc<Self>, store: &S, session_key: i64) {
        while let Some(after) = self.still_wanted(session_key) {
            let page = store
                .read_events_bounded(session_key, after, log_page())
                .await;
            let events: Vec<Arc<EncodedEvent>> = match page {
                Ok(page) => page.into_items().into_iter().map(Arc::new).collect(),
                Err(error) => {
                    tracing::warn!(%error, session_key, "cannot read events for watchers");
                    Vec::new()
                }
            };
            if events.is_empty() {
                // Let each watcher try the log itself.
                let mut sessions = lock(&self.sessions);
                if let Some(channel) = sessions.get_mut(&session_key) {
                    let _ = channel.sender.send(Live::Head(channel.wanted));
                    if !channel.fetched() {
                        sessions.remove(&session_key);
                    }
                }
                return;
            }
            let many = lock(&self.sessions)
                .get(&session_key)
                .is_some_and(|channel| channel.sender.receiver_count() >= MANY_WATCHERS);
            if !many {
                self.deliver(session_key, &events);
                continue;
            }
            let hub = Arc::clone(self);
            let delivered =
                tokio::task::spawn_blocking(move || hub.deliver(session_key, &events)).await;
            if delivered.is_err() {
                // The runtime is shutting down.
                return;
            }
        }
    }
}

impl CommitSink for Hub {
    fn committed(&self, session_key: i64, events: &[Arc<EncodedEvent>]) {
        for event in events {
            match &event.effect {
                Effect::ClosesRun(run_id) => self.run_closed(session_key, run_id),
                Effect::SessionDeleted => lock(&self.runs).close_session(session_key),
                Effect::None => {}
            }
        }
        self.deliver(session_key, events);
    }

    fn head_moved(&self, session_key: i64, revision: i64) {
        let mut sessions = lock(&self.sessions);
        if let Some(channel) = sessions.get_mut(&session_key)
            && revision > channel.published
        {
            self.want(channel, session_key, revision);
        }
    }

    fn watched_sessions(&self) -> Vec<i64> {
        self.sessions
            .lock()
            .map(|s| s.keys().copied().collect())
            .unwrap_or_default()
    }

    fn ephemeral(&self, session_key: i64, ephemeral: Arc<Ephemeral>) {
        self.buffer(session_key, &ephemeral);
        let mut sessions = lock(&self.sessions);
        let Some(channel) = sessions.get_mut(&session_key) else {
            return;
        };
        if channel.fetching {
            channel.held.push(ephemeral);
        } else if channel.sender.send(Live::Ephemeral(ephemeral)).is_err() {
            sessions.remove(&session_key);
        }
    }

    fn run_closed(&self, session_key: i64, run_id: &str) {
        lock(&self.runs).close(session_key, run_id);
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
        let mut sessions = lock(&self.hub.sessions);
        // Our own receiver is still counted while we are being dropped.
        if sessions
            .get(&self.session_key)
            .is_some_and(|c| c.sender.receiver_count() <= 1)
        {
            sessions.remove(&self.session_key);
        }
    }
}

/// What a watch stream yields.
#[derive(Clone, Debug)]
pub enum WatchItem {
    /// A committed change, encoded once for all of its session's watchers.
    Event(Arc<EncodedEvent>),
    /// Replay is done; `revision` is the last one replayed.
    CaughtUp { revision: i64 },
    /// The stream has been idle; `revision` is the head.
    Progress { revision: i64 },
    /// A delta or discarded run (no revision of its own).
    Ephemeral(Arc<Ephemeral>),
}

/// Watch stream settings.
#[derive(Clone, Copy, Debug)]
pub struct WatchOptions {
    /// An idle stream gets a progress event this often.
    pub progress_interval: Duration,
}

/// What one watcher asked for.
#[derive(Clone, Debug, Default)]
pub struct WatchRequest {
    pub after_revision: i64,
    /// After caught-up, send the deltas so far of every open run.
    pub include_active_deltas: bool,
    /// Per run, the last delta index the watcher already has: only later
    /// ones are sent (a merged delta reaching past it is sent whole).
    pub delta_cursors: HashMap<String, i64>,
}

/// The highest delta index sent per run, so a delta that was both in the
/// snapshot and in the live channel goes out once.
#[derive(Default)]
struct SentDeltas(HashMap<String, i64>);

impl SentDeltas {
    /// Starts from where a reconnecting watcher left each run.
    fn after(cursors: HashMap<String, i64>) -> Self {
        SentDeltas(cursors)
    }

    /// Whether `ephemeral` should go out, recording it if so.
    fn admit(&mut self, ephemeral: &Ephemeral) -> bool {
        match &ephemeral.kind {
            EphemeralKind::Delta { run_id, index, .. } => {
                let sent = self.0.entry(run_id.clone()).or_insert(-1);
                if *index <= *sent {
                    return false;
                }
                *sent = *index;
                true
            }
            EphemeralKind::RunDiscarded { run_id } => {
                self.0.remove(run_id);
                true
            }
        }
    }

    /// A committed change that closes a run's partial output lets its
    /// indexes start over.
    fn observe(&mut self, effect: &Effect) {
        if let Effect::ClosesRun(run_id) = effect {
            self.0.remove(run_id);
        }
    }
}

/// The buffered deltas whose run the log has not closed (by its exchange or
/// its end) after they were published, up to revision `head`. The buffer is
/// only a cache: a replica that missed a closing commit's hint, or a watcher
/// that joins between a commit and its delivery to the hub, still gets
/// only what is open.
async fn still_open<S: Store>(
    store: &S,
    session_key: i64,
    deltas: Vec<Arc<Ephemeral>>,
    head: i64,
) -> Result<Vec<Arc<Ephemeral>>> {
    let Some(since) = deltas.iter().map(|d| d.revision).min() else {
        return Ok(deltas);
    };
    // The latest revision that closed each run.
    let mut closed: HashMap<String, i64> = HashMap::new();
    let mut after = since;
    while after < head {
        let page = store
            .read_events_bounded(session_key, after, log_page())
            .await?
            .into_items();
        let Some(last) = page.last().map(|e| e.revision) else {
            break;
        };
        for event in page {
            if let Effect::ClosesRun(run_id) = event.effect {
                closed.insert(run_id, event.revision);
            }
        }
        after = last;
    }
    Ok(deltas
        .into_iter()
        .filter(|delta| {
            closed
                .get(delta.kind.run_id())
                .is_none_or(|&closed_at| delta.revision >= closed_at)
        })
        .collect())
}

/// A session's events, a page at a time, for [`ReadAhead`].
fn event_pages<S: Store>(store: S, session_key: i64) -> ReadPage<EncodedEvent> {
    Arc::new(move |after, bound| {
        let store = store.clone();
        Box::pin(async move { store.read_events_bounded(session_key, after, bound).await })
    })
}

fn revision_of(event: &EncodedEvent) -> i64 {
    event.revision
}

/// A page of events for work that reads the log without sending it (the
/// hub's fetcher, the open-runs check): bounded in bytes too.
fn log_page() -> ReadBound {
    ReadBound {
        rows: REPLAY_PAGE,
        bytes: PAGE_BYTES,
        at_least_one: true,
    }
}

/// Streams `session`'s events after `after_revision`: replay, `CaughtUp`,
/// then live events, ending after `session_deleted` or on shutdown. The
/// replay reads ahead on `share` (or, without one, and on every later
/// return to the log, a share of `budget`'s taken whatever the budget
/// holds: a running stream progresses).
pub fn watch<S: Store>(
    store: S,
    hub: Arc<Hub>,
    session: SessionHandle,
    request: WatchRequest,
    options: WatchOptions,
    budget: Arc<StreamBudget>,
    share: Option<Share>,
) -> Result<impl Stream<Item = Result<WatchItem>> + Send + 'static> {
    let after_revision = request.after_revision;
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
    let mut subscription = hub.subscribe(session.key, session.revision);
    let closing = hub.closing.subscribe();
    let interval = options.progress_interval;
    Ok(async_stream::try_stream! {
        // One timer for the stream's life, re-armed only when it fires: an
        // event does not touch the timer wheel, it moves `active`.
        let idle = tokio::time::sleep(interval);
        tokio::pin!(idle);
        let mut active = tokio::time::Instant::now();
        let mut last = after_revision;
        let mut caught_up = false;
        let mut sent_deltas = SentDeltas::after(request.delta_cursors);
        let mut from_storage = true;
        // The share of the first replay (admitted with the call, if it had
        // anything to replay); a later return to the log takes a new one.
        let mut share = share;
        loop {
            if *closing.borrow() {
                break;
            }
            if from_storage {
                // Events are read ahead (one page at a time, within the
                // stream's byte bounds) while earlier ones are sent.
                let share = share.take().unwrap_or_else(|| budget.share());
                let mut events = ReadAhead::to_end(event_pages(store.clone(), session.key), revision_of, share, last);
                while let Some(event) = events.next().await? {
                    last = event.revision;
                    sent_deltas.observe(&event.effect);
                    let deleted = event.effect == Effect::SessionDeleted;
                    yield WatchItem::Event(Arc::new(event));
                    if deleted {
                        return;
                    }
                    if *closing.borrow() {
                        break;
                    }
                }
                drop(events);
                if *closing.borrow() {
                    break;
                }
                from_storage = false;
                active = tokio::time::Instant::now();
                if !caught_up {
                    caught_up = true;
                    yield WatchItem::CaughtUp { revision: last };
                    if request.include_active_deltas {
                        let deltas = still_open(&store, session.key, hub.active_deltas(session.key), last).await?;
                        for delta in deltas {
                            if sent_deltas.admit(&delta) {
                                // Stamped with the revision just sent: a delta
                                // never follows an event of a later revision.
                                let mut delta = Ephemeral::clone(&delta);
                                delta.revision = last;
                                yield WatchItem::Ephemeral(Arc::new(delta));
                            }
                        }
                    }
                }
            }
            let received = tokio::select! {
                biased;
                received = subscription.receiver.recv() => Some(received),
                () = &mut idle => None,
            };
            let Some(received) = received else {
                // The timer was set before the last wake-up; it counts from there.
                let now = tokio::time::Instant::now();
                if now >= active + interval {
                    active = now;
                    yield WatchItem::Progress { revision: last };
                }
                idle.as_mut().reset(active + interval);
                continue;
            };
            active = tokio::time::Instant::now();
            match received {
                Ok(Live::Closing) => break,
                Ok(Live::Head(head)) => {
                    if head > last {
                        from_storage = true;
                    }
                }
                Ok(Live::Event(event)) => {
                    let revision = event.revision;
                    if revision <= last {
                        continue;
                    }
                    if revision > last + 1 {
                        // A gap: the log has what we missed, in order.
                        from_storage = true;
                        continue;
                    }
                    last = revision;
                    sent_deltas.observe(&event.effect);
                    let deleted = event.effect == Effect::SessionDeleted;
                    yield WatchItem::Event(event);
                    if deleted {
                        return;
                    }
                }
                Ok(Live::Ephemeral(ephemeral)) => {
                    if ephemeral.revision >= last && sent_deltas.admit(&ephemeral) {
                        yield WatchItem::Ephemeral(ephemeral);
                    }
                }
                Err(broadcast::error::RecvError::Lagged(skipped)) => {
                    tracing::debug!(skipped, "watcher lagged; catching up from storage");
                    from_storage = true;
                }
                Err(broadcast::error::RecvError::Closed) => break,
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tokio::sync::{broadcast, mpsc};

    use super::{Hub, Live};
    use crate::domain::{Change, DeltaContent, Ephemeral, EphemeralKind, SessionEvent, Timestamp};
    use crate::store::CommitSink as _;
    use crate::wire::EncodedEvent;

    const SESSION: i64 = 7;

    fn delta(revision: i64, index: i64) -> Arc<Ephemeral> {
        Arc::new(Ephemeral {
            revision,
            time: Timestamp(1),
            kind: EphemeralKind::Delta {
                run_id: "r1".into(),
                index,
                merged_from: None,
                content: DeltaContent::Text(format!("delta {index}")),
            },
        })
    }

    fn run_ended(revision: i64) -> Arc<EncodedEvent> {
        Arc::new(EncodedEvent::new(SessionEvent {
            revision,
            time: Timestamp(1),
            change: Change::RunEnded {
                run_id: "r1".into(),
                expired: false,
            },
        }))
    }

    /// What the channel carries, as (revision of an event | delta index).
    fn carried(receiver: &mut broadcast::Receiver<Live>) -> Vec<String> {
        let mut out = Vec::new();
        while let Ok(item) = receiver.try_recv() {
            out.push(match item {
                Live::Event(event) => format!("event {}", event.revision),
                Live::Ephemeral(ephemeral) => match &ephemeral.kind {
                    EphemeralKind::Delta { index, .. } => format!("delta {index}"),
                    EphemeralKind::RunDiscarded { .. } => "discarded".into(),
                },
                Live::Head(revision) => format!("head {revision}"),
                Live::Closing => "closing".into(),
            });
        }
        out
    }

    /// Another replica's commit closing run r1 is hinted, then that
    /// replica's next delta of r1 (index 0 again) arrives while the
    /// fetcher reads the commit: the delta goes out after the commit.
    #[test]
    fn a_delta_arriving_while_the_fetcher_reads_goes_out_after_what_it_reads() {
        let hub = Arc::new(Hub::default());
        let (fetcher, mut asked) = mpsc::unbounded_channel();
        assert!(hub.fetcher.set(fetcher).is_ok());
        let mut watcher = hub.subscribe(SESSION, 1);
        hub.ephemeral(SESSION, delta(1, 0));
        assert_eq!(carried(&mut watcher.receiver), ["delta 0"]);

        hub.run_closed(SESSION, "r1");
        hub.head_moved(SESSION, 2);
        assert_eq!(asked.try_recv().ok(), Some(SESSION), "the fetcher is asked");
        hub.ephemeral(SESSION, delta(2, 0));
        assert!(carried(&mut watcher.receiver).is_empty(), "held meanwhile");

        // The fetcher's turn: it reads from revision 1, delivers 2, and
        // finds nothing more wanted.
        assert_eq!(hub.still_wanted(SESSION), Some(1));
        hub.deliver(SESSION, &[run_ended(2)]);
        assert_eq!(hub.still_wanted(SESSION), None);
        assert_eq!(carried(&mut watcher.receiver), ["event 2", "delta 0"]);

        // Caught up, a delta goes straight out.
        hub.ephemeral(SESSION, delta(2, 1));
        assert_eq!(carried(&mut watcher.receiver), ["delta 1"]);
    }
}
