//! The plumbing both backends' writers share: a write waiting for its
//! answer ([`Pending`]), the same with its type erased for a queue
//! ([`Job`]) and, once applied, waiting for its transaction ([`Settle`]);
//! batches taken from a queue; and answering callers after publishing their
//! events (on a thread of its own, for PostgreSQL).
//!
//! Each write carries its own typed reply channel from the caller to the
//! writer and back: nothing is packed into a common answer type and
//! unpacked again.

use std::sync::Arc;

use futures_core::future::BoxFuture;
use sqlx::AnyConnection;
use tokio::sync::{mpsc, oneshot};

use super::CommitSink;
use super::ops::{self, AppendExchange, Applied, Dialect, SearchWrites, Write};
use crate::domain::{Error, Result};
use crate::wire::EncodedEvent;

/// A write on its way to the database, and where its caller waits.
pub(super) struct Pending<W: Write> {
    tenant: String,
    op: W,
    reply: oneshot::Sender<Result<W::Reply>>,
}

/// An append on its way: the bulk paths read the exchange in place.
pub(super) type PendingAppend = Pending<AppendExchange>;

/// A bulk run's appends by their outcomes (`append::Outcome`, one per
/// append, in order): the refused are answered now; the applied are
/// returned to be answered once their transaction is on disk, and the
/// deferred, in arrival order, for the general path.
pub(super) fn by_outcome(
    appends: Vec<PendingAppend>,
    outcomes: Vec<super::append::Outcome>,
) -> (Vec<Box<dyn Settle>>, Vec<PendingAppend>) {
    use super::append::Outcome;
    let mut done = Vec::with_capacity(outcomes.len());
    let mut deferred = Vec::new();
    for (pending, outcome) in appends.into_iter().zip(outcomes) {
        match outcome {
            Outcome::Done(Ok(applied)) => done.push(pending.applied(applied)),
            Outcome::Done(Err(error)) => pending.fail(error),
            Outcome::Deferred => deferred.push(pending),
        }
    }
    (done, deferred)
}

impl<W: Write> Pending<W> {
    /// The write, and the receiver its answer arrives on.
    pub(super) fn new(tenant: &str, op: W) -> (Self, oneshot::Receiver<Result<W::Reply>>) {
        let (reply, answer) = oneshot::channel();
        let pending = Pending {
            tenant: tenant.to_owned(),
            op,
            reply,
        };
        (pending, answer)
    }

    pub(super) fn tenant(&self) -> &str {
        &self.tenant
    }

    pub(super) fn op(&self) -> &W {
        &self.op
    }

    /// The caller has gone (its deadline passed, or it cancelled): nobody
    /// waits for the answer.
    pub(super) fn abandoned(&self) -> bool {
        self.reply.is_closed()
    }

    /// Answers with `result`, publishing its events first if it succeeded
    /// (its transaction is on disk).
    pub(super) fn answer(self, sink: &dyn CommitSink, result: Result<Applied<W::Reply>>) {
        let _ = self
            .reply
            .send(result.map(|applied| publish(sink, applied)));
    }

    /// Answers with `error`: nothing of the write is stored.
    pub(super) fn fail(self, error: Error) {
        let _ = self.reply.send(Err(error));
    }

    /// Applied, waiting for its transaction to commit.
    pub(super) fn applied(self, applied: Applied<W::Reply>) -> Box<dyn Settle> {
        Box::new(Done {
            pending: self,
            applied,
        })
    }
}

/// Waits for the answer of a write sent to a writer: `ShuttingDown` if the
/// writer dropped it unanswered (it has stopped).
pub(super) async fn answer<T>(answer: oneshot::Receiver<Result<T>>) -> Result<T> {
    answer.await.map_err(|_| Error::ShuttingDown)?
}

/// Sends `job` to a writer's queue (`None` in a queue asks its writer to
/// stop); a stopped writer drops it, which answers `ShuttingDown`.
pub(super) async fn enqueue<J>(queue: &mpsc::Sender<Option<J>>, job: J) {
    let _ = queue.send(Some(job)).await;
}

/// A [`Pending`] write with its type erased, for a queue holding every
/// kind of write.
pub(super) trait Job: Send + 'static {
    /// See [`Pending::abandoned`].
    fn abandoned(&self) -> bool;

    /// Applies a copy of the write in `conn`'s open transaction. `Ok`: it
    /// waits for that transaction ([`Settle`]). `Err`: the transaction must
    /// be rolled back; the job comes back with the error, to be applied
    /// again or answered with it.
    fn apply<'c>(
        self: Box<Self>,
        conn: &'c mut AnyConnection,
        dialect: Dialect,
        search: SearchWrites,
    ) -> BoxFuture<'c, std::result::Result<Box<dyn Settle>, Refused>>;

    /// Answers with `error`: nothing of the write is stored.
    fn fail(self: Box<Self>, error: Error);
}

