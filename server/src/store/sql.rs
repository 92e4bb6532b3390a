//! [`SqlStore`]: the [`Store`] over SQLite or PostgreSQL. Reads are shared
//! SQL on a pool; writes take the backend's write path (SQLite's group-commit
//! writer, PostgreSQL's per-request transactions).

use std::sync::{Arc, Mutex};

use sqlx::any::AnyRow;
use sqlx::{AnyPool, Row};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::ops::{self, SESSION_COLUMNS, WriteOp, Written, decode, session_from_row, text_col};
use super::text::escape;
use super::{CommitSink, ListedCall, SessionHandle, Store, postgres, sqlite};
use crate::domain::{
    AppendedExchange, Error, NewExchange, NewSession, ProviderCall, Result, Session, SessionEvent,
    SessionPatch, SessionQuery, SessionSummary, StoredMessage, Timestamp,
};

/// A sessionstore on a SQL database. Cheap to clone.
#[derive(Clone)]
pub struct SqlStore {
    inner: Arc<Inner>,
}

pub(super) struct Inner {
    pub(super) pool: AnyPool,
    pub(super) writes: WritePath,
    pub(super) sink: Arc<dyn CommitSink>,
    /// Background tasks (the SQLite writer, the PostgreSQL listener).
    pub(super) tasks: Mutex<Vec<JoinHandle<()>>>,
    pub(super) closing: tokio::sync::watch::Sender<bool>,
}

/// How writes reach the database.
pub(super) enum WritePath {
    /// Queued to the one SQLite writer task; `None` asks it to stop.
    Queue(mpsc::Sender<Option<sqlite::Job>>),
    /// A transaction per request on the pool (PostgreSQL).
    Direct,
}

impl SqlStore {
    pub(super) fn from_inner(inner: Inner) -> Self {
        SqlStore {
            inner: Arc::new(inner),
        }
    }

    async fn write(&self, tenant: &str, op: WriteOp) -> Result<Written> {
        match &self.inner.writes {
            WritePath::Queue(queue) => sqlite::submit(queue, tenant, op).await,
            WritePath::Direct => {
                postgres::write(&self.inner.pool, self.inner.sink.as_ref(), tenant, op).await
            }
        }
    }
}

impl SqlStore {
    /// Messages of `session` matching `range` (a condition on `$2` and an
    /// order), at most `limit`.
    async fn messages_where(
        &self,
        session: &SessionHandle,
        range: &str,
        bound: i64,
        limit: usize,
    ) -> Result<Vec<StoredMessage>> {
        let sql = format!(
            "SELECT id, sequence, produced_by_call_id, body, create_time FROM messages \
             WHERE session_key = $1 AND {range} LIMIT $3"
        );
        let rows = sqlx::query(&sql)
            .bind(session.key)
            .bind(bound)
            .bind(limit_param(limit))
            .fetch_all(&self.inner.pool)
            .await?;
        rows.iter()
            .map(|row| stored_message_from_row(row, &session.id))
            .collect()
    }
}

fn stored_message_from_row(row: &AnyRow, session_id: &str) -> Result<StoredMessage> {
    let body: String = row.try_get("body")?;
    let call_id: Option<String> = row.try_get("produced_by_call_id")?;
    Ok(StoredMessage {
        id: row.try_get("id")?,
        session_id: session_id.to_owned(),
        sequence: row.try_get("sequence")?,
        produced_by_call_id: call_id.unwrap_or_default(),
        message: decode(&body)?,
        create_time: Timestamp(row.try_get("create_time")?),
    })
}

fn limit_param(limit: usize) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX)
}

fn unexpected(written: Written) -> Error {
    let what = match written {
        Written::Created(..) => "created",
        Written::Updated(_) => "updated",
        Written::Deleted => "deleted",
        Written::Appended(..) => "appended",
    };
    Error::storage(std::io::Error::other(format!(
        "writer answered with the wrong kind of result ({what})"
    )))
}

impl Store for SqlStore {
    async fn create_session(
        &self,
        tenant: &str,
        new: NewSession,
    ) -> Result<(Session, Vec<StoredMessage>)> {
        match self.write(tenant, WriteOp::Create(new)).await? {
            Written::Created(session, messages) => Ok((session, messages)),
            other => Err(unexpected(other)),
        }
    }

