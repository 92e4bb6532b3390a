//! The SQLite bulk-append path straight through the engine (rusqlite), on a
//! thread of its own.
//!
//! The writer task hands each run of queued appends that starts a batch to
//! this thread, which reads, decides and writes it with [`append::Run`] in
//! one `BEGIN IMMEDIATE … COMMIT` of its own connection. Through sqlx each of
//! the run's dozen statements was a round trip to sqlx's worker thread
//! (BENCHMARKS.md: about 0.1 ms each); here they are plain calls. What the
//! run defers, and everything else, the writer then applies through sqlx as
//! before, after this commit, so arrival order holds.
//!
//! **Durability off the writer's path.** The thread commits with
//! `synchronous = NORMAL`: `COMMIT` writes the run's WAL frames but does not
//! wait for the disk. A second thread, the syncer, then `fdatasync`s the WAL
//! file and only after that runs what waits on the run (the callers'
//! acknowledgements and the watch events). While it waits on the disk the
//! engine thread already writes the next run, and one sync covers every run
//! committed before it began. The WAL is a log: a sync that covers a run
//! covers every earlier one, so no acknowledged write can depend on one
//! that is lost. What a caller is told is therefore as durable as with
//! `synchronous = FULL`. The difference: for the ~1 ms until the sync, other
//! connections can already read a run whose callers have not been answered;
//! a power loss or OS crash in that window (not a `kill -9`: the OS has the
//! pages) loses it. If a sync ever fails, no later write is acknowledged
//! (the failed pages may be gone while a later sync succeeds), as
//! PostgreSQL stops on a failed WAL flush.
//!
//! Only file databases take this path: `sqlite::memory:` lives inside
//! sqlx's one connection.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use rusqlite::Connection;
use tokio::sync::{mpsc, oneshot};

use super::wal::truncated;
use crate::domain::{Error, NewExchange, Result, Timestamp};
use crate::store::OpenError;
use crate::store::append::{Outcome, Run, Statement, Value};
use crate::store::once::TakeOnce;
use crate::store::ops::{Dialect, SearchWrites};
use crate::store::rows::Columns;
use crate::store::writer::PendingAppend;

/// A run's requests, in arrival order.
pub(super) type Requests = Vec<PendingAppend>;

/// Distinct statement texts kept prepared: multi-row statements differ by
/// row count, so a run's dozen statements take up to a few hundred texts.
const STATEMENT_CACHE: usize = 512;

/// What the engine thread is asked to do.
enum Work {
    /// Append a run in one transaction.
    Append {
        requests: Requests,
        reply: oneshot::Sender<(Requests, Result<Vec<Outcome>>)>,
    },
    /// Checkpoint the WAL between runs (see [`WalCheckpoints`]).
    Checkpoint(oneshot::Sender<rusqlite::Result<Checkpointed>>),
    /// Copy all of the WAL back and cut it to zero bytes, between runs
    /// (see [`EngineAppends::truncate_wal`]); whether it was.
    Truncate(oneshot::Sender<rusqlite::Result<bool>>),
    /// Close the connection and end the thread.
    Stop,
}

/// What `PRAGMA wal_checkpoint` reports: frames in the WAL, and how many
/// of them are now in the database file.
#[derive(Clone, Copy, Debug)]
pub(super) struct Checkpointed {
    pub(super) busy: bool,
    pub(super) wal_frames: i64,
    pub(super) copied_frames: i64,
}

impl Checkpointed {
    /// Runs a `PASSIVE` checkpoint on `conn`: it never waits for a lock.
    pub(super) fn passive(conn: &Connection) -> rusqlite::Result<Self> {
        conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |row| {
            Ok(Checkpointed {
                busy: row.get::<_, i64>(0)? != 0,
                wal_frames: row.get(1)?,
                copied_frames: row.get(2)?,
            })
        })
    }

    /// Every frame in the WAL is in the database file (and synced there),
    /// so the next write can start the WAL over.
    pub(super) fn complete(&self) -> bool {
        !self.busy && self.wal_frames == self.copied_frames
    }
}

