//! The SQLite backend: WAL, `synchronous = FULL`, foreign keys on.
//!
//! All writes go through one writer task. It drains whatever requests are
//! queued (up to [`MAX_BATCH`]) into one `BEGIN IMMEDIATE` transaction,
//! each request inside its own savepoint, and acknowledges every request
//! only after that transaction has committed: group commit, one fsync for
//! many appends, and no two writers can ever race for a sequence. Reads use
//! a separate pool (WAL lets them run beside the writer).
//!
//! `sqlite::memory:` runs the very same code on a one-connection pool, the
//! connection kept open for the store's lifetime.

use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::migrate::Migrator;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool, SqlitePoolOptions,
    SqliteRow, SqliteSynchronous,
};
use sqlx::{Connection, Row};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use super::{CommitSink, ListedCall, SessionHandle, Store};
use crate::domain::exchange::diff_full_history;
use crate::domain::{
    AppendedExchange, Change, Error, Message, NewExchange, NewSession, ProviderCall, Result,
    Session, SessionEvent, SessionPatch, SessionQuery, SessionSummary, StoredMessage, Timestamp,
    ids,
};

static MIGRATOR: Migrator = sqlx::migrate!("../migrations/sqlite");

/// The most write requests committed in one transaction.
const MAX_BATCH: usize = 256;
/// Write requests that may wait for the writer before callers are held back.
const QUEUE_DEPTH: usize = 4096;

/// Why the store could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("cannot open the SQLite database: {0}")]
    Database(#[from] sqlx::Error),
    #[error("cannot apply the SQLite migrations: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
}

/// A sessionstore on SQLite. Cheap to clone.
#[derive(Clone)]
pub struct SqliteStore {
    inner: Arc<Inner>,
}

struct Inner {
    pool: SqlitePool,
    /// `None` asks the writer to finish the queue and stop.
    jobs: mpsc::Sender<Option<Job>>,
    writer: Mutex<Option<JoinHandle<()>>>,
}

impl SqliteStore {
    /// Opens (creating if missing) and migrates the database at `url`
    /// (`sqlite://PATH` or `sqlite::memory:`), then starts the writer.
    pub async fn open(url: &str, sink: Arc<dyn CommitSink>) -> Result<Self, OpenError> {
        let pool = connect(url).await?;
        MIGRATOR.run(&pool).await?;
        let (jobs, queue) = mpsc::channel(QUEUE_DEPTH);
        let writer = tokio::spawn(run_writer(pool.clone(), queue, sink));
        Ok(SqliteStore {
            inner: Arc::new(Inner {
                pool,
                jobs,
                writer: Mutex::new(Some(writer)),
            }),
        })
    }

    /// Applies the migrations and returns, for `sessionstore migrate`.
    pub async fn migrate(url: &str) -> Result<(), OpenError> {
        let pool = connect(url).await?;
        MIGRATOR.run(&pool).await?;
        pool.close().await;
        Ok(())
    }

    async fn submit(&self, tenant: &str, op: WriteOp) -> Result<Written> {
        let (reply, answer) = oneshot::channel();
        let job = Job {
            tenant: tenant.to_owned(),
            op,
            reply,
        };
        self.inner
            .jobs
            .send(Some(job))
            .await
            .map_err(|_| Error::ShuttingDown)?;
        answer.await.map_err(|_| Error::ShuttingDown)?
    }
}

fn is_in_memory(url: &str) -> bool {
    url.contains(":memory:") || url.contains("mode=memory")
}

async fn connect(url: &str) -> Result<SqlitePool, sqlx::Error> {
    let in_memory = is_in_memory(url);
    let mut options = SqliteConnectOptions::from_str(url)?
        .create_if_missing(true)
        .foreign_keys(true)
        .busy_timeout(Duration::from_secs(10));
    if !in_memory {
        // FULL: an acknowledged commit survives power loss, not just a crash.
        options = options
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full);
    }
    let pool = if in_memory {
        // One connection, never recycled: it *is* the database.
        SqlitePoolOptions::new()
            .max_connections(1)
            .min_connections(1)
            .idle_timeout(None)
            .max_lifetime(None)
    } else {
        SqlitePoolOptions::new()
            .max_connections(8)
            .acquire_timeout(Duration::from_secs(30))
    };
    pool.connect_with(options).await
}

