//! [`SqlStore`]: the [`Store`] over SQLite or PostgreSQL. Reads are shared
//! SQL on a pool; writes take the backend's write path (SQLite's group-commit
//! writer, PostgreSQL's per-request transactions).

use std::sync::{Arc, Mutex};

use futures_util::TryStreamExt as _;
use sqlx::any::AnyRow;
use sqlx::{AnyPool, Row};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::ops::{
    AppendExchange, Appended, ControlSession, CreateSession, DeleteIdle, DeleteSession,
    ForkSession, PurgeTombstones, UpdateSession, Write,
};
use super::rows::{
    MESSAGE_COLUMNS, SESSION_COLUMNS, decode, session_from_row, stored_message_from_row, text_col,
};
use super::sqlite_reads::{self, EngineReads};
use super::sqlite_search::SearchIndexer;
use super::text::{escape, escape_ordered, unescape_ordered};
use super::writer::{self, Pending};
use super::{
    CommitSink, ListedCall, Page, ReadBound, SearchQuery, SessionHandle, Store, SweepCandidate,
    postgres, sqlite,
};
use crate::domain::{
    AppendedExchange, Control, Controlled, Ephemeral, Error, Fork, Message, NewExchange,
    NewSession, ProviderCall, Result, SearchHit, Session, SessionEvent, SessionPatch, SessionQuery,
    SessionSummary, StateEntry, StoredMessage, Timestamp,
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
    /// This process's name among the replicas (PostgreSQL's ephemeral hints).
    pub(super) replica: String,
    /// Message reads through the SQLite engine itself (file databases only).
    pub(super) engine_reads: Option<Arc<EngineReads>>,
    /// The thread writing the search file (SQLite file databases only).
    pub(super) search_indexer: Option<Arc<SearchIndexer>>,
}

/// How writes reach the database.
pub(super) enum WritePath {
    /// Queued to the one SQLite writer task; `None` asks it to stop.
    Queue(mpsc::Sender<Option<sqlite::Queued>>),
    /// PostgreSQL: appends queued to a few batch writers, every other
    /// write a transaction of its own on the pool.
    Direct(postgres::Appends),
}

impl SqlStore {
    /// The store over an opened SQLite database.
    pub(super) fn sqlite(opened: sqlite::Opened, sink: Arc<dyn CommitSink>) -> Self {
        SqlStore::from_inner(Inner {
            pool: opened.pool,
            writes: WritePath::Queue(opened.queue),
            sink,
            tasks: Mutex::new(opened.tasks),
            closing: opened.closing,
            replica: String::new(),
            engine_reads: opened.engine_reads,
            search_indexer: opened.search_indexer,
        })
    }

    /// The store over an opened PostgreSQL database.
    pub(super) fn postgres(opened: postgres::Opened, sink: Arc<dyn CommitSink>) -> Self {
        SqlStore::from_inner(Inner {
            pool: opened.pool,
            writes: WritePath::Direct(opened.appends),
            sink,
            tasks: Mutex::new(opened.tasks),
            closing: opened.closing,
            replica: opened.replica,
            engine_reads: None,
            search_indexer: None,
        })
    }

    fn from_inner(inner: Inner) -> Self {
        SqlStore {
            inner: Arc::new(inner),
        }
    }

    /// Runs `op` through the backend's write path and waits for its answer.
    async fn write<W: Write>(&self, tenant: &str, op: W) -> Result<W::Reply> {
        let (pending, answer) = Pending::new(tenant, op);
        match &self.inner.writes {
            WritePath::Queue(queue) => {
                writer::enqueue(queue, sqlite::Queued::Write(Box::new(pending))).await;
            }
            WritePath::Direct(_) => {
                postgres::write(
                    &self.inner.pool,
                    self.inner.sink.as_ref(),
                    Box::new(pending),
                )
                .await;
            }
        }
        writer::answer(answer).await
    }

    async fn append(&self, tenant: &str, exchange: NewExchange) -> Result<Appended> {
        let (pending, answer) = Pending::new(tenant, AppendExchange(Box::new(exchange)));
        match &self.inner.writes {
            WritePath::Queue(queue) => {
                writer::enqueue(queue, sqlite::Queued::Append(pending)).await
            }
            WritePath::Direct(appends) => postgres::submit_append(appends, pending).await,
        }
        writer::answer(answer).await
    }
}