/// What runs once the runs committed before it are on disk: `true` if
/// they are, `false` if the WAL could not be synced.
pub(super) type AfterSync = Box<dyn FnOnce(bool) + Send>;

/// The engine writer thread's handle, and its syncer's.
pub(super) struct EngineAppends {
    requests: mpsc::Sender<Work>,
    stopped: TakeOnce<oneshot::Receiver<()>>,
    syncer: WalSyncer,
}

impl EngineAppends {
    /// Starts the thread on `conn`, a writing connection (`Role::Appends`)
    /// to the (migrated) database at `path`. `indexed` is the last search
    /// log id the indexer has applied; the thread deletes the log rows
    /// before it now and then. `search` is where appends' search work goes
    /// (`Logged`, or `Off` with search switched off).
    pub(super) fn start(
        conn: Connection,
        path: &Path,
        indexed: Arc<AtomicI64>,
        search: SearchWrites,
    ) -> Result<Self, OpenError> {
        conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
        let (requests, mut queue) = mpsc::channel::<Work>(1);
        let (done, stopped) = oneshot::channel();
        std::thread::Builder::new()
            .name("sqlite-appends".into())
            .spawn(move || {
                let mut log = SearchLog {
                    writes: search,
                    indexed,
                    deleted_before: 0,
                };
                while let Some(work) = queue.blocking_recv() {
                    match work {
                        Work::Append { requests, reply } => {
                            let outcome = {
                                let borrowed: Vec<(&str, &NewExchange)> = requests
                                    .iter()
                                    .map(|pending| (pending.tenant(), pending.op().0.as_ref()))
                                    .collect();
                                append_run(&conn, &mut log, &borrowed)
                            };
                            let _ = reply.send((requests, outcome));
                        }
                        Work::Checkpoint(reply) => {
                            let _ = reply.send(Checkpointed::passive(&conn));
                        }
                        Work::Truncate(reply) => {
                            let _ = reply.send(truncated(&conn, "main"));
                        }
                        Work::Stop => break,
                    }
                }
                drop(conn);
                let _ = done.send(());
            })
            .map_err(|error| OpenError::Engine(Box::new(error)))?;
        let mut wal = path.as_os_str().to_owned();
        wal.push("-wal");
        let syncer = WalSyncer::start(PathBuf::from(wal))?;
        Ok(EngineAppends {
            requests,
            stopped: TakeOnce::new(stopped),
            syncer,
        })
    }

    /// Appends `requests` in one committed transaction and hands them back
    /// with one outcome each; `Err` if anything failed, in which case
    /// nothing was written. Committed is not yet durable: acknowledge
    /// through [`Self::after_sync`].
    pub(super) async fn append(&self, requests: Requests) -> (Requests, Result<Vec<Outcome>>) {
        let (reply, answer) = oneshot::channel();
        if let Err(mpsc::error::SendError(work)) =
            self.requests.send(Work::Append { requests, reply }).await
        {
            let requests = match work {
                Work::Append { requests, .. } => requests,
                Work::Checkpoint(_) | Work::Truncate(_) | Work::Stop => Vec::new(),
            };
            return (requests, Err(thread_gone()));
        }
        match answer.await {
            Ok(answered) => answered,
            // The thread never drops a request unanswered while it runs.
            Err(_) => (Vec::new(), Err(thread_gone())),
        }
    }

    /// Copies every frame of the WAL back into the database file and cuts
    /// the WAL to zero bytes (EraseUser: frames written before a secure
    /// delete still hold what it overwrote); whether it could. On this
    /// thread, between two runs: a `TRUNCATE` checkpoint takes the write
    /// lock, so from any other connection it would first wait for a gap
    /// between the runs, and then hold every append while it waits for
    /// readers. Here it waits only for readers (up to the busy timeout).
    pub(super) async fn truncate_wal(&self) -> Result<bool> {
        let (reply, answer) = oneshot::channel();
        if self.requests.send(Work::Truncate(reply)).await.is_err() {
            return Err(thread_gone());
        }
        match answer.await {
            Ok(truncated) => Ok(truncated?),
            Err(_) => Err(thread_gone()),
        }
    }