impl From<sqlx::Error> for Error {
    fn from(error: sqlx::Error) -> Self {
        Error::storage(error)
    }
}

// ---------------------------------------------------------------------------
// The writer

enum WriteOp {
    Create(NewSession),
    Update { id: String, patch: SessionPatch },
    Delete { id: String },
    Append(Box<NewExchange>),
}

enum Written {
    Created(Session, Vec<StoredMessage>),
    Updated(Session),
    Deleted,
    Appended(i64, AppendedExchange),
}

struct Job {
    tenant: String,
    op: WriteOp,
    reply: oneshot::Sender<Result<Written>>,
}

/// What one applied request committed: its answer and the events to publish.
struct Applied {
    written: Written,
    session_key: i64,
    events: Vec<Arc<SessionEvent>>,
}

async fn run_writer(
    pool: SqlitePool,
    mut queue: mpsc::Receiver<Option<Job>>,
    sink: Arc<dyn CommitSink>,
) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    while let Some(first) = queue.recv().await {
        match first {
            Some(job) => batch.push(job),
            None => queue.close(),
        }
        while batch.len() < MAX_BATCH {
            match queue.try_recv() {
                Ok(Some(job)) => batch.push(job),
                Ok(None) => queue.close(),
                Err(_) => break,
            }
        }
        if !batch.is_empty() {
            commit_batch(&pool, sink.as_ref(), std::mem::take(&mut batch)).await;
        }
    }
    tracing::debug!("sqlite writer stopped");
}

async fn commit_batch(pool: &SqlitePool, sink: &dyn CommitSink, jobs: Vec<Job>) {
    let mut conn = match pool.acquire().await {
        Ok(conn) => conn,
        Err(error) => return fail_all(jobs, &error),
    };
    let mut tx = match conn.begin_with("BEGIN IMMEDIATE").await {
        Ok(tx) => tx,
        Err(error) => return fail_all(jobs, &error),
    };
    let mut results = Vec::with_capacity(jobs.len());
    for job in jobs {
        let outcome = apply_in_savepoint(&mut tx, &job.tenant, job.op).await;
        match outcome {
            Ok(result) => results.push((job.reply, result)),
            Err(broken) => {
                // The savepoint itself failed: the transaction is unusable.
                tracing::error!(error = %broken, "write transaction broken; rolling back the batch");
                drop(tx);
                let error = Error::storage(broken);
                for (reply, _) in results {
                    let _ = reply.send(Err(Error::storage(std::io::Error::other(
                        "batch rolled back",
                    ))));
                }
                let _ = job.reply.send(Err(error));
                return;
            }
        }
    }
    if let Err(error) = tx.commit().await {
        tracing::error!(%error, "commit failed");
        for (reply, result) in results {
            let answer = match result {
                Ok(_) => Err(Error::storage(std::io::Error::other("commit failed"))),
                Err(domain) => Err(domain),
            };
            let _ = reply.send(answer);
        }
        return;
    }
    for (reply, result) in results {
        let answer = result.map(|applied| {
            if !applied.events.is_empty() {
                sink.committed(applied.session_key, &applied.events);
            }
            applied.written
        });
        let _ = reply.send(answer);
    }
}

fn fail_all(jobs: Vec<Job>, error: &sqlx::Error) {
    tracing::error!(%error, "cannot start a write transaction");
    for job in jobs {
        let _ = job.reply.send(Err(Error::storage(std::io::Error::other(
            "cannot start a write transaction",
        ))));
    }
}

/// Runs one request in a savepoint: on a domain error the savepoint is
/// rolled back (the request writes nothing) and the batch goes on. The
/// outer `Err` means the savepoint machinery itself failed.
async fn apply_in_savepoint(
    conn: &mut SqliteConnection,
    tenant: &str,
    op: WriteOp,
) -> Result<Result<Applied>, sqlx::Error> {
    let mut savepoint = conn.begin().await?;
    let result = apply(&mut savepoint, tenant, op).await;
    match result {
        Ok(applied) => {
            savepoint.commit().await?;
            Ok(Ok(applied))
        }
        Err(error) => {
            savepoint.rollback().await?;
            if let Error::Storage(source) = &error {
                tracing::error!(error = %source, "write failed");
            }
            Ok(Err(error))
        }
    }
}