impl SqlStore {
    /// Messages of `session` matching `range` (a condition on `$2` and an
    /// order), within `bound`.
    async fn messages_where(
        &self,
        session: &SessionHandle,
        range: &str,
        bound_value: i64,
        bound: ReadBound,
    ) -> Result<Page<StoredMessage>> {
        let sql = format!(
            "SELECT {MESSAGE_COLUMNS} FROM messages WHERE session_key = $1 AND {range} LIMIT $3"
        );
        if let Some(engine) = &self.inner.engine_reads {
            let sql = sqlite_reads::unplanned(&sql);
            let params = [session.key, bound_value, limit_param(bound.rows)];
            return engine
                .messages(sql, params, bound, session.id.clone())
                .await;
        }
        let rows = sqlx::query(&sql)
            .bind(session.key)
            .bind(bound_value)
            .bind(limit_param(bound.rows))
            .fetch(&self.inner.pool);
        bounded(rows, bound, "body", |row| {
            stored_message_from_row(row, &session.id)
        })
        .await
    }
}

/// Consumes `rows` while `bound` admits them (measuring each by its
/// `body` column), converting each with `convert`. Rows past the bound are
/// not taken from the stream: the rest of the result is discarded when the
/// stream is dropped.
async fn bounded<T>(
    mut rows: futures_core::stream::BoxStream<'_, std::result::Result<AnyRow, sqlx::Error>>,
    bound: ReadBound,
    body: &str,
    convert: impl Fn(&AnyRow) -> Result<T>,
) -> Result<Page<T>> {
    let mut page = Page {
        rows: Vec::new(),
        cut: false,
    };
    let mut bytes = 0;
    while let Some(row) = rows.try_next().await? {
        let size = row.try_get::<&str, _>(body)?.len();
        if !bound.admits(page.rows.len(), bytes, size) {
            page.cut = true;
            break;
        }
        bytes += size;
        page.rows.push((convert(&row)?, size));
    }
    Ok(page)
}

fn limit_param(limit: usize) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX)
}

