//! The SQLite backend: WAL, `synchronous = FULL`, foreign keys on.
//!
//! What it owns, each in its own module:
//! - `connections.rs`: every connection, sqlx's pool and the engine's, opened
//!   and configured in one place;
//! - `writer.rs`: the writer task every write goes through (group commit,
//!   one transaction per batch);
//! - `engine.rs`: a file database's rusqlite threads (appends and their
//!   WAL syncer, checkpoints, the search indexer, reads), started and
//!   stopped together.
//!
//! Reads use the rest of the pool (WAL lets them run beside the writer),
//! or the engine's own connections for messages and events. What keeps a
//! batch short (each measured, see BENCHMARKS.md): the writer keeps one
//! connection, so its page cache survives between batches; a 32 MiB page
//! cache; savepoint journals in memory rather than in a temporary file per
//! transaction; and WAL checkpoints beside the writer instead of inside the
//! commit that happens to cross SQLite's threshold.
//!
//! `sqlite::memory:` runs the same writer on a one-connection pool, the
//! connection kept open for the store's lifetime, without an engine.

use std::sync::Arc;

use futures_core::future::BoxFuture;
use sqlx::AnyPool;
use sqlx::migrate::Migrator;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::fault::DiskSpace;
use super::once::TakeOnce;
use super::ops::SearchWrites;
use super::rows::OwnedMessageRow;
use super::sql::{self, Backend, close_pool};
use super::writer::{Job, PendingAppend, enqueue};
use super::{CommitSink, OpenError, Page, ReadBound, SessionHandle, StoreOptions};
use crate::domain::Result;
use crate::domain::target::Origins;
use crate::wire::EncodedEvent;
use engine::Engine;
use writer::Queued;

mod appends;
pub mod backup;
mod checkpoints;
mod columns;
pub(super) mod connections;
pub(super) use connections::is_in_memory;
mod engine;
pub(super) mod ledger;
mod reads;
mod search;
mod search_file;
mod wal;
// A VFS for the WAL files of the busiest writers: FFI, so `unsafe`.
#[allow(unsafe_code)]
mod wal_writes;
mod writer;

pub(super) static MIGRATOR: Migrator = sqlx::migrate!("../migrations/sqlite");

/// Write requests that may wait for the writer before callers are held back.
const QUEUE_DEPTH: usize = 4096;

/// An open SQLite database's machinery: the writer task's queue and the
/// engine, for a file database.
pub(super) struct Sqlite {
    /// The writer task's queue; `None` asks it to stop.
    queue: mpsc::Sender<Option<Queued>>,
    writer: TakeOnce<JoinHandle<()>>,
    engine: Option<Arc<Engine>>,
}

/// Opens (creating if missing) and migrates the database, then starts the
/// engine (for a file) and the writer.
pub(super) async fn open(
    url: &str,
    sink: Arc<dyn CommitSink>,
    options: &StoreOptions,
) -> Result<(AnyPool, Sqlite), OpenError> {
    let search = options.search;
    let pool = connections::pool(url).await?;
    ledger::migrate(&pool, super::ledger::Mode::Expand).await?;
    let space = Arc::new(DiskSpace::default());
    let engine = if connections::is_in_memory(url) {
        None
    } else {
        let path = connections::file_path(url)?;
        Some(Arc::new(Engine::start(
            &path,
            &space,
            search,
            options.wal_writes,
        )?))
    };
    // A file database's search index is written by the indexer thread,
    // from the ranges writes log; in memory, by the writes themselves.
    let writes = match (search, &engine) {
        (false, _) => SearchWrites::Off,
        (true, Some(_)) => SearchWrites::Logged,
        (true, None) => SearchWrites::Inline,
    };
    let (queue, jobs) = mpsc::channel(QUEUE_DEPTH);
    let writer = tokio::spawn(writer::run(
        pool.clone(),
        jobs,
        sink,
        engine.clone(),
        space,
        writes,
    ));
    let sqlite = Sqlite {
        queue,
        writer: TakeOnce::new(writer),
        engine,
    };
    Ok((pool, sqlite))
}

