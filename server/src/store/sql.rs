//! [`SqlStore`]: the [`Store`] over a SQL database. Reads are shared SQL
//! on the pool (`$N` placeholders work in SQLite and PostgreSQL alike);
//! what differs between the backends is a [`Backend`] (`sqlite/`,
//! `postgres/`): its write path, the reads it serves through machinery of
//! its own, its search dialect, how ephemeral changes reach other
//! replicas, and how it stops. The backend is chosen once, when the store
//! is opened (`store::open`).

use std::sync::Arc;

use futures_core::future::BoxFuture;
use futures_util::TryStreamExt as _;
use sqlx::any::AnyRow;
use sqlx::{AnyPool, Row};

use super::append::Value;
use super::ops::{
    APPROVAL_COLUMNS, AppendExchange, Appended, AskApproval, ControlSession, CreateSession, Decide,
    DeleteExpired, DeleteIdle, DeleteSession, DeleteSharedState, EndRunTakingNext, EraseFinish,
    EraseMark, EraseRows, EraseTombstones, ExpireApprovals, ForkSession, PurgeTombstones,
    SetSharedState, Submit, TakeInput, Tombstones, Unindex, UpdateSession, Withdraw, Write,
    approval_from_row,
};
use super::rows::{
    BorrowedRow, MESSAGE_COLUMNS, SESSION_COLUMNS, message_row, scope_entries, session_from_row,
    shared_state_from_row, state_from_row, text_col,
};
use super::rows::{Content, EventPage, EventRow, EventRows, OwnedMessageRow, events_with_contents};
use super::text::{escape, escape_ordered, unescape};
use super::writer::{self, Job, Pending, PendingAppend};
use super::{
    CommitSink, ListedCall, Page, ReadBound, SearchQuery, SessionHandle, SharedStateWrite, Store,
    SweepCandidate,
};
use crate::domain::approvals::{Approval, ApprovalQuery, DecideApproval, Decided, RequestApproval};
use crate::domain::erase::{Erased, Erasure};
use crate::domain::queue::{QueuedInput, SubmitInput, Submitted, Taken};
use crate::domain::target::{Origin, Origins};
use crate::domain::usage::{self, UsageGroup, UsageQuery, UsageRow};
use crate::domain::{
    ControlOp, Ephemeral, Error, Fork, NewExchange, NewSession, ProviderCall, Result, SearchHit,
    Session, SessionEvent, SessionPatch, SessionQuery, SessionSummary, StateEntry, StoredMessage,
    Timestamp,
};
use crate::domain::{control, search};
use crate::wire::EncodedEvent;

/// Sessions an erasure makes tombstones, or removes, per transaction.
const ERASE_SESSIONS_PER_BATCH: i64 = 100;

/// Rows an erasure, or the deletion of a session's history, deletes per
/// transaction.
const ERASE_ROWS_PER_BATCH: i64 = 1000;

/// How long an erasure keeps its tombstones (and their `session_deleted`
/// events) after the last: other replicas' watchers read the event from
/// the log when the commit hint reaches them, within milliseconds.
const ERASE_TOMBSTONE_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

/// The most sessions a metadata filter may match for a listing to read
/// them all and sort them ([`ListPlan::Drive`]); past it, walking the
/// sessions newest first and testing each stops sooner. Around this many,
/// on SQLite at 100,000 sessions, the two take about as long (1–2 ms).
const LIST_DRIVE_MAX: i64 = 2000;

/// How a ListSessions statement with metadata filters finds its sessions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ListPlan {
    /// As the database's planner chooses.
    Planner,
    /// From the sessions the filter at this index matches, sorted
    /// afterwards; the other filters are tested on each.
    Drive(usize),
    /// The tenant's (or user's) sessions newest first, each tested against
    /// every filter, until the page is full.
    Walk,
}

/// A sessionstore on a SQL database. Cheap to clone.
#[derive(Clone)]
pub struct SqlStore {
    inner: Arc<Inner>,
}

struct Inner {
    pool: AnyPool,
    sink: Arc<dyn CommitSink>,
    backend: Box<dyn Backend>,
    /// Whether the search index is kept (`--search`).
    search: bool,
}

