//! The SQLite search index: an FTS5 table in a database file of its own
//! (`<database>-search`), written by a thread of its own.
//!
//! **Why.** Indexing two 1 KB messages is most of an append's work on
//! SQLite's one writer: `perf` of the append thread put FTS5 (tokenizing,
//! flushing each run's terms to a segment, merging segments) at about 45%
//! of it (BENCHMARKS.md). A second file has a second writer, so indexing
//! runs beside the appends, on the other core, and in larger passes
//! (larger segments, fewer merges per message).
//!
//! **How.** A write that changes searchable messages records the changed
//! range (`session key, from..until` sequences) in the main database's
//! `search_log`, in its own transaction; an append run records one row per
//! session. This thread reads the log past the id it last applied and, in
//! one transaction of the search file, deletes the index rows of each range
//! and indexes the range's messages as they are in the same snapshot of the
//! main database (so an edit, redaction, rollback or delete is simply a
//! range whose current messages are fewer or different), then records the
//! last id applied. Applying a range twice changes nothing, so a crash
//! between the two files only means a range is applied again.
//!
//! **Search sees every committed write.** `SearchMessages` reads the log's
//! last id, wakes this thread and waits until that id is applied before it
//! queries, so a search after an acknowledged write finds it.
//!
//! **Deletions wait their turn.** A range with no message left (a session
//! deleted or erased, messages rolled back) only goes into the search
//! file's `unindex_backlog`; its index rows are deleted in later passes,
//! after the log, a few hundred milliseconds at a time. FTS5's
//! `secure-delete` (see [`CREATE_INDEX`]) costs milliseconds a message,
//! and an erasure of thousands of sessions would otherwise hold up every
//! search for minutes; meanwhile no search can find those rows (it joins
//! the messages). EraseUser waits until the backlog is done through its
//! own log rows before it answers.
//!
//! **Recovery.** The search file is derived data. This thread rebuilds it
//! from all messages when it is new (the first start after the migration
//! that moved the index here, or the file deleted by hand), when it records
//! an id past the log's end (the main database lost its last commits in a
//! power loss while the search file kept them), or when it is behind rows
//! already deleted from the log (an older search file). The append thread
//! deletes applied log rows, keeping the last one, so both are detectable.
//!
//! `sqlite::memory:` keeps the index inline (a `search` schema attached in
//! memory, written in each write's transaction): there is no second file.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError, SyncSender, TrySendError};
use std::time::{Duration, Instant};

use rusqlite::{Connection, OptionalExtension};
use tokio::sync::watch;

use super::columns::content;
use super::search_file::{CREATE_INDEX, search_path};
use super::wal;
use crate::domain::{Error, Result, control};
use crate::store::OpenError;
use crate::store::fault::DiskSpace;
use crate::store::once::TakeOnce;
use crate::store::rows::{Content, search_rowid};

/// Log rows applied per pass at most.
const PASS_ROWS: i64 = 4096;

/// How long a pass goes on taking log rows: deleting index rows with
/// FTS5's `secure-delete` costs about a millisecond a message, so a pass
/// over thousands of erased sessions would otherwise hold the search file
/// for a minute.
const PASS_TIME: Duration = Duration::from_millis(200);

/// Pages one step of merging the index's segments writes at most, before
/// a backlog of deletions (see `apply_ranges`).
const MERGE_PAGES: i64 = 500;

/// How long the thread sleeps when nothing wakes it.
const IDLE_POLL: Duration = Duration::from_secs(1);

/// How long the thread lets the log gather after a pass that applied
/// rows, unless a search is waiting (a search ends the wait at once, so
/// it costs searches nothing): larger passes write larger segments, which
/// FTS5 merges fewer times. 100 ms measured 11–14% more appends at 64
/// clients than 20 ms, and the same at 16 (BENCHMARKS.md).
const GATHER: Duration = Duration::from_millis(100);

/// How long a search waits for the index to catch up before failing.
const CATCH_UP_TIMEOUT: Duration = Duration::from_secs(30);

/// The indexer thread's handle.
pub(super) struct SearchIndexer {
    wake: SyncSender<()>,
    /// How far the thread has got.
    applied: watch::Receiver<Progress>,
    /// Set to stop the thread.
    stop: Arc<std::sync::atomic::AtomicBool>,
    /// Searches waiting for the index to catch up.
    searching: Arc<AtomicUsize>,
    thread: TakeOnce<std::thread::JoinHandle<()>>,
}

