//! Write operations, each run inside a transaction the caller owns. The SQL
//! is shared by both backends (`$N` placeholders work in SQLite and
//! PostgreSQL alike); [`Dialect`] covers the two places they differ: row
//! locking and the cross-replica commit hint.

use std::sync::Arc;

use sqlx::any::AnyRow;
use sqlx::{AnyConnection, Row};

use super::text::{escape, unescape};
use crate::domain::exchange::diff_full_history;
use crate::domain::{
    AppendedExchange, Change, Error, Message, NewExchange, NewSession, Result, Session,
    SessionEvent, SessionPatch, StoredMessage, Timestamp, ids,
};

/// The PostgreSQL channel carrying commit hints (`"<session key>:<revision>"`).
pub const NOTIFY_CHANNEL: &str = "sessionstore_commits";

/// Which SQL dialect a connection speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dialect {
    Sqlite,
    Postgres,
}

/// A write request.
#[derive(Clone)]
pub enum WriteOp {
    Create(NewSession),
    Update { id: String, patch: SessionPatch },
    Delete { id: String },
    Append(Box<NewExchange>),
}

/// A write's answer.
pub enum Written {
    Created(Session, Vec<StoredMessage>),
    Updated(Session),
    Deleted,
    Appended(i64, AppendedExchange),
}

/// What one applied request committed: its answer and the events to publish.
pub struct Applied {
    pub written: Written,
    pub session_key: i64,
    pub events: Vec<Arc<SessionEvent>>,
}

/// Applies one write inside the caller's transaction.
pub async fn apply(
    conn: &mut AnyConnection,
    dialect: Dialect,
    tenant: &str,
    op: WriteOp,
) -> Result<Applied> {
    let mut tx = Tx { conn, dialect };
    match op {
        WriteOp::Create(new) => tx.create_session(tenant, new).await,
        WriteOp::Update { id, patch } => tx.update_session(tenant, &id, patch).await,
        WriteOp::Delete { id } => tx.delete_session(tenant, &id).await,
        WriteOp::Append(exchange) => tx.append_exchange(tenant, *exchange).await,
    }
}

impl From<sqlx::Error> for Error {
    fn from(error: sqlx::Error) -> Self {
        Error::storage(error)
    }
}

pub fn encode<T: serde::Serialize>(value: &T) -> Result<String> {
    serde_json::to_string(value).map_err(Error::storage)
}

pub fn decode<T: serde::de::DeserializeOwned>(text: &str) -> Result<T> {
    serde_json::from_str(text).map_err(Error::storage)
}

/// Reads an escaped text column.
pub fn text_col(row: &AnyRow, column: &str) -> Result<String> {
    Ok(unescape(row.try_get::<String, _>(column)?))
}

/// The session columns [`session_from_row`] reads.
pub const SESSION_COLUMNS: &str = "key, id, title, system_prompt, user_name, metadata, \
     summary_message_id, revision, create_time, update_time, next_sequence";

pub fn session_from_row(row: &AnyRow) -> Result<Session> {
    let metadata: String = row.try_get("metadata")?;
    Ok(Session {
        id: text_col(row, "id")?,
        title: text_col(row, "title")?,
        system_prompt: text_col(row, "system_prompt")?,
        user: text_col(row, "user_name")?,
        metadata: decode(&metadata)?,
        summary_message_id: text_col(row, "summary_message_id")?,
        revision: row.try_get("revision")?,
        create_time: Timestamp(row.try_get("create_time")?),
        update_time: Timestamp(row.try_get("update_time")?),
    })
}

/// A live session row as the write path needs it.
struct SessionRow {
    key: i64,
    session: Session,
    next_sequence: i64,
}

struct Tx<'c> {
    conn: &'c mut AnyConnection,
    dialect: Dialect,
}