/// What one backend does its own way. Everything else the store does is
/// the shared SQL of this module.
pub(super) trait Backend: Send + Sync + 'static {
    /// Runs or queues `job`, which answers its caller itself (a job the
    /// backend drops unanswered tells its caller the server is shutting
    /// down).
    fn write(&self, job: Box<dyn Job>) -> BoxFuture<'_, ()>;

    /// Queues an append for the backend's batch writer.
    fn append(&self, pending: PendingAppend) -> BoxFuture<'_, ()>;

    /// The messages of `session` matching `range` (a condition on `$2`,
    /// bound to `value`, and an order), within `bound`.
    fn messages<'a>(
        &'a self,
        pool: &'a AnyPool,
        session: &'a SessionHandle,
        range: &'static str,
        value: i64,
        bound: ReadBound,
    ) -> BoxFuture<'a, Result<Page<OwnedMessageRow>>> {
        Box::pin(messages(pool, session, range, value, bound))
    }

    /// A session's events after revision `after`, within `bound`.
    fn events<'a>(
        &'a self,
        pool: &'a AnyPool,
        session_key: i64,
        after: i64,
        bound: ReadBound,
    ) -> BoxFuture<'a, Result<Page<EncodedEvent>>> {
        Box::pin(events(pool, session_key, after, bound))
    }

    /// The provider and model of each provider call of a session, by id.
    fn call_origins<'a>(
        &'a self,
        pool: &'a AnyPool,
        session_key: i64,
    ) -> BoxFuture<'a, Result<Origins>> {
        Box::pin(call_origins(pool, session_key))
    }

    /// The search statement in this backend's dialect (`$1` the words,
    /// `$2` the tenant, `$3` and `$4` limit and offset, then
    /// `filters`), and the words as it binds them.
    fn search_statement(&self, filters: &str, words: &[String]) -> (String, String);

    /// The statement that opens a read transaction whose reads all see one
    /// snapshot, if the database needs one (PostgreSQL's default isolation
    /// gives each statement its own; SQLite's read transaction is one
    /// snapshot already).
    fn snapshot_reads(&self) -> Option<&'static str> {
        None
    }

    /// Whether the store chooses how a listing filtered by metadata finds
    /// its sessions ([`ListPlan`]) instead of the database's planner.
    fn plans_metadata_filters(&self) -> bool {
        false
    }

    /// Waits until every write acknowledged so far is searchable.
    fn search_ready<'a>(&'a self, _pool: &'a AnyPool) -> BoxFuture<'a, Result<()>> {
        Box::pin(async { Ok(()) })
    }

    /// Sends an ephemeral change to the other replicas, if there can be
    /// any. (This replica's watchers get it from the store.)
    fn send_ephemeral<'a>(
        &'a self,
        _pool: &'a AnyPool,
        _session_key: i64,
        _ephemeral: &'a Ephemeral,
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(async { Ok(()) })
    }

    /// Makes what deletes removed unreadable in the store's files: once
    /// it returns, no file holds a deleted byte (SQLite: the search index
    /// has applied every deletion, and the WAL files are checkpointed and
    /// truncated). PostgreSQL holds nothing deleted in a live row already.
    fn scrub<'a>(&'a self, _pool: &'a AnyPool) -> BoxFuture<'a, Result<()>> {
        Box::pin(async { Ok(()) })
    }

    /// Writes queued and not yet taken by a writer.
    fn queued_writes(&self) -> usize;

    /// What the append writers' batches have done (PostgreSQL).
    fn append_batches(&self) -> Option<crate::metrics::BatchFigures> {
        None
    }

    /// Finishes the writes queued, stops every task and thread of the
    /// backend, and closes `pool` ([`close_pool`]).
    fn close<'a>(&'a self, pool: &'a AnyPool) -> BoxFuture<'a, ()>;
}

impl SqlStore {
    /// The store over `pool`, its writes and own machinery `backend`'s.
    pub(super) fn new(
        pool: AnyPool,
        sink: Arc<dyn CommitSink>,
        backend: Box<dyn Backend>,
        search: bool,
    ) -> Self {
        SqlStore {
            inner: Arc::new(Inner {
                pool,
                sink,
                backend,
                search,
            }),
        }
    }

    /// Runs `op` through the backend's write path and waits for its answer.
    /// How a listing filtered by `metadata` finds its sessions, from how
    /// many sessions each filter matches (counted up to
    /// [`LIST_DRIVE_MAX`] + 1, from the filter's index alone).
    async fn list_plan(&self, tenant: &str, metadata: &[(String, String)]) -> Result<ListPlan> {
        let mut fewest: Option<(usize, i64)> = None;
        for (index, (key, value)) in metadata.iter().enumerate() {
            let matches: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM (SELECT 1 FROM session_metadata \
                 INDEXED BY session_metadata_by_value \
                 WHERE tenant = $1 AND key = $2 AND value = $3 LIMIT $4) AS matching",
            )
            .bind(escape(tenant))
            .bind(escape(key))
            .bind(escape(value))
            .bind(LIST_DRIVE_MAX + 1)
            .fetch_one(&self.inner.pool)
            .await?;
            if fewest.is_none_or(|(_, least)| matches < least) {
                fewest = Some((index, matches));
            }
        }
        Ok(match fewest {
            Some((index, matches)) if matches <= LIST_DRIVE_MAX => ListPlan::Drive(index),
            _ => ListPlan::Walk,
        })
    }

    async fn write<W: Write>(&self, tenant: &str, op: W) -> Result<W::Reply> {
        let (pending, answer) = Pending::new(tenant, op);
        self.inner.backend.write(Box::new(pending)).await;
        writer::answer(answer).await
    }

    /// The history of the session DeleteSession (or the sweeper) made the
    /// tombstone `key`: its rows a batch per transaction, as EraseUser
    /// deletes a user's, so that a long session never holds SQLite's one
    /// writer (nor, on PostgreSQL, one transaction) for all of it; then its
    /// search entries. Should it stop part way (the database went away),
    /// the session is already gone from every read, and the sweeper's
    /// purge of its tombstone takes what is left.
    async fn delete_history(&self, tenant: &str, key: i64) -> Result<()> {
        self.erase_rows(tenant, Tombstones::Session(key)).await?;
        self.write(tenant, Unindex { key }).await
    }

    /// Deletes the rows of the tombstones `of` a batch per transaction
    /// ([`EraseRows`]) until none is left: (messages, provider calls)
    /// deleted. Each batch starts after the tables the one before found
    /// empty; a pass that skipped some ends with one batch over every
    /// table, since another replica may have made more of a user's
    /// sessions tombstones meanwhile.
    async fn erase_rows(&self, tenant: &str, of: Tombstones) -> Result<(i64, i64)> {
        let (mut messages, mut provider_calls) = (0, 0);
        let mut emptied = 0;
        loop {
            let op = EraseRows {
                of: of.clone(),
                limit: ERASE_ROWS_PER_BATCH,
                emptied,
            };
            let rows = self.write(tenant, op).await?;
            messages += rows.messages;
            provider_calls += rows.provider_calls;
            if rows.more {
                emptied = rows.emptied;
            } else if emptied > 0 {
                emptied = 0;
            } else {
                return Ok((messages, provider_calls));
            }
        }
    }

    async fn append(&self, tenant: &str, exchange: NewExchange) -> Result<Appended> {
        let (pending, answer) = Pending::new(tenant, AppendExchange(Box::new(exchange)));
        self.inner.backend.append(pending).await;
        writer::answer(answer).await
    }

    async fn messages_where(
        &self,
        session: &SessionHandle,
        range: &'static str,
        value: i64,
        bound: ReadBound,
    ) -> Result<Page<OwnedMessageRow>> {
        let pool = &self.inner.pool;
        self.inner
            .backend
            .messages(pool, session, range, value, bound)
            .await
    }

    /// The messages of `session` matching `range` (as
    /// [`SqlStore::messages_where`]), decoded.
    async fn stored_messages_where(
        &self,
        session: &SessionHandle,
        range: &'static str,
        value: i64,
        bound: ReadBound,
    ) -> Result<Page<StoredMessage>> {
        self.messages_where(session, range, value, bound)
            .await?
            .try_map(|row| row.into_stored(&session.id))
    }
}

