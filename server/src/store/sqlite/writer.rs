//! The SQLite writer task: every write of a database goes through it.
//!
//! It drains whatever requests are queued (up to [`MAX_BATCH`]) into one
//! `BEGIN IMMEDIATE` transaction, each request inside its own savepoint,
//! and acknowledges every request only after that transaction is on disk:
//! group commit, one fsync for many appends, and no two writers can ever
//! race for a sequence. On a file database a batch's leading run of
//! appends goes through the engine's append thread instead
//! (`appends.rs`), fsynced by its syncer.

use std::sync::Arc;

use sqlx::pool::PoolConnection;
use sqlx::{Any, AnyConnection, AnyPool, Connection as _};
use tokio::sync::mpsc;

use super::appends::EngineAppends;
use super::engine::Engine;
use crate::domain::{Error, NewExchange};
use crate::store::CommitSink;
use crate::store::append;
use crate::store::fault::{self, DiskSpace};
use crate::store::ops::{Dialect, SearchWrites};
use crate::store::writer::{Job, PendingAppend, Refused, Settle, by_outcome, next_batch};

/// The most write requests committed in one transaction.
const MAX_BATCH: usize = 256;

/// A write queued for the writer: appends apart, so that a run of them
/// goes through the bulk path together.
pub(super) enum Queued {
    Append(PendingAppend),
    Write(Box<dyn Job>),
}

impl Queued {
    fn abandoned(&self) -> bool {
        match self {
            Queued::Append(pending) => pending.abandoned(),
            Queued::Write(job) => job.abandoned(),
        }
    }

    fn fail(self, error: Error) {
        match self {
            Queued::Append(pending) => pending.fail(error),
            Queued::Write(job) => job.fail(error),
        }
    }
}

/// The writer: batches of queued requests, one transaction each. On a
/// file database (`engine` is there) a batch's leading run of appends is
/// written through the engine first, and the rest (with whatever that run
/// deferred) through sqlx on a pool connection the writer keeps for good:
/// SQLite drops a connection's page cache whenever another connection has
/// written, so a writer that took any free connection would start every
/// batch by reading back the pages the previous batch wrote.
/// (`sqlite::memory:` has a single connection, which readers need between
/// batches.)
pub(super) async fn run(
    pool: AnyPool,
    mut queue: mpsc::Receiver<Option<Queued>>,
    sink: Arc<dyn CommitSink>,
    engine: Option<Arc<Engine>>,
    space: Arc<DiskSpace>,
    search: SearchWrites,
) {
    let keep_connection = engine.is_some();
    let mut kept: Option<PoolConnection<Any>> = None;
    while let Some((batch, stopping)) = next_batch(&mut queue, MAX_BATCH).await {
        if stopping {
            // Finish what is queued, then stop.
            queue.close();
        }
        // A caller already gone (its deadline passed, or it cancelled) before
        // its write began will hear of nothing: skip it.
        let mut batch: Vec<Queued> = batch.into_iter().filter(|job| !job.abandoned()).collect();
        if let Some(engine) = &engine {
            batch = append_through_engine(engine.appends(), &sink, &space, batch).await;
        }
        if batch.is_empty() {
            if let Some(indexer) = engine.as_ref().and_then(|engine| engine.indexer()) {
                indexer.wake();
            }
            continue;
        }
        let mut conn = match kept.take() {
            Some(conn) => conn,
            None => match acquire(&pool, keep_connection).await {
                Ok(conn) => conn,
                Err(error) => {
                    fail_all(batch, error);
                    continue;
                }
            },
        };
        let healthy = commit_batch(&mut conn, search, sink.as_ref(), &space, batch).await;
        if keep_connection {
            if healthy {
                kept = Some(conn);
            } else {
                // A failed COMMIT can leave the connection inside a
                // transaction SQLite has already rolled back (sqlx then
                // counts one still open): close it rather than hand it on.
                // (In memory the one connection is the database: kept.)
                let _ = conn.detach().close().await;
            }
        }
        if let Some(indexer) = engine.as_ref().and_then(|engine| engine.indexer()) {
            indexer.wake();
        }
    }
    if let Some(conn) = kept {
        // Without the search file it is no connection for anyone else.
        let _ = conn.detach().close().await;
    }
    tracing::debug!("sqlite writer stopped");
}

