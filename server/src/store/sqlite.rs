//! The SQLite write path: WAL, `synchronous = FULL`, foreign keys on.
//!
//! All writes go through one writer task. It drains whatever requests are
//! queued (up to [`MAX_BATCH`]) into one `BEGIN IMMEDIATE` transaction,
//! each request inside its own savepoint, and acknowledges every request
//! only after that transaction has committed: group commit, one fsync for
//! many appends, and no two writers can ever race for a sequence. Reads use
//! the rest of the pool (WAL lets them run beside the writer).
//!
//! `sqlite::memory:` runs the very same code on a one-connection pool, the
//! connection kept open for the store's lifetime.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::any::AnyPoolOptions;
use sqlx::migrate::Migrator;
use sqlx::{AnyConnection, AnyPool, Connection, Executor};
use tokio::sync::{mpsc, oneshot};

use super::batch;
use super::ops::{self, Dialect, WriteOp, Written};
use super::sql::{Inner, SqlStore, WritePath, publish};
use super::{CommitSink, OpenError};
use crate::domain::{Error, NewExchange, Result};

pub(super) static MIGRATOR: Migrator = sqlx::migrate!("../migrations/sqlite");

/// The most write requests committed in one transaction.
const MAX_BATCH: usize = 256;
/// Write requests that may wait for the writer before callers are held back.
const QUEUE_DEPTH: usize = 4096;

/// A queued write and where to send its answer.
pub(super) struct Job {
    tenant: String,
    op: WriteOp,
    reply: oneshot::Sender<Result<Written>>,
}

fn is_in_memory(url: &str) -> bool {
    url.contains(":memory:") || url.contains("mode=memory")
}

/// A file URL without an explicit mode opens read-write-create.
fn with_create_mode(url: &str) -> String {
    if is_in_memory(url) || url.contains("mode=") {
        url.to_owned()
    } else if url.contains('?') {
        format!("{url}&mode=rwc")
    } else {
        format!("{url}?mode=rwc")
    }
}

pub(super) async fn connect(url: &str) -> Result<AnyPool, sqlx::Error> {
    sqlx::any::install_default_drivers();
    let in_memory = is_in_memory(url);
    let options = if in_memory {
        // One connection, never recycled: it *is* the database.
        AnyPoolOptions::new()
            .max_connections(1)
            .min_connections(1)
            .idle_timeout(None)
            .max_lifetime(None)
    } else {
        AnyPoolOptions::new()
            .max_connections(8)
            .acquire_timeout(Duration::from_secs(30))
    };
    options
        // A local file needs no liveness ping (a round trip to sqlx's
        // worker thread) before every batch.
        .test_before_acquire(false)
        .after_connect(move |conn, _| {
            Box::pin(async move {
                if !in_memory {
                    // FULL: an acknowledged commit survives power loss, not just a crash.
                    conn.execute("PRAGMA journal_mode = WAL").await?;
                }
                conn.execute(
                    "PRAGMA synchronous = FULL; PRAGMA foreign_keys = ON; PRAGMA busy_timeout = 10000",
                )
                .await?;
                Ok(())
            })
        })
        .connect(&with_create_mode(url))
        .await
}

/// Opens (creating if missing) and migrates the database, then starts the writer.
pub(super) async fn open(url: &str, sink: Arc<dyn CommitSink>) -> Result<SqlStore, OpenError> {
    let pool = connect(url).await?;
    MIGRATOR.run(&pool).await?;
    let (queue, jobs) = mpsc::channel(QUEUE_DEPTH);
    let writer = tokio::spawn(run_writer(pool.clone(), jobs, Arc::clone(&sink)));
    Ok(SqlStore::from_inner(Inner {
        pool,
        writes: WritePath::Queue(queue),
        sink,
        tasks: Mutex::new(vec![writer]),
        closing: tokio::sync::watch::Sender::new(false),
        replica: String::new(),
    }))
}

/// Queues a write and waits for its commit.
pub(super) async fn submit(
    queue: &mpsc::Sender<Option<Job>>,
    tenant: &str,
    op: WriteOp,
) -> Result<Written> {
    let (reply, answer) = oneshot::channel();
    let job = Job {
        tenant: tenant.to_owned(),
        op,
        reply,
    };
    queue
        .send(Some(job))
        .await
        .map_err(|_| Error::ShuttingDown)?;
    answer.await.map_err(|_| Error::ShuttingDown)?
}

async fn run_writer(
    pool: AnyPool,
    mut queue: mpsc::Receiver<Option<Job>>,
    sink: Arc<dyn CommitSink>,
) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    while let Some(first) = queue.recv().await {
        match first {
            Some(job) => batch.push(job),
            None => queue.close(),
        }
        while batch.len() < MAX_BATCH {
            match queue.try_recv() {
                Ok(Some(job)) => batch.push(job),
                Ok(None) => queue.close(),
                Err(_) => break,
            }
        }
        if !batch.is_empty() {
            commit_batch(&pool, sink.as_ref(), std::mem::take(&mut batch)).await;
        }
    }
    tracing::debug!("sqlite writer stopped");
}

fn batch_failed(what: &'static str) -> Error {
    Error::storage(std::io::Error::other(what))
}