/// A write that failed to apply, and the job to apply again or answer.
pub(super) struct Refused {
    pub(super) error: Error,
    pub(super) job: Box<dyn Job>,
}

impl<W: Write> Job for Pending<W> {
    fn abandoned(&self) -> bool {
        Pending::abandoned(self)
    }

    fn apply<'c>(
        self: Box<Self>,
        conn: &'c mut AnyConnection,
        dialect: Dialect,
        search: SearchWrites,
    ) -> BoxFuture<'c, std::result::Result<Box<dyn Settle>, Refused>> {
        Box::pin(async move {
            match ops::apply(conn, dialect, search, &self.tenant, self.op.clone()).await {
                Ok(applied) => Ok((*self).applied(applied)),
                Err(error) => Err(Refused { error, job: self }),
            }
        })
    }

    fn fail(self: Box<Self>, error: Error) {
        Pending::fail(*self, error);
    }
}

/// An applied write waiting for its transaction's outcome.
pub(super) trait Settle: Send + 'static {
    /// The events the write records, with their sessions' internal keys.
    fn events(&self) -> &[(i64, Arc<EncodedEvent>)];

    /// The transaction committed: answers, publishing the events first.
    fn committed(self: Box<Self>, sink: &dyn CommitSink);

    /// The transaction did not commit: answers with `error`.
    fn fail(self: Box<Self>, error: Error);

    /// The transaction did not commit: the write, to apply again.
    fn again(self: Box<Self>) -> Box<dyn Job>;
}

struct Done<W: Write> {
    pending: Pending<W>,
    applied: Applied<W::Reply>,
}

impl<W: Write> Settle for Done<W> {
    fn events(&self) -> &[(i64, Arc<EncodedEvent>)] {
        &self.applied.events
    }

    fn committed(self: Box<Self>, sink: &dyn CommitSink) {
        let Done { pending, applied } = *self;
        pending.answer(sink, Ok(applied));
    }

    fn fail(self: Box<Self>, error: Error) {
        self.pending.fail(error);
    }

    fn again(self: Box<Self>) -> Box<dyn Job> {
        Box::new(self.pending)
    }
}

/// A writer's next batch: waits for one queued job, then takes whatever
/// else is queued, up to `max`. The flag says the stop signal (a queued
/// `None`) was taken: the writer commits this batch and stops. `None` once
/// the queue is closed and empty.
pub(super) async fn next_batch<J>(
    queue: &mut mpsc::Receiver<Option<J>>,
    max: usize,
) -> Option<(Vec<J>, bool)> {
    let first = queue.recv().await?;
    let mut stop = first.is_none();
    let mut batch: Vec<J> = first.into_iter().collect();
    while batch.len() < max && !stop {
        match queue.try_recv() {
            Ok(Some(job)) => batch.push(job),
            Ok(None) => stop = true,
            Err(_) => break,
        }
    }
    Some((batch, stop))
}

/// Answers writes, publishing their events first, on a thread of its own
/// rather than on one of the runtime's workers. Waking a thousand watcher
/// tasks from a worker puts them all on that worker's own queue, behind
/// the task that woke them; woken from another thread, they go to the
/// shared queue and every worker takes them. Measured (PostgreSQL, 1,000
/// watchers on one replica, BENCHMARKS.md): p99 31–35 ms → about 3 ms.
/// One thread keeps the order in which the answers were handed over.
/// (SQLite's engine appends are answered from its syncer thread already.)
#[derive(Clone)]
pub(super) struct Publisher {
    queue: std::sync::mpsc::Sender<Box<dyn FnOnce() + Send>>,
}

impl Publisher {
    /// Starts the thread; it stops once every clone is dropped.
    pub(super) fn start() -> std::io::Result<Self> {
        let (queue, answers) = std::sync::mpsc::channel::<Box<dyn FnOnce() + Send>>();
        std::thread::Builder::new()
            .name("publisher".into())
            .spawn(move || {
                while let Ok(answer) = answers.recv() {
                    answer();
                }
            })?;
        Ok(Publisher { queue })
    }

    /// Answers writes whose transaction committed, publishing their events.
    pub(super) fn committed(&self, sink: &Arc<dyn CommitSink>, done: Vec<Box<dyn Settle>>) {
        if done.is_empty() {
            return;
        }
        let sink = Arc::clone(sink);
        let answer: Box<dyn FnOnce() + Send> = Box::new(move || {
            for settle in done {
                settle.committed(sink.as_ref());
            }
        });
        if let Err(std::sync::mpsc::SendError(answer)) = self.queue.send(answer) {
            // The thread is gone: answer here.
            answer();
        }
    }
}

/// A write's answer from its [`Applied`], publishing its events first.
pub(super) fn publish<T>(sink: &dyn CommitSink, applied: Applied<T>) -> T {
    for (session_key, event) in applied.events {
        sink.committed(session_key, &[event]);
    }
    applied.reply
}