impl Store for SqlStore {
    async fn create_session(
        &self,
        tenant: &str,
        new: NewSession,
    ) -> Result<(Session, Vec<StoredMessage>)> {
        self.write(tenant, CreateSession(new)).await
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
        let mut session = session_from_row(&row)?;
        session.hide_expired_lease(Timestamp::now());
        Ok(session)
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
        let now = Timestamp::now();
        rows.iter()
            .map(|row| {
                let mut session = session_from_row(row)?;
                session.hide_expired_lease(now);
                Ok(SessionSummary {
                    session,
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
        let id = id.to_owned();
        self.write(tenant, UpdateSession { id, patch }).await
    }

    async fn delete_session(&self, tenant: &str, id: &str) -> Result<()> {
        let id = id.to_owned();
        self.write(tenant, DeleteSession { id }).await
    }

    async fn append_exchange(
        &self,
        tenant: &str,
        exchange: NewExchange,
    ) -> Result<(i64, AppendedExchange)> {
        self.append(tenant, exchange).await
    }

    async fn resolve(&self, tenant: &str, id: &str) -> Result<SessionHandle> {
        let row = sqlx::query(
            "SELECT key, id, revision, next_sequence, system_prompt, summary_message_id, run_id, \
             run_expire_time FROM sessions WHERE tenant = $1 AND id = $2 AND deleted = 0",
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
            active_run_id: text_col(&row, "run_id")?,
            run_expire_time: Timestamp(row.try_get("run_expire_time")?),
        })
    }

    async fn read_messages(
        &self,
        session: &SessionHandle,
        after: i64,
        limit: usize,
    ) -> Result<Vec<StoredMessage>> {
        self.read_messages_bounded(session, after, ReadBound::rows(limit))
            .await
            .map(Page::into_items)
    }

    async fn read_messages_bounded(
        &self,
        session: &SessionHandle,
        after: i64,
        bound: ReadBound,
    ) -> Result<Page<StoredMessage>> {
        self.messages_where(session, "sequence > $2 ORDER BY sequence", after, bound)
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
            ReadBound::rows(limit),
        )
        .await
        .map(Page::into_items)
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
        self.read_events_bounded(session_key, after, ReadBound::rows(limit))
            .await
            .map(Page::into_items)
    }

    async fn read_events_bounded(
        &self,
        session_key: i64,
        after: i64,
        bound: ReadBound,
    ) -> Result<Page<SessionEvent>> {
        if let Some(engine) = &self.inner.engine_reads {
            return engine.events(session_key, after, bound).await;
        }
        let rows = sqlx::query(
            "SELECT revision, time, body FROM events WHERE session_key = $1 AND revision > $2 \
             ORDER BY revision LIMIT $3",
        )
        .bind(session_key)
        .bind(after)
        .bind(limit_param(bound.rows))
        .fetch(&self.inner.pool);
        bounded(rows, bound, "body", |row| {
            let body: &str = row.try_get("body")?;
            Ok(SessionEvent {
                revision: row.try_get("revision")?,
                time: Timestamp(row.try_get("time")?),
                change: decode(body)?,
            })
        })
        .await
    }

    async fn control(&self, tenant: &str, id: &str, control: Control) -> Result<Controlled> {
        let id = id.to_owned();
        self.write(tenant, ControlSession { id, control }).await
    }

    async fn fork_session(
        &self,
        tenant: &str,
        fork: Fork,
    ) -> Result<(Session, Vec<StoredMessage>)> {
        self.write(tenant, ForkSession(fork)).await
    }

    async fn publish_ephemeral(&self, session: &SessionHandle, ephemeral: Ephemeral) -> Result<()> {
        let ephemeral = Arc::new(ephemeral);
        if let WritePath::Direct(_) = self.inner.writes {
            postgres::send_ephemeral(
                &self.inner.pool,
                &self.inner.replica,
                session.key,
                &ephemeral,
            )
            .await?;
        }
        self.inner.sink.ephemeral(session.key, ephemeral);
        Ok(())
    }

    async fn get_state(&self, session: &SessionHandle, key: &str) -> Result<StateEntry> {
        let row = sqlx::query(
            "SELECT key, value, version, update_time FROM session_state \
             WHERE session_key = $1 AND key = $2",
        )
        .bind(session.key)
        .bind(escape_ordered(key))
        .fetch_optional(&self.inner.pool)
        .await?
        .ok_or_else(|| Error::StateNotFound(key.to_owned()))?;
        state_from_row(&row)
    }

    async fn list_state(
        &self,
        session: &SessionHandle,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<StateEntry>> {
        let rows = sqlx::query(
            "SELECT key, value, version, update_time FROM session_state \
             WHERE session_key = $1 AND key > $2 ORDER BY key LIMIT $3",
        )
        .bind(session.key)
        .bind(escape_ordered(after.unwrap_or_default()))
        .bind(limit_param(limit))
        .fetch_all(&self.inner.pool)
        .await?;
        rows.iter().map(state_from_row).collect()
    }

    async fn search(&self, tenant: &str, query: SearchQuery) -> Result<Vec<SearchHit>> {
        let user_filter = if query.user.is_some() {
            " AND s.user_name = $5"
        } else {
            ""
        };
        let (sql, words) = match self.inner.writes {
            WritePath::Queue(_) => (
                format!(
                    "SELECT s.id AS session_id, s.title, m.sequence, m.id AS message_id, m.body, \
                     snippet(message_search, 0, '**', '**', '…', 16) AS snippet \
                     FROM search.message_search f \
                     JOIN messages m ON m.session_key = (f.rowid >> 32) \
                      AND m.sequence = (f.rowid & 4294967295) \
                     JOIN sessions s ON s.key = m.session_key \
                     WHERE message_search MATCH $1 AND s.tenant = $2 AND s.deleted = 0{user_filter} \
                     ORDER BY f.rank, f.rowid LIMIT $3 OFFSET $4"
                ),
                // Each word a quoted FTS5 string: all must occur, no operators.
                query
                    .words
                    .iter()
                    .map(|w| format!("\"{}\"", w.replace('"', "\"\"")))
                    .collect::<Vec<_>>()
                    .join(" "),
            ),
            WritePath::Direct(_) => (
                format!(
                    "SELECT s.id AS session_id, s.title, m.sequence, m.id AS message_id, m.body, \
                     ts_headline('simple', f.text, q, 'StartSel=**, StopSel=**, MaxWords=24, MinWords=8') AS snippet \
                     FROM message_search f CROSS JOIN plainto_tsquery('simple', $1) q \
                     JOIN messages m ON m.session_key = f.session_key AND m.sequence = f.sequence \
                     JOIN sessions s ON s.key = f.session_key \
                     WHERE f.words @@ q AND s.tenant = $2 AND s.deleted = 0{user_filter} \
                     ORDER BY ts_rank(f.words, q) DESC, f.session_key, f.sequence LIMIT $3 OFFSET $4"
                ),
                query.words.join(" "),
            ),
        };
        if let Some(indexer) = &self.inner.search_indexer {
            // Every write acknowledged so far is indexed before the query.
            let logged: i64 = sqlx::query_scalar("SELECT coalesce(max(id), 0) FROM search_log")
                .fetch_one(&self.inner.pool)
                .await?;
            indexer.caught_up(logged).await?;
        }
        let mut q = sqlx::query(&sql)
            .bind(words)
            .bind(escape(tenant))
            .bind(limit_param(query.limit))
            .bind(limit_param(query.offset));
        if let Some(user) = &query.user {
            q = q.bind(escape(user));
        }
        let rows = q.fetch_all(&self.inner.pool).await?;
        rows.iter()
            .map(|row| {
                let body: String = row.try_get("body")?;
                let message: Message = decode(&body)?;
                Ok(SearchHit {
                    session_id: text_col(row, "session_id")?,
                    session_title: text_col(row, "title")?,
                    sequence: row.try_get("sequence")?,
                    message_id: row.try_get("message_id")?,
                    role: message.role,
                    snippet: row.try_get("snippet")?,
                })
            })
            .collect()
    }

    async fn expired_leases(&self, now: Timestamp, limit: usize) -> Result<Vec<SweepCandidate>> {
        self.candidates(
            "SELECT tenant, id FROM sessions WHERE run_id <> '' AND deleted = 0 \
             AND run_expire_time <= $1 ORDER BY run_expire_time LIMIT $2",
            now,
            limit,
        )
        .await
    }

    async fn idle_sessions(&self, before: Timestamp, limit: usize) -> Result<Vec<SweepCandidate>> {
        self.candidates(
            "SELECT tenant, id FROM sessions WHERE deleted = 0 AND update_time < $1 \
             ORDER BY update_time LIMIT $2",
            before,
            limit,
        )
        .await
    }

    async fn delete_idle(&self, tenant: &str, id: &str, before: Timestamp) -> Result<bool> {
        let op = DeleteIdle {
            id: id.to_owned(),
            idle_before: before,
        };
        match self.write(tenant, op).await {
            Ok(deleted) => Ok(deleted),
            // Deleted meanwhile: nothing to do.
            Err(Error::SessionNotFound(_)) => Ok(false),
            Err(error) => Err(error),
        }
    }

    async fn purge_tombstones(&self, before: Timestamp, limit: usize) -> Result<u64> {
        let op = PurgeTombstones {
            before,
            limit: limit_param(limit),
        };
        self.write("", op).await
    }

    async fn probe(&self) -> Result<()> {
        sqlx::query("SELECT 1").execute(&self.inner.pool).await?;
        Ok(())
    }

    fn pool_status(&self) -> crate::metrics::PoolStatus {
        let pool = &self.inner.pool;
        crate::metrics::PoolStatus {
            connections: pool.size(),
            idle: pool.num_idle(),
            max: pool.options().get_max_connections(),
            queued_writes: match &self.inner.writes {
                WritePath::Queue(queue) => Some(queue.max_capacity() - queue.capacity()),
                WritePath::Direct(appends) => Some(appends.queued()),
            },
        }
    }

    async fn close(&self) {
        self.inner.closing.send_replace(true);
        match &self.inner.writes {
            // Ask the writers to finish what is queued.
            WritePath::Queue(queue) => {
                let _ = queue.send(None).await;
            }
            WritePath::Direct(appends) => appends.stop().await,
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
        if let Some(indexer) = &self.inner.search_indexer {
            indexer.stop().await;
        }
        if let Some(engine) = &self.inner.engine_reads {
            engine.close();
        }
        close_pool(&self.inner.pool).await;
        if let Some(engine) = &self.inner.engine_reads {
            let path = engine.path().to_owned();
            let kept = tokio::task::spawn_blocking(move || sqlite::keep_wal_files(&path)).await;
            if let Ok(Err(error)) = kept {
                tracing::warn!(%error, "cannot leave the SQLite WAL files in place");
            }
        }
    }
}

/// Closes every connection of `pool` before returning. sqlx's `close` can
/// return with one still open: a connection dropped just before (the
/// writer's own, a finished read's) goes back to the pool from a task of
/// its own after a ping, and if that lands while `close` waits for the
/// last permits, it is left idle, open until the pool itself is dropped.
/// On SQLite that connection then closes last, after the caller has gone
/// on, so the WAL is not yet copied back when `close` returns (a restart in
/// the same process, or a copy of the file, saw the database as it was).
async fn close_pool(pool: &AnyPool) {
    loop {
        pool.close().await;
        if pool.size() == 0 {
            return;
        }
        // Let the returning connection's task get as far as the pool.
        tokio::task::yield_now().await;
    }
}

impl SqlStore {
    async fn candidates(
        &self,
        sql: &str,
        time: Timestamp,
        limit: usize,
    ) -> Result<Vec<SweepCandidate>> {
        let rows = sqlx::query(sql)
            .bind(time.0)
            .bind(limit_param(limit))
            .fetch_all(&self.inner.pool)
            .await?;
        rows.iter()
            .map(|row| {
                Ok(SweepCandidate {
                    tenant: text_col(row, "tenant")?,
                    id: text_col(row, "id")?,
                })
            })
            .collect()
    }
}

fn state_from_row(row: &AnyRow) -> Result<StateEntry> {
    Ok(StateEntry {
        key: unescape_ordered(row.try_get("key")?),
        value: text_col(row, "value")?,
        version: row.try_get("version")?,
        update_time: Timestamp(row.try_get("update_time")?),
    })
}