/// A pool connection for the writer. On a file database (`file`) it is
/// the writer's for good, and the search file is detached from it: its
/// `BEGIN IMMEDIATE` would otherwise take the search file's write lock
/// too (SQLite locks every attached database), shutting the indexer out
/// of the file for every batch, although the writer only logs to the main
/// database's `search_log` there (`search.rs`).
async fn acquire(pool: &AnyPool, file: bool) -> Result<PoolConnection<Any>, sqlx::Error> {
    let mut conn = pool.acquire().await?;
    if file
        && let Err(error) = sqlx::query("DETACH DATABASE search")
            .execute(&mut *conn)
            .await
    {
        // Not back to the pool half-configured.
        let _ = conn.detach().close().await;
        return Err(error);
    }
    Ok(conn)
}

/// Writes the leading run of appends of `batch` through the engine, in a
/// transaction of its own, and answers those it decided once that
/// transaction is on disk (the syncer's turn; the writer goes on at once).
/// Returns what is left for the general path, in arrival order: the
/// requests the run deferred (all of them if it failed, having written
/// nothing), then the rest of the batch.
async fn append_through_engine(
    engine: &EngineAppends,
    sink: &Arc<dyn CommitSink>,
    space: &DiskSpace,
    batch: Vec<Queued>,
) -> Vec<Queued> {
    let mut jobs = batch.into_iter().peekable();
    let mut requests = Vec::new();
    while let Some(Queued::Append(pending)) = jobs.next_if(|job| matches!(job, Queued::Append(_))) {
        requests.push(pending);
    }
    if requests.is_empty() {
        return jobs.collect();
    }
    let sent = requests.len();
    let (requests, outcomes) = engine.append(requests).await;
    let mut left = Vec::new();
    match outcomes {
        Ok(outcomes) => {
            let (done, deferred) = by_outcome(requests, outcomes);
            left.extend(deferred.into_iter().map(Queued::Append));
            // Answered, and published to watchers, once on disk.
            let sink = Arc::clone(sink);
            engine.after_sync(Box::new(move |synced| {
                for settle in done {
                    if synced {
                        settle.committed(sink.as_ref());
                    } else {
                        settle.fail(batch_failed("the write could not be synced to disk"));
                    }
                }
            }));
        }
        Err(error) if fault::is_shared(&error) => {
            // A full disk fails the general path alike.
            space.note(&error);
            tracing::warn!(%error, appends = requests.len(), "bulk append failed");
            for pending in requests {
                pending.fail(fault::again(&error));
            }
        }
        Err(error) if requests.len() == sent => {
            tracing::warn!(%error, "bulk append failed; applying the requests one by one");
            left.extend(requests.into_iter().map(Queued::Append));
        }
        Err(error) => {
            // The thread is gone, and the requests with it (their callers
            // are told the server is shutting down).
            tracing::error!(%error, "bulk append lost");
        }
    }
    left.extend(jobs);
    left
}

fn batch_failed(what: &'static str) -> Error {
    Error::storage(std::io::Error::other(what))
}

/// Commits one batch on `conn`; `false` if the connection failed and
/// should go back to the pool rather than be kept. Each request is applied
/// in a savepoint of its own: one that fails is rolled back alone, answered
/// with its error, and the batch goes on. The rest are answered once the
/// batch has committed, or with the fault that stopped it.
async fn commit_batch(
    conn: &mut AnyConnection,
    search: SearchWrites,
    sink: &dyn CommitSink,
    space: &DiskSpace,
    jobs: Vec<Queued>,
) -> bool {
    let mut tx = match conn.begin_with("BEGIN IMMEDIATE").await {
        Ok(tx) => tx,
        Err(error) => {
            fail_all(jobs, error);
            return false;
        }
    };
    let mut applied: Vec<Box<dyn Settle>> = Vec::with_capacity(jobs.len());
    let mut jobs = jobs.into_iter().peekable();
    let mut broken = None;
    while let Some(job) = jobs.next() {
        let run = match job {
            Queued::Append(first) => {
                // A run of appends goes through the bulk path together.
                let mut run = vec![first];
                while let Some(Queued::Append(next)) =
                    jobs.next_if(|job| matches!(job, Queued::Append(_)))
                {
                    run.push(next);
                }
                apply_appends(&mut tx, search, space, run, &mut applied).await
            }
            Queued::Write(job) => apply_one(&mut tx, search, space, job, &mut applied).await,
        };
        if let Err(error) = run {
            broken = Some(error);
            break;
        }
    }
    if let Some(error) = broken {
        // The savepoint machinery itself failed: the transaction is unusable.
        space.note(&error);
        tracing::error!(%error, "write transaction broken; rolling back the batch");
        drop(tx);
        for settle in applied {
            settle.fail(fault::again(&error));
        }
        for job in jobs {
            job.fail(fault::again(&error));
        }
        return false;
    }
    if let Err(error) = tx.commit().await {
        // A full disk, typically: nothing of the batch is written.
        let error = Error::from(error);
        space.note(&error);
        tracing::error!(%error, "commit failed");
        for settle in applied {
            settle.fail(fault::again(&error));
        }
        return false;
    }
    for settle in applied {
        settle.committed(sink);
    }
    true
}

