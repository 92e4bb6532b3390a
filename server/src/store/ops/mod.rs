//! Write operations, each run inside a transaction the caller owns. The SQL
//! is shared by both backends (`$N` placeholders work in SQLite and
//! PostgreSQL alike); [`Dialect`] covers the two places they differ: row
//! locking and the cross-replica commit hint.

use std::sync::Arc;

use sqlx::{AnyConnection, Row};

use super::rows::{
    EventRow, EventRows, GatheredEvent, MESSAGE_COLUMNS, SESSION_COLUMNS, encode_content,
    events_with_contents, search_rowid, session_from_row, stored_message_from_row,
};
use super::text::escape;
use crate::domain::{
    AppendedExchange, Change, Error, Fork, Message, NewExchange, NewSession, Result, Session,
    SessionEvent, SessionPatch, StoredMessage, Timestamp, control, ids,
};
use crate::wire::EncodedEvent;

mod appends;
mod approvals;
mod conversation;
mod erase;
mod keys;
mod queue;
mod sessions;
mod state;
mod sweeps;

pub use approvals::{APPROVAL_COLUMNS, AskApproval, Decide, ExpireApprovals, approval_from_row};
pub use erase::{EraseFinish, EraseMark, EraseRows, EraseTombstones, Tombstones};
pub use queue::{EndRunTakingNext, Submit, TakeInput, Withdraw};
pub use state::{DeleteSharedState, SetSharedState};

/// Which SQL dialect a connection speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dialect {
    Sqlite,
    Postgres,
}

/// Where writes put what the search index needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SearchWrites {
    /// The words, into the search table, in the write's own transaction
    /// (PostgreSQL, and SQLite in memory).
    Inline,
    /// The message ranges that changed, into `search_log`, which the
    /// SQLite indexer thread re-indexes into the search file (SQLite file
    /// databases; `sqlite/search.rs`).
    Logged,
    /// Nowhere: search is switched off (`--search off`).
    Off,
}

/// Records a changed message range for the SQLite indexer thread.
pub const LOG_SEARCH: &str =
    "INSERT INTO search_log (session_key, from_sequence, until_sequence) VALUES ($1, $2, $3)";

/// Records an event: its encoding in `wire`; `body`, where events written
/// before the log kept encodings hold their JSON, stays empty.
pub const INSERT_EVENT: &str =
    "INSERT INTO events (session_key, revision, time, body, wire) VALUES ($1, $2, $3, '', $4)";

/// What one applied write committed: its answer, and the events to
/// publish, each with its session's internal key.
pub struct Applied<T> {
    pub reply: T,
    pub events: Vec<(i64, Arc<EncodedEvent>)>,
}

/// An append's answer: the session's new revision and what was appended.
pub type Appended = (i64, AppendedExchange);

/// A write: what it changes inside the caller's transaction, and the
/// answer its caller gets. Each is `Clone` so that a write that lost a
/// race (PostgreSQL) can be applied again from the start.
pub trait Write: Clone + Send + Sync + 'static {
    type Reply: Send + 'static;

    /// Applies the write inside `tx`'s transaction.
    fn apply(
        self,
        tx: &mut Tx<'_>,
        tenant: &str,
    ) -> impl Future<Output = Result<Self::Reply>> + Send;
}

/// CreateSession, with its initial history.
#[derive(Clone)]
pub struct CreateSession(pub NewSession);

/// UpdateSession: the fields `patch` names.
#[derive(Clone)]
pub struct UpdateSession {
    pub id: String,
    pub patch: SessionPatch,
}

/// DeleteSession's first step: the session made a tombstone, gone from
/// every read with its rows still there. Answers the tombstone's key, whose
/// rows [`EraseRows`] then deletes a batch at a time and [`Unindex`]
/// takes out of search, so that deleting a long session never holds a
/// writer for more than a batch.
#[derive(Clone)]
pub struct DeleteSession {
    pub id: String,
}

/// DeleteSession's last step: the search entries of the session with key
/// `key`, once its messages are gone.
#[derive(Clone)]
pub struct Unindex {
    pub key: i64,
}

/// AppendExchange.
#[derive(Clone)]
pub struct AppendExchange(pub Box<NewExchange>);

/// A conversation-control request on one session (runs, rollback,
/// edits, state), answered with its own kind of reply.
#[derive(Clone)]
pub struct ControlSession<C> {
    pub id: String,
    pub control: C,
}

/// ForkSession.
#[derive(Clone)]
pub struct ForkSession(pub Fork);

/// The sweeper's delete: the session, if its last revision is older than
/// `idle_before`, made a tombstone as [`DeleteSession`] makes it. Answers
/// its key if it was.
#[derive(Clone)]
pub struct DeleteIdle {
    pub id: String,
    pub idle_before: Timestamp,
}

