//! Sessions: create (with an initial history), fork, update, delete.

use super::keys::Earlier;
use super::{
    CreateSession, DeleteExpired, DeleteIdle, DeleteSession, Dialect, ForkSession, NewRow,
    SessionRow, Tx, Unindex, UpdateSession, Write,
};
use crate::domain::{
    Change, Error, Fork, Metadata, NewSession, Result, Session, SessionPatch, StateChange,
    StateEntry, StoredMessage, Timestamp, ids,
};
use crate::store::rows::{MESSAGE_COLUMNS, encode, scope_entries, stored_message_from_row};
use crate::store::text::escape;

impl Tx<'_> {
    /// Creates a session with its history, its own state and its shared
    /// state changes.
    pub(super) async fn create_session(
        &mut self,
        tenant: &str,
        new: NewSession,
    ) -> Result<Created> {
        let history: Vec<NewRow> = new
            .history_to_store()
            .iter()
            .cloned()
            .map(NewRow::input)
            .collect();
        let own_state = new.own_state();
        let shared: Vec<StateChange> = new.shared_state_changes().cloned().collect();
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
            next_sequence: 0,
            expire_time: new.expire_time,
        };
        let created = self
            .insert_session(tenant, session, history, None, own_state)
            .await?;
        for change in &shared {
            self.apply_shared_change(tenant, change).await?;
        }
        Ok(created)
    }

    /// CreateSession's first answer to the call that left `earlier`: the
    /// session and history its `session_created` event recorded.
    async fn created_before(&mut self, earlier: &Earlier) -> Result<Created> {
        let event = self
            .logged_event(earlier.session_key, earlier.revision, false)
            .await?
            .ok_or_else(|| {
                Error::storage(std::io::Error::other("idempotency key without its event"))
            })?
            .decode()?;
        let Change::SessionCreated {
            session, messages, ..
        } = event.change
        else {
            return Err(Error::storage(std::io::Error::other(
                "a CreateSession key points at another event",
            )));
        };
        Ok(Created {
            key: earlier.session_key,
            session,
            messages,
        })
    }

    /// Inserts a new session (revision 1) with its history, its state
    /// entries (version 1) and its `session_created` event.
    /// `summary_index` names the history entry that is the summary
    /// message, if any.
    pub(super) async fn insert_session(
        &mut self,
        tenant: &str,
        mut session: Session,
        history: Vec<NewRow>,
        summary_index: Option<usize>,
        state: Metadata,
    ) -> Result<Created> {
        self.lock_session_id(tenant, &session.id).await?;
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
             parent_sequence, expire_time) \
             VALUES ($1, $2, $3, $4, $5, $6, 1, $7, $7, $8, $8, $9, $10, $11) RETURNING key",
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
        .bind(session.expire_time.0)
        .fetch_one(&mut *self.conn)
        .await
        .map_err(|e| taken_or(e, &session.id))?;
        self.index_metadata(key, tenant, &session.metadata).await?;
        let messages = self.insert_messages(key, &session.id, 0, history).await?;
        session.next_sequence = count;
        if let Some(summary) = summary_index.and_then(|i| messages.get(i)) {
            session.summary_message_id = summary.id.clone();
            sqlx::query("UPDATE sessions SET summary_message_id = $1 WHERE key = $2")
                .bind(escape(&session.summary_message_id))
                .bind(key)
                .execute(&mut *self.conn)
                .await?;
        }
        let mut entries = Vec::with_capacity(state.len());
        for (state_key, value) in state {
            self.put_state(key, &state_key, &value, 1).await?;
            entries.push(StateEntry {
                scope: String::new(),
                key: state_key,
                value,
                version: 1,
                update_time: self.now,
            });
        }
        let change = Change::SessionCreated {
            session: session.clone(),
            messages: messages.clone(),
            state: entries,
        };
        self.insert_event(key, 1, change).await?;
        Ok(Created {
            key,
            session,
            messages,
        })
    }

    pub(super) async fn fork_session(&mut self, tenant: &str, fork: Fork) -> Result<Created> {
        let source = self.load_live(tenant, &fork.source_id).await?;
        let last = source.session.next_sequence - 1;
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
            next_sequence: 0,
            expire_time: Timestamp(0),
        };
        self.insert_session(tenant, session, history, summary_index, Metadata::new())
            .await
    }

    pub(super) async fn update_session(
        &mut self,
        tenant: &str,
        id: &str,
        patch: SessionPatch,
    ) -> Result<Session> {
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
            expire_time,
        } = patch;
        let session = &mut row.session;
        if let Some(title) = title {
            session.title = title;
        }
        if let Some(prompt) = system_prompt {
            session.system_prompt = prompt;
        }
        let metadata_changed = metadata.is_some();
        if let Some(metadata) = metadata {
            session.metadata = metadata;
        }
        if let Some(summary) = summary_message_id {
            session.summary_message_id = summary;
        }
        if let Some(expire_time) = expire_time {
            session.expire_time = expire_time;
        }
        sqlx::query(
            "UPDATE sessions SET title = $1, system_prompt = $2, metadata = $3, \
             summary_message_id = $4, expire_time = $5 WHERE key = $6",
        )
        .bind(escape(&session.title))
        .bind(escape(&session.system_prompt))
        .bind(encode(&session.metadata)?)
        .bind(escape(&session.summary_message_id))
        .bind(session.expire_time.0)
        .bind(row.key)
        .execute(&mut *self.conn)
        .await?;
        if metadata_changed {
            self.index_metadata(row.key, tenant, &row.session.metadata)
                .await?;
        }
        let mut updated = row.session.clone();
        updated.revision += 1;
        updated.update_time = self.now;
        let change = Change::SessionUpdated {
            session: updated.clone(),
        };
        self.bump(&mut row, change).await?;
        Ok(updated)
    }

    /// Replaces the rows ListSessions' metadata filter reads for a session.
    async fn index_metadata(
        &mut self,
        session_key: i64,
        tenant: &str,
        metadata: &Metadata,
    ) -> Result<()> {
        sqlx::query("DELETE FROM session_metadata WHERE session_key = $1")
            .bind(session_key)
            .execute(&mut *self.conn)
            .await?;
        for (key, value) in metadata {
            sqlx::query(
                "INSERT INTO session_metadata (session_key, tenant, key, value) \
                 VALUES ($1, $2, $3, $4)",
            )
            .bind(session_key)
            .bind(escape(tenant))
            .bind(escape(key))
            .bind(escape(value))
            .execute(&mut *self.conn)
            .await?;
        }
        Ok(())
    }

    /// Makes the creators of one session id take turns, until the
    /// transaction ends: on PostgreSQL a transaction-scoped advisory lock
    /// on the (tenant, id), so a creator that finds the id free is the only
    /// one that can create it (CreateSession, an append's
    /// `create_if_missing`, on any replica). SQLite has one writer.
    pub(super) async fn lock_session_id(&mut self, tenant: &str, id: &str) -> Result<()> {
        if self.dialect == Dialect::Postgres {
            sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1, 7))")
                .bind(format!("{}\u{1f}{}", escape(tenant), escape(id)))
                .execute(&mut *self.conn)
                .await?;
        }
        Ok(())
    }

    /// Makes a session a tombstone (for the sweeper: only if it is still
    /// idle, or expired): its key if it did. Its history is deleted after,
    /// a batch per transaction ([`EraseRows`](super::EraseRows)).
    pub(super) async fn delete_session(
        &mut self,
        tenant: &str,
        id: &str,
        only_if: DeleteIf,
    ) -> Result<Option<i64>> {
        let mut row = self.load_unsettled(tenant, id).await?;
        let proceed = match only_if {
            DeleteIf::Always => true,
            DeleteIf::IdleBefore(cutoff) => row.session.update_time < cutoff,
            DeleteIf::ExpiredBy(now) => row.session.is_expired(now),
        };
        if !proceed {
            return Ok(None);
        }
        self.tombstone(&mut row).await?;
        Ok(Some(row.key))
    }

    /// Makes a live session a tombstone: gone from every read, out of the
    /// metadata index, its cancels dropped, `session_deleted` recorded. Its
    /// history stays until the caller deletes it.
    pub(super) async fn tombstone(&mut self, row: &mut SessionRow) -> Result<()> {
        for sql in [
            "DELETE FROM session_metadata WHERE session_key = $1",
            "DELETE FROM run_cancels WHERE session_key = $1",
            "DELETE FROM approvals WHERE session_key = $1",
            "DELETE FROM queued_inputs WHERE session_key = $1",
            "UPDATE sessions SET deleted = 1, message_count = 0, run_id = '', run_expire_time = 0 \
             WHERE key = $1",
        ] {
            sqlx::query(sql)
                .bind(row.key)
                .execute(&mut *self.conn)
                .await?;
        }
        self.bump(row, Change::SessionDeleted).await?;
        Ok(())
    }
}

