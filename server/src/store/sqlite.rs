//! The SQLite write path: WAL, `synchronous = FULL`, foreign keys on.
//!
//! All writes go through one writer task. It drains whatever requests are
//! queued (up to [`MAX_BATCH`]) into one `BEGIN IMMEDIATE` transaction,
//! each request inside its own savepoint, and acknowledges every request
//! only after that transaction is on disk: group commit, one fsync for
//! many appends, and no two writers can ever race for a sequence. (The
//! engine's append runs are fsynced by a syncer thread beside the writer;
//! see `sqlite_appends.rs`.) Reads use
//! the rest of the pool (WAL lets them run beside the writer).
//!
//! What keeps a batch short (each measured, see BENCHMARKS.md): the writer
//! keeps one connection, so its page cache survives between batches; a
//! 32 MiB page cache; savepoint journals in memory (`temp_store = MEMORY`)
//! rather than in a temporary file per transaction; and WAL checkpoints
//! run beside the writer (`sqlite_checkpoints.rs`) instead of inside the
//! commit that happens to cross SQLite's threshold.
//!
//! `sqlite::memory:` runs the very same code on a one-connection pool, the
//! connection kept open for the store's lifetime.

use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::AtomicI64;
use std::time::Duration;

use sqlx::any::AnyPoolOptions;
use sqlx::migrate::Migrator;
use sqlx::pool::PoolConnection;
use sqlx::{Any, AnyConnection, AnyPool, Connection, Executor};
use tokio::sync::mpsc;

use super::batch;
use super::fault::{self, DiskSpace};
use super::ops::{Dialect, SearchWrites};
use super::sqlite_appends::{EngineAppends, WAL_SIZE_LIMIT};
use super::sqlite_checkpoints::Checkpointer;
use super::sqlite_reads::EngineReads;
use super::sqlite_search::{self, SearchIndexer};
use super::writer::{Job, PendingAppend, Refused, Settle, next_batch};
use super::{CommitSink, OpenError};
use crate::domain::{Error, NewExchange, Result};

pub(super) static MIGRATOR: Migrator = sqlx::migrate!("../migrations/sqlite");

/// The most write requests committed in one transaction.
const MAX_BATCH: usize = 256;
/// Write requests that may wait for the writer before callers are held back.
const QUEUE_DEPTH: usize = 4096;

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

/// The database file a file URL names.
fn file_path(url: &str) -> Result<PathBuf, sqlx::Error> {
    Ok(sqlx::sqlite::SqliteConnectOptions::from_str(url)?
        .get_filename()
        .to_path_buf())
}

/// A pool on the database `url` names, every connection configured and
/// with the search index attached as `search`: the search file beside a
/// database file (created here if missing), or an in-memory one.
pub(super) async fn connect(url: &str) -> Result<AnyPool, OpenError> {
    sqlx::any::install_default_drivers();
    let in_memory = is_in_memory(url);
    let attach_search: Arc<str> = if in_memory {
        format!(
            "ATTACH DATABASE ':memory:' AS search; {}",
            sqlite_search::CREATE_INDEX
        )
        .into()
    } else {
        let path = file_path(url)?;
        sqlite_search::prepare(&path)?;
        sqlite_search::attach(&sqlite_search::search_path(&path)).into()
    };
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
            let attach_search = Arc::clone(&attach_search);
            Box::pin(async move {
                if !in_memory {
                    // FULL: an acknowledged commit survives power loss, not just a crash.
                    conn.execute("PRAGMA journal_mode = WAL").await?;
                    // The checkpointer thread copies the WAL back, off the
                    // writer's path; a connection that starts the WAL over
                    // cuts the file back.
                    conn.execute("PRAGMA wal_autocheckpoint = 0").await?;
                    conn.execute(
                        format!("PRAGMA journal_size_limit = {WAL_SIZE_LIMIT}").as_str(),
                    )
                    .await?;
                }
                conn.execute(
                    "PRAGMA synchronous = FULL; PRAGMA foreign_keys = ON; PRAGMA busy_timeout = 10000; \
                     PRAGMA cache_size = -32768; PRAGMA temp_store = MEMORY",
                )
                .await?;
                conn.execute(&*attach_search).await?;
                Ok(())
            })
        })
        .connect(&with_create_mode(url))
        .await
        .map_err(OpenError::from)
}

/// An opened SQLite database: its pool, the writer's queue and the
/// threads and tasks that serve it.
pub(super) struct Opened {
    pub pool: AnyPool,
    /// The writer task's queue; `None` asks it to stop.
    pub queue: mpsc::Sender<Option<Queued>>,
    pub tasks: Vec<tokio::task::JoinHandle<()>>,
    pub closing: tokio::sync::watch::Sender<bool>,
    /// Message reads through the engine itself (file databases only).
    pub engine_reads: Option<Arc<EngineReads>>,
    /// The thread writing the search file (file databases only).
    pub search_indexer: Option<Arc<SearchIndexer>>,
}

