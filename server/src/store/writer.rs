//! The plumbing both backends' writers share: a queue a caller waits on
//! for its answer, batches taken from it, and answering callers after
//! publishing their events (on a thread of its own, for PostgreSQL).

use std::sync::Arc;

use tokio::sync::mpsc;

use super::CommitSink;
use super::ops::{self, Written};
use crate::domain::{Error, Result};

/// Sends the job `job` builds around its reply channel to a writer's
/// queue, and waits for the writer's answer.
pub(super) async fn queue_and_wait<J>(
    queue: &mpsc::Sender<Option<J>>,
    job: impl FnOnce(tokio::sync::oneshot::Sender<Result<Written>>) -> J,
) -> Result<Written> {
    let (reply, answer) = tokio::sync::oneshot::channel();
    queue
        .send(Some(job(reply)))
        .await
        .map_err(|_| Error::ShuttingDown)?;
    answer.await.map_err(|_| Error::ShuttingDown)?
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

    /// Publishes the events of `applied` writes and answers their callers.
    pub(super) fn answer(
        &self,
        sink: &Arc<dyn CommitSink>,
        answers: Vec<(
            tokio::sync::oneshot::Sender<Result<Written>>,
            Result<ops::Applied>,
        )>,
    ) {
        if answers.is_empty() {
            return;
        }
        let sink = Arc::clone(sink);
        let answer: Box<dyn FnOnce() + Send> = Box::new(move || {
            for (reply, result) in answers {
                let _ = reply.send(result.map(|applied| publish(sink.as_ref(), applied)));
            }
        });
        if let Err(std::sync::mpsc::SendError(answer)) = self.queue.send(answer) {
            // The thread is gone: answer here.
            answer();
        }
    }
}

/// Answers a write from its [`ops::Applied`], publishing its events first.
pub(super) fn publish(sink: &dyn CommitSink, applied: ops::Applied) -> Written {
    for (session_key, event) in applied.events {
        sink.committed(session_key, &[event]);
    }
    applied.written
}