/// A session just inserted: its internal key, the session and its history.
pub(super) struct Created {
    pub key: i64,
    pub session: Session,
    pub messages: Vec<StoredMessage>,
}

impl Created {
    fn reply(self) -> (Session, Vec<StoredMessage>) {
        (self.session, self.messages)
    }
}

impl Write for CreateSession {
    type Reply = (Session, Vec<StateEntry>);

    /// With a request id, a retry answers the first call's session (and
    /// the named scopes' entries as they are now) and writes nothing.
    async fn apply(self, tx: &mut Tx<'_>, tenant: &str) -> Result<Self::Reply> {
        let key = self.0.request_key();
        let scopes = self.0.state_scopes.clone();
        let created = match &key {
            Some(key) => match tx.earlier_call(tenant, key).await? {
                Some(earlier) => Some(tx.created_before(&earlier).await?),
                None => None,
            },
            None => None,
        };
        let created = match created {
            Some(created) => created,
            None => {
                let created = tx.create_session(tenant, self.0).await?;
                if let Some(key) = &key {
                    tx.keep_key(tenant, key, created.key, created.session.revision, None)
                        .await?;
                }
                created
            }
        };
        let state = scope_entries(tx.conn, tenant, created.key, &scopes).await?;
        Ok((created.session, state))
    }
}