/// A session's messages after sequence `$2`, in order.
const MESSAGES_AFTER: &str = "sequence > $2 ORDER BY sequence";

/// The statement [`Backend::messages`] runs: `$1` the session key, `$3`
/// the row limit.
pub(super) fn messages_statement(range: &str) -> String {
    format!("SELECT {MESSAGE_COLUMNS} FROM messages WHERE session_key = $1 AND {range} LIMIT $3")
}

/// [`Backend::messages`] through `pool`, of sqlx's `Any` driver or its
/// PostgreSQL one (`postgres/reads.rs`).
pub(super) async fn messages<DB>(
    pool: &sqlx::Pool<DB>,
    session: &SessionHandle,
    range: &str,
    value: i64,
    bound: ReadBound,
) -> Result<Page<OwnedMessageRow>>
where
    DB: sqlx::Database,
    DB::Row: BorrowedRow,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
    for<'q> i64: sqlx::Encode<'q, DB>,
    i64: sqlx::Type<DB>,
{
    let sql = messages_statement(range);
    let rows = sqlx::query::<DB>(&sql)
        .bind(session.key)
        .bind(value)
        .bind(limit_param(bound.rows))
        .fetch(pool);
    bounded(
        rows,
        bound,
        |row| Ok(message_row(row)?.content_len()),
        |row| Ok(message_row(row)?.into_owned()),
    )
    .await
}

/// [`Backend::events`] through the pool.
pub(super) async fn events(
    pool: &AnyPool,
    session_key: i64,
    after: i64,
    bound: ReadBound,
) -> Result<Page<EncodedEvent>> {
    let sql = events_with_contents(EVENTS_AFTER);
    let mut rows = sqlx::query(&sql)
        .bind(session_key)
        .bind(after)
        .bind(after.saturating_add(limit_param(bound.rows)))
        .fetch(pool);
    let mut page = EventPage::new(bound);
    let mut events = EventRows::default();
    loop {
        let row = rows.try_next().await?;
        let done = match &row {
            Some(row) => events.push(&EventRow::from_any(row)?)?,
            None => events.finish(),
        };
        if let Some(event) = done
            && !page.add(event)?
        {
            break;
        }
        if row.is_none() {
            break;
        }
    }
    page.finish()
}

/// The events [`Backend::events`] reads, as [`events_with_contents`]
/// takes them: after revision `$2`, up to `$3` (`$2` + the row limit).
pub(super) const EVENTS_AFTER: &str = "e.revision > $2 AND e.revision <= $3";

/// Consumes `rows` while `bound` admits them (measuring each with
/// `size`), converting each with `convert`. Rows past the bound are
/// not taken from the stream: the rest of the result is discarded when the
/// stream is dropped.
pub(super) async fn bounded<R, T>(
    mut rows: futures_core::stream::BoxStream<'_, std::result::Result<R, sqlx::Error>>,
    bound: ReadBound,
    size: impl Fn(&R) -> Result<usize>,
    convert: impl Fn(&R) -> Result<T>,
) -> Result<Page<T>> {
    let mut page = Page {
        rows: Vec::new(),
        cut: false,
    };
    let mut bytes = 0;
    while let Some(row) = rows.try_next().await? {
        let size = size(&row)?;
        if !bound.admits(page.rows.len(), bytes, size) {
            page.cut = true;
            break;
        }
        bytes += size;
        page.rows.push((convert(&row)?, size));
    }
    Ok(page)
}

/// A row limit as a bound parameter.
pub(super) fn limit_param(limit: usize) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX)
}

/// The columns a [`SessionHandle`] is made of.
const HANDLE_COLUMNS: &str = "key, id, revision, next_sequence, system_prompt, summary_message_id, \
     run_id, run_expire_time, expire_time";

/// A session's handle, or NOT_FOUND for an expired one (gone from its
/// expire_time on).
fn handle_from_row(row: &AnyRow) -> Result<SessionHandle> {
    let expire_time: i64 = row.try_get("expire_time")?;
    if expire_time > 0 && expire_time <= Timestamp::now().0 {
        return Err(Error::SessionNotFound(text_col(row, "id")?));
    }
    Ok(SessionHandle {
        key: row.try_get("key")?,
        id: text_col(row, "id")?,
        revision: row.try_get("revision")?,
        next_sequence: row.try_get("next_sequence")?,
        system_prompt: text_col(row, "system_prompt")?,
        summary_message_id: text_col(row, "summary_message_id")?,
        active_run_id: text_col(row, "run_id")?,
        run_expire_time: Timestamp(row.try_get("run_expire_time")?),
    })
}

impl Store for SqlStore {
    async fn create_session(
        &self,
        tenant: &str,
        new: NewSession,
    ) -> Result<(Session, Vec<StateEntry>)> {
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
        let now = Timestamp::now();
        if session.is_expired(now) {
            return Err(Error::SessionNotFound(id.to_owned()));
        }
        session.hide_expired_lease(now);
        Ok(session)
    }