/// Where the indexer is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Progress {
    /// Building the index from every message.
    Building,
    /// Applied the log through `through`; every deletion of the log rows
    /// through `cleared` is done (`cleared <= through`).
    Applied { through: i64, cleared: i64 },
}

impl SearchIndexer {
    /// Starts the thread on `conn`, a connection to the (migrated)
    /// database with its search file attached (`Role::Search`). `applied`
    /// tells the append thread which log rows it may delete.
    pub(super) fn start(
        conn: Connection,
        applied: Arc<AtomicI64>,
        space: Arc<DiskSpace>,
    ) -> Result<Self, OpenError> {
        let failed = |error: rusqlite::Error| OpenError::Engine(Box::new(error));
        let start = match check_applied(&conn).map_err(failed)? {
            Some(through) => {
                applied.store(through, Ordering::Release);
                Progress::Applied {
                    through,
                    cleared: cleared(&conn, through).map_err(failed)?,
                }
            }
            None => Progress::Building,
        };
        let (progress, watching) = watch::channel(start);
        let (wake, woken) = mpsc::sync_channel(1);
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let searching = Arc::new(AtomicUsize::new(0));
        let waits = Waits {
            woken,
            stop: Arc::clone(&stop),
            searching: Arc::clone(&searching),
        };
        let thread = std::thread::Builder::new()
            .name("sqlite-search".into())
            .spawn(move || run(&conn, &progress, &applied, &waits, &space))
            .map_err(|error| OpenError::Engine(Box::new(error)))?;
        Ok(SearchIndexer {
            wake,
            applied: watching,
            stop,
            searching,
            thread: TakeOnce::new(thread),
        })
    }

    /// Tells the thread the log has new rows.
    pub(super) fn wake(&self) {
        match self.wake.try_send(()) {
            Ok(()) | Err(TrySendError::Full(())) | Err(TrySendError::Disconnected(())) => {}
        }
    }

    /// Waits until the log is applied through `log_id`: a search then
    /// finds every write logged before it (and no deleted message, though
    /// the deletion is not done: the search joins the messages).
    pub(super) async fn caught_up(&self, log_id: i64) -> Result<()> {
        let _searching = Searching::count(&self.searching);
        self.wait_for(
            |progress| matches!(progress, Progress::Applied { through, .. } if through >= log_id),
        )
        .await
    }

    /// Waits until every deletion of the log rows through `log_id` is
    /// done: nothing they deleted is left in the index (EraseUser).
    pub(super) async fn cleared(&self, log_id: i64) -> Result<()> {
        self.wait_for(
            |progress| matches!(progress, Progress::Applied { cleared, .. } if cleared >= log_id),
        )
        .await
    }

    /// Waits until `reached`, for as long as the thread keeps making
    /// passes: SEARCH_INDEX_BEHIND only once a whole [`CATCH_UP_TIMEOUT`]
    /// passed without one (a rebuild is one pass; a large erasure is many
    /// short ones).
    async fn wait_for(&self, reached: impl Fn(Progress) -> bool) -> Result<()> {
        let mut applied = self.applied.clone();
        self.wake();
        loop {
            if reached(*applied.borrow_and_update()) {
                break Ok(());
            }
            match tokio::time::timeout(CATCH_UP_TIMEOUT, applied.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => {
                    break Err(Error::storage(std::io::Error::other(
                        "the search indexer stopped",
                    )));
                }
                Err(_) => break Err(Error::SearchIndexBehind),
            }
        }
    }

    /// Stops the thread and waits for it (its pass, if one runs, finishes).
    pub(super) async fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        self.wake();
        self.thread.join().await;
    }
}

/// The id the index has applied through, or `None` if it must be built:
/// never built; past the log's end (see the module notes); or behind rows
/// already deleted from the log (a search file older than the database,
/// as when one is restored from a backup and the other is not).
fn check_applied(conn: &Connection) -> rusqlite::Result<Option<i64>> {
    let applied: Option<i64> = conn
        .query_row("SELECT log_id FROM search.search_applied", [], |row| {
            row.get(0)
        })
        .optional()?;
    let (first, end): (Option<i64>, i64) = conn.query_row(
        "SELECT min(id), coalesce(max(id), 0) FROM main.search_log",
        [],
        |row| Ok((row.get(0)?, row.get(1)?)),
    )?;
    let Some(applied) = applied else {
        return Ok(None);
    };
    // The log keeps the last row it was trimmed to, so ids after it are
    // all there, and none after its end was ever written.
    let deleted_unapplied = first.is_some_and(|first| applied + 1 < first);
    if applied > end || deleted_unapplied {
        tracing::warn!(
            applied,
            log_first = first,
            log_end = end,
            "the search index does not match the database (a lost commit, or a restored file); rebuilding it"
        );
        conn.execute("DELETE FROM search.search_applied", [])?;
        return Ok(None);
    }
    Ok(Some(applied))
}

