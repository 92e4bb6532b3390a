//! The SQLite bulk-append path straight through the engine (rusqlite), on a
//! thread of its own.
//!
//! The writer task hands each run of queued appends that starts a batch to
//! this thread, which reads, decides and writes it with [`batch::Run`] in
//! one `BEGIN IMMEDIATE … COMMIT` of its own connection. Through sqlx each of
//! the run's dozen statements was a round trip to sqlx's worker thread
//! (BENCHMARKS.md: about 0.1 ms each); here they are plain calls. What the
//! run defers, and everything else, the writer then applies through sqlx as
//! before, after this commit, so arrival order holds.
//!
//! Only file databases take this path: `sqlite::memory:` lives inside
//! sqlx's one connection.

use std::path::Path;

use rusqlite::{Connection, OpenFlags};
use tokio::sync::{mpsc, oneshot};

use super::OpenError;
use super::batch::{Outcome, Run, Statement, Value};
use super::ops::{Columns, Dialect};
use crate::domain::{Error, NewExchange, Result, Timestamp};

/// A run's requests: tenant and exchange, in arrival order.
pub(super) type Requests = Vec<(String, Box<NewExchange>)>;

/// Distinct statement texts kept prepared: multi-row statements differ by
/// row count, so a run's dozen statements take up to a few hundred texts.
const STATEMENT_CACHE: usize = 512;

struct Request {
    requests: Requests,
    reply: oneshot::Sender<(Requests, Result<Vec<Outcome>>)>,
}

/// The engine writer thread's handle.
pub(super) struct EngineAppends {
    requests: mpsc::Sender<Request>,
    stopped: oneshot::Receiver<()>,
}

impl EngineAppends {
    /// Opens a writing connection to the (migrated) database at `path`,
    /// configured as sqlx's are, and starts its thread.
    pub(super) fn start(path: &Path) -> Result<Self, OpenError> {
        let engine = |error: rusqlite::Error| OpenError::Engine(Box::new(error));
        let conn = Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(engine)?;
        // As sqlx's connections (sqlite.rs): FULL fsyncs the WAL at every
        // commit; the checkpointer task copies the WAL back.
        conn.execute_batch(
            "PRAGMA synchronous = FULL; PRAGMA foreign_keys = ON; PRAGMA busy_timeout = 10000; \
             PRAGMA cache_size = -32768; PRAGMA temp_store = MEMORY; \
             PRAGMA wal_autocheckpoint = 0",
        )
        .map_err(engine)?;
        conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
        let (requests, mut queue) = mpsc::channel::<Request>(1);
        let (done, stopped) = oneshot::channel();
        std::thread::Builder::new()
            .name("sqlite-appends".into())
            .spawn(move || {
                while let Some(Request { requests, reply }) = queue.blocking_recv() {
                    let outcome = {
                        let borrowed: Vec<(&str, &NewExchange)> = requests
                            .iter()
                            .map(|(tenant, exchange)| (tenant.as_str(), exchange.as_ref()))
                            .collect();
                        append_run(&conn, &borrowed)
                    };
                    let _ = reply.send((requests, outcome));
                }
                drop(conn);
                let _ = done.send(());
            })
            .map_err(|error| OpenError::Engine(Box::new(error)))?;
        Ok(EngineAppends { requests, stopped })
    }

    /// Appends `requests` in one committed transaction and hands them back
    /// with one outcome each; `Err` if anything failed, in which case
    /// nothing was written.
    pub(super) async fn append(&self, requests: Requests) -> (Requests, Result<Vec<Outcome>>) {
        let (reply, answer) = oneshot::channel();
        if let Err(mpsc::error::SendError(request)) =
            self.requests.send(Request { requests, reply }).await
        {
            return (request.requests, Err(thread_gone()));
        }
        match answer.await {
            Ok(answered) => answered,
            // The thread never drops a request unanswered while it runs.
            Err(_) => (Vec::new(), Err(thread_gone())),
        }
    }

    /// Stops the thread and waits until its connection is closed.
    pub(super) async fn stop(self) {
        drop(self.requests);
        let _ = self.stopped.await;
    }
}

fn thread_gone() -> Error {
    Error::storage(std::io::Error::other("the SQLite append thread stopped"))
}

/// One run in one transaction: rolled back (writing nothing) on any error.
fn append_run(conn: &Connection, requests: &[(&str, &NewExchange)]) -> Result<Vec<Outcome>> {
    let result = (|| {
        conn.prepare_cached("BEGIN IMMEDIATE")?.execute([])?;
        let mut run = Run::new(Dialect::Sqlite, requests);
        for statement in run.session_reads() {
            let mut prepared = prepare(conn, &statement)?;
            let mut rows = prepared.raw_query();
            while let Some(row) = rows.next()? {
                run.add_session(&EngineRow(row))?;
            }
        }
        for statement in run.request_id_reads() {
            let mut prepared = prepare(conn, &statement)?;
            let mut rows = prepared.raw_query();
            while let Some(row) = rows.next()? {
                run.add_stored_request_id(&EngineRow(row))?;
            }
        }
        let (outcomes, writes) = run.decide(Timestamp::now());
        for statement in &writes {
            prepare(conn, statement)?.raw_execute()?;
        }
        conn.prepare_cached("COMMIT")?.execute([])?;
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
        }
    }
    Ok(prepared)
}

struct EngineRow<'a, 'r>(&'a rusqlite::Row<'r>);

impl Columns for EngineRow<'_, '_> {
    fn int(&self, column: &str) -> Result<i64> {
        Ok(self.0.get(column)?)
    }

    fn raw_text(&self, column: &str) -> Result<String> {
        Ok(self.0.get(column)?)
    }
}