    async fn get_session_with_state(
        &self,
        tenant: &str,
        id: &str,
        scopes: &[String],
    ) -> Result<(Session, Vec<StateEntry>)> {
        let mut tx = self.inner.pool.begin().await?;
        if let Some(sql) = self.inner.backend.snapshot_reads() {
            sqlx::query(sql).execute(&mut *tx).await?;
        }
        let sql = format!(
            "SELECT {SESSION_COLUMNS} FROM sessions \
             WHERE tenant = $1 AND id = $2 AND deleted = 0"
        );
        let row = sqlx::query(&sql)
            .bind(escape(tenant))
            .bind(escape(id))
            .fetch_optional(&mut *tx)
            .await?
            .ok_or_else(|| Error::SessionNotFound(id.to_owned()))?;
        let key: i64 = row.try_get("key")?;
        let mut session = session_from_row(&row)?;
        let now = Timestamp::now();
        if session.is_expired(now) {
            return Err(Error::SessionNotFound(id.to_owned()));
        }
        session.hide_expired_lease(now);
        let entries = scope_entries(&mut tx, tenant, key, scopes).await?;
        tx.commit().await?;
        Ok((session, entries))
    }

    async fn submit_input(
        &self,
        tenant: &str,
        session_id: &str,
        input: SubmitInput,
    ) -> Result<Submitted> {
        let session_id = session_id.to_owned();
        self.write(tenant, Submit { session_id, input }).await
    }

    async fn take_queued_input(
        &self,
        tenant: &str,
        session_id: &str,
        run_id: &str,
    ) -> Result<Taken> {
        let (session_id, run_id) = (session_id.to_owned(), run_id.to_owned());
        self.write(tenant, TakeInput { session_id, run_id }).await
    }

    async fn end_run_taking_next(
        &self,
        tenant: &str,
        session_id: &str,
        run_id: &str,
    ) -> Result<(i64, Option<QueuedInput>)> {
        let (session_id, run_id) = (session_id.to_owned(), run_id.to_owned());
        self.write(tenant, EndRunTakingNext { session_id, run_id })
            .await
    }

    async fn list_queued_inputs(
        &self,
        tenant: &str,
        session_id: &str,
        after: i64,
        limit: usize,
    ) -> Result<Vec<QueuedInput>> {
        let session = self.resolve(tenant, session_id).await?;
        let bodies: Vec<Vec<u8>> = sqlx::query_scalar(
            "SELECT body FROM queued_inputs WHERE session_key = $1 AND state = 0 \
             AND position > $2 ORDER BY position LIMIT $3",
        )
        .bind(session.key)
        .bind(after)
        .bind(limit_param(limit))
        .fetch_all(&self.inner.pool)
        .await?;
        bodies
            .iter()
            .map(|body| crate::wire::decode_queued_input(body))
            .collect()
    }

    async fn withdraw_queued_input(
        &self,
        tenant: &str,
        session_id: &str,
        input_id: &str,
    ) -> Result<i64> {
        let (session_id, input_id) = (session_id.to_owned(), input_id.to_owned());
        self.write(
            tenant,
            Withdraw {
                session_id,
                input_id,
            },
        )
        .await
    }

    async fn request_approval(
        &self,
        tenant: &str,
        session_id: &str,
        request: RequestApproval,
    ) -> Result<(Approval, i64)> {
        let session_id = session_id.to_owned();
        self.write(
            tenant,
            AskApproval {
                session_id,
                request,
            },
        )
        .await
    }

    async fn decide_approval(
        &self,
        tenant: &str,
        session_id: &str,
        decision: DecideApproval,
    ) -> Result<Decided> {
        self.expire_if_due(tenant, Some(session_id)).await?;
        let session_id = session_id.to_owned();
        self.write(
            tenant,
            Decide {
                session_id,
                decision,
            },
        )
        .await
    }

    async fn get_approval(
        &self,
        tenant: &str,
        session_id: &str,
        approval_id: &str,
    ) -> Result<Approval> {
        let session = self.resolve(tenant, session_id).await?;
        self.expire_if_due(tenant, Some(session_id)).await?;
        let row = sqlx::query(&format!(
            "SELECT {APPROVAL_COLUMNS} FROM approvals a JOIN sessions s ON s.key = a.session_key \
             WHERE a.session_key = $1 AND a.approval_id = $2"
        ))
        .bind(session.key)
        .bind(escape(approval_id))
        .fetch_optional(&self.inner.pool)
        .await?
        .ok_or_else(|| Error::ApprovalNotFound(approval_id.to_owned()))?;
        approval_from_row(&row)
    }

    async fn list_approvals(&self, tenant: &str, query: ApprovalQuery) -> Result<Vec<Approval>> {
        self.expire_if_due(tenant, query.session_id.as_deref())
            .await?;
        let now = Timestamp::now();
        let mut values = vec![Value::Text(escape(tenant)), Value::Int(now.0)];
        let mut filters = String::new();
        let mut bind = |values: &mut Vec<Value>, condition: &str, value: Value| {
            values.push(value);
            filters.push_str(&format!(" AND {condition} ${}", values.len()));
        };
        if let Some(id) = &query.session_id {
            bind(&mut values, "s.id =", Value::Text(escape(id)));
        }
        if let Some(user) = &query.user {
            bind(&mut values, "s.user_name =", Value::Text(escape(user)));
        }
        if let Some(state) = query.state {
            bind(&mut values, "a.state =", Value::Int(state.code()));
        }
        if let Some((time, id)) = &query.after {
            values.push(Value::Int(time.0));
            values.push(Value::Text(escape(id)));
            filters.push_str(&format!(
                " AND (a.create_time > ${t} OR (a.create_time = ${t} AND a.approval_id > ${i}))",
                t = values.len() - 1,
                i = values.len()
            ));
        }
        values.push(Value::Int(i64::try_from(query.limit).unwrap_or(i64::MAX)));
        let sql = format!(
            "SELECT {APPROVAL_COLUMNS} FROM approvals a JOIN sessions s ON s.key = a.session_key \
             WHERE a.tenant = $1 AND s.deleted = 0 AND (s.expire_time = 0 OR s.expire_time > $2)\
             {filters} ORDER BY a.create_time, a.approval_id LIMIT ${}",
            values.len()
        );
        let rows = bound(&sql, values).fetch_all(&self.inner.pool).await?;
        rows.iter().map(approval_from_row).collect()
    }