async fn apply(conn: &mut SqliteConnection, tenant: &str, op: WriteOp) -> Result<Applied> {
    match op {
        WriteOp::Create(new) => create_session(conn, tenant, new).await,
        WriteOp::Update { id, patch } => update_session(conn, tenant, &id, patch).await,
        WriteOp::Delete { id } => delete_session(conn, tenant, &id).await,
        WriteOp::Append(exchange) => append_exchange(conn, tenant, *exchange).await,
    }
}

// ---------------------------------------------------------------------------
// Write operations (inside the writer's transaction)

/// A live session row as the write path needs it.
struct SessionRow {
    key: i64,
    session: Session,
    next_sequence: i64,
}

const SESSION_COLUMNS: &str = "key, id, title, system_prompt, user_name, metadata, \
     summary_message_id, revision, create_time, update_time, next_sequence";

fn session_from_row(row: &SqliteRow) -> Result<Session> {
    let metadata: String = row.try_get("metadata")?;
    Ok(Session {
        id: row.try_get("id")?,
        title: row.try_get("title")?,
        system_prompt: row.try_get("system_prompt")?,
        user: row.try_get("user_name")?,
        metadata: serde_json::from_str(&metadata).map_err(Error::storage)?,
        summary_message_id: row.try_get("summary_message_id")?,
        revision: row.try_get("revision")?,
        create_time: Timestamp(row.try_get("create_time")?),
        update_time: Timestamp(row.try_get("update_time")?),
    })
}

async fn load_live(conn: &mut SqliteConnection, tenant: &str, id: &str) -> Result<SessionRow> {
    let sql = format!(
        "SELECT {SESSION_COLUMNS} FROM sessions WHERE tenant = ? AND id = ? AND deleted = 0"
    );
    let row = sqlx::query(&sql)
        .bind(tenant)
        .bind(id)
        .fetch_optional(&mut *conn)
        .await?
        .ok_or_else(|| Error::SessionNotFound(id.to_owned()))?;
    Ok(SessionRow {
        key: row.try_get("key")?,
        session: session_from_row(&row)?,
        next_sequence: row.try_get("next_sequence")?,
    })
}

fn encode<T: serde::Serialize>(value: &T) -> Result<String> {
    serde_json::to_string(value).map_err(Error::storage)
}

fn decode<T: serde::de::DeserializeOwned>(text: &str) -> Result<T> {
    serde_json::from_str(text).map_err(Error::storage)
}

async fn insert_event(
    conn: &mut SqliteConnection,
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
    sqlx::query("INSERT INTO events (session_key, revision, time, body) VALUES (?, ?, ?, ?)")
        .bind(session_key)
        .bind(revision)
        .bind(time.0)
        .bind(encode(&event.change)?)
        .execute(&mut *conn)
        .await?;
    Ok(Arc::new(event))
}

/// Inserts messages at consecutive sequences from `first_sequence`.
async fn insert_messages(
    conn: &mut SqliteConnection,
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
             VALUES (?, ?, ?, ?, ?, ?)",
        )
        .bind(session_key)
        .bind(sequence)
        .bind(&id)
        .bind(call_id.as_deref())
        .bind(encode(&message)?)
        .bind(now.0)
        .execute(&mut *conn)
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

async fn create_session(
    conn: &mut SqliteConnection,
    tenant: &str,
    new: NewSession,
) -> Result<Applied> {
    let id = new.id.clone().unwrap_or_else(ids::session_id);
    let taken: Option<i64> =
        sqlx::query_scalar("SELECT 1 FROM sessions WHERE tenant = ? AND id = ? AND deleted = 0")
            .bind(tenant)
            .bind(&id)
            .fetch_optional(&mut *conn)
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
         VALUES (?, ?, ?, ?, ?, ?, 1, ?, ?, ?, ?) RETURNING key",
    )
    .bind(tenant)
    .bind(&session.id)
    .bind(&session.title)
    .bind(&session.system_prompt)
    .bind(&session.user)
    .bind(encode(&session.metadata)?)
    .bind(count)
    .bind(count)
    .bind(now.0)
    .bind(now.0)
    .fetch_one(&mut *conn)
    .await?;
    let messages = insert_messages(
        conn,
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
    let event = insert_event(conn, key, 1, now, change).await?;
    Ok(Applied {
        written: Written::Created(session, messages),
        session_key: key,
        events: vec![event],
    })
}