    /// A handle that asks this thread for checkpoints, without keeping it
    /// running.
    pub(super) fn checkpoints(&self) -> WalCheckpoints {
        WalCheckpoints(self.requests.downgrade())
    }

    /// Runs `then` once every run committed so far is on disk.
    pub(super) fn after_sync(&self, then: AfterSync) {
        self.syncer.after(then);
    }

    /// Stops the thread and waits until its connection is closed and
    /// everything waiting on a sync has run. Nothing may append after.
    pub(super) async fn stop(&self) {
        let _ = self.requests.send(Work::Stop).await;
        if let Some(stopped) = self.stopped.take() {
            let _ = stopped.await;
        }
        self.syncer.stop().await;
    }
}

/// Asks the engine thread for a checkpoint between its runs. While the
/// engine writes, a checkpoint from another connection can never catch up
/// with the WAL's end, and SQLite starts the WAL over only once all of it
/// is in the database file; the engine's own checkpoint, between two runs,
/// can. Holds the thread's queue weakly: it does not keep the thread alive.
pub(super) struct WalCheckpoints(mpsc::WeakSender<Work>);

impl WalCheckpoints {
    /// Blocks until the engine thread has checkpointed; `None` once it has
    /// stopped. Call from a thread of its own, never from the runtime.
    pub(super) fn blocking_checkpoint(&self) -> Option<rusqlite::Result<Checkpointed>> {
        let queue = self.0.upgrade()?;
        let (reply, answer) = oneshot::channel();
        queue.blocking_send(Work::Checkpoint(reply)).ok()?;
        drop(queue);
        answer.blocking_recv().ok()
    }
}

/// The syncer thread's handle (see the module notes).
struct WalSyncer {
    /// `None` once stopped.
    waiting: Mutex<Option<std::sync::mpsc::Sender<AfterSync>>>,
    stopped: TakeOnce<oneshot::Receiver<()>>,
}

impl WalSyncer {
    fn start(wal: PathBuf) -> Result<Self, OpenError> {
        let (waiting, queue) = std::sync::mpsc::channel::<AfterSync>();
        let (done, stopped) = oneshot::channel();
        std::thread::Builder::new()
            .name("sqlite-wal-sync".into())
            .spawn(move || {
                run_syncer(&wal, &queue);
                let _ = done.send(());
            })
            .map_err(|error| OpenError::Engine(Box::new(error)))?;
        Ok(WalSyncer {
            waiting: Mutex::new(Some(waiting)),
            stopped: TakeOnce::new(stopped),
        })
    }

    fn after(&self, then: AfterSync) {
        let waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
        let sent = match waiting.as_ref() {
            Some(waiting) => waiting.send(then).map_err(|error| error.0),
            None => Err(then),
        };
        if let Err(then) = sent {
            // The thread is gone (it never stops while the store runs).
            then(false);
        }
    }

    async fn stop(&self) {
        drop(
            self.waiting
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take(),
        );
        if let Some(stopped) = self.stopped.take() {
            let _ = stopped.await;
        }
    }
}

/// The syncer thread: each sync covers everything queued before it began.
fn run_syncer(wal: &Path, queue: &std::sync::mpsc::Receiver<AfterSync>) {
    let mut file = None;
    let mut failed = false;
    while let Ok(first) = queue.recv() {
        let waiting: Vec<AfterSync> = std::iter::once(first).chain(queue.try_iter()).collect();
        if !failed && let Err(error) = sync(&mut file, wal) {
            tracing::error!(
                %error,
                wal = %wal.display(),
                "syncing the SQLite WAL failed; no later write will be acknowledged"
            );
            failed = true;
        }
        for then in waiting {
            then(!failed);
        }
    }
}

/// `fdatasync` of the WAL file, opened on first use. The engine's
/// connection stays open as long as the syncer runs, so SQLite never
/// deletes or replaces the file under it.
fn sync(file: &mut Option<File>, wal: &Path) -> std::io::Result<()> {
    let open = match file {
        Some(open) => open,
        None => file.insert(File::open(wal)?),
    };
    open.sync_data()
}