    async fn expired_approvals(&self, now: Timestamp, limit: usize) -> Result<Vec<SweepCandidate>> {
        self.candidates(
            "SELECT DISTINCT s.tenant, s.id FROM approvals a JOIN sessions s ON s.key = a.session_key \
             WHERE a.state = 1 AND a.expire_time > 0 AND a.expire_time <= $1 AND s.deleted = 0 \
             LIMIT $2",
            now,
            limit,
        )
        .await
    }

    async fn expire_approvals(&self, tenant: &str, session_id: &str) -> Result<()> {
        let session_id = session_id.to_owned();
        self.write(tenant, ExpireApprovals { session_id }).await
    }

    async fn list_sessions(
        &self,
        tenant: &str,
        query: SessionQuery,
    ) -> Result<Vec<SessionSummary>> {
        let plan = if query.metadata.is_empty() || !self.inner.backend.plans_metadata_filters() {
            ListPlan::Planner
        } else {
            self.list_plan(tenant, &query.metadata).await?
        };
        let sql = list_sessions_sql(plan, &query);
        let now = Timestamp::now();
        let mut q = sqlx::query(&sql).bind(escape(tenant));
        if let Some(user) = &query.user {
            q = q.bind(escape(user));
        }
        for (key, value) in &query.metadata {
            q = q.bind(escape(key)).bind(escape(value));
        }
        if let Some(after) = &query.after {
            q = q.bind(after.update_time).bind(escape(&after.id));
        }
        let rows = q
            .bind(now.0)
            .bind(limit_param(query.limit))
            .fetch_all(&self.inner.pool)
            .await?;
        rows.iter().map(|row| summary_from_row(row, now)).collect()
    }

    async fn update_session(&self, tenant: &str, id: &str, patch: SessionPatch) -> Result<Session> {
        let id = id.to_owned();
        self.write(tenant, UpdateSession { id, patch }).await
    }

    async fn delete_session(&self, tenant: &str, id: &str) -> Result<()> {
        let id = id.to_owned();
        let key = self.write(tenant, DeleteSession { id }).await?;
        self.delete_history(tenant, key).await
    }

    async fn append_exchange(&self, tenant: &str, exchange: NewExchange) -> Result<Appended> {
        self.append(tenant, exchange).await
    }

    async fn resolve(&self, tenant: &str, id: &str) -> Result<SessionHandle> {
        let row = sqlx::query(&format!(
            "SELECT {HANDLE_COLUMNS} FROM sessions WHERE tenant = $1 AND id = $2 AND deleted = 0"
        ))
        .bind(escape(tenant))
        .bind(escape(id))
        .fetch_optional(&self.inner.pool)
        .await?
        .ok_or_else(|| Error::SessionNotFound(id.to_owned()))?;
        handle_from_row(&row)
    }