impl Backend for Sqlite {
    fn write(&self, job: Box<dyn Job>) -> BoxFuture<'_, ()> {
        Box::pin(enqueue(&self.queue, Queued::Write(job)))
    }

    fn append(&self, pending: PendingAppend) -> BoxFuture<'_, ()> {
        Box::pin(enqueue(&self.queue, Queued::Append(pending)))
    }

    fn messages<'a>(
        &'a self,
        pool: &'a AnyPool,
        session: &'a SessionHandle,
        range: &'static str,
        value: i64,
        bound: ReadBound,
    ) -> BoxFuture<'a, Result<Page<OwnedMessageRow>>> {
        let Some(engine) = &self.engine else {
            return Box::pin(sql::messages(pool, session, range, value, bound));
        };
        Box::pin(async move {
            let sql = reads::unplanned(&sql::messages_statement(range));
            let params = [session.key, value, sql::limit_param(bound.rows)];
            engine.reads().messages(sql, params, bound).await
        })
    }

    fn events<'a>(
        &'a self,
        pool: &'a AnyPool,
        session_key: i64,
        after: i64,
        bound: ReadBound,
    ) -> BoxFuture<'a, Result<Page<EncodedEvent>>> {
        match &self.engine {
            Some(engine) => Box::pin(engine.reads().events(session_key, after, bound)),
            None => Box::pin(sql::events(pool, session_key, after, bound)),
        }
    }

    fn call_origins<'a>(
        &'a self,
        pool: &'a AnyPool,
        session_key: i64,
    ) -> BoxFuture<'a, Result<Origins>> {
        match &self.engine {
            Some(engine) => Box::pin(engine.reads().call_origins(session_key)),
            None => Box::pin(sql::call_origins(pool, session_key)),
        }
    }

    /// SQLite has statistics only where someone ran `ANALYZE`, and a
    /// connection reads them when it loads the schema, not when they
    /// change: a filtered listing's plan would depend on both. Without
    /// them it walks every session newest first for a filter that matches
    /// one in a thousand (8 ms at 100,000 sessions, against 0.1 ms reading
    /// the filter's index first). The store's plans name their indexes,
    /// so they hold whatever the statistics say.
    fn plans_metadata_filters(&self) -> bool {
        true
    }

    fn search_statement(&self, filters: &str, words: &[String]) -> (String, String) {
        let statement = format!(
            "SELECT s.id AS session_id, s.title, m.sequence, m.id AS message_id, m.body, m.wire, \
             snippet(message_search, 0, '**', '**', '…', 16) AS snippet \
             FROM search.message_search f \
             JOIN messages m ON m.session_key = (f.rowid >> 32) \
              AND m.sequence = (f.rowid & 4294967295) \
             JOIN sessions s ON s.key = m.session_key \
             WHERE message_search MATCH $1 AND s.tenant = $2 AND s.deleted = 0{filters} \
             ORDER BY f.rank, f.rowid LIMIT $3 OFFSET $4"
        );
        // Each word a quoted FTS5 string: all must occur, no operators.
        let words = words
            .iter()
            .map(|w| format!("\"{}\"", w.replace('"', "\"\"")))
            .collect::<Vec<_>>()
            .join(" ");
        (statement, words)
    }

    fn search_ready<'a>(&'a self, pool: &'a AnyPool) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let Some(indexer) = self.engine.as_ref().and_then(|engine| engine.indexer()) else {
                // In memory, writes index their own words; switched off,
                // there is nothing to wait for.
                return Ok(());
            };
            // Every write acknowledged so far is indexed before the query.
            indexer.caught_up(last_logged(pool).await?).await
        })
    }

    fn scrub<'a>(&'a self, pool: &'a AnyPool) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let Some(engine) = &self.engine else {
                // In memory: no file to scrub.
                return Ok(());
            };
            // The indexer has done every deletion logged so far (with
            // FTS5's secure-delete), then both WAL files go.
            if let Some(indexer) = engine.indexer() {
                indexer.cleared(last_logged(pool).await?).await?;
            }
            engine.truncate_wal().await
        })
    }

    fn queued_writes(&self) -> usize {
        self.queue.max_capacity() - self.queue.capacity()
    }

    fn close<'a>(&'a self, pool: &'a AnyPool) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            // The writer finishes what is queued, then stops.
            let _ = self.queue.send(None).await;
            self.writer.join().await;
            if let Some(engine) = &self.engine {
                engine.stop().await;
            }
            close_pool(pool).await;
            if let Some(engine) = &self.engine {
                engine.keep_wal_files().await;
            }
        })
    }
}

/// The last id in the search log: every write acknowledged so far logged
/// its changes at or before it.
async fn last_logged(pool: &AnyPool) -> Result<i64> {
    Ok(
        sqlx::query_scalar("SELECT coalesce(max(id), 0) FROM search_log")
            .fetch_one(pool)
            .await?,
    )
}