    async fn get_session(&self, tenant: &str, id: &str) -> Result<Session> {
        let sql = format!(
            "SELECT {SESSION_COLUMNS} FROM sessions WHERE tenant = $1 AND id = $2 AND deleted = 0"
        );
        let row = sqlx::query(&sql)
            .bind(escape(tenant))
            .bind(escape(id))
            .fetch_optional(&self.inner.pool)
            .await?
            .ok_or_else(|| Error::SessionNotFound(id.to_owned()))?;
        session_from_row(&row)
    }

    async fn list_sessions(
        &self,
        tenant: &str,
        query: SessionQuery,
    ) -> Result<Vec<SessionSummary>> {
        let mut sql = format!(
            "SELECT {SESSION_COLUMNS}, message_count, provider_call_count, last_model, \
             last_provider, last_cost_micros_usd, last_request_id, total_tokens, \
             total_cost_micros_usd FROM sessions WHERE tenant = $1 AND deleted = 0"
        );
        let mut next = 2;
        if query.user.is_some() {
            sql.push_str(&format!(" AND user_name = ${next}"));
            next += 1;
        }
        if query.after.is_some() {
            sql.push_str(&format!(
                " AND (update_time, id) < (${next}, ${})",
                next + 1
            ));
            next += 2;
        }
        sql.push_str(&format!(
            " ORDER BY update_time DESC, id DESC LIMIT ${next}"
        ));
        let mut q = sqlx::query(&sql).bind(escape(tenant));
        if let Some(user) = &query.user {
            q = q.bind(escape(user));
        }
        if let Some(after) = &query.after {
            q = q.bind(after.update_time).bind(escape(&after.id));
        }
        let rows = q
            .bind(limit_param(query.limit))
            .fetch_all(&self.inner.pool)
            .await?;
        rows.iter()
            .map(|row| {
                Ok(SessionSummary {
                    session: session_from_row(row)?,
                    message_count: row.try_get("message_count")?,
                    provider_call_count: row.try_get("provider_call_count")?,
                    last_model: text_col(row, "last_model")?,
                    last_provider: text_col(row, "last_provider")?,
                    last_cost_micros_usd: row.try_get("last_cost_micros_usd")?,
                    last_request_id: text_col(row, "last_request_id")?,
                    total_tokens: row.try_get("total_tokens")?,
                    total_cost_micros_usd: row.try_get("total_cost_micros_usd")?,
                })
            })
            .collect()
    }

    async fn update_session(&self, tenant: &str, id: &str, patch: SessionPatch) -> Result<Session> {
        let op = WriteOp::Update {
            id: id.to_owned(),
            patch,
        };
        match self.write(tenant, op).await? {
            Written::Updated(session) => Ok(session),
            other => Err(unexpected(other)),
        }
    }

    async fn delete_session(&self, tenant: &str, id: &str) -> Result<()> {
        let op = WriteOp::Delete { id: id.to_owned() };
        match self.write(tenant, op).await? {
            Written::Deleted => Ok(()),
            other => Err(unexpected(other)),
        }
    }

    async fn append_exchange(
        &self,
        tenant: &str,
        exchange: NewExchange,
    ) -> Result<(i64, AppendedExchange)> {
        match self
            .write(tenant, WriteOp::Append(Box::new(exchange)))
            .await?
        {
            Written::Appended(revision, appended) => Ok((revision, appended)),
            other => Err(unexpected(other)),
        }
    }

    async fn resolve(&self, tenant: &str, id: &str) -> Result<SessionHandle> {
        let row = sqlx::query(
            "SELECT key, id, revision, next_sequence, system_prompt, summary_message_id \
             FROM sessions WHERE tenant = $1 AND id = $2 AND deleted = 0",
        )
        .bind(escape(tenant))
        .bind(escape(id))
        .fetch_optional(&self.inner.pool)
        .await?
        .ok_or_else(|| Error::SessionNotFound(id.to_owned()))?;
        Ok(SessionHandle {
            key: row.try_get("key")?,
            id: text_col(&row, "id")?,
            revision: row.try_get("revision")?,
            next_sequence: row.try_get("next_sequence")?,
            system_prompt: text_col(&row, "system_prompt")?,
            summary_message_id: text_col(&row, "summary_message_id")?,
        })
    }