    async fn resolve_run(
        &self,
        tenant: &str,
        id: &str,
        run_id: &str,
    ) -> Result<(SessionHandle, bool)> {
        let row = sqlx::query(&format!(
            "SELECT {HANDLE_COLUMNS}, (SELECT count(*) FROM run_cancels c \
             WHERE c.session_key = sessions.key AND c.run_id = $3) AS cancels \
             FROM sessions WHERE tenant = $1 AND id = $2 AND deleted = 0"
        ))
        .bind(escape(tenant))
        .bind(escape(id))
        .bind(escape(run_id))
        .fetch_optional(&self.inner.pool)
        .await?
        .ok_or_else(|| Error::SessionNotFound(id.to_owned()))?;
        let cancels: i64 = row.try_get("cancels")?;
        Ok((handle_from_row(&row)?, cancels > 0))
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

    async fn read_message_rows_bounded(
        &self,
        session: &SessionHandle,
        after: i64,
        bound: ReadBound,
    ) -> Result<Page<OwnedMessageRow>> {
        self.messages_where(session, MESSAGES_AFTER, after, bound)
            .await
    }

    async fn read_messages_before(
        &self,
        session: &SessionHandle,
        before: i64,
        limit: usize,
    ) -> Result<Vec<StoredMessage>> {
        self.stored_messages_where(
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

    async fn call_origins(&self, session: &SessionHandle) -> Result<Origins> {
        self.inner
            .backend
            .call_origins(&self.inner.pool, session.key)
            .await
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
             create_time, cached_input_tokens, cache_creation_input_tokens, reasoning_tokens, \
             usage_json, duration_micros FROM provider_calls \
             WHERE session_key = $1 AND ordinal > $2 ORDER BY ordinal LIMIT $3",
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
                        cached_input_tokens: row.try_get("cached_input_tokens")?,
                        cache_creation_input_tokens: row.try_get("cache_creation_input_tokens")?,
                        reasoning_tokens: row.try_get("reasoning_tokens")?,
                        usage_json: text_col(row, "usage_json")?,
                        duration_micros: row.try_get("duration_micros")?,
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
            .await?
            .into_items()
            .iter()
            .map(EncodedEvent::decode)
            .collect()
    }

    async fn read_events_bounded(
        &self,
        session_key: i64,
        after: i64,
        bound: ReadBound,
    ) -> Result<Page<EncodedEvent>> {
        let pool = &self.inner.pool;
        self.inner
            .backend
            .events(pool, session_key, after, bound)
            .await
    }

    async fn control<C: ControlOp>(&self, tenant: &str, id: &str, control: C) -> Result<C::Reply> {
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
        let pool = &self.inner.pool;
        self.inner
            .backend
            .send_ephemeral(pool, session.key, &ephemeral)
            .await?;
        self.inner.sink.ephemeral(session.key, Arc::new(ephemeral));
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

    async fn get_shared_state(&self, tenant: &str, scope: &str, key: &str) -> Result<StateEntry> {
        let row = sqlx::query(
            "SELECT scope, key, value, version, update_time FROM shared_state \
             WHERE tenant = $1 AND scope = $2 AND key = $3",
        )
        .bind(escape(tenant))
        .bind(escape_ordered(scope))
        .bind(escape_ordered(key))
        .fetch_optional(&self.inner.pool)
        .await?
        .ok_or_else(|| Error::StateNotFound(key.to_owned()))?;
        shared_state_from_row(&row)
    }

    async fn list_shared_state(
        &self,
        tenant: &str,
        scope: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<StateEntry>> {
        let rows = sqlx::query(
            "SELECT scope, key, value, version, update_time FROM shared_state \
             WHERE tenant = $1 AND scope = $2 AND key > $3 ORDER BY key LIMIT $4",
        )
        .bind(escape(tenant))
        .bind(escape_ordered(scope))
        .bind(escape_ordered(after.unwrap_or_default()))
        .bind(limit_param(limit))
        .fetch_all(&self.inner.pool)
        .await?;
        rows.iter().map(shared_state_from_row).collect()
    }

    async fn set_shared_state(&self, tenant: &str, entry: SharedStateWrite) -> Result<StateEntry> {
        self.write(tenant, SetSharedState(entry)).await
    }

    async fn delete_shared_state(&self, tenant: &str, entry: SharedStateWrite) -> Result<()> {
        self.write(tenant, DeleteSharedState(entry)).await
    }

    async fn summarize_usage(&self, tenant: &str, query: UsageQuery) -> Result<Vec<UsageRow>> {
        let (key, join) = match query.group {
            UsageGroup::Total => ("''", ""),
            UsageGroup::Session => ("s.id", " JOIN sessions s ON s.key = c.session_key"),
            UsageGroup::User => ("c.user_name", ""),
            UsageGroup::Model => ("c.provider || '/' || c.model", ""),
            UsageGroup::Day => ("c.create_time / 86400000000", ""),
        };
        let mut values = vec![Value::Text(escape(tenant))];
        let mut filters = String::new();
        let mut bind = |values: &mut Vec<Value>, condition: &str, value: Value| {
            values.push(value);
            filters.push_str(&format!(" AND {condition} ${}", values.len()));
        };
        if let Some(user) = &query.user {
            bind(&mut values, "c.user_name =", Value::Text(escape(user)));
        }
        if let Some(session_key) = query.session_key {
            bind(&mut values, "c.session_key =", Value::Int(session_key));
        }
        if let Some(start) = query.start {
            bind(&mut values, "c.create_time >=", Value::Int(start.0));
        }
        if let Some(end) = query.end {
            bind(&mut values, "c.create_time <", Value::Int(end.0));
        }
        let sums = "count(*) AS calls,              CAST(COALESCE(sum(c.prompt_tokens), 0) AS BIGINT) AS prompt_tokens,              CAST(COALESCE(sum(c.completion_tokens), 0) AS BIGINT) AS completion_tokens,              CAST(COALESCE(sum(c.cached_input_tokens), 0) AS BIGINT) AS cached_input_tokens,              CAST(COALESCE(sum(c.cache_creation_input_tokens), 0) AS BIGINT)                  AS cache_creation_input_tokens,              CAST(COALESCE(sum(c.reasoning_tokens), 0) AS BIGINT) AS reasoning_tokens,              CAST(COALESCE(sum(c.total_tokens), 0) AS BIGINT) AS total_tokens,              CAST(COALESCE(sum(c.cost_micros_usd), 0) AS BIGINT) AS cost_micros_usd";
        let sql = if query.group == UsageGroup::Total {
            format!("SELECT {sums} FROM provider_calls c WHERE c.tenant = $1{filters}")
        } else {
            let mut having = String::new();
            if let Some(after) = &query.after {
                let after = match query.group {
                    UsageGroup::Day => Value::Int(
                        usage::day_of_date(after)
                            .ok_or_else(|| Error::invalid("page_token", "is malformed"))?,
                    ),
                    _ => Value::Text(escape(after)),
                };
                values.push(after);
                having = format!(" HAVING {key} > ${}", values.len());
            }
            values.push(Value::Int(i64::try_from(query.limit).unwrap_or(i64::MAX)));
            format!(
                "SELECT {key} AS k, {sums} FROM provider_calls c{join}                  WHERE c.tenant = $1{filters} GROUP BY {key}{having} ORDER BY {key} LIMIT ${}",
                values.len()
            )
        };
        let rows = bound(&sql, values).fetch_all(&self.inner.pool).await?;
        rows.iter()
            .map(|row| {
                let key = match query.group {
                    UsageGroup::Total => String::new(),
                    UsageGroup::Day => usage::date_of_day(row.try_get("k")?),
                    _ => text_col(row, "k")?,
                };
                Ok(UsageRow {
                    key,
                    calls: row.try_get("calls")?,
                    prompt_tokens: row.try_get("prompt_tokens")?,
                    completion_tokens: row.try_get("completion_tokens")?,
                    cached_input_tokens: row.try_get("cached_input_tokens")?,
                    cache_creation_input_tokens: row.try_get("cache_creation_input_tokens")?,
                    reasoning_tokens: row.try_get("reasoning_tokens")?,
                    total_tokens: row.try_get("total_tokens")?,
                    cost_micros_usd: row.try_get("cost_micros_usd")?,
                })
            })
            .collect()
    }

    async fn erase_user(&self, tenant: &str, erasure: Erasure) -> Result<Erased> {
        let Erasure { user, scopes } = erasure;
        let mut erased = Erased::default();
        let mut last_marked = None;
        loop {
            let op = EraseMark {
                user: user.clone(),
                limit: ERASE_SESSIONS_PER_BATCH,
            };
            let marked = self.write(tenant, op).await?;
            if marked == 0 {
                break;
            }
            erased.sessions += marked;
            last_marked = Some(tokio::time::Instant::now());
        }
        let (messages, provider_calls) = self
            .erase_rows(tenant, Tombstones::OfUser(user.clone()))
            .await?;
        erased.messages += messages;
        erased.provider_calls += provider_calls;
        if let Some(marked) = last_marked {
            tokio::time::sleep_until(marked + ERASE_TOMBSTONE_GRACE).await;
        }
        loop {
            let op = EraseTombstones {
                user: user.clone(),
                limit: ERASE_SESSIONS_PER_BATCH,
            };
            if self.write(tenant, op).await? == 0 {
                break;
            }
        }
        let op = EraseFinish {
            user,
            scopes,
            erased,
        };
        erased.state_entries = self.write(tenant, op).await?;
        self.inner.backend.scrub(&self.inner.pool).await?;
        tracing::info!(
            tenant,
            sessions = erased.sessions,
            messages = erased.messages,
            provider_calls = erased.provider_calls,
            state_entries = erased.state_entries,
            "erased a user's sessions"
        );
        Ok(erased)
    }

    async fn search(&self, tenant: &str, query: SearchQuery) -> Result<Vec<SearchHit>> {
        if !self.inner.search {
            return Err(Error::SearchDisabled);
        }
        // Expired sessions are gone from their expire_time on.
        let mut filters = " AND (s.expire_time = 0 OR s.expire_time > $5)".to_owned();
        if query.user.is_some() {
            filters.push_str(" AND s.user_name = $6");
        }
        let (sql, words) = self.inner.backend.search_statement(&filters, &query.words);
        self.inner.backend.search_ready(&self.inner.pool).await?;
        let mut q = sqlx::query(&sql)
            .bind(words)
            .bind(escape(tenant))
            .bind(limit_param(query.limit))
            .bind(limit_param(query.offset))
            .bind(Timestamp::now().0);
        if let Some(user) = &query.user {
            q = q.bind(escape(user));
        }
        let rows = q.fetch_all(&self.inner.pool).await?;
        rows.iter()
            .map(|row| {
                let message = Content::of(row.try_get("body")?, row.try_get("wire")?).message()?;
                Ok(SearchHit {
                    session_id: text_col(row, "session_id")?,
                    session_title: text_col(row, "title")?,
                    sequence: row.try_get("sequence")?,
                    message_id: row.try_get("message_id")?,
                    role: message.role,
                    // SQLite's index cuts its own; PostgreSQL's keeps
                    // only words, so the snippet is cut from the body.
                    snippet: match row.try_get::<Option<String>, _>("snippet")? {
                        Some(snippet) => snippet,
                        None => search::snippet(&control::search_text(&message), &query.words),
                    },
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
        // No index orders every tenant's sessions by update_time: appends
        // would write one more entry each (migration 0014). The listing
        // index orders each tenant's, so the tenants are walked in order
        // (one index probe each, through the live-id index) and each one's
        // idle sessions read oldest first, until `limit`.
        let tenants: Vec<String> = sqlx::query_scalar(
            "WITH RECURSIVE tenants (tenant) AS ( \
                 SELECT MIN(tenant) FROM sessions WHERE deleted = 0 \
                 UNION ALL \
                 SELECT (SELECT MIN(s.tenant) FROM sessions s \
                         WHERE s.deleted = 0 AND s.tenant > tenants.tenant) \
                 FROM tenants WHERE tenants.tenant IS NOT NULL) \
             SELECT tenant FROM tenants WHERE tenant IS NOT NULL",
        )
        .fetch_all(&self.inner.pool)
        .await?;
        let mut idle = Vec::new();
        for tenant in tenants {
            let left = limit.saturating_sub(idle.len());
            if left == 0 {
                break;
            }
            let rows = sqlx::query(
                "SELECT tenant, id FROM sessions WHERE tenant = $1 AND deleted = 0 \
                 AND update_time < $2 ORDER BY update_time, id LIMIT $3",
            )
            .bind(tenant)
            .bind(before.0)
            .bind(limit_param(left))
            .fetch_all(&self.inner.pool)
            .await?;
            for row in &rows {
                idle.push(SweepCandidate {
                    tenant: text_col(row, "tenant")?,
                    id: text_col(row, "id")?,
                });
            }
        }
        Ok(idle)
    }

    async fn expired_sessions(&self, now: Timestamp, limit: usize) -> Result<Vec<SweepCandidate>> {
        self.candidates(
            "SELECT tenant, id FROM sessions WHERE deleted = 0 AND expire_time > 0 \
             AND expire_time <= $1 ORDER BY expire_time LIMIT $2",
            now,
            limit,
        )
        .await
    }

    async fn delete_expired(&self, tenant: &str, id: &str, now: Timestamp) -> Result<bool> {
        let op = DeleteExpired {
            id: id.to_owned(),
            now,
        };
        match self.write(tenant, op).await {
            Ok(Some(key)) => self.delete_history(tenant, key).await.map(|()| true),
            Ok(None) => Ok(false),
            // Deleted meanwhile (by another replica's sweeper): nothing to do.
            Err(Error::SessionNotFound(_)) => Ok(false),
            Err(error) => Err(error),
        }
    }

    async fn delete_idle(&self, tenant: &str, id: &str, before: Timestamp) -> Result<bool> {
        let op = DeleteIdle {
            id: id.to_owned(),
            idle_before: before,
        };
        match self.write(tenant, op).await {
            Ok(Some(key)) => self.delete_history(tenant, key).await.map(|()| true),
            Ok(None) => Ok(false),
            // Deleted meanwhile: nothing to do.
            Err(Error::SessionNotFound(_)) => Ok(false),
            Err(error) => Err(error),
        }
    }

    async fn purge_tombstones(&self, before: Timestamp, limit: usize) -> Result<u64> {
        // Deletions cut short (the server or the database went away part
        // way through `delete_history`) are finished a batch at a time
        // first, so the purge's one transaction has little left to take.
        let unfinished = sqlx::query(
            "SELECT s.tenant, s.key FROM sessions s \
             WHERE s.deleted = 1 AND s.update_time < $1 \
             AND (EXISTS (SELECT 1 FROM messages m WHERE m.session_key = s.key) \
             OR EXISTS (SELECT 1 FROM provider_calls c WHERE c.session_key = s.key)) \
             ORDER BY s.update_time LIMIT $2",
        )
        .bind(before.0)
        .bind(limit_param(limit))
        .fetch_all(&self.inner.pool)
        .await?;
        for row in unfinished {
            let (tenant, key) = (text_col(&row, "tenant")?, row.try_get("key")?);
            tracing::info!(tenant, key, "finishing a deleted session's deletion");
            self.delete_history(&tenant, key).await?;
        }
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
            queued_writes: Some(self.inner.backend.queued_writes()),
            append_batches: self.inner.backend.append_batches(),
        }
    }

    async fn close(&self) {
        self.inner.backend.close(&self.inner.pool).await;
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
pub(super) async fn close_pool(pool: &AnyPool) {
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
    /// Records the expiries due in the tenant's sessions (or in one) before
    /// a call reads or decides their approvals: a write only when one is
    /// due.
    async fn expire_if_due(&self, tenant: &str, session_id: Option<&str>) -> Result<()> {
        let due: Vec<String> = sqlx::query_scalar(
            "SELECT DISTINCT s.id FROM approvals a JOIN sessions s ON s.key = a.session_key \
             WHERE a.tenant = $1 AND a.state = 1 AND a.expire_time > 0 AND a.expire_time <= $2 \
             AND s.deleted = 0 AND ($3 = '' OR s.id = $3) LIMIT 100",
        )
        .bind(escape(tenant))
        .bind(Timestamp::now().0)
        .bind(escape(session_id.unwrap_or_default()))
        .fetch_all(&self.inner.pool)
        .await?;
        for id in due {
            match self.expire_approvals(tenant, &unescape(id)).await {
                Ok(()) | Err(Error::SessionNotFound(_)) => {}
                Err(error) => return Err(error),
            }
        }
        Ok(())
    }

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

/// The statement [`Backend::call_origins`] runs.
pub(super) const CALL_ORIGINS: &str =
    "SELECT id, provider, model FROM provider_calls WHERE session_key = $1";

/// [`Backend::call_origins`] through sqlx.
pub(super) async fn call_origins(pool: &AnyPool, session_key: i64) -> Result<Origins> {
    let mut rows = sqlx::query(CALL_ORIGINS).bind(session_key).fetch(pool);
    let mut origins = Origins::default();
    while let Some(row) = rows.try_next().await? {
        origins.insert(
            row.try_get("id")?,
            Origin {
                provider: text_col(&row, "provider")?,
                model: text_col(&row, "model")?,
            },
        );
    }
    Ok(origins)
}

/// ListSessions' statement for `plan`: its parameters are the tenant, the
/// user (if any), each metadata filter's key and value, the cursor (if
/// any), the time now and the limit, in that order.
fn list_sessions_sql(plan: ListPlan, query: &SessionQuery) -> String {
    // Which table the statement reads first, and how. SQLite's plans
    // are named outright (`INDEXED BY`, and `CROSS JOIN`, which SQLite
    // never reorders), so that no statistics can change them.
    let user_param = query.user.is_some().then_some(2);
    let first_filter = if user_param.is_some() { 3 } else { 2 };
    let from = match plan {
        ListPlan::Planner => "sessions".to_owned(),
        ListPlan::Walk if user_param.is_some() => {
            "sessions INDEXED BY sessions_by_user_update".to_owned()
        }
        ListPlan::Walk => "sessions INDEXED BY sessions_by_update".to_owned(),
        ListPlan::Drive(index) => {
            let key = first_filter + 2 * index;
            format!(
                "(SELECT session_key FROM session_metadata \
                 INDEXED BY session_metadata_by_value \
                 WHERE tenant = $1 AND key = ${key} AND value = ${}) AS driving \
                 CROSS JOIN sessions ON sessions.key = driving.session_key",
                key + 1
            )
        }
    };
    let mut sql = format!(
        "SELECT {SESSION_COLUMNS}, message_count, provider_call_count, last_model, \
         last_provider, last_cost_micros_usd, last_request_id, total_tokens, \
         total_cost_micros_usd FROM {from} WHERE sessions.tenant = $1 AND deleted = 0"
    );
    if let Some(user) = user_param {
        sql.push_str(&format!(" AND user_name = ${user}"));
    }
    let mut next = first_filter;
    for index in 0..query.metadata.len() {
        let (key, value) = (next, next + 1);
        next += 2;
        match plan {
            ListPlan::Drive(driving) if driving == index => {}
            ListPlan::Planner => sql.push_str(&format!(
                " AND key IN (SELECT session_key FROM session_metadata \
                 WHERE tenant = $1 AND key = ${key} AND value = ${value})"
            )),
            _ => sql.push_str(&format!(
                " AND EXISTS (SELECT 1 FROM session_metadata m \
                 WHERE m.session_key = sessions.key AND m.key = ${key} AND m.value = ${value})"
            )),
        }
    }
    if query.after.is_some() {
        sql.push_str(&format!(
            " AND (update_time, id) < (${next}, ${})",
            next + 1
        ));
        next += 2;
    }
    // Expired sessions are gone from their expire_time on.
    sql.push_str(&format!(
        " AND (expire_time = 0 OR expire_time > ${next}) \
         ORDER BY update_time DESC, id DESC LIMIT ${}",
        next + 1
    ));
    sql
}

/// A ListSessions row, its lease hidden if it expired by `now`.
fn summary_from_row(row: &AnyRow, now: Timestamp) -> Result<SessionSummary> {
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
}

/// `sql` with `values` bound, in order.
fn bound(
    sql: &str,
    values: Vec<Value>,
) -> sqlx::query::Query<'_, sqlx::Any, sqlx::any::AnyArguments<'_>> {
    let mut statement = sqlx::query(sql);
    for value in values {
        statement = match value {
            Value::Int(v) => statement.bind(v),
            Value::Text(v) => statement.bind(v),
            Value::NullableText(v) => statement.bind(v),
            Value::Bytes(v) => statement.bind(v),
            Value::Words(v) => statement.bind(crate::domain::search::tsvector(&v)),
        };
    }
    statement
}