impl Tx<'_> {
    /// Loads a live session, locking its row on PostgreSQL so concurrent
    /// writers to one session serialise (SQLite's writer is already alone).
    async fn load_live(&mut self, tenant: &str, id: &str) -> Result<SessionRow> {
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

    async fn insert_event(
        &mut self,
        session_key: i64,
        revision: i64,
        time: Timestamp,
        change: Change,
    ) -> Result<Arc<SessionEvent>> {
        let event = SessionEvent {
            revision,
            time,
            change,
        };
        sqlx::query(
            "INSERT INTO events (session_key, revision, time, body) VALUES ($1, $2, $3, $4)",
        )
        .bind(session_key)
        .bind(revision)
        .bind(time.0)
        .bind(encode(&event.change)?)
        .execute(&mut *self.conn)
        .await?;
        if self.dialect == Dialect::Postgres {
            // Delivered at commit, to every replica's listener: a hint to
            // re-read the log, never the payload.
            sqlx::query("SELECT pg_notify($1, $2)")
                .bind(NOTIFY_CHANNEL)
                .bind(format!("{session_key}:{revision}"))
                .execute(&mut *self.conn)
                .await?;
        }
        Ok(Arc::new(event))
    }

    /// Inserts messages at consecutive sequences from `first_sequence`.
    async fn insert_messages(
        &mut self,
        session_key: i64,
        session_id: &str,
        first_sequence: i64,
        messages: impl IntoIterator<Item = (Message, Option<String>)>,
        now: Timestamp,
    ) -> Result<Vec<StoredMessage>> {
        let mut stored = Vec::new();
        for (offset, (message, call_id)) in (0_i64..).zip(messages) {
            let id = ids::message_id();
            let sequence = first_sequence + offset;
            sqlx::query(
                "INSERT INTO messages (session_key, sequence, id, produced_by_call_id, body, create_time) \
                 VALUES ($1, $2, $3, $4, $5, $6)",
            )
            .bind(session_key)
            .bind(sequence)
            .bind(&id)
            .bind(call_id.as_deref())
            .bind(encode(&message)?)
            .bind(now.0)
            .execute(&mut *self.conn)
            .await?;
            stored.push(StoredMessage {
                id,
                session_id: session_id.to_owned(),
                sequence,
                produced_by_call_id: call_id.unwrap_or_default(),
                message,
                create_time: now,
            });
        }
        Ok(stored)
    }

    async fn create_session(&mut self, tenant: &str, new: NewSession) -> Result<Applied> {
        let id = new.id.clone().unwrap_or_else(ids::session_id);
        let taken: Option<i64> = sqlx::query_scalar(
            "SELECT key FROM sessions WHERE tenant = $1 AND id = $2 AND deleted = 0",
        )
        .bind(escape(tenant))
        .bind(escape(&id))
        .fetch_optional(&mut *self.conn)
        .await?;
        if taken.is_some() {
            return Err(Error::SessionExists(id));
        }
        let now = Timestamp::now();
        let history: Vec<Message> = new.history_to_store().to_vec();
        let count = i64::try_from(history.len()).map_err(Error::storage)?;
        let session = Session {
            id,
            title: new.title,
            system_prompt: new.system_prompt,
            user: new.user,
            metadata: new.metadata,
            summary_message_id: String::new(),
            revision: 1,
            create_time: now,
            update_time: now,
        };
        let key: i64 = sqlx::query_scalar(
            "INSERT INTO sessions (tenant, id, title, system_prompt, user_name, metadata, revision, \
             next_sequence, message_count, create_time, update_time) \
             VALUES ($1, $2, $3, $4, $5, $6, 1, $7, $7, $8, $8) RETURNING key",
        )
        .bind(escape(tenant))
        .bind(escape(&session.id))
        .bind(escape(&session.title))
        .bind(escape(&session.system_prompt))
        .bind(escape(&session.user))
        .bind(encode(&session.metadata)?)
        .bind(count)
        .bind(now.0)
        .fetch_one(&mut *self.conn)
        .await
        .map_err(|e| taken_or(e, &session.id))?;
        let messages = self
            .insert_messages(
                key,
                &session.id,
                0,
                history.into_iter().map(|m| (m, None)),
                now,
            )
            .await?;
        let change = Change::SessionCreated {
            session: session.clone(),
            messages: messages.clone(),
        };
        let event = self.insert_event(key, 1, now, change).await?;
        Ok(Applied {
            written: Written::Created(session, messages),
            session_key: key,
            events: vec![event],
        })
    }

    async fn update_session(
        &mut self,
        tenant: &str,
        id: &str,
        patch: SessionPatch,
    ) -> Result<Applied> {
        let SessionRow {
            key, mut session, ..
        } = self.load_live(tenant, id).await?;
        if let Some(summary) = patch.summary_message_id.as_ref().filter(|s| !s.is_empty()) {
            let exists: Option<i64> = sqlx::query_scalar(
                "SELECT sequence FROM messages WHERE session_key = $1 AND id = $2",
            )
            .bind(key)
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
        let now = Timestamp::now();
        session.revision += 1;
        session.update_time = now;
        sqlx::query(
            "UPDATE sessions SET title = $1, system_prompt = $2, metadata = $3, \
             summary_message_id = $4, revision = $5, update_time = $6 WHERE key = $7",
        )
        .bind(escape(&session.title))
        .bind(escape(&session.system_prompt))
        .bind(encode(&session.metadata)?)
        .bind(escape(&session.summary_message_id))
        .bind(session.revision)
        .bind(now.0)
        .bind(key)
        .execute(&mut *self.conn)
        .await?;
        let change = Change::SessionUpdated {
            session: session.clone(),
        };
        let event = self
            .insert_event(key, session.revision, now, change)
            .await?;
        Ok(Applied {
            written: Written::Updated(session),
            session_key: key,
            events: vec![event],
        })
    }

    async fn delete_session(&mut self, tenant: &str, id: &str) -> Result<Applied> {
        let SessionRow { key, session, .. } = self.load_live(tenant, id).await?;
        for sql in [
            "DELETE FROM idempotency_keys WHERE session_key = $1",
            "DELETE FROM messages WHERE session_key = $1",
            "DELETE FROM provider_calls WHERE session_key = $1",
            "DELETE FROM events WHERE session_key = $1",
        ] {
            sqlx::query(sql).bind(key).execute(&mut *self.conn).await?;
        }
        let now = Timestamp::now();
        let revision = session.revision + 1;
        sqlx::query(
            "UPDATE sessions SET deleted = 1, revision = $1, update_time = $2, message_count = 0 \
             WHERE key = $3",
        )
        .bind(revision)
        .bind(now.0)
        .bind(key)
        .execute(&mut *self.conn)
        .await?;
        let event = self
            .insert_event(key, revision, now, Change::SessionDeleted)
            .await?;
        Ok(Applied {
            written: Written::Deleted,
            session_key: key,
            events: vec![event],
        })
    }

    /// The first result of an earlier request with this idempotency key, if any.
    async fn earlier_result(
        &mut self,
        tenant: &str,
        request_id: &str,
        fingerprint: &[u8],
    ) -> Result<Option<Applied>> {
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
        let Change::ExchangeAppended(first) = decode::<Change>(&body)? else {
            return Err(Error::storage(std::io::Error::other(
                "idempotency key points at a non-append event",
            )));
        };
        Ok(Some(Applied {
            written: Written::Appended(revision, first),
            session_key: key,
            events: Vec::new(),
        }))
    }

    async fn append_exchange(&mut self, tenant: &str, exchange: NewExchange) -> Result<Applied> {
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

        let SessionRow {
            key,
            session,
            next_sequence,
        } = self.load_live(tenant, &exchange.session_id).await?;
        if self.dialect == Dialect::Postgres
            && let Some(fingerprint) = &fingerprint
            && let Some(first) = self
                .earlier_result(tenant, &exchange.request_id, fingerprint)
                .await?
        {
            // A concurrent retry committed while we waited for the row lock.
            return Ok(first);
        }
        if let Some(expected) = exchange.expected_next_sequence
            && expected != next_sequence
        {
            return Err(Error::SequenceMismatch {
                expected,
                actual: next_sequence,
            });
        }
        let call = exchange.normalized_call();
        let NewExchange {
            messages,
            mut full_history,
            response_messages,
            run_id,
            request_id,
            ..
        } = exchange;
        let inputs = if full_history.is_empty() {
            messages
        } else {
            let bodies: Vec<String> = sqlx::query_scalar(
                "SELECT body FROM messages WHERE session_key = $1 ORDER BY sequence",
            )
            .bind(key)
            .fetch_all(&mut *self.conn)
            .await?;
            let stored = bodies
                .iter()
                .map(|b| decode::<Message>(b))
                .collect::<Result<Vec<_>>>()?;
            let new_from = diff_full_history(&full_history, &session.system_prompt, &stored)?;
            full_history.split_off(new_from)
        };
        if inputs.is_empty() && call.is_none() {
            return Err(Error::invalid(
                "full_history",
                "holds no message beyond the stored history and there is no provider_call: nothing to write",
            ));
        }

        let now = Timestamp::now();
        let call = call.map(|mut call| {
            call.id = ids::call_id();
            call.session_id = session.id.clone();
            call.create_time = now;
            call
        });
        if let Some(call) = &call {
            sqlx::query(
                "INSERT INTO provider_calls (id, session_key, request_id, provider, model, \
                 requested_provider, requested_model, prompt_tokens, completion_tokens, \
                 total_tokens, cost_micros_usd, create_time) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
            )
            .bind(&call.id)
            .bind(key)
            .bind(escape(&call.request_id))
            .bind(escape(&call.provider))
            .bind(escape(&call.model))
            .bind(escape(&call.requested_provider))
            .bind(escape(&call.requested_model))
            .bind(call.prompt_tokens)
            .bind(call.completion_tokens)
            .bind(call.total_tokens)
            .bind(call.cost_micros_usd)
            .bind(now.0)
            .execute(&mut *self.conn)
            .await?;
        }
        let call_id = call.as_ref().map(|c| c.id.clone());
        let to_store = inputs
            .into_iter()
            .map(|m| (m, None))
            .chain(response_messages.into_iter().map(|m| (m, call_id.clone())));
        let stored = self
            .insert_messages(key, &session.id, next_sequence, to_store, now)
            .await?;
        let added = i64::try_from(stored.len()).map_err(Error::storage)?;
        let next_sequence = next_sequence + added;
        let revision = session.revision + 1;
        match &call {
            None => {
                sqlx::query(
                    "UPDATE sessions SET revision = $1, next_sequence = $2, \
                     message_count = message_count + $3, update_time = $4 WHERE key = $5",
                )
                .bind(revision)
                .bind(next_sequence)
                .bind(added)
                .bind(now.0)
                .bind(key)
                .execute(&mut *self.conn)
                .await?;
            }
            Some(call) => {
                sqlx::query(
                    "UPDATE sessions SET revision = $1, next_sequence = $2, \
                     message_count = message_count + $3, update_time = $4, \
                     provider_call_count = provider_call_count + 1, last_model = $5, \
                     last_provider = $6, last_cost_micros_usd = $7, last_request_id = $8, \
                     total_tokens = total_tokens + $9, \
                     total_cost_micros_usd = total_cost_micros_usd + $7 WHERE key = $10",
                )
                .bind(revision)
                .bind(next_sequence)
                .bind(added)
                .bind(now.0)
                .bind(escape(&call.model))
                .bind(escape(&call.provider))
                .bind(call.cost_micros_usd)
                .bind(escape(&call.request_id))
                .bind(call.total_tokens)
                .bind(key)
                .execute(&mut *self.conn)
                .await?;
            }
        }
        let appended = AppendedExchange {
            messages: stored,
            provider_call: call,
            run_id,
            next_sequence,
        };
        let event = self
            .insert_event(
                key,
                revision,
                now,
                Change::ExchangeAppended(appended.clone()),
            )
            .await?;
        if let Some(fingerprint) = fingerprint {
            sqlx::query(
                "INSERT INTO idempotency_keys (tenant, request_id, session_key, fingerprint, revision) \
                 VALUES ($1, $2, $3, $4, $5)",
            )
            .bind(escape(tenant))
            .bind(escape(&request_id))
            .bind(key)
            .bind(fingerprint)
            .bind(revision)
            .execute(&mut *self.conn)
            .await?;
        }
        Ok(Applied {
            written: Written::Appended(revision, appended),
            session_key: key,
            events: vec![event],
        })
    }
}

/// Maps a unique violation on a session insert to "already exists" (two
/// creators raced for one caller-chosen id).
fn taken_or(error: sqlx::Error, id: &str) -> Error {
    match &error {
        sqlx::Error::Database(db) if db.is_unique_violation() => {
            Error::SessionExists(id.to_owned())
        }
        _ => Error::storage(error),
    }
}

/// Whether a failed PostgreSQL write is worth retrying from the start: a
/// serialization failure, a deadlock, or a unique violation from a racing
/// writer (the retry then sees the winner's row and answers accordingly).
pub fn is_retryable(error: &Error) -> bool {
    let Error::Storage(source) = error else {
        return false;
    };
    let Some(sqlx::Error::Database(db)) = source.downcast_ref::<sqlx::Error>() else {
        return false;
    };
    db.is_unique_violation() || matches!(db.code().as_deref(), Some("40001" | "40P01"))
}