impl Write for ForkSession {
    type Reply = (Session, Vec<StoredMessage>);

    async fn apply(self, tx: &mut Tx<'_>, tenant: &str) -> Result<Self::Reply> {
        tx.fork_session(tenant, self.0).await.map(Created::reply)
    }
}

impl Write for UpdateSession {
    type Reply = Session;

    async fn apply(self, tx: &mut Tx<'_>, tenant: &str) -> Result<Session> {
        tx.update_session(tenant, &self.id, self.patch).await
    }
}

impl Write for DeleteSession {
    type Reply = i64;

    async fn apply(self, tx: &mut Tx<'_>, tenant: &str) -> Result<i64> {
        let key = tx
            .delete_session(tenant, &self.id, DeleteIf::Always)
            .await?;
        key.ok_or_else(|| Error::SessionNotFound(self.id))
    }
}

impl Write for DeleteIdle {
    type Reply = Option<i64>;

    async fn apply(self, tx: &mut Tx<'_>, tenant: &str) -> Result<Option<i64>> {
        tx.delete_session(tenant, &self.id, DeleteIf::IdleBefore(self.idle_before))
            .await
    }
}

impl Write for DeleteExpired {
    type Reply = Option<i64>;

    async fn apply(self, tx: &mut Tx<'_>, tenant: &str) -> Result<Option<i64>> {
        tx.delete_session(tenant, &self.id, DeleteIf::ExpiredBy(self.now))
            .await
    }
}

impl Write for Unindex {
    type Reply = ();

    async fn apply(self, tx: &mut Tx<'_>, _tenant: &str) -> Result<()> {
        tx.unindex(self.key, 0, 1 << 32).await
    }
}

/// When `delete_session` goes ahead.
pub(super) enum DeleteIf {
    Always,
    /// The sweeper's retention: only if not changed since.
    IdleBefore(Timestamp),
    /// The sweeper's expiry: only if expired by then.
    ExpiredBy(Timestamp),
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