/// One search waiting for the thread, counted for as long as it waits
/// (also when its caller goes away).
struct Searching<'a>(&'a AtomicUsize);

impl<'a> Searching<'a> {
    fn count(searching: &'a AtomicUsize) -> Self {
        searching.fetch_add(1, Ordering::AcqRel);
        Searching(searching)
    }
}

impl Drop for Searching<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// What the thread waits on between passes.
struct Waits {
    woken: mpsc::Receiver<()>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    searching: Arc<AtomicUsize>,
}

impl Waits {
    fn stopping(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    /// Waits for a wake-up (or [`IDLE_POLL`]); `false` once the store is gone.
    fn idle(&self) -> bool {
        !matches!(
            self.woken.recv_timeout(IDLE_POLL),
            Err(RecvTimeoutError::Disconnected)
        )
    }

    /// Lets the log gather for [`GATHER`], unless a search is waiting or
    /// the thread is stopping.
    fn gather(&self) {
        let until = Instant::now() + GATHER;
        while self.searching.load(Ordering::Acquire) == 0 && !self.stopping() {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            if let Err(RecvTimeoutError::Disconnected) = self.woken.recv_timeout(left) {
                return;
            }
        }
    }
}

fn run(
    conn: &Connection,
    progress: &watch::Sender<Progress>,
    applied: &AtomicI64,
    waits: &Waits,
    space: &DiskSpace,
) {
    // Log rows per pass: fewer after a pass that found the disk full.
    let mut rows = PASS_ROWS;
    // After a pass that found the disk full, the next waits as long as
    // writes make background work wait (as the checkpointer does): space
    // freed meanwhile goes to the callers' writes first.
    let mut full_at: Option<Instant> = None;
    // When a pass last applied rows, until the search file's WAL has been
    // given back after it.
    let mut applied_at: Option<Instant> = None;
    let wal = conn
        .path()
        .map(|path| format!("{}-wal", search_path(Path::new(path)).display()));
    loop {
        if waits.stopping() {
            return;
        }
        // The index waits while writes find the disk full: freed space
        // goes to them first. (Searches meanwhile may answer
        // SEARCH_INDEX_BEHIND.)
        if space.holding_back() || full_at.is_some_and(|at| at.elapsed() < DiskSpace::HOLD_BACK) {
            if !waits.idle() {
                return;
            }
            continue;
        }
        let more = match pass(conn, rows) {
            Ok(Some(Pass {
                through,
                cleared,
                cut,
            })) => {
                full_at = None;
                applied.store(through, Ordering::Release);
                progress.send_replace(Progress::Applied { through, cleared });
                applied_at = Some(Instant::now());
                rows = (rows * 2).min(PASS_ROWS);
                // A pass cut short goes on at once.
                Some(cut)
            }
            Ok(None) => None,
            Err(error) => {
                // Short of space, smaller passes still fit.
                if matches!(error, crate::domain::Error::StorageFull(_)) {
                    rows = (rows / 4).max(1);
                    full_at = Some(Instant::now());
                }
                tracing::error!(%error, rows, "indexing messages for search failed; retrying");
                None
            }
        };
        match more {
            Some(true) => {}
            // Whatever is logged meanwhile goes in the next pass.
            Some(false) => waits.gather(),
            None => {
                if applied_at.is_some_and(|at| at.elapsed() >= wal::QUIET)
                    && cut_quiet_wal(conn, wal.as_deref())
                {
                    applied_at = None;
                }
                if !waits.idle() {
                    return;
                }
            }
        }
    }
}

/// Once indexing pauses, gives the search file's WAL space back as the
/// checkpointer does the database's: cut to zero bytes if larger than
/// [`wal::KEEP_QUIET_WAL`], without waiting for a search still
/// reading it (tried again at the next idle wake-up). Whether it is done
/// with (cut, or small enough to keep).
fn cut_quiet_wal(conn: &Connection, wal: Option<&str>) -> bool {
    let size = wal
        .and_then(|wal| std::fs::metadata(wal).ok())
        .map_or(0, |meta| meta.len());
    if size <= wal::KEEP_QUIET_WAL {
        return true;
    }
    if conn.busy_timeout(Duration::ZERO).is_err() {
        return false;
    }
    let cut = wal::cut_quiet_wal(conn, "search", wal);
    if let Err(error) = conn.busy_timeout(wal::BUSY_TIMEOUT) {
        tracing::warn!(%error, "cannot set the search indexer's busy timeout back");
    }
    cut
}

/// What a pass applied.
struct Pass {
    /// The last log id applied.
    through: i64,
    /// The last log id whose deletions are all done.
    cleared: i64,
    /// Whether work is left that the pass could have done
    /// ([`PASS_TIME`]).
    cut: bool,
}

/// One pass: what it applied, or `None` if the log had nothing new.
///
/// In two transactions. The first reads the main database: the log rows
/// past the applied id, and the current messages of their ranges, in one
/// snapshot. It is short on purpose: while a reader holds a snapshot, no
/// checkpoint can copy the WAL frames written after it back, and the WAL
/// only starts over once one has copied all of them; a snapshot held for
/// as long as a pass writes (seconds, deleting an erasure's rows) let the
/// WAL grow by gigabytes under appends. The second writes the search file
/// alone. What the first read is current as of its log rows, or newer (a
/// later change is also in a later log row, applied again then).
fn pass(conn: &Connection, rows: i64) -> Result<Option<Pass>> {
    let work = in_transaction(conn, "BEGIN", |conn| read_log(conn, rows))?;
    match work {
        None => Ok(None),
        // Deferred, but the search file's write lock is taken first: a
        // transaction that has read a file before it writes gets
        // SQLITE_BUSY at once if the lock is held, without waiting out
        // the busy timeout (its snapshot might be stale by then).
        Some(Work::Rebuild) => in_transaction(
            conn,
            "BEGIN; UPDATE search.search_applied SET log_id = log_id",
            |conn| {
                rebuild(conn).map(|through| {
                    Some(Pass {
                        through,
                        cleared: through,
                        cut: false,
                    })
                })
            },
        ),
        Some(Work::Ranges { applied, ranges }) => in_transaction(
            conn,
            "BEGIN; UPDATE search.search_applied SET log_id = log_id",
            |conn| apply_ranges(conn, applied, ranges).map(Some),
        ),
    }
}

/// Runs `body` in a transaction `begin` starts: committed if it answers
/// `Some`, rolled back otherwise.
fn in_transaction<T>(
    conn: &Connection,
    begin: &str,
    body: impl FnOnce(&Connection) -> Result<Option<T>>,
) -> Result<Option<T>> {
    conn.execute_batch(begin)?;
    let result = body(conn);
    let finished = match &result {
        Ok(Some(_)) => conn.execute_batch("COMMIT"),
        _ => conn.execute_batch("ROLLBACK"),
    };
    match (result, finished) {
        (Ok(done), Ok(())) => Ok(done),
        (Err(error), _) => Err(error),
        (Ok(_), Err(error)) => {
            if !conn.is_autocommit() {
                let _ = conn.execute_batch("ROLLBACK");
            }
            Err(error.into())
        }
    }
}

/// What a pass has to do.
enum Work {
    /// Build the index from every message.
    Rebuild,
    /// Apply these log rows past `applied`, in id order (perhaps none,
    /// if only the backlog has work).
    Ranges { applied: i64, ranges: Vec<Range> },
}

/// One log row and the messages of its range as they are now: `(row id
/// in the index, text)`, empty texts left out.
struct Range {
    id: i64,
    session_key: i64,
    from: i64,
    until: i64,
    texts: Vec<(i64, String)>,
    /// The range has no message left: a session deleted or erased, or
    /// messages rolled back. Its index rows are then only recorded in
    /// `unindex_backlog` and deleted later, when no log row waits: with
    /// FTS5's secure-delete a deletion costs milliseconds a message, and
    /// searches wait for the log. A search cannot find them meanwhile (it
    /// joins the messages). A later range of the same session deletes
    /// them first, since its messages may reuse their sequences.
    deferred: bool,
}

fn read_log(conn: &Connection, pass_rows: i64) -> Result<Option<Work>> {
    let applied: Option<i64> = conn
        .query_row("SELECT log_id FROM search.search_applied", [], |row| {
            row.get(0)
        })
        .optional()?;
    let Some(applied) = applied else {
        return Ok(Some(Work::Rebuild));
    };
    let mut ranges = Vec::new();
    {
        let mut log = conn.prepare_cached(
            "SELECT id, session_key, from_sequence, until_sequence FROM main.search_log \
             WHERE id > ?1 ORDER BY id LIMIT ?2",
        )?;
        let mut rows = log.query([applied, pass_rows])?;
        while let Some(row) = rows.next()? {
            ranges.push(Range {
                id: row.get(0)?,
                session_key: row.get(1)?,
                from: row.get(2)?,
                until: row.get(3)?,
                texts: Vec::new(),
                deferred: true,
            });
        }
    }
    if ranges.is_empty() && !backlog_waits(conn)? {
        return Ok(None);
    }
    let mut read = conn.prepare_cached(
        "SELECT sequence, redacted, body, wire FROM main.messages \
         WHERE session_key = ?1 AND sequence >= ?2 AND sequence < ?3",
    )?;
    for range in &mut ranges {
        let mut rows = read.query([range.session_key, range.from, range.until])?;
        while let Some(row) = rows.next()? {
            range.deferred = false;
            if row.get::<_, bool>(1)? {
                continue;
            }
            let sequence: i64 = row.get(0)?;
            let text = text_of(content(row, 2, 3)?)?;
            if !text.is_empty() {
                range
                    .texts
                    .push((search_rowid(range.session_key, sequence), text));
            }
        }
    }
    Ok(Some(Work::Ranges { applied, ranges }))
}

/// Whether `unindex_backlog` holds a deletion to do.
fn backlog_waits(conn: &Connection) -> rusqlite::Result<bool> {
    conn.query_row(
        "SELECT EXISTS (SELECT 1 FROM search.unindex_backlog)",
        [],
        |row| row.get(0),
    )
}

/// The last log id through which every deletion is done, the log being
/// applied through `through`.
fn cleared(conn: &Connection, through: i64) -> rusqlite::Result<i64> {
    let first: Option<i64> = conn.query_row(
        "SELECT min(log_id) FROM search.unindex_backlog",
        [],
        |row| row.get(0),
    )?;
    Ok(first.map_or(through, |first| first - 1))
}

/// Applies `ranges` (the log rows past `applied`) in order, in the
/// search file's write transaction, then deletions from the backlog,
/// until the pass has taken [`PASS_TIME`]: the transaction holds the
/// search file, and searches wait for it.
fn apply_ranges(conn: &Connection, applied: i64, ranges: Vec<Range>) -> Result<Pass> {
    let started = Instant::now();
    let budget_left = || started.elapsed() < PASS_TIME;
    let mut defer = conn.prepare_cached(
        "INSERT INTO search.unindex_backlog (log_id, session_key, from_sequence, until_sequence) \
         VALUES (?1, ?2, ?3, ?4)",
    )?;
    // Every range's old rows out first, then the current messages of all
    // of them in row id order (FTS5 starts a new segment whenever a row id
    // goes back), each once.
    let mut texts = BTreeMap::new();
    let mut through = applied;
    let mut cut = false;
    for range in ranges {
        if through != applied && !budget_left() {
            cut = true;
            break;
        }
        through = range.id;
        if range.deferred {
            defer.execute([range.id, range.session_key, range.from, range.until])?;
            continue;
        }
        unindex_backlog(conn, "session_key = ?1", range.session_key)?;
        unindex(conn, range.session_key, range.from, range.until)?;
        texts.extend(range.texts);
    }
    insert_texts(conn, texts)?;
    conn.prepare_cached("UPDATE search.search_applied SET log_id = ?1")?
        .execute([through])?;
    // Then the backlog, oldest first, one deletion at least: after merging
    // the index's segments a step at a time while that is left to do, for
    // the time left. A secure delete of a row visits every segment that
    // holds its terms, so it is far cheaper in a merged index: 2,000 rows
    // of 150 words took 3.4 s in the segments that passes of 240 rows
    // leave, 0.44 s once merged, and merging those 60,000 rows took
    // 0.43 s in steps of at most 0.03 s (BENCHMARKS.md).
    if !cut && backlog_waits(conn)? {
        merge_segments(conn, &budget_left)?;
    }
    let mut oldest =
        conn.prepare_cached("SELECT log_id FROM search.unindex_backlog ORDER BY log_id LIMIT 1")?;
    let mut first = true;
    while !cut {
        let Some(log_id) = oldest
            .query_row([], |row| row.get::<_, i64>(0))
            .optional()?
        else {
            break;
        };
        if !first && !budget_left() {
            cut = true;
            break;
        }
        first = false;
        unindex_backlog(conn, "log_id = ?1", log_id)?;
    }
    Ok(Pass {
        through,
        cleared: cleared(conn, through)?,
        cut,
    })
}

/// Merges the index's segments in steps of [`MERGE_PAGES`] while
/// `time_left` and a step still merges something.
fn merge_segments(conn: &Connection, time_left: &dyn Fn() -> bool) -> Result<()> {
    let mut merge = conn.prepare_cached(
        "INSERT INTO search.message_search (message_search, rank) VALUES ('merge', ?1)",
    )?;
    while time_left() {
        let before = conn.total_changes();
        merge.execute([MERGE_PAGES])?;
        // FTS5's own test for a merge that found nothing to do.
        if conn.total_changes() - before < 2 {
            break;
        }
    }
    Ok(())
}

/// Deletes the index rows of messages `from..until` of a session.
fn unindex(conn: &Connection, session_key: i64, from: i64, until: i64) -> Result<()> {
    conn.prepare_cached("DELETE FROM search.message_search WHERE rowid >= ?1 AND rowid < ?2")?
        .execute([
            search_rowid(session_key, from),
            search_rowid(session_key, until),
        ])?;
    Ok(())
}

/// Does the deletions of `unindex_backlog` that `filter` (of `?1`) picks,
/// and forgets them.
fn unindex_backlog(conn: &Connection, filter: &str, value: i64) -> Result<()> {
    let ranges: Vec<(i64, i64, i64)> = conn
        .prepare_cached(&format!(
            "SELECT session_key, from_sequence, until_sequence \
             FROM search.unindex_backlog WHERE {filter}"
        ))?
        .query_map([value], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)))?
        .collect::<rusqlite::Result<_>>()?;
    for (session_key, from, until) in ranges {
        unindex(conn, session_key, from, until)?;
    }
    conn.prepare_cached(&format!(
        "DELETE FROM search.unindex_backlog WHERE {filter}"
    ))?
    .execute([value])?;
    Ok(())
}