    async fn read_messages(
        &self,
        session: &SessionHandle,
        after: i64,
        limit: usize,
    ) -> Result<Vec<StoredMessage>> {
        self.messages_where(session, "sequence > $2 ORDER BY sequence", after, limit)
            .await
    }

    async fn read_messages_before(
        &self,
        session: &SessionHandle,
        before: i64,
        limit: usize,
    ) -> Result<Vec<StoredMessage>> {
        self.messages_where(
            session,
            "sequence < $2 ORDER BY sequence DESC",
            before,
            limit,
        )
        .await
    }

    async fn message_sequence(
        &self,
        session: &SessionHandle,
        message_id: &str,
    ) -> Result<Option<i64>> {
        Ok(
            sqlx::query_scalar("SELECT sequence FROM messages WHERE session_key = $1 AND id = $2")
                .bind(session.key)
                .bind(escape(message_id))
                .fetch_optional(&self.inner.pool)
                .await?,
        )
    }

    async fn read_provider_calls(
        &self,
        session: &SessionHandle,
        after: i64,
        limit: usize,
    ) -> Result<Vec<ListedCall>> {
        let rows = sqlx::query(
            "SELECT ordinal, id, request_id, provider, model, requested_provider, \
             requested_model, prompt_tokens, completion_tokens, total_tokens, cost_micros_usd, \
             create_time FROM provider_calls WHERE session_key = $1 AND ordinal > $2 \
             ORDER BY ordinal LIMIT $3",
        )
        .bind(session.key)
        .bind(after)
        .bind(limit_param(limit))
        .fetch_all(&self.inner.pool)
        .await?;
        rows.iter()
            .map(|row| {
                Ok(ListedCall {
                    ordinal: row.try_get("ordinal")?,
                    call: ProviderCall {
                        id: row.try_get("id")?,
                        session_id: session.id.clone(),
                        request_id: text_col(row, "request_id")?,
                        provider: text_col(row, "provider")?,
                        model: text_col(row, "model")?,
                        requested_provider: text_col(row, "requested_provider")?,
                        requested_model: text_col(row, "requested_model")?,
                        prompt_tokens: row.try_get("prompt_tokens")?,
                        completion_tokens: row.try_get("completion_tokens")?,
                        total_tokens: row.try_get("total_tokens")?,
                        cost_micros_usd: row.try_get("cost_micros_usd")?,
                        create_time: Timestamp(row.try_get("create_time")?),
                    },
                })
            })
            .collect()
    }

    async fn read_events(
        &self,
        session_key: i64,
        after: i64,
        limit: usize,
    ) -> Result<Vec<SessionEvent>> {
        let rows = sqlx::query(
            "SELECT revision, time, body FROM events WHERE session_key = $1 AND revision > $2 \
             ORDER BY revision LIMIT $3",
        )
        .bind(session_key)
        .bind(after)
        .bind(limit_param(limit))
        .fetch_all(&self.inner.pool)
        .await?;
        rows.iter()
            .map(|row| {
                let body: String = row.try_get("body")?;
                Ok(SessionEvent {
                    revision: row.try_get("revision")?,
                    time: Timestamp(row.try_get("time")?),
                    change: decode(&body)?,
                })
            })
            .collect()
    }

    async fn close(&self) {
        self.inner.closing.send_replace(true);
        if let WritePath::Queue(queue) = &self.inner.writes {
            // Ask the writer to finish what is queued.
            let _ = queue.send(None).await;
        }
        let tasks = self
            .inner
            .tasks
            .lock()
            .map(|mut t| std::mem::take(&mut *t))
            .unwrap_or_default();
        for task in tasks {
            let _ = task.await;
        }
        self.inner.pool.close().await;
    }
}

/// Answers a write from its [`ops::Applied`], publishing its events first.
pub(super) fn publish(sink: &dyn CommitSink, applied: ops::Applied) -> Written {
    if !applied.events.is_empty() {
        sink.committed(applied.session_key, &applied.events);
    }
    applied.written
}
