//! Write operations, each run inside a transaction the caller owns. The SQL
//! is shared by both backends (`$N` placeholders work in SQLite and
//! PostgreSQL alike); [`Dialect`] covers the two places they differ: row
//! locking and the cross-replica commit hint.

use std::sync::Arc;

use sqlx::{AnyConnection, Row};

use super::batch;
use super::rows::{
    MESSAGE_COLUMNS, SESSION_COLUMNS, decode, encode, search_rowid, session_from_row,
    stored_message_from_row,
};
use super::text::{escape, escape_ordered};
use crate::domain::exchange::diff_full_history;
use crate::domain::{
    AppendedExchange, Change, Control, Controlled, Error, Fork, Message, NewExchange, NewSession,
    Result, Session, SessionEvent, SessionPatch, StateEntry, StoredMessage, Timestamp, control,
    ids,
};

/// The PostgreSQL channel carrying commit hints (`"<session key>:<revision>"`).
pub const NOTIFY_CHANNEL: &str = "sessionstore_commits";

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
    /// databases; `sqlite_search.rs`).
    Logged,
}

/// Records a changed message range for the SQLite indexer thread.
pub const LOG_SEARCH: &str =
    "INSERT INTO search_log (session_key, from_sequence, until_sequence) VALUES ($1, $2, $3)";

/// A write request.
#[derive(Clone)]
pub enum WriteOp {
    Create(NewSession),
    Update {
        id: String,
        patch: SessionPatch,
    },
    Delete {
        id: String,
    },
    Append(Box<NewExchange>),
    Control {
        id: String,
        control: Control,
    },
    Fork(Fork),
    /// Delete the session if its last revision is older than `idle_before`.
    DeleteIdle {
        id: String,
        idle_before: Timestamp,
    },
    /// Remove at most `limit` tombstones of sessions deleted before `before`.
    PurgeTombstones {
        before: Timestamp,
        limit: i64,
    },
}

/// A write's answer.
pub enum Written {
    Created(Session, Vec<StoredMessage>),
    Updated(Session),
    Deleted,
    Appended(i64, AppendedExchange),
    Controlled(Controlled),
    /// How many sessions a sweep removed.
    Swept(u64),
}

/// What one applied request committed: its answer and the events to
/// publish, each with its session's internal key.
pub struct Applied {
    pub written: Written,
    pub events: Vec<(i64, Arc<SessionEvent>)>,
}

/// Applies one write inside the caller's transaction.
pub async fn apply(
    conn: &mut AnyConnection,
    dialect: Dialect,
    search: SearchWrites,
    tenant: &str,
    op: WriteOp,
) -> Result<Applied> {
    let mut tx = Tx {
        conn,
        dialect,
        search,
        now: Timestamp::now(),
        events: Vec::new(),
    };
    let written = match op {
        WriteOp::Create(new) => tx.create_session(tenant, new).await?,
        WriteOp::Update { id, patch } => tx.update_session(tenant, &id, patch).await?,
        WriteOp::Delete { id } => tx.delete_session(tenant, &id, None).await?,
        WriteOp::Append(exchange) => tx.append_exchange(tenant, *exchange).await?,
        WriteOp::Control { id, control } => tx.control(tenant, &id, control).await?,
        WriteOp::Fork(fork) => tx.fork_session(tenant, fork).await?,
        WriteOp::DeleteIdle { id, idle_before } => {
            tx.delete_session(tenant, &id, Some(idle_before)).await?
        }
        WriteOp::PurgeTombstones { before, limit } => tx.purge_tombstones(before, limit).await?,
    };
    Ok(Applied {
        written,
        events: tx.events,
    })
}

/// A live session row as the write path needs it.
struct SessionRow {
    key: i64,
    session: Session,
    next_sequence: i64,
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

struct Tx<'c> {
    conn: &'c mut AnyConnection,
    dialect: Dialect,
    search: SearchWrites,
    /// The time of every revision this request makes.
    now: Timestamp,
    /// The events this request recorded, with their session keys.
    events: Vec<(i64, Arc<SessionEvent>)>,
}