fn thread_gone() -> Error {
    Error::storage(std::io::Error::other("the SQLite append thread stopped"))
}

/// One run in one transaction: rolled back (writing nothing) on any error.
fn append_run(
    conn: &Connection,
    log: &mut SearchLog,
    requests: &[(&str, &NewExchange)],
) -> Result<Vec<Outcome>> {
    let result = (|| {
        conn.prepare_cached("BEGIN IMMEDIATE")?.execute([])?;
        let now = Timestamp::now();
        let mut run = Run::new(Dialect::Sqlite, log.writes, requests);
        // The reads are one statement per session or key, of one text each.
        let mut names = ColumnNames::default();
        for statement in run.session_reads() {
            let mut prepared = prepare(conn, &statement)?;
            let names = names.of(&statement.sql, &prepared);
            let mut rows = prepared.raw_query();
            while let Some(row) = rows.next()? {
                run.add_session(&EngineRow { row, names }, now)?;
            }
        }
        for statement in run.request_id_reads() {
            let mut prepared = prepare(conn, &statement)?;
            let names = names.of(&statement.sql, &prepared);
            let mut rows = prepared.raw_query();
            while let Some(row) = rows.next()? {
                run.add_stored_request_id(&EngineRow { row, names })?;
            }
        }
        let (outcomes, writes) = run.decide(now);
        for statement in &writes {
            prepare(conn, statement)?.raw_execute()?;
        }
        let deleted_before = log.trim(conn)?;
        conn.prepare_cached("COMMIT")?.execute([])?;
        log.deleted_before = deleted_before;
        Ok(outcomes)
    })();
    if result.is_err()
        && !conn.is_autocommit()
        && let Err(error) = conn.execute_batch("ROLLBACK")
    {
        tracing::error!(%error, "rolling back a failed append run failed");
    }
    result
}

/// Search log rows the indexer has applied, deleted in the append runs.
struct SearchLog {
    /// `Logged`, or `Off` (nothing logged, nothing to trim).
    writes: SearchWrites,
    /// The last id the indexer applied (and synced).
    indexed: Arc<AtomicI64>,
    /// Rows before this id are deleted.
    deleted_before: i64,
}

impl SearchLog {
    /// Applied rows deleted at once, at least.
    const TRIM_ROWS: i64 = 4096;

    /// Deletes the applied rows, once there are enough of them, in the
    /// run's transaction, keeping the last applied one so the log's end is
    /// known (`search.rs`). The id deleted before, if committed.
    fn trim(&self, conn: &Connection) -> rusqlite::Result<i64> {
        let indexed = self.indexed.load(Ordering::Acquire);
        if indexed - self.deleted_before < Self::TRIM_ROWS {
            return Ok(self.deleted_before);
        }
        conn.prepare_cached("DELETE FROM search_log WHERE id < ?1")?
            .execute([indexed])?;
        Ok(indexed)
    }
}

/// `statement` prepared (from the cache) with its parameters bound. Its
/// `$N` placeholders become SQLite's `?N`, bound by number.
fn prepare<'c>(
    conn: &'c Connection,
    statement: &Statement,
) -> rusqlite::Result<rusqlite::CachedStatement<'c>> {
    let mut prepared = conn.prepare_cached(&statement.sql.replace('$', "?"))?;
    for (index, value) in (1..).zip(&statement.params) {
        match value {
            Value::Int(v) => prepared.raw_bind_parameter(index, v)?,
            Value::Text(v) => prepared.raw_bind_parameter(index, v)?,
            Value::NullableText(v) => prepared.raw_bind_parameter(index, v)?,
            Value::Bytes(v) => prepared.raw_bind_parameter(index, v)?,
            // PostgreSQL's: SQLite's search rows are the text itself.
            Value::Words(v) => prepared.raw_bind_parameter(index, v)?,
        }
    }
    Ok(prepared)
}

/// A statement's column names, read once for all of its rows and for the
/// statements of the same text after it.
#[derive(Default)]
struct ColumnNames {
    sql: String,
    names: Vec<String>,
}