/// The sweeper's expiry: session `id`, if it has expired by `now`, made a
/// tombstone as [`DeleteSession`] makes it. Answers its key if it was.
#[derive(Clone)]
pub struct DeleteExpired {
    pub id: String,
    pub now: Timestamp,
}

/// The sweeper's purge: at most `limit` tombstones of sessions deleted
/// before `before`. Answers how many it removed.
#[derive(Clone)]
pub struct PurgeTombstones {
    pub before: Timestamp,
    pub limit: i64,
}

/// Applies one write inside the caller's transaction.
pub async fn apply<W: Write>(
    conn: &mut AnyConnection,
    dialect: Dialect,
    search: SearchWrites,
    tenant: &str,
    op: W,
) -> Result<Applied<W::Reply>> {
    let mut tx = Tx {
        conn,
        dialect,
        search,
        now: Timestamp::now(),
        events: Vec::new(),
    };
    let reply = op.apply(&mut tx, tenant).await?;
    Ok(Applied {
        reply,
        events: tx.events,
    })
}

/// A live session row as the write path needs it.
struct SessionRow {
    key: i64,
    session: Session,
}

/// A message to insert: the message, the call that produced it, whether it
/// is a redaction marker.
struct NewRow {
    message: Message,
    call_id: Option<String>,
    redacted: bool,
}

impl NewRow {
    fn input(message: Message) -> Self {
        NewRow {
            message,
            call_id: None,
            redacted: false,
        }
    }
}

/// One write's transaction: the connection, the dialect, the time of
/// its revisions and the events it recorded.
pub struct Tx<'c> {
    conn: &'c mut AnyConnection,
    dialect: Dialect,
    search: SearchWrites,
    /// The time of every revision this request makes.
    now: Timestamp,
    /// The events this request recorded, with their session keys.
    events: Vec<(i64, Arc<EncodedEvent>)>,
}