impl Tx<'_> {
    /// Loads a live session, locking its row on PostgreSQL so concurrent
    /// writers to one session serialise (SQLite's writer is already alone).
    /// A lease that has run out is settled first: its `run_ended` is
    /// recorded before the caller's own change.
    async fn load_live(&mut self, tenant: &str, id: &str) -> Result<SessionRow> {
        let mut row = self.load_unsettled(tenant, id).await?;
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
            next_sequence: row.try_get("next_sequence")?,
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
        let hint = match &change {
            // Other replicas drop the buffered deltas of a run that closed.
            Change::ExchangeAppended(appended) if !appended.run_id.is_empty() => {
                format!("{session_key}:{revision}:{}", appended.run_id)
            }
            Change::RunEnded { run_id, .. } => format!("{session_key}:{revision}:{run_id}"),
            _ => format!("{session_key}:{revision}"),
        };
        let event = SessionEvent {
            revision,
            time: self.now,
            change,
        };
        sqlx::query(
            "INSERT INTO events (session_key, revision, time, body) VALUES ($1, $2, $3, $4)",
        )
        .bind(session_key)
        .bind(revision)
        .bind(self.now.0)
        .bind(encode(&event.change)?)
        .execute(&mut *self.conn)
        .await?;
        if self.dialect == Dialect::Postgres {
            // Delivered at commit, to every replica's listener: a hint to
            // re-read the log, never the payload.
            sqlx::query("SELECT pg_notify($1, $2)")
                .bind(NOTIFY_CHANNEL)
                .bind(hint)
                .execute(&mut *self.conn)
                .await?;
        }
        self.events.push((session_key, Arc::new(event)));
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
                 create_time, redacted) VALUES ($1, $2, $3, $4, $5, $6, $7)",
            )
            .bind(session_key)
            .bind(sequence)
            .bind(&id)
            .bind(row.call_id.as_deref())
            .bind(encode(&row.message)?)
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
        if self.search == SearchWrites::Logged {
            return self.log_search(session_key, sequence, sequence + 1).await;
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
            Dialect::Postgres => sqlx::query(
                "INSERT INTO message_search (session_key, sequence, text) VALUES ($1, $2, $3)",
            )
            .bind(session_key)
            .bind(sequence)
            .bind(text),
        };
        query.execute(&mut *self.conn).await?;
        Ok(())
    }

    /// Removes the words of messages `from..until` from the search index.
    async fn unindex(&mut self, session_key: i64, from: i64, until: i64) -> Result<()> {
        if self.search == SearchWrites::Logged {
            return self.log_search(session_key, from, until).await;
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
        sqlx::query(
            "UPDATE messages SET body = $1, redacted = $2 WHERE session_key = $3 AND sequence = $4",
        )
        .bind(encode(message)?)
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

    async fn create_session(&mut self, tenant: &str, new: NewSession) -> Result<Written> {
        let history: Vec<NewRow> = new
            .history_to_store()
            .iter()
            .cloned()
            .map(NewRow::input)
            .collect();
        let session = Session {
            id: new.id.clone().unwrap_or_else(ids::session_id),
            title: new.title,
            system_prompt: new.system_prompt,
            user: new.user,
            metadata: new.metadata,
            summary_message_id: String::new(),
            revision: 1,
            create_time: self.now,
            update_time: self.now,
            parent_session_id: String::new(),
            parent_sequence: 0,
            active_run_id: String::new(),
            run_expire_time: Timestamp(0),
        };
        let (session, messages) = self.insert_session(tenant, session, history, None).await?;
        Ok(Written::Created(session, messages))
    }

    /// Inserts a new session (revision 1) with its history and its
    /// `session_created` event. `summary_index` names the history entry
    /// that is the summary message, if any.
    async fn insert_session(
        &mut self,
        tenant: &str,
        mut session: Session,
        history: Vec<NewRow>,
        summary_index: Option<usize>,
    ) -> Result<(Session, Vec<StoredMessage>)> {
        let taken: Option<i64> = sqlx::query_scalar(
            "SELECT key FROM sessions WHERE tenant = $1 AND id = $2 AND deleted = 0",
        )
        .bind(escape(tenant))
        .bind(escape(&session.id))
        .fetch_optional(&mut *self.conn)
        .await?;
        if taken.is_some() {
            return Err(Error::SessionExists(session.id));
        }
        let count = i64::try_from(history.len()).map_err(Error::storage)?;
        let key: i64 = sqlx::query_scalar(
            "INSERT INTO sessions (tenant, id, title, system_prompt, user_name, metadata, revision, \
             next_sequence, message_count, create_time, update_time, parent_session_id, \
             parent_sequence) \
             VALUES ($1, $2, $3, $4, $5, $6, 1, $7, $7, $8, $8, $9, $10) RETURNING key",
        )
        .bind(escape(tenant))
        .bind(escape(&session.id))
        .bind(escape(&session.title))
        .bind(escape(&session.system_prompt))
        .bind(escape(&session.user))
        .bind(encode(&session.metadata)?)
        .bind(count)
        .bind(self.now.0)
        .bind(escape(&session.parent_session_id))
        .bind(session.parent_sequence)
        .fetch_one(&mut *self.conn)
        .await
        .map_err(|e| taken_or(e, &session.id))?;
        let messages = self.insert_messages(key, &session.id, 0, history).await?;
        if let Some(summary) = summary_index.and_then(|i| messages.get(i)) {
            session.summary_message_id = summary.id.clone();
            sqlx::query("UPDATE sessions SET summary_message_id = $1 WHERE key = $2")
                .bind(escape(&session.summary_message_id))
                .bind(key)
                .execute(&mut *self.conn)
                .await?;
        }
        let change = Change::SessionCreated {
            session: session.clone(),
            messages: messages.clone(),
        };
        self.insert_event(key, 1, change).await?;
        Ok((session, messages))
    }

    async fn fork_session(&mut self, tenant: &str, fork: Fork) -> Result<Written> {
        let source = self.load_live(tenant, &fork.source_id).await?;
        let last = source.next_sequence - 1;
        if fork.at_sequence > last {
            return Err(Error::invalid(
                "at_sequence",
                format!(
                    "{} is past the end of session {:?} (its last sequence is {last})",
                    fork.at_sequence, fork.source_id
                ),
            ));
        }
        let rows = sqlx::query(&format!(
            "SELECT {MESSAGE_COLUMNS} FROM messages \
             WHERE session_key = $1 AND sequence <= $2 ORDER BY sequence"
        ))
        .bind(source.key)
        .bind(fork.at_sequence)
        .fetch_all(&mut *self.conn)
        .await?;
        let mut summary_index = None;
        let mut history = Vec::with_capacity(rows.len());
        for (index, row) in rows.iter().enumerate() {
            let stored = stored_message_from_row(row, &source.session.id)?;
            if stored.id == source.session.summary_message_id {
                summary_index = Some(index);
            }
            history.push(NewRow {
                message: stored.message,
                call_id: None,
                redacted: stored.redacted,
            });
        }
        let parent = source.session;
        let session = Session {
            id: fork.new_id.unwrap_or_else(ids::session_id),
            title: parent.title,
            system_prompt: parent.system_prompt,
            user: parent.user,
            metadata: parent.metadata,
            summary_message_id: String::new(),
            revision: 1,
            create_time: self.now,
            update_time: self.now,
            parent_session_id: parent.id,
            parent_sequence: fork.at_sequence,
            active_run_id: String::new(),
            run_expire_time: Timestamp(0),
        };
        let (session, messages) = self
            .insert_session(tenant, session, history, summary_index)
            .await?;
        Ok(Written::Created(session, messages))
    }

    async fn update_session(
        &mut self,
        tenant: &str,
        id: &str,
        patch: SessionPatch,
    ) -> Result<Written> {
        let mut row = self.load_live(tenant, id).await?;
        if let Some(summary) = patch.summary_message_id.as_ref().filter(|s| !s.is_empty()) {
            let exists: Option<i64> = sqlx::query_scalar(
                "SELECT sequence FROM messages WHERE session_key = $1 AND id = $2",
            )
            .bind(row.key)
            .bind(escape(summary))
            .fetch_optional(&mut *self.conn)
            .await?;
            if exists.is_none() {
                return Err(Error::invalid(
                    "session.summary_message_id",
                    format!("names no message of session {id:?}"),
                ));
            }
        }
        let SessionPatch {
            title,
            system_prompt,
            metadata,
            summary_message_id,
        } = patch;
        let session = &mut row.session;
        if let Some(title) = title {
            session.title = title;
        }
        if let Some(prompt) = system_prompt {
            session.system_prompt = prompt;
        }
        if let Some(metadata) = metadata {
            session.metadata = metadata;
        }
        if let Some(summary) = summary_message_id {
            session.summary_message_id = summary;
        }
        sqlx::query(
            "UPDATE sessions SET title = $1, system_prompt = $2, metadata = $3, \
             summary_message_id = $4 WHERE key = $5",
        )
        .bind(escape(&session.title))
        .bind(escape(&session.system_prompt))
        .bind(encode(&session.metadata)?)
        .bind(escape(&session.summary_message_id))
        .bind(row.key)
        .execute(&mut *self.conn)
        .await?;
        let mut updated = row.session.clone();
        updated.revision += 1;
        updated.update_time = self.now;
        let change = Change::SessionUpdated {
            session: updated.clone(),
        };
        self.bump(&mut row, change).await?;
        Ok(Written::Updated(updated))
    }

    /// Deletes a session (only if idle since before `idle_before`, when given).
    async fn delete_session(
        &mut self,
        tenant: &str,
        id: &str,
        idle_before: Option<Timestamp>,
    ) -> Result<Written> {
        let mut row = self.load_unsettled(tenant, id).await?;
        if idle_before.is_some_and(|cutoff| row.session.update_time >= cutoff) {
            return Ok(Written::Swept(0));
        }
        let key = row.key;
        for sql in [
            "DELETE FROM idempotency_keys WHERE session_key = $1",
            "DELETE FROM messages WHERE session_key = $1",
            "DELETE FROM provider_calls WHERE session_key = $1",
            "DELETE FROM events WHERE session_key = $1",
            "DELETE FROM session_state WHERE session_key = $1",
        ] {
            sqlx::query(sql).bind(key).execute(&mut *self.conn).await?;
        }
        self.unindex(key, 0, 1 << 32).await?;
        sqlx::query(
            "UPDATE sessions SET deleted = 1, message_count = 0, run_id = '', run_expire_time = 0 \
             WHERE key = $1",
        )
        .bind(key)
        .execute(&mut *self.conn)
        .await?;
        self.bump(&mut row, Change::SessionDeleted).await?;
        Ok(match idle_before {
            Some(_) => Written::Swept(1),
            None => Written::Deleted,
        })
    }

    async fn purge_tombstones(&mut self, before: Timestamp, limit: i64) -> Result<Written> {
        // Their events, and nothing else, are still there; the foreign keys cascade.
        let purged = sqlx::query(
            "DELETE FROM sessions WHERE key IN (SELECT key FROM sessions \
             WHERE deleted = 1 AND update_time < $1 ORDER BY update_time LIMIT $2)",
        )
        .bind(before.0)
        .bind(limit)
        .execute(&mut *self.conn)
        .await?;
        Ok(Written::Swept(purged.rows_affected()))
    }

    /// The first result of an earlier request with this idempotency key, if any.
    async fn earlier_result(
        &mut self,
        tenant: &str,
        request_id: &str,
        fingerprint: &[u8],
    ) -> Result<Option<Written>> {
        let earlier: Option<(Vec<u8>, i64, i64)> = sqlx::query_as(
            "SELECT fingerprint, session_key, revision FROM idempotency_keys \
             WHERE tenant = $1 AND request_id = $2",
        )
        .bind(escape(tenant))
        .bind(escape(request_id))
        .fetch_optional(&mut *self.conn)
        .await?;
        let Some((earlier_fingerprint, key, revision)) = earlier else {
            return Ok(None);
        };
        if earlier_fingerprint != fingerprint {
            return Err(Error::IdempotencyConflict(request_id.to_owned()));
        }
        let body: String =
            sqlx::query_scalar("SELECT body FROM events WHERE session_key = $1 AND revision = $2")
                .bind(key)
                .bind(revision)
                .fetch_one(&mut *self.conn)
                .await?;
        let Change::ExchangeAppended(mut first) = decode::<Change>(&body)? else {
            return Err(Error::storage(std::io::Error::other(
                "idempotency key points at a non-append event",
            )));
        };
        first.replayed = true;
        Ok(Some(Written::Appended(revision, first)))
    }

    /// An append on the general path: the steps a bulk run defers, then
    /// the decider ([`batch::append_loaded`]), the one place the rules of
    /// an append live.
    async fn append_exchange(&mut self, tenant: &str, exchange: NewExchange) -> Result<Written> {
        // Idempotency first: a retry gets the first result even if it would
        // now fail another check (a stale expected_next_sequence, say).
        let fingerprint = (!exchange.request_id.is_empty()).then(|| exchange.fingerprint());
        if let Some(fingerprint) = &fingerprint
            && let Some(first) = self
                .earlier_result(tenant, &exchange.request_id, fingerprint)
                .await?
        {
            return Ok(first);
        }

        // Settles an expired lease first.
        let row = self.load_live(tenant, &exchange.session_id).await?;
        if self.dialect == Dialect::Postgres
            && let Some(fingerprint) = &fingerprint
            && let Some(first) = self
                .earlier_result(tenant, &exchange.request_id, fingerprint)
                .await?
        {
            // A concurrent retry committed while we waited for the row lock.
            return Ok(first);
        }
        let history_from = if exchange.full_history.is_empty() {
            None
        } else {
            // The lease and sequence come before the diff, as for any append.
            batch::admit(&row.session, row.next_sequence, &exchange)?;
            let bodies: Vec<String> = sqlx::query_scalar(
                "SELECT body FROM messages WHERE session_key = $1 ORDER BY sequence",
            )
            .bind(row.key)
            .fetch_all(&mut *self.conn)
            .await?;
            let stored = bodies
                .iter()
                .map(|b| decode::<Message>(b))
                .collect::<Result<Vec<_>>>()?;
            let from =
                diff_full_history(&exchange.full_history, &row.session.system_prompt, &stored)?;
            if from >= exchange.full_history.len() && exchange.provider_call.is_none() {
                return Err(Error::invalid(
                    "full_history",
                    "holds no message beyond the stored history and there is no provider_call: nothing to write",
                ));
            }
            Some(from)
        };
        let loaded = batch::Loaded {
            key: row.key,
            next_sequence: row.next_sequence,
            session: row.session,
        };
        let applied = batch::append_loaded(
            self.conn,
            self.dialect,
            self.search,
            tenant,
            &exchange,
            loaded,
            history_from,
            self.now,
        )
        .await?;
        self.events.extend(applied.events);
        Ok(applied.written)
    }

    async fn control(&mut self, tenant: &str, id: &str, control: Control) -> Result<Written> {
        let mut row = self.load_live(tenant, id).await?;
        if let Some(run_id) = control.transcript_run() {
            Self::check_lease(&row, run_id)?;
        }
        let controlled = match control {
            Control::BeginRun {
                run_id,
                lease_micros,
            } => self.begin_run(&mut row, run_id, lease_micros).await?,
            Control::EndRun { run_id } => {
                if row.session.active_run_id == run_id {
                    sqlx::query(
                        "UPDATE sessions SET run_id = '', run_expire_time = 0 WHERE key = $1",
                    )
                    .bind(row.key)
                    .execute(&mut *self.conn)
                    .await?;
                    let change = Change::RunEnded {
                        run_id,
                        expired: false,
                    };
                    Controlled::Revision(self.bump(&mut row, change).await?)
                } else {
                    Controlled::Revision(row.session.revision)
                }
            }
            Control::Rollback { after_sequence, .. } => {
                self.rollback(&mut row, after_sequence).await?
            }
            Control::Edit {
                message_id,
                message,
                reason,
                ..
            } => self.edit(&mut row, &message_id, message, reason).await?,
            Control::Redact {
                message_id, reason, ..
            } => self.redact(&mut row, &message_id, reason).await?,
            Control::SetState {
                key,
                value,
                expected_version,
            } => {
                self.set_state(&mut row, key, value, expected_version)
                    .await?
            }
            Control::DeleteState {
                key,
                expected_version,
            } => self.delete_state(&mut row, key, expected_version).await?,
            Control::SettleLease => Controlled::Revision(row.session.revision),
        };
        Ok(Written::Controlled(controlled))
    }

    async fn begin_run(
        &mut self,
        row: &mut SessionRow,
        run_id: String,
        lease_micros: i64,
    ) -> Result<Controlled> {
        Self::check_lease(row, &run_id)?;
        let expire_time = Timestamp(self.now.0.saturating_add(lease_micros));
        sqlx::query("UPDATE sessions SET run_id = $1, run_expire_time = $2 WHERE key = $3")
            .bind(escape(&run_id))
            .bind(expire_time.0)
            .bind(row.key)
            .execute(&mut *self.conn)
            .await?;
        row.session.active_run_id = run_id.clone();
        row.session.run_expire_time = expire_time;
        let change = Change::RunBegun {
            run_id,
            expire_time,
        };
        let revision = self.bump(row, change).await?;
        Ok(Controlled::RunBegun {
            revision,
            expire_time,
        })
    }

    async fn rollback(&mut self, row: &mut SessionRow, after_sequence: i64) -> Result<Controlled> {
        if after_sequence >= row.next_sequence - 1 {
            return Ok(Controlled::RolledBack {
                revision: row.session.revision,
                next_sequence: row.next_sequence,
            });
        }
        let removed: Vec<String> = sqlx::query_scalar(
            "SELECT id FROM messages WHERE session_key = $1 AND sequence > $2 ORDER BY sequence",
        )
        .bind(row.key)
        .bind(after_sequence)
        .fetch_all(&mut *self.conn)
        .await?;
        sqlx::query("DELETE FROM messages WHERE session_key = $1 AND sequence > $2")
            .bind(row.key)
            .bind(after_sequence)
            .execute(&mut *self.conn)
            .await?;
        self.unindex(row.key, after_sequence + 1, row.next_sequence)
            .await?;
        let summary_cleared = removed.contains(&row.session.summary_message_id);
        if summary_cleared {
            row.session.summary_message_id.clear();
        }
        let next_sequence = after_sequence + 1;
        sqlx::query(
            "UPDATE sessions SET next_sequence = $1, message_count = $1, summary_message_id = $2 \
             WHERE key = $3",
        )
        .bind(next_sequence)
        .bind(escape(&row.session.summary_message_id))
        .bind(row.key)
        .execute(&mut *self.conn)
        .await?;
        row.next_sequence = next_sequence;
        let change = Change::RolledBack {
            after_sequence,
            removed_message_ids: removed,
            next_sequence,
            summary_cleared,
        };
        let revision = self.bump(row, change).await?;
        Ok(Controlled::RolledBack {
            revision,
            next_sequence,
        })
    }

    async fn edit(
        &mut self,
        row: &mut SessionRow,
        message_id: &str,
        message: Message,
        reason: String,
    ) -> Result<Controlled> {
        let old = self.find_message(row, message_id).await?;
        self.replace_message(row, &old, &message, false).await?;
        let edited = StoredMessage {
            message,
            redacted: false,
            ..old.clone()
        };
        let change = Change::MessageEdited {
            message: edited.clone(),
            previous: old.message,
            reason,
        };
        let revision = self.bump(row, change).await?;
        Ok(Controlled::Edited {
            revision,
            message: edited,
        })
    }

    async fn redact(
        &mut self,
        row: &mut SessionRow,
        message_id: &str,
        reason: String,
    ) -> Result<Controlled> {
        let old = self.find_message(row, message_id).await?;
        let marker = control::redacted(&old.message);
        self.replace_message(row, &old, &marker, true).await?;
        // Erase it from the event history too: every event that carries its
        // content (its creation, and any edits).
        let pattern = format!("%{}%", old.id);
        let events: Vec<(i64, String)> = sqlx::query_as(
            "SELECT revision, body FROM events WHERE session_key = $1 AND body LIKE $2",
        )
        .bind(row.key)
        .bind(pattern)
        .fetch_all(&mut *self.conn)
        .await?;
        for (revision, body) in events {
            let mut change: Change = decode(&body)?;
            if control::scrub(&mut change, &old.id) {
                sqlx::query("UPDATE events SET body = $1 WHERE session_key = $2 AND revision = $3")
                    .bind(encode(&change)?)
                    .bind(row.key)
                    .bind(revision)
                    .execute(&mut *self.conn)
                    .await?;
            }
        }
        let change = Change::MessageRedacted {
            message_id: old.id,
            sequence: old.sequence,
            reason,
        };
        Ok(Controlled::Revision(self.bump(row, change).await?))
    }

    /// The current version of a state entry, if it exists.
    async fn state_version(&mut self, row: &SessionRow, key: &str) -> Result<Option<i64>> {
        Ok(sqlx::query_scalar(
            "SELECT version FROM session_state WHERE session_key = $1 AND key = $2",
        )
        .bind(row.key)
        .bind(escape_ordered(key))
        .fetch_optional(&mut *self.conn)
        .await?)
    }

    async fn set_state(
        &mut self,
        row: &mut SessionRow,
        key: String,
        value: String,
        expected_version: Option<i64>,
    ) -> Result<Controlled> {
        let current = self.state_version(row, &key).await?;
        check_version(&key, expected_version, current)?;
        if current.is_none() {
            let entries: i64 =
                sqlx::query_scalar("SELECT COUNT(*) FROM session_state WHERE session_key = $1")
                    .bind(row.key)
                    .fetch_one(&mut *self.conn)
                    .await?;
            if entries >= control::MAX_STATE_ENTRIES {
                return Err(Error::LimitExceeded {
                    field: "key".into(),
                    limit: "max_state_entries",
                    description: format!(
                        "the session already holds {} state entries, the most allowed",
                        control::MAX_STATE_ENTRIES
                    ),
                });
            }
        }
        let version = row.session.revision + 1;
        sqlx::query(
            "INSERT INTO session_state (session_key, key, value, version, update_time) \
             VALUES ($1, $2, $3, $4, $5) ON CONFLICT (session_key, key) \
             DO UPDATE SET value = excluded.value, version = excluded.version, \
             update_time = excluded.update_time",
        )
        .bind(row.key)
        .bind(escape_ordered(&key))
        .bind(escape(&value))
        .bind(version)
        .bind(self.now.0)
        .execute(&mut *self.conn)
        .await?;
        let entry = StateEntry {
            key: key.clone(),
            value: value.clone(),
            version,
            update_time: self.now,
        };
        let change = Change::StateChanged {
            key,
            value,
            version,
            deleted: false,
        };
        self.bump(row, change).await?;
        Ok(Controlled::State(entry))
    }

    async fn delete_state(
        &mut self,
        row: &mut SessionRow,
        key: String,
        expected_version: Option<i64>,
    ) -> Result<Controlled> {
        let Some(current) = self.state_version(row, &key).await? else {
            return Err(Error::StateNotFound(key));
        };
        check_version(&key, expected_version, Some(current))?;
        sqlx::query("DELETE FROM session_state WHERE session_key = $1 AND key = $2")
            .bind(row.key)
            .bind(escape_ordered(&key))
            .execute(&mut *self.conn)
            .await?;
        let change = Change::StateChanged {
            key,
            value: String::new(),
            version: row.session.revision + 1,
            deleted: true,
        };
        Ok(Controlled::Revision(self.bump(row, change).await?))
    }
}

/// Checks `expected_version` (0: must not exist) against the current version.
fn check_version(key: &str, expected: Option<i64>, current: Option<i64>) -> Result<()> {
    match expected {
        Some(expected) if expected != current.unwrap_or(0) => Err(Error::StateVersionMismatch {
            key: key.to_owned(),
            expected,
            actual: current.unwrap_or(0),
        }),
        _ => Ok(()),
    }
}

/// Maps a unique violation on a session insert to "already exists" (two
/// creators raced for one caller-chosen id).
fn taken_or(error: sqlx::Error, id: &str) -> Error {
    match &error {
        sqlx::Error::Database(db) if db.is_unique_violation() => {
            Error::SessionExists(id.to_owned())
        }
        _ => Error::from(error),
    }
}