/// Applies one request in a savepoint of its own: rolled back and answered
/// with its error if it fails. `Err` means the savepoint machinery itself
/// failed (the transaction is unusable; the request has been answered).
async fn apply_one(
    conn: &mut AnyConnection,
    search: SearchWrites,
    space: &DiskSpace,
    job: Box<dyn Job>,
    applied: &mut Vec<Box<dyn Settle>>,
) -> Result<(), Error> {
    let mut savepoint = match conn.begin().await {
        Ok(savepoint) => savepoint,
        Err(broken) => {
            let broken = Error::from(broken);
            job.fail(fault::again(&broken));
            return Err(broken);
        }
    };
    match job.apply(&mut savepoint, Dialect::Sqlite, search).await {
        Ok(settle) => match savepoint.commit().await {
            Ok(()) => applied.push(settle),
            Err(broken) => {
                let broken = Error::from(broken);
                settle.fail(fault::again(&broken));
                return Err(broken);
            }
        },
        Err(Refused { error, job }) => {
            let rolled_back = savepoint.rollback().await;
            if let Error::Storage(source) = &error {
                tracing::error!(error = %source, "write failed");
            }
            space.note(&error);
            job.fail(error);
            rolled_back.map_err(Error::from)?;
        }
    }
    Ok(())
}

/// Applies a run of appends through the bulk path, in a savepoint; the
/// requests it defers (and, if it fails, all of them) then go one by one
/// through the general path. `Err` as for [`apply_one`]; the requests not
/// yet answered are answered by the caller.
async fn apply_appends(
    conn: &mut AnyConnection,
    search: SearchWrites,
    space: &DiskSpace,
    run: Vec<PendingAppend>,
    applied: &mut Vec<Box<dyn Settle>>,
) -> Result<(), Error> {
    let requests: Vec<(&str, &NewExchange)> = run
        .iter()
        .map(|pending| (pending.tenant(), pending.op().0.as_ref()))
        .collect();
    let outcomes = match bulk_in_savepoint(conn, search, &requests).await {
        Ok(outcomes) => outcomes,
        Err(broken) => {
            let broken = Error::from(broken);
            for pending in run {
                pending.fail(fault::again(&broken));
            }
            return Err(broken);
        }
    };
    let mut deferred = Vec::new();
    match outcomes {
        Some(outcomes) => {
            for (pending, outcome) in run.into_iter().zip(outcomes) {
                match outcome {
                    append::Outcome::Done(Ok(done)) => applied.push(pending.applied(done)),
                    append::Outcome::Done(Err(error)) => pending.fail(error),
                    append::Outcome::Deferred => deferred.push(pending),
                }
            }
        }
        None => deferred = run,
    }
    let mut deferred = deferred.into_iter();
    while let Some(pending) = deferred.next() {
        if let Err(broken) = apply_one(conn, search, space, Box::new(pending), applied).await {
            for pending in deferred {
                pending.fail(fault::again(&broken));
            }
            return Err(broken);
        }
    }
    Ok(())
}

/// The bulk path in a savepoint: `None` if a statement failed (rolled
/// back; nothing written). The outer `Err` means the savepoint itself failed.
async fn bulk_in_savepoint(
    conn: &mut AnyConnection,
    search: SearchWrites,
    requests: &[(&str, &NewExchange)],
) -> Result<Option<Vec<append::Outcome>>, sqlx::Error> {
    let mut savepoint = conn.begin().await?;
    match append::append_all(&mut savepoint, Dialect::Sqlite, search, requests).await {
        Ok(outcomes) => {
            savepoint.commit().await?;
            Ok(Some(outcomes))
        }
        Err(error) => {
            tracing::warn!(%error, "bulk append failed; applying the requests one by one");
            savepoint.rollback().await?;
            Ok(None)
        }
    }
}

fn fail_all(jobs: Vec<Queued>, error: sqlx::Error) {
    let error = Error::from(error);
    tracing::error!(%error, "cannot start a write transaction");
    for job in jobs {
        job.fail(fault::again(&error));
    }
}