impl ColumnNames {
    fn of(&mut self, sql: &str, statement: &rusqlite::Statement<'_>) -> &[String] {
        if self.sql != sql {
            self.sql = sql.to_owned();
            self.names = statement
                .column_names()
                .into_iter()
                .map(str::to_owned)
                .collect();
        }
        &self.names
    }
}

/// A row of a run's reads, its columns found by name in its statement's
/// `names`. rusqlite's own lookup by name asks SQLite for each column's
/// name and compares it without regard to case, column after column, for
/// every value: 2% of the server's CPU in appends (a session row has 17
/// columns).
struct EngineRow<'a, 'r> {
    row: &'a rusqlite::Row<'r>,
    names: &'a [String],
}

impl EngineRow<'_, '_> {
    fn get<T: rusqlite::types::FromSql>(&self, column: &str) -> Result<T> {
        let index = self
            .names
            .iter()
            .position(|name| name == column)
            .ok_or_else(|| rusqlite::Error::InvalidColumnName(column.to_owned()))?;
        Ok(self.row.get(index)?)
    }
}

impl Columns for EngineRow<'_, '_> {
    fn int(&self, column: &str) -> Result<i64> {
        self.get(column)
    }

    fn raw_text(&self, column: &str) -> Result<String> {
        self.get(column)
    }

    fn optional_text(&self, column: &str) -> Result<Option<String>> {
        self.get(column)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;

    use super::*;

    /// Queues `count` waiters, closes the queue, runs the syncer to the
    /// end and returns what each waiter was told, in order.
    fn syncer_answers(wal: &Path, count: usize) -> Vec<bool> {
        let (waiting, queue) = mpsc::channel::<AfterSync>();
        let (told, answers) = mpsc::channel();
        for index in 0..count {
            let told = told.clone();
            let then: AfterSync = Box::new(move |synced| {
                let _ = told.send((index, synced));
            });
            let _ = waiting.send(then);
        }
        drop(waiting);
        run_syncer(wal, &queue);
        drop(told);
        let answers: Vec<(usize, bool)> = answers.iter().collect();
        assert_eq!(
            answers.iter().map(|(index, _)| *index).collect::<Vec<_>>(),
            (0..count).collect::<Vec<_>>(),
            "every waiter runs once, in order"
        );
        answers.into_iter().map(|(_, synced)| synced).collect()
    }

    #[test]
    fn the_syncer_answers_every_waiter_after_syncing_the_wal() -> std::io::Result<()> {
        let dir = std::env::temp_dir().join(format!("sessionstore-syncer-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let wal = dir.join("db.sqlite-wal");
        std::fs::write(&wal, b"frames")?;
        assert_eq!(syncer_answers(&wal, 3), [true, true, true]);
        std::fs::remove_dir_all(&dir)
    }

    #[test]
    fn after_a_failed_sync_no_later_waiter_is_told_it_is_on_disk() -> std::io::Result<()> {
        // The first sync fails (no WAL file yet); the first waiter then
        // creates the file and queues a second waiter, whose sync could
        // succeed: it must still be told no.
        let dir =
            std::env::temp_dir().join(format!("sessionstore-syncer-failed-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let wal = dir.join("db.sqlite-wal");
        let (waiting, queue) = mpsc::channel::<AfterSync>();
        let (told, answers) = mpsc::channel();
        let (told_first, file, requeue) = (told.clone(), wal.clone(), waiting.clone());
        let first: AfterSync = Box::new(move |synced| {
            let _ = told_first.send(synced);
            let _ = told_first.send(std::fs::write(&file, b"frames").is_ok());
            let second: AfterSync = Box::new(move |synced| {
                let _ = told.send(synced);
            });
            let _ = requeue.send(second);
        });
        let _ = waiting.send(first);
        drop(waiting);
        run_syncer(&wal, &queue);
        // The first waiter's answer, its file written, the second's answer.
        assert_eq!(answers.try_iter().collect::<Vec<_>>(), [false, true, false]);
        std::fs::remove_dir_all(&dir)
    }
}
