//! Message and event-log reads straight through the SQLite engine
//! (rusqlite), on tokio's blocking threads.
//!
//! sqlx's SQLite driver hands every row from its worker thread to the async
//! caller one at a time; for a long history that hop, not the engine, is
//! most of the read (BENCHMARKS.md: a 10,000-message export spent 60 ms in
//! sqlx against 16 ms in the engine). Here a page of messages, or of events
//! for a WatchSession replay, is read on one blocking thread and handed
//! over whole. Only file
//! databases take this path: `sqlite::memory:` lives inside sqlx's one
//! connection, and reads there go through sqlx like every other read.
//!
//! The connections are read-only (`query_only`) and WAL lets them read
//! beside the writer, as sqlx's read pool does.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use rusqlite::{Connection, OptionalExtension as _};

use super::columns::{blob, content, text};
use super::connections::{self, Role};
use crate::domain::target::{Origin, Origins};
use crate::domain::{Error, Result};
use crate::store::rows::{
    Content, EventPage, EventRow, GatheredEvent, MessageRow, OwnedMessageRow,
};
use crate::store::sql::CALL_ORIGINS;
use crate::store::text::unescape;
use crate::store::{Page, ReadBound, WalWrites};
use crate::wire::EncodedEvent;

/// A session's events in a range of revisions, in order (as `sql::events`,
/// without the join: [`EngineReads::events`]). Every bound is written
/// `(?N + 0)`, the upper one too, so the planner never looks at a value
/// (see [`unplanned`]): with `revision <= ?3` the statement was prepared
/// again on every page, 5% of a replay's server CPU.
const EVENTS: &str = "SELECT revision, time, body, wire, refers_from, refers_until FROM events \
     WHERE session_key = (?1 + 0) AND revision > (?2 + 0) AND revision <= (?3 + 0) ORDER BY revision";

/// The first message the events in a range of revisions refer to.
const FIRST_REFERRED: &str = "SELECT refers_from FROM events \
     WHERE session_key = (?1 + 0) AND revision > (?2 + 0) AND revision <= (?3 + 0) \
     AND refers_until > refers_from ORDER BY revision LIMIT 1";

/// A session's messages from a sequence on, in order: the content of the
/// messages its events refer to.
const CONTENTS: &str = "SELECT sequence, body, wire FROM messages \
     WHERE session_key = (?1 + 0) AND sequence >= (?2 + 0) ORDER BY sequence";

/// `sql` (PostgreSQL-style `$1`, `$2`, `$3`) for the engine, with `?1` and
/// `?2` written as `(?N + 0)`. The bundled SQLite has STAT4, and after an
/// `ANALYZE` the planner looks at a bound value it compares an indexed
/// column with; a statement whose plan used a value is re-prepared every
/// time that parameter is bound again, which for an export of 10,000
/// messages was 5% of the server's CPU. The planner cannot look into
/// `?N + 0`, and it still uses the index (`session_key = … AND sequence >
/// …`).
pub(super) fn unplanned(sql: &str) -> String {
    sql.replace("$1", "(?1 + 0)")
        .replace("$2", "(?2 + 0)")
        .replace('$', "?")
}

/// Idle connections kept for the next read.
const MAX_IDLE: usize = 8;
/// A small pool of read-only engine connections to one database file.
pub(super) struct EngineReads {
    path: PathBuf,
    idle: Mutex<Vec<Connection>>,
    /// Closed with the store: connections are no longer kept.
    closed: AtomicBool,
}

impl EngineReads {
    /// Reads for the database file at `path`.
    pub(super) fn new(path: PathBuf) -> Arc<Self> {
        Arc::new(EngineReads {
            path,
            idle: Mutex::new(Vec::new()),
            closed: AtomicBool::new(false),
        })
    }

    /// Runs `sql` (as [`unplanned`] writes it; its parameters the session's
    /// key, a bound, a limit) and copies out the message rows it selects,
    /// in its order, stepping no further than `bound` allows.
    pub(super) async fn messages(
        self: &Arc<Self>,
        sql: String,
        params: [i64; 3],
        bound: ReadBound,
    ) -> Result<Page<OwnedMessageRow>> {
        let this = Arc::clone(self);
        tokio::task::spawn_blocking(move || {
            this.with_connection(|conn| {
                let mut statement = conn.prepare_cached(&sql)?;
                let mut rows = statement.query(params)?;
                let mut page = Page {
                    rows: Vec::new(),
                    cut: false,
                };
                let mut bytes = 0;
                let mut arena = bytes::BytesMut::new();
                while let Some(row) = rows.next()? {
                    // The size is taken where SQLite holds the content: a
                    // row past the bound is never copied.
                    let stored = MessageRow {
                        id: row.get(0)?,
                        sequence: row.get(1)?,
                        produced_by_call_id: row.get(2)?,
                        body: text(row, 3)?,
                        wire: blob(row, 6)?,
                        create_time: row.get(4)?,
                        redacted: row.get(5)?,
                    };
                    let size = stored.content_len();
                    if !bound.admits(page.rows.len(), bytes, size) {
                        page.cut = true;
                        break;
                    }
                    bytes += size;
                    page.rows.push((stored.into_owned_in(&mut arena), size));
                }
                Ok(page)
            })
        })
        .await
        .map_err(Error::storage)?
    }