async fn update_session(
    conn: &mut SqliteConnection,
    tenant: &str,
    id: &str,
    patch: SessionPatch,
) -> Result<Applied> {
    let SessionRow {
        key, mut session, ..
    } = load_live(conn, tenant, id).await?;
    if let Some(summary) = patch.summary_message_id.as_ref().filter(|s| !s.is_empty()) {
        let exists: Option<i64> =
            sqlx::query_scalar("SELECT 1 FROM messages WHERE session_key = ? AND id = ?")
                .bind(key)
                .bind(summary)
                .fetch_optional(&mut *conn)
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
        "UPDATE sessions SET title = ?, system_prompt = ?, metadata = ?, summary_message_id = ?, \
         revision = ?, update_time = ? WHERE key = ?",
    )
    .bind(&session.title)
    .bind(&session.system_prompt)
    .bind(encode(&session.metadata)?)
    .bind(&session.summary_message_id)
    .bind(session.revision)
    .bind(now.0)
    .bind(key)
    .execute(&mut *conn)
    .await?;
    let change = Change::SessionUpdated {
        session: session.clone(),
    };
    let event = insert_event(conn, key, session.revision, now, change).await?;
    Ok(Applied {
        written: Written::Updated(session),
        session_key: key,
        events: vec![event],
    })
}

async fn delete_session(conn: &mut SqliteConnection, tenant: &str, id: &str) -> Result<Applied> {
    let SessionRow { key, session, .. } = load_live(conn, tenant, id).await?;
    for sql in [
        "DELETE FROM idempotency_keys WHERE session_key = ?",
        "DELETE FROM messages WHERE session_key = ?",
        "DELETE FROM provider_calls WHERE session_key = ?",
        "DELETE FROM events WHERE session_key = ?",
    ] {
        sqlx::query(sql).bind(key).execute(&mut *conn).await?;
    }
    let now = Timestamp::now();
    let revision = session.revision + 1;
    sqlx::query(
        "UPDATE sessions SET deleted = 1, revision = ?, update_time = ?, message_count = 0 \
         WHERE key = ?",
    )
    .bind(revision)
    .bind(now.0)
    .bind(key)
    .execute(&mut *conn)
    .await?;
    let event = insert_event(conn, key, revision, now, Change::SessionDeleted).await?;
    Ok(Applied {
        written: Written::Deleted,
        session_key: key,
        events: vec![event],
    })
}