async fn commit_batch(pool: &AnyPool, sink: &dyn CommitSink, jobs: Vec<Job>) {
    let mut conn = match pool.acquire().await {
        Ok(conn) => conn,
        Err(error) => return fail_all(jobs, &error),
    };
    let mut tx = match conn.begin_with("BEGIN IMMEDIATE").await {
        Ok(tx) => tx,
        Err(error) => return fail_all(jobs, &error),
    };
    let mut results = Vec::with_capacity(jobs.len());
    // A caller already gone (its deadline passed, or it cancelled) before
    // its write began will hear of nothing: skip it.
    let mut jobs = jobs
        .into_iter()
        .filter(|job| !job.reply.is_closed())
        .peekable();
    while let Some(job) = jobs.next() {
        let applied = if matches!(job.op, WriteOp::Append(_)) {
            // A run of appends goes through the bulk path together.
            let mut run = vec![job];
            while let Some(next) = jobs.next_if(|job| matches!(job.op, WriteOp::Append(_))) {
                run.push(next);
            }
            apply_appends(&mut tx, run, &mut results).await
        } else {
            apply_one(&mut tx, job, &mut results).await
        };
        if let Err((broken, unanswered)) = applied {
            // The savepoint machinery itself failed: the transaction is unusable.
            tracing::error!(error = %broken, "write transaction broken; rolling back the batch");
            drop(tx);
            for (reply, _) in results {
                let _ = reply.send(Err(batch_failed("batch rolled back")));
            }
            for reply in unanswered.into_iter().chain(jobs.map(|job| job.reply)) {
                let _ = reply.send(Err(batch_failed("batch rolled back")));
            }
            return;
        }
    }
    if let Err(error) = tx.commit().await {
        tracing::error!(%error, "commit failed");
        for (reply, result) in results {
            let _ = reply.send(result.and(Err(batch_failed("commit failed"))));
        }
        return;
    }
    for (reply, result) in results {
        let _ = reply.send(result.map(|applied| publish(sink, applied)));
    }
}

type Reply = oneshot::Sender<Result<Written>>;
/// A broken transaction, and the callers not yet answered.
type Broken = (sqlx::Error, Vec<Reply>);

/// Applies one request in its own savepoint.
async fn apply_one(
    conn: &mut AnyConnection,
    job: Job,
    results: &mut Vec<(Reply, Result<ops::Applied>)>,
) -> std::result::Result<(), Broken> {
    match apply_in_savepoint(conn, &job.tenant, job.op).await {
        Ok(result) => {
            results.push((job.reply, result));
            Ok(())
        }
        Err(broken) => Err((broken, vec![job.reply])),
    }
}

/// Applies a run of appends through the bulk path, in a savepoint; the
/// requests it defers (and, if it fails, all of them) then go one by one
/// through the general path.
async fn apply_appends(
    conn: &mut AnyConnection,
    run: Vec<Job>,
    results: &mut Vec<(Reply, Result<ops::Applied>)>,
) -> std::result::Result<(), Broken> {
    let requests: Vec<(&str, &NewExchange)> = run
        .iter()
        .filter_map(|job| match &job.op {
            WriteOp::Append(exchange) => Some((job.tenant.as_str(), exchange.as_ref())),
            _ => None,
        })
        .collect();
    let outcomes = match bulk_in_savepoint(conn, &requests).await {
        Ok(outcomes) => outcomes,
        Err(broken) => return Err((broken, run.into_iter().map(|job| job.reply).collect())),
    };
    let mut run = run.into_iter();
    match outcomes {
        Some(outcomes) => {
            for outcome in outcomes {
                let Some(job) = run.next() else { break };
                match outcome {
                    batch::Outcome::Done(result) => results.push((job.reply, result)),
                    batch::Outcome::Deferred => {
                        if let Err((broken, mut unanswered)) = apply_one(conn, job, results).await {
                            unanswered.extend(run.map(|job| job.reply));
                            return Err((broken, unanswered));
                        }
                    }
                }
            }
        }
        None => {
            while let Some(job) = run.next() {
                if let Err((broken, mut unanswered)) = apply_one(conn, job, results).await {
                    unanswered.extend(run.map(|job| job.reply));
                    return Err((broken, unanswered));
                }
            }
        }
    }
    Ok(())
}

/// The bulk path in a savepoint: `None` if a statement failed (rolled
/// back; nothing written). The outer `Err` means the savepoint itself failed.
async fn bulk_in_savepoint(
    conn: &mut AnyConnection,
    requests: &[(&str, &NewExchange)],
) -> Result<Option<Vec<batch::Outcome>>, sqlx::Error> {
    let mut savepoint = conn.begin().await?;
    match batch::append_all(&mut savepoint, Dialect::Sqlite, requests).await {
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

fn fail_all(jobs: Vec<Job>, error: &sqlx::Error) {
    tracing::error!(%error, "cannot start a write transaction");
    for job in jobs {
        let _ = job
            .reply
            .send(Err(batch_failed("cannot start a write transaction")));
    }
}

/// Runs one request in a savepoint: on a domain error the savepoint is
/// rolled back (the request writes nothing) and the batch goes on. The
/// outer `Err` means the savepoint machinery itself failed.
async fn apply_in_savepoint(
    conn: &mut AnyConnection,
    tenant: &str,
    op: WriteOp,
) -> Result<Result<ops::Applied>, sqlx::Error> {
    let mut savepoint = conn.begin().await?;
    let result = ops::apply(&mut savepoint, Dialect::Sqlite, tenant, op).await;
    match result {
        Ok(applied) => {
            savepoint.commit().await?;
            Ok(Ok(applied))
        }
        Err(error) => {
            savepoint.rollback().await?;
            if let Error::Storage(source) = &error {
                tracing::error!(error = %source, "write failed");
            }
            Ok(Err(error))
        }
    }
}