    /// The session's events after revision `after`, within `bound`, in
    /// revision order (as `SqlStore::read_events_bounded`).
    pub(super) async fn events(
        self: &Arc<Self>,
        session_key: i64,
        after: i64,
        bound: ReadBound,
    ) -> Result<Page<EncodedEvent>> {
        let this = Arc::clone(self);
        let limit = i64::try_from(bound.rows).unwrap_or(i64::MAX);
        tokio::task::spawn_blocking(move || {
            this.with_connection(|conn| {
                // Two ordered scans, not a join (which seeks the messages
                // once per event): the events, and beside them the
                // messages they refer to, in one read transaction so both
                // see one snapshot. The messages come in the events'
                // order: an event refers to messages appended after those
                // of every earlier event that still refers to any (a
                // rollback writes out whole the events of the messages it
                // removes before their sequences are taken again).
                let tx = conn.unchecked_transaction()?;
                let mut events = tx.prepare_cached(EVENTS)?;
                let mut contents = tx.prepare_cached(CONTENTS)?;
                let until = after.saturating_add(limit);
                // The first message referred to, where the messages' scan starts.
                let first: Option<i64> = tx
                    .prepare_cached(FIRST_REFERRED)?
                    .query_row([session_key, after, until], |row| row.get(0))
                    .optional()?;
                let mut messages = match first {
                    Some(first) => Some(contents.query([session_key, first])?),
                    None => None,
                };
                let mut rows = events.query([session_key, after, until])?;
                // A message read ahead of the event that refers to it.
                let mut ahead: Option<(i64, String, Option<Vec<u8>>)> = None;
                let mut page = EventPage::new(bound);
                while let Some(row) = rows.next()? {
                    let mut event = GatheredEvent::new(&event_row(row)?)?;
                    if let (Some(refers), Some(messages)) = (event.refers(), messages.as_mut()) {
                        if let Some((sequence, body, wire)) = ahead.take() {
                            if sequence >= refers.end {
                                ahead = Some((sequence, body, wire));
                            } else if sequence >= refers.start {
                                event.add_content(sequence, Content::of(&body, wire.as_deref()))?;
                            }
                        }
                        while ahead.is_none() {
                            let Some(message) = messages.next()? else {
                                break;
                            };
                            let sequence: i64 = message.get(0)?;
                            if sequence >= refers.end {
                                ahead = Some((sequence, message.get(1)?, message.get(2)?));
                            } else if sequence >= refers.start {
                                // Copied once, from where SQLite holds it.
                                event.add_content(sequence, content(message, 1, 2)?)?;
                            }
                        }
                    }
                    if !page.add(event)? {
                        break;
                    }
                }
                page.finish()
            })
        })
        .await
        .map_err(Error::storage)?
    }

    /// The provider and model of each provider call of a session, by id
    /// (as `sql::call_origins`), read in one go.
    pub(super) async fn call_origins(self: &Arc<Self>, session_key: i64) -> Result<Origins> {
        let this = Arc::clone(self);
        tokio::task::spawn_blocking(move || {
            this.with_connection(|conn| {
                let mut statement = conn.prepare_cached(&unplanned(CALL_ORIGINS))?;
                let mut rows = statement.query([session_key])?;
                let mut origins = Origins::default();
                while let Some(row) = rows.next()? {
                    origins.insert(
                        row.get(0)?,
                        Origin {
                            provider: unescape(row.get(1)?),
                            model: unescape(row.get(2)?),
                        },
                    );
                }
                Ok(origins)
            })
        })
        .await
        .map_err(Error::storage)?
    }

    /// Runs `read` on an idle connection (or a new one), then keeps the
    /// connection for the next read unless enough are idle.
    fn with_connection<T>(&self, read: impl FnOnce(&Connection) -> Result<T>) -> Result<T> {
        let idle = self
            .idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop();
        let conn = match idle {
            Some(conn) => conn,
            None => self.open().map_err(Error::storage)?,
        };
        let result = read(&conn);
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        if idle.len() < MAX_IDLE && !self.closed.load(Ordering::Acquire) {
            idle.push(conn);
        }
        result
    }

    /// Closes the idle connections and keeps none from now on, so the
    /// store's own pool, closing after this, holds the database's last
    /// connection (the one that checkpoints the WAL on its way out).
    pub(super) fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }

    fn open(&self) -> rusqlite::Result<Connection> {
        connections::engine(&self.path, Role::Read, WalWrites::Direct)
    }
}

/// A row of [`EVENTS`], borrowed from the engine's.
fn event_row<'a>(row: &'a rusqlite::Row<'_>) -> rusqlite::Result<EventRow<'a>> {
    Ok(EventRow {
        revision: row.get(0)?,
        time: row.get(1)?,
        body: text(row, 2)?,
        wire: blob(row, 3)?,
        refers_from: row.get(4)?,
        refers_until: row.get(5)?,
        content: None,
    })
}