async fn append_exchange(
    conn: &mut SqliteConnection,
    tenant: &str,
    exchange: NewExchange,
) -> Result<Applied> {
    // Idempotency first: a retry gets the first result even if it would now
    // fail another check (a stale expected_next_sequence, say).
    let fingerprint = (!exchange.request_id.is_empty()).then(|| exchange.fingerprint());
    if let Some(fingerprint) = &fingerprint {
        let earlier: Option<(Vec<u8>, i64, i64)> = sqlx::query_as(
            "SELECT fingerprint, session_key, revision FROM idempotency_keys \
             WHERE tenant = ? AND request_id = ?",
        )
        .bind(tenant)
        .bind(&exchange.request_id)
        .fetch_optional(&mut *conn)
        .await?;
        if let Some((earlier_fingerprint, key, revision)) = earlier {
            if earlier_fingerprint != *fingerprint {
                return Err(Error::IdempotencyConflict(exchange.request_id));
            }
            let body: String = sqlx::query_scalar(
                "SELECT body FROM events WHERE session_key = ? AND revision = ?",
            )
            .bind(key)
            .bind(revision)
            .fetch_one(&mut *conn)
            .await?;
            let Change::ExchangeAppended(first) = decode::<Change>(&body)? else {
                return Err(Error::storage(std::io::Error::other(
                    "idempotency key points at a non-append event",
                )));
            };
            return Ok(Applied {
                written: Written::Appended(revision, first),
                session_key: key,
                events: Vec::new(),
            });
        }
    }

    let SessionRow {
        key,
        session,
        next_sequence,
    } = load_live(conn, tenant, &exchange.session_id).await?;
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
        let bodies: Vec<String> =
            sqlx::query_scalar("SELECT body FROM messages WHERE session_key = ? ORDER BY sequence")
                .bind(key)
                .fetch_all(&mut *conn)
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
             requested_provider, requested_model, prompt_tokens, completion_tokens, total_tokens, \
             cost_micros_usd, create_time) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(&call.id)
        .bind(key)
        .bind(&call.request_id)
        .bind(&call.provider)
        .bind(&call.model)
        .bind(&call.requested_provider)
        .bind(&call.requested_model)
        .bind(call.prompt_tokens)
        .bind(call.completion_tokens)
        .bind(call.total_tokens)
        .bind(call.cost_micros_usd)
        .bind(now.0)
        .execute(&mut *conn)
        .await?;
    }
    let call_id = call.as_ref().map(|c| c.id.clone());
    let to_store = inputs
        .into_iter()
        .map(|m| (m, None))
        .chain(response_messages.into_iter().map(|m| (m, call_id.clone())));
    let stored = insert_messages(conn, key, &session.id, next_sequence, to_store, now).await?;
    let added = i64::try_from(stored.len()).map_err(Error::storage)?;
    let next_sequence = next_sequence + added;
    let revision = session.revision + 1;
    match &call {
        None => {
            sqlx::query(
                "UPDATE sessions SET revision = ?, next_sequence = ?, \
                 message_count = message_count + ?, update_time = ? WHERE key = ?",
            )
            .bind(revision)
            .bind(next_sequence)
            .bind(added)
            .bind(now.0)
            .bind(key)
            .execute(&mut *conn)
            .await?;
        }
        Some(call) => {
            sqlx::query(
                "UPDATE sessions SET revision = ?, next_sequence = ?, \
                 message_count = message_count + ?, update_time = ?, \
                 provider_call_count = provider_call_count + 1, last_model = ?, \
                 last_provider = ?, last_cost_micros_usd = ?, last_request_id = ?, \
                 total_tokens = total_tokens + ?, \
                 total_cost_micros_usd = total_cost_micros_usd + ? WHERE key = ?",
            )
            .bind(revision)
            .bind(next_sequence)
            .bind(added)
            .bind(now.0)
            .bind(&call.model)
            .bind(&call.provider)
            .bind(call.cost_micros_usd)
            .bind(&call.request_id)
            .bind(call.total_tokens)
            .bind(call.cost_micros_usd)
            .bind(key)
            .execute(&mut *conn)
            .await?;
        }
    }
    let appended = AppendedExchange {
        messages: stored,
        provider_call: call,
        run_id,
        next_sequence,
    };
    let event = insert_event(
        conn,
        key,
        revision,
        now,
        Change::ExchangeAppended(appended.clone()),
    )
    .await?;
    if let Some(fingerprint) = fingerprint {
        sqlx::query(
            "INSERT INTO idempotency_keys (tenant, request_id, session_key, fingerprint, revision) \
             VALUES (?, ?, ?, ?, ?)",
        )
        .bind(tenant)
        .bind(&request_id)
        .bind(key)
        .bind(fingerprint)
        .bind(revision)
        .execute(&mut *conn)
        .await?;
    }
    Ok(Applied {
        written: Written::Appended(revision, appended),
        session_key: key,
        events: vec![event],
    })
}

// ---------------------------------------------------------------------------
// Reads (on the pool)