/// The index built anew from every message, through the log's end.
fn rebuild(conn: &Connection) -> Result<i64> {
    let end: i64 = conn.query_row(
        "SELECT coalesce(max(id), 0) FROM main.search_log",
        [],
        |row| row.get(0),
    )?;
    conn.execute_batch(&format!(
        "DELETE FROM search.unindex_backlog; \
         DROP TABLE IF EXISTS search.message_search; {CREATE_INDEX};"
    ))?;
    let mut count = 0_u64;
    {
        let mut read = conn.prepare(
            "SELECT session_key, sequence, body, wire FROM main.messages WHERE redacted = 0 \
             ORDER BY session_key, sequence",
        )?;
        let mut insert =
            conn.prepare("INSERT INTO search.message_search (rowid, text) VALUES (?1, ?2)")?;
        let mut rows = read.query([])?;
        while let Some(row) = rows.next()? {
            let text = text_of(content(row, 2, 3)?)?;
            if !text.is_empty() {
                insert.execute(rusqlite::params![
                    search_rowid(row.get(0)?, row.get(1)?),
                    text
                ])?;
                count += 1;
            }
        }
    }
    conn.execute(
        "INSERT OR REPLACE INTO search.search_applied (id, log_id) VALUES (1, ?1)",
        [end],
    )?;
    tracing::info!(messages = count, "built the search index");
    Ok(end)
}

/// The searchable text of a stored message ("" if none).
fn text_of(content: Content<'_>) -> Result<String> {
    let message = content.message()?;
    let text = control::search_text(&message);
    Ok(if text.trim().is_empty() {
        String::new()
    } else {
        text
    })
}

fn insert_texts(conn: &Connection, texts: BTreeMap<i64, String>) -> Result<()> {
    let mut insert =
        conn.prepare_cached("INSERT INTO search.message_search (rowid, text) VALUES (?1, ?2)")?;
    for (rowid, text) in texts {
        insert.execute(rusqlite::params![rowid, text])?;
    }
    Ok(())
}