/// Opens (creating if missing) and migrates the database, then starts the writer.
pub(super) async fn open(url: &str, sink: Arc<dyn CommitSink>) -> Result<Opened, OpenError> {
    let pool = connect(url).await?;
    MIGRATOR.run(&pool).await?;
    let space = Arc::new(DiskSpace::default());
    let (engine_reads, engine_appends, checkpointer, indexer) = if is_in_memory(url) {
        (None, None, None, None)
    } else {
        let path = file_path(url)?;
        // The last search log id indexed: the append thread deletes the
        // log rows before it.
        let indexed = Arc::new(AtomicI64::new(0));
        let indexer = Arc::new(SearchIndexer::start(
            &path,
            Arc::clone(&indexed),
            Arc::clone(&space),
        )?);
        let appends = EngineAppends::start(&path, indexed)?;
        let checkpointer = Checkpointer::start(&path, appends.checkpoints(), Arc::clone(&space))?;
        (
            Some(EngineReads::new(path.clone())),
            Some(appends),
            Some(checkpointer),
            Some(indexer),
        )
    };
    let (queue, jobs) = mpsc::channel(QUEUE_DEPTH);
    let writer = tokio::spawn(run_writer(
        pool.clone(),
        jobs,
        Arc::clone(&sink),
        engine_appends,
        indexer.clone(),
        space,
    ));
    let closing = tokio::sync::watch::Sender::new(false);
    let mut tasks = vec![writer];
    if let Some(checkpointer) = checkpointer {
        tasks.push(tokio::spawn(checkpointer.run_until(closing.subscribe())));
    }
    Ok(Opened {
        pool,
        queue,
        tasks,
        closing,
        engine_reads,
        search_indexer: indexer,
    })
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
async fn run_writer(
    pool: AnyPool,
    mut queue: mpsc::Receiver<Option<Queued>>,
    sink: Arc<dyn CommitSink>,
    engine: Option<EngineAppends>,
    indexer: Option<Arc<SearchIndexer>>,
    space: Arc<DiskSpace>,
) {
    let keep_connection = engine.is_some();
    // A file database's search index is written by the indexer thread,
    // from the ranges writes log; in memory, by the writes themselves.
    let search = if indexer.is_some() {
        SearchWrites::Logged
    } else {
        SearchWrites::Inline
    };
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
            batch = append_through_engine(engine, &sink, &space, batch).await;
        }
        if batch.is_empty() {
            if let Some(indexer) = &indexer {
                indexer.wake();
            }
            continue;
        }
        let mut conn = match kept.take() {
            Some(conn) => conn,
            None => match pool.acquire().await {
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
        if let Some(indexer) = &indexer {
            indexer.wake();
        }
    }
    if let Some(engine) = engine {
        // Its connection closes before the pool's last one, which
        // checkpoints the WAL on its way out.
        engine.stop().await;
    }
    tracing::debug!("sqlite writer stopped");
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
            let mut done = Vec::with_capacity(outcomes.len());
            for (pending, outcome) in requests.into_iter().zip(outcomes) {
                match outcome {
                    batch::Outcome::Done(Ok(applied)) => done.push(pending.applied(applied)),
                    batch::Outcome::Done(Err(error)) => pending.fail(error),
                    batch::Outcome::Deferred => left.push(Queued::Append(pending)),
                }
            }
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
                    batch::Outcome::Done(Ok(done)) => applied.push(pending.applied(done)),
                    batch::Outcome::Done(Err(error)) => pending.fail(error),
                    batch::Outcome::Deferred => deferred.push(pending),
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
) -> Result<Option<Vec<batch::Outcome>>, sqlx::Error> {
    let mut savepoint = conn.begin().await?;
    match batch::append_all(&mut savepoint, Dialect::Sqlite, search, requests).await {
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

/// Leaves a closed file database's WAL and shared-memory files (and its
/// search file's) on disk, empty, as they are after a crash: SQLite deletes
/// them when its last connection closes, and a server started on a full
/// disk could then not create them again, so it could not even read. One
/// connection opens the database (which creates them) and closes without
/// the checkpoint that would delete them; every connection before it has
/// already checkpointed everything, so they hold no frames.
pub(super) fn keep_wal_files(path: &std::path::Path) -> rusqlite::Result<()> {
    let conn = super::sqlite_reads::open_engine(path)?;
    conn.set_db_config(
        rusqlite::config::DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE,
        true,
    )?;
    conn.execute_batch(&sqlite_search::attach(&sqlite_search::search_path(path)))?;
    conn.query_row("SELECT count(*) FROM main.sqlite_master", [], |_| Ok(()))?;
    conn.query_row("SELECT count(*) FROM search.sqlite_master", [], |_| Ok(()))?;
    Ok(())
}