fn stored_message_from_row(row: &SqliteRow, session_id: &str) -> Result<StoredMessage> {
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

impl Store for SqliteStore {
    async fn create_session(
        &self,
        tenant: &str,
        new: NewSession,
    ) -> Result<(Session, Vec<StoredMessage>)> {
        match self.submit(tenant, WriteOp::Create(new)).await? {
            Written::Created(session, messages) => Ok((session, messages)),
            other => Err(unexpected(other)),
        }
    }

    async fn get_session(&self, tenant: &str, id: &str) -> Result<Session> {
        let sql = format!(
            "SELECT {SESSION_COLUMNS} FROM sessions WHERE tenant = ? AND id = ? AND deleted = 0"
        );
        let row = sqlx::query(&sql)
            .bind(tenant)
            .bind(id)
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
             total_cost_micros_usd FROM sessions WHERE tenant = ? AND deleted = 0"
        );
        if query.user.is_some() {
            sql.push_str(" AND user_name = ?");
        }
        if query.after.is_some() {
            sql.push_str(" AND (update_time, id) < (?, ?)");
        }
        sql.push_str(" ORDER BY update_time DESC, id DESC LIMIT ?");
        let mut q = sqlx::query(&sql).bind(tenant);
        if let Some(user) = &query.user {
            q = q.bind(user);
        }
        if let Some(after) = &query.after {
            q = q.bind(after.update_time).bind(&after.id);
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
                    last_model: row.try_get("last_model")?,
                    last_provider: row.try_get("last_provider")?,
                    last_cost_micros_usd: row.try_get("last_cost_micros_usd")?,
                    last_request_id: row.try_get("last_request_id")?,
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
        match self.submit(tenant, op).await? {
            Written::Updated(session) => Ok(session),
            other => Err(unexpected(other)),
        }
    }

    async fn delete_session(&self, tenant: &str, id: &str) -> Result<()> {
        let op = WriteOp::Delete { id: id.to_owned() };
        match self.submit(tenant, op).await? {
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
            .submit(tenant, WriteOp::Append(Box::new(exchange)))
            .await?
        {
            Written::Appended(revision, appended) => Ok((revision, appended)),
            other => Err(unexpected(other)),
        }
    }

    async fn resolve(&self, tenant: &str, id: &str) -> Result<SessionHandle> {
        let row: Option<(i64, String, i64, i64, String, String)> = sqlx::query_as(
            "SELECT key, id, revision, next_sequence, system_prompt, summary_message_id \
             FROM sessions WHERE tenant = ? AND id = ? AND deleted = 0",
        )
        .bind(tenant)
        .bind(id)
        .fetch_optional(&self.inner.pool)
        .await?;
        let (key, id, revision, next_sequence, system_prompt, summary_message_id) =
            row.ok_or_else(|| Error::SessionNotFound(id.to_owned()))?;
        Ok(SessionHandle {
            key,
            id,
            revision,
            next_sequence,
            system_prompt,
            summary_message_id,
        })
    }

    async fn read_messages(
        &self,
        session: &SessionHandle,
        after: i64,
        limit: usize,
    ) -> Result<Vec<StoredMessage>> {
        let rows = sqlx::query(
            "SELECT id, sequence, produced_by_call_id, body, create_time FROM messages \
             WHERE session_key = ? AND sequence > ? ORDER BY sequence LIMIT ?",
        )
        .bind(session.key)
        .bind(after)
        .bind(limit_param(limit))
        .fetch_all(&self.inner.pool)
        .await?;
        rows.iter()
            .map(|row| stored_message_from_row(row, &session.id))
            .collect()
    }

    async fn read_messages_before(
        &self,
        session: &SessionHandle,
        before: i64,
        limit: usize,
    ) -> Result<Vec<StoredMessage>> {
        let rows = sqlx::query(
            "SELECT id, sequence, produced_by_call_id, body, create_time FROM messages \
             WHERE session_key = ? AND sequence < ? ORDER BY sequence DESC LIMIT ?",
        )
        .bind(session.key)
        .bind(before)
        .bind(limit_param(limit))
        .fetch_all(&self.inner.pool)
        .await?;
        rows.iter()
            .map(|row| stored_message_from_row(row, &session.id))
            .collect()
    }

    async fn message_sequence(
        &self,
        session: &SessionHandle,
        message_id: &str,
    ) -> Result<Option<i64>> {
        Ok(
            sqlx::query_scalar("SELECT sequence FROM messages WHERE session_key = ? AND id = ?")
                .bind(session.key)
                .bind(message_id)
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
             create_time FROM provider_calls WHERE session_key = ? AND ordinal > ? \
             ORDER BY ordinal LIMIT ?",
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
                        request_id: row.try_get("request_id")?,
                        provider: row.try_get("provider")?,
                        model: row.try_get("model")?,
                        requested_provider: row.try_get("requested_provider")?,
                        requested_model: row.try_get("requested_model")?,
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
        let rows: Vec<(i64, i64, String)> = sqlx::query_as(
            "SELECT revision, time, body FROM events WHERE session_key = ? AND revision > ? \
             ORDER BY revision LIMIT ?",
        )
        .bind(session_key)
        .bind(after)
        .bind(limit_param(limit))
        .fetch_all(&self.inner.pool)
        .await?;
        rows.into_iter()
            .map(|(revision, time, body)| {
                Ok(SessionEvent {
                    revision,
                    time: Timestamp(time),
                    change: decode(&body)?,
                })
            })
            .collect()
    }

    async fn close(&self) {
        // Ask the writer to finish what is queued, then wait for it.
        let _ = self.inner.jobs.send(None).await;
        let writer = self.inner.writer.lock().ok().and_then(|mut w| w.take());
        if let Some(writer) = writer {
            let _ = writer.await;
        }
        self.inner.pool.close().await;
    }
}