impl Tx<'_> {
    /// Loads a live session, locking its row on PostgreSQL so concurrent
    /// writers to one session serialise (SQLite's writer is already alone).
    /// A lease that has run out is settled first: its `run_ended` is
    /// recorded before the caller's own change.
    async fn load_live(&mut self, tenant: &str, id: &str) -> Result<SessionRow> {
        let mut row = self.load_unsettled(tenant, id).await?;
        if row.session.is_expired(self.now) {
            // Gone from its expire_time on; the sweeper deletes it.
            return Err(Error::SessionNotFound(id.to_owned()));
        }
        let session = &row.session;
        if !session.active_run_id.is_empty() && session.run_expire_time <= self.now {
            let run_id = std::mem::take(&mut row.session.active_run_id);
            row.session.run_expire_time = Timestamp(0);
            sqlx::query("UPDATE sessions SET run_id = '', run_expire_time = 0 WHERE key = $1")
                .bind(row.key)
                .execute(&mut *self.conn)
                .await?;
            self.bump(
                &mut row,
                Change::RunEnded {
                    run_id,
                    expired: true,
                },
            )
            .await?;
        }
        Ok(row)
    }

    async fn load_unsettled(&mut self, tenant: &str, id: &str) -> Result<SessionRow> {
        let lock = match self.dialect {
            Dialect::Sqlite => "",
            Dialect::Postgres => " FOR UPDATE",
        };
        let sql = format!(
            "SELECT {SESSION_COLUMNS} FROM sessions \
             WHERE tenant = $1 AND id = $2 AND deleted = 0{lock}"
        );
        let row = sqlx::query(&sql)
            .bind(escape(tenant))
            .bind(escape(id))
            .fetch_optional(&mut *self.conn)
            .await?
            .ok_or_else(|| Error::SessionNotFound(id.to_owned()))?;
        Ok(SessionRow {
            key: row.try_get("key")?,
            session: session_from_row(&row)?,
        })
    }

    /// Records `change` as the session's next revision (revision and
    /// `update_time` on the row, and the event). Returns the revision.
    async fn bump(&mut self, row: &mut SessionRow, change: Change) -> Result<i64> {
        row.session.revision += 1;
        row.session.update_time = self.now;
        sqlx::query("UPDATE sessions SET revision = $1, update_time = $2 WHERE key = $3")
            .bind(row.session.revision)
            .bind(self.now.0)
            .bind(row.key)
            .execute(&mut *self.conn)
            .await?;
        self.insert_event(row.key, row.session.revision, change)
            .await?;
        Ok(row.session.revision)
    }

    async fn insert_event(
        &mut self,
        session_key: i64,
        revision: i64,
        change: Change,
    ) -> Result<()> {
        let event = EncodedEvent::new(SessionEvent {
            revision,
            time: self.now,
            change,
        });
        sqlx::query(INSERT_EVENT)
            .bind(session_key)
            .bind(revision)
            .bind(self.now.0)
            .bind(event.encoding())
            .execute(&mut *self.conn)
            .await?;
        self.events.push((session_key, Arc::new(event)));
        Ok(())
    }

    /// The event at `revision` of the session `session_key`, whole: the
    /// content of the messages it refers to put back. `only_referring`
    /// reads it only if it refers to messages.
    async fn logged_event(
        &mut self,
        session_key: i64,
        revision: i64,
        only_referring: bool,
    ) -> Result<Option<EncodedEvent>> {
        let condition = if only_referring {
            "e.revision = $2 AND e.refers_until > e.refers_from"
        } else {
            "e.revision = $2"
        };
        let rows = sqlx::query(&events_with_contents(condition))
            .bind(session_key)
            .bind(revision)
            .fetch_all(&mut *self.conn)
            .await?;
        let mut events = EventRows::default();
        for row in &rows {
            // One revision: nothing is done before the last row.
            events.push(&EventRow::from_any(row)?)?;
        }
        events.finish().map(GatheredEvent::into_event).transpose()
    }

    /// Writes out whole the events that refer to the session's messages
    /// `from..until` for their content (see [`EncodedEvent::referring`]),
    /// before those messages change or go, so that a replay still shows
    /// what each event recorded.
    async fn keep_contents_in_events(
        &mut self,
        session_key: i64,
        from: i64,
        until: i64,
    ) -> Result<()> {
        let revisions: Vec<i64> = sqlx::query_scalar(
            "SELECT DISTINCT referenced_by FROM messages \
             WHERE session_key = $1 AND sequence >= $2 AND sequence < $3 AND referenced_by > 0",
        )
        .bind(session_key)
        .bind(from)
        .bind(until)
        .fetch_all(&mut *self.conn)
        .await?;
        for revision in revisions {
            if let Some(event) = self.logged_event(session_key, revision, true).await? {
                self.rewrite_event(session_key, revision, event.encoding())
                    .await?;
            }
        }
        Ok(())
    }

    /// Stores event `revision` anew, whole.
    async fn rewrite_event(&mut self, session_key: i64, revision: i64, wire: &[u8]) -> Result<()> {
        sqlx::query(
            "UPDATE events SET body = '', wire = $1, refers_from = 0, refers_until = 0 \
             WHERE session_key = $2 AND revision = $3",
        )
        .bind(wire)
        .bind(session_key)
        .bind(revision)
        .execute(&mut *self.conn)
        .await?;
        Ok(())
    }

    /// Refuses a transcript write while another run holds the lease.
    fn check_lease(row: &SessionRow, run_id: &str) -> Result<()> {
        let active = &row.session.active_run_id;
        if !active.is_empty() && active != run_id {
            return Err(Error::SessionBusy {
                active_run_id: active.clone(),
                expire_time: row.session.run_expire_time,
            });
        }
        Ok(())
    }

    /// Inserts messages at consecutive sequences from `first_sequence`, and
    /// their searchable text.
    /// Appends `rows` to the history of `row`'s session at its next
    /// sequence, contiguous, and moves its next sequence and message count
    /// on (the caller records the revision).
    async fn append_rows(
        &mut self,
        row: &mut SessionRow,
        rows: impl IntoIterator<Item = NewRow>,
    ) -> Result<Vec<StoredMessage>> {
        let first = row.session.next_sequence;
        let stored = self
            .insert_messages(row.key, &row.session.id, first, rows)
            .await?;
        let added = i64::try_from(stored.len()).map_err(Error::storage)?;
        row.session.next_sequence = first + added;
        sqlx::query(
            "UPDATE sessions SET next_sequence = $1, message_count = message_count + $2 \
             WHERE key = $3",
        )
        .bind(row.session.next_sequence)
        .bind(added)
        .bind(row.key)
        .execute(&mut *self.conn)
        .await?;
        Ok(stored)
    }

    async fn insert_messages(
        &mut self,
        session_key: i64,
        session_id: &str,
        first_sequence: i64,
        rows: impl IntoIterator<Item = NewRow>,
    ) -> Result<Vec<StoredMessage>> {
        let mut stored = Vec::new();
        for (offset, row) in (0_i64..).zip(rows) {
            let id = ids::message_id();
            let sequence = first_sequence + offset;
            sqlx::query(
                "INSERT INTO messages (session_key, sequence, id, produced_by_call_id, body, \
                 wire, create_time, redacted) VALUES ($1, $2, $3, $4, '', $5, $6, $7)",
            )
            .bind(session_key)
            .bind(sequence)
            .bind(&id)
            .bind(row.call_id.as_deref())
            .bind(encode_content(&row.message))
            .bind(self.now.0)
            .bind(i64::from(row.redacted))
            .execute(&mut *self.conn)
            .await?;
            if !row.redacted {
                self.index(session_key, sequence, &row.message).await?;
            }
            stored.push(StoredMessage {
                id,
                session_id: session_id.to_owned(),
                sequence,
                produced_by_call_id: row.call_id.unwrap_or_default(),
                message: row.message,
                create_time: self.now,
                redacted: row.redacted,
            });
        }
        Ok(stored)
    }

    /// Adds a message's words to the search index.
    async fn index(&mut self, session_key: i64, sequence: i64, message: &Message) -> Result<()> {
        match self.search {
            SearchWrites::Logged => {
                return self.log_search(session_key, sequence, sequence + 1).await;
            }
            SearchWrites::Off => return Ok(()),
            SearchWrites::Inline => {}
        }
        let text = control::search_text(message);
        if text.trim().is_empty() {
            return Ok(());
        }
        let query = match self.dialect {
            Dialect::Sqlite => {
                sqlx::query("INSERT INTO search.message_search (rowid, text) VALUES ($1, $2)")
                    .bind(search_rowid(session_key, sequence))
                    .bind(text)
            }
            // A search build (`postgres/search.rs`) may have inserted this
            // row after the write's `unindex` looked, from the message as
            // it was: the write's words replace it. (Inserting alone, the
            // write hit a unique violation once the build's page committed,
            // and was rolled back and run again whole.)
            Dialect::Postgres => sqlx::query(
                "INSERT INTO message_search (session_key, sequence, words) \
                 VALUES ($1, $2, CAST($3 AS tsvector)) \
                 ON CONFLICT (session_key, sequence) DO UPDATE SET words = EXCLUDED.words",
            )
            .bind(session_key)
            .bind(sequence)
            .bind(crate::domain::search::tsvector(&text)),
        };
        query.execute(&mut *self.conn).await?;
        Ok(())
    }

    /// Removes the words of messages `from..until` from the search index.
    async fn unindex(&mut self, session_key: i64, from: i64, until: i64) -> Result<()> {
        match self.search {
            SearchWrites::Logged => return self.log_search(session_key, from, until).await,
            SearchWrites::Off => return Ok(()),
            SearchWrites::Inline => {}
        }
        let query = match self.dialect {
            Dialect::Sqlite => {
                sqlx::query("DELETE FROM search.message_search WHERE rowid >= $1 AND rowid < $2")
                    .bind(search_rowid(session_key, from))
                    .bind(search_rowid(session_key, until))
            }
            Dialect::Postgres => sqlx::query(
                "DELETE FROM message_search WHERE session_key = $1 AND sequence >= $2 AND sequence < $3",
            )
            .bind(session_key)
            .bind(from)
            .bind(until),
        };
        query.execute(&mut *self.conn).await?;
        Ok(())
    }

    /// Records that messages `from..until` changed, for the indexer thread
    /// to re-index ([`SearchWrites::Logged`]).
    async fn log_search(&mut self, session_key: i64, from: i64, until: i64) -> Result<()> {
        sqlx::query(LOG_SEARCH)
            .bind(session_key)
            .bind(from)
            .bind(until)
            .execute(&mut *self.conn)
            .await?;
        Ok(())
    }

    async fn find_message(&mut self, row: &SessionRow, message_id: &str) -> Result<StoredMessage> {
        let found = sqlx::query(&format!(
            "SELECT {MESSAGE_COLUMNS} FROM messages WHERE session_key = $1 AND id = $2"
        ))
        .bind(row.key)
        .bind(escape(message_id))
        .fetch_optional(&mut *self.conn)
        .await?
        .ok_or_else(|| Error::MessageNotFound(message_id.to_owned()))?;
        stored_message_from_row(&found, &row.session.id)
    }

    /// Replaces a stored message's body (same id and sequence) and its
    /// searchable text.
    async fn replace_message(
        &mut self,
        row: &SessionRow,
        old: &StoredMessage,
        message: &Message,
        redacted: bool,
    ) -> Result<()> {
        self.keep_contents_in_events(row.key, old.sequence, old.sequence + 1)
            .await?;
        sqlx::query(
            "UPDATE messages SET body = '', wire = $1, redacted = $2 \
             WHERE session_key = $3 AND sequence = $4",
        )
        .bind(encode_content(message))
        .bind(i64::from(redacted))
        .bind(row.key)
        .bind(old.sequence)
        .execute(&mut *self.conn)
        .await?;
        self.unindex(row.key, old.sequence, old.sequence + 1)
            .await?;
        if !redacted {
            self.index(row.key, old.sequence, message).await?;
        }
        Ok(())
    }
}
