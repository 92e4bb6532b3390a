//! Storage: one trait, one module per backend.
//!
//! Every method is scoped to a tenant or takes a [`SessionHandle`] that was
//! resolved for one. Backends map their database errors into
//! [`domain::Error`](crate::domain::Error) here, at the boundary; nothing
//! above this module sees a database type.

use std::future::Future;
use std::sync::Arc;

use crate::domain::approvals::{Approval, ApprovalQuery, DecideApproval, Decided, RequestApproval};
use crate::domain::erase::{Erased, Erasure};
use crate::domain::queue::{QueuedInput, SubmitInput, Submitted, Taken};
use crate::domain::target::Origins;
use crate::domain::usage::{UsageQuery, UsageRow};
use crate::domain::{
    AppendedExchange, ControlOp, Ephemeral, Fork, NewExchange, NewSession, ProviderCall, Result,
    SearchHit, Session, SessionEvent, SessionPatch, SessionQuery, SessionSummary, StateEntry,
    StoredMessage, Timestamp,
};
use crate::wire::EncodedEvent;

mod append;
mod export;
mod fault;
mod ledger;
mod once;
mod ops;
mod postgres;
mod rows;
mod sql;
mod sqlite;
mod text;
mod writer;

pub use export::ExportStart;
pub use ledger::{CheckStatus, Checked, Kind, Mode as MigrateMode, PendingMigration, Refusal};
pub use rows::{EncodedMessage, MessageRow, OwnedMessageRow};
pub use sql::SqlStore;
pub use sqlite::backup;

/// The database URL when none is given (`serve`, `migrate`, `backup`,
/// `restore`).
pub const DEFAULT_DATABASE_URL: &str = "sqlite://data/sessionstore.db";

/// Why a store could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("unsupported database URL {0:?}: use sqlite://PATH, sqlite::memory: or postgres://…")]
    UnsupportedUrl(String),
    #[error("cannot connect to the database: {0}")]
    Database(#[from] sqlx::Error),
    #[error("cannot connect to PostgreSQL at {target}: {cause}")]
    Unreachable { target: String, cause: String },
    #[error("bad database URL: {0}")]
    Url(String),
    #[error("cannot apply the database migrations: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("cannot start the SQLite append writer: {0}")]
    Engine(#[source] Box<dyn std::error::Error + Send + Sync>),
    #[error("cannot start the store's publisher thread: {0}")]
    Publisher(#[source] std::io::Error),
    #[error("cannot prepare the search index: {0}")]
    Search(#[source] crate::domain::Error),
    #[error("cannot register in the replica registry: {0}")]
    Register(#[source] sqlx::Error),
    /// The database's migrations say no (finalized past this binary,
    /// replicas behind a finalize): each with an exit code of its own.
    #[error(transparent)]
    Refused(#[from] Refusal),
    #[error("a SQLite database has no replica registry: only PostgreSQL replicas register")]
    NoRegistry,
}

impl OpenError {
    /// The exit code the process ends with for it, when it has its own.
    pub fn exit_code(&self) -> Option<u8> {
        match self {
            OpenError::Refused(refusal) => Some(refusal.exit_code()),
            _ => None,
        }
    }
}

/// Backend tuning that is not part of the URL.
#[derive(Clone, Debug)]
pub struct StoreOptions {
    /// PostgreSQL pool size per replica.
    pub max_connections: u32,
    /// PostgreSQL append writers per replica (`--append-writers`); `None`:
    /// one per core, at most 4.
    pub append_writers: Option<u32>,
    /// PostgreSQL: whether an append batch whose sessions a writer keeps
    /// commits in one round trip, as a statement of its own
    /// (`--append-one-trip`).
    pub append_one_trip: bool,
    /// How often a PostgreSQL replica re-reads the heads of watched sessions,
    /// in case a commit hint was lost.
    pub recheck_interval: std::time::Duration,
    /// Whether the search index is kept (`--search on`). Off, nothing is
    /// indexed, what was is removed, and searches fail SEARCH_DISABLED;
    /// on again, the index is rebuilt from the messages in the background.
    pub search: bool,
    /// The `HOST:PORT` a served store's server listens on: a PostgreSQL
    /// store registers under it in the replica registry. None: it does
    /// not register.
    pub advertised_address: Option<String>,
    /// How a SQLite file database's append and search connections write
    /// their WAL (`--sqlite-wal-writes`).
    pub wal_writes: WalWrites,
}

/// How a SQLite file database's busiest connections write the WAL.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WalWrites {
    /// A transaction's frames gathered into a few large writes (the
    /// WAL-gathering VFS), where the linked SQLite is one it was tested
    /// with; `Direct` otherwise, with a log line saying why.
    #[default]
    Gathered,
    /// Each frame written as SQLite writes it (SQLite's default VFS).
    Direct,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            max_connections: 16,
            append_writers: None,
            append_one_trip: true,
            recheck_interval: std::time::Duration::from_secs(5),
            search: true,
            advertised_address: None,
            wal_writes: WalWrites::default(),
        }
    }
}

enum Backend {
    Sqlite,
    Postgres,
}

fn backend_of(url: &str) -> Result<Backend, OpenError> {
    if url.starts_with("sqlite:") {
        Ok(Backend::Sqlite)
    } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        Ok(Backend::Postgres)
    } else {
        Err(OpenError::UnsupportedUrl(url.to_owned()))
    }
}

/// Whether the store `url` names writes its appends on a thread of its own
/// (a SQLite file; not in memory, not PostgreSQL): that thread is busy for
/// much of an append's time, so it takes a core's share beside the async
/// runtime's workers.
pub fn appends_on_own_thread(url: &str) -> bool {
    matches!(backend_of(url), Ok(Backend::Sqlite)) && !sqlite::is_in_memory(url)
}

/// Checks a database URL's form without connecting: its scheme, and for
/// PostgreSQL every listed host and `target_session_attrs`.
pub fn check_url(url: &str) -> Result<(), OpenError> {
    match backend_of(url)? {
        Backend::Sqlite => Ok(()),
        Backend::Postgres => postgres::check_url(url),
    }
}

/// Opens the store a database URL names, applying its migrations.
pub async fn open(
    url: &str,
    sink: Arc<dyn CommitSink>,
    options: &StoreOptions,
) -> Result<SqlStore, OpenError> {
    let (pool, backend): (_, Box<dyn sql::Backend>) = match backend_of(url)? {
        Backend::Sqlite => {
            let (pool, sqlite) = sqlite::open(url, Arc::clone(&sink), options).await?;
            (pool, Box::new(sqlite))
        }
        Backend::Postgres => {
            let (pool, postgres) = postgres::open(url, Arc::clone(&sink), options).await?;
            (pool, Box::new(postgres))
        }
    };
    Ok(SqlStore::new(pool, sink, backend, options.search))
}

/// What [`migrate`] did: the migrations it applied, in order, and this
/// binary's schema (the highest version it ships).
#[derive(Debug)]
pub struct Migrated {
    pub applied: Vec<PendingMigration>,
    pub schema: i64,
}

/// Applies a database's pending migrations of `mode` and returns: the
/// expand ones (`migrate`), or all of them (`migrate --finalize`, which
/// first refuses while a live replica runs an older schema). Refuses a
/// database finalized past this binary's schema ([`Refusal`]).
pub async fn migrate(url: &str, mode: MigrateMode) -> Result<Migrated, OpenError> {
    let (pool, applied, schema) = match backend_of(url)? {
        Backend::Sqlite => {
            let pool = sqlite::connections::pool(url).await?;
            let applied = sqlite::ledger::migrate(&pool, mode).await;
            (pool, applied, sqlite::ledger::schema())
        }
        Backend::Postgres => {
            postgres::check_reachable(url).await?;
            let pool = postgres::connect(url, 2).await?;
            let applied = postgres::ledger::migrate(&pool, mode).await;
            (pool, applied, postgres::ledger::schema())
        }
    };
    pool.close().await;
    Ok(Migrated {
        applied: applied?,
        schema,
    })
}

/// `migrate --check`: what a database has pending for this binary, and
/// whether it would refuse it. Applies nothing.
pub async fn check(url: &str) -> Result<Checked, OpenError> {
    match backend_of(url)? {
        Backend::Sqlite => sqlite::ledger::check(url).await,
        Backend::Postgres => {
            postgres::check_reachable(url).await?;
            let pool = postgres::connect(url, 2).await?;
            let checked = postgres::ledger::check(&pool).await;
            pool.close().await;
            checked
        }
    }
}

/// A replica in the registry (PostgreSQL's `sessionstore_replicas`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Replica {
    pub replica_id: String,
    /// What its `--version` prints.
    pub version: String,
    /// The highest migration version it ships.
    pub schema: i64,
    /// The `HOST:PORT` it serves on.
    pub address: String,
    /// RFC 3339, UTC.
    pub start_time: String,
    /// RFC 3339, UTC: its last heartbeat, by the database's clock.
    pub heartbeat_time: String,
}

/// The live replicas of a PostgreSQL database, oldest start first (a
/// SQLite database has no registry: [`OpenError::NoRegistry`]).
pub async fn replicas(url: &str) -> Result<Vec<Replica>, OpenError> {
    match backend_of(url)? {
        Backend::Sqlite => Err(OpenError::NoRegistry),
        Backend::Postgres => {
            postgres::check_reachable(url).await?;
            let pool = postgres::connect(url, 2).await?;
            let live = match pool.acquire().await {
                Ok(mut conn) => postgres::registry::live(&mut conn).await,
                Err(error) => Err(error),
            };
            pool.close().await;
            Ok(live?)
        }
    }
}

/// A live session as a reader needs it: its internal key and current head.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionHandle {
    /// The internal key; never reused, so it names this incarnation of the id.
    pub key: i64,
    pub id: String,
    pub revision: i64,
    pub next_sequence: i64,
    pub system_prompt: String,
    pub summary_message_id: String,
    /// The run holding the lease ('' if none) and when it runs out.
    pub active_run_id: String,
    pub run_expire_time: Timestamp,
}

impl SessionHandle {
    /// Refuses partial output from a run other than the lease holder's.
    pub fn check_lease(&self, run_id: &str, now: Timestamp) -> Result<()> {
        if !self.active_run_id.is_empty()
            && self.run_expire_time > now
            && self.active_run_id != run_id
        {
            return Err(crate::domain::Error::SessionBusy {
                active_run_id: self.active_run_id.clone(),
                expire_time: self.run_expire_time,
            });
        }
        Ok(())
    }
}

/// How much one bounded read ([`Store::read_messages_bounded`],
/// [`Store::read_events_bounded`]) may return.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadBound {
    /// At most this many rows.
    pub rows: usize,
    /// The read stops before a row whose stored body would take the page's
    /// bodies past this many bytes…
    pub bytes: usize,
    /// …unless the page is still empty and this is set: then that row is
    /// read anyway, so a reader always progresses.
    pub at_least_one: bool,
}

impl ReadBound {
    /// No byte bound: at most `rows` rows.
    pub fn rows(rows: usize) -> Self {
        ReadBound {
            rows,
            bytes: usize::MAX,
            at_least_one: true,
        }
    }

    /// Whether a row of `row_bytes` joins a page that holds `rows` rows of
    /// `bytes` so far.
    pub fn admits(&self, rows: usize, bytes: usize, row_bytes: usize) -> bool {
        (rows == 0 && self.at_least_one) || bytes.saturating_add(row_bytes) <= self.bytes
    }
}

/// Rows read under a [`ReadBound`], each with the size of its stored body
/// (the bytes the read counted for it).
#[derive(Debug)]
pub struct Page<T> {
    pub rows: Vec<(T, usize)>,
    /// The read stopped at the byte bound, before its row limit: more rows
    /// may follow the last one.
    pub cut: bool,
}

impl<T> Page<T> {
    /// The rows alone.
    pub fn into_items(self) -> Vec<T> {
        self.rows.into_iter().map(|(item, _)| item).collect()
    }

    /// Each row converted by `convert`, its size kept.
    pub fn try_map<U>(self, mut convert: impl FnMut(T) -> Result<U>) -> Result<Page<U>> {
        let rows = self
            .rows
            .into_iter()
            .map(|(item, size)| Ok((convert(item)?, size)))
            .collect::<Result<_>>()?;
        Ok(Page {
            rows,
            cut: self.cut,
        })
    }
}

/// A provider call with its position in the session's call list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListedCall {
    pub ordinal: i64,
    pub call: ProviderCall,
}

/// Receives every committed change right after its transaction commits.
/// The watch hub implements it.
pub trait CommitSink: Send + Sync + 'static {
    /// `events` were committed, here, for the session with internal key `session_key`.
    fn committed(&self, session_key: i64, events: &[Arc<EncodedEvent>]);

    /// The session's head is at least `revision` (a commit somewhere,
    /// perhaps on another replica): watchers behind it should read the log.
    fn head_moved(&self, session_key: i64, revision: i64);

    /// The internal keys of the sessions that currently have watchers.
    fn watched_sessions(&self) -> Vec<i64>;

    /// An ephemeral change (a delta, a discarded run) was published,
    /// here or on another replica.
    fn ephemeral(&self, session_key: i64, ephemeral: Arc<Ephemeral>);

    /// A run's partial output is superseded (its exchange committed, or it
    /// ended) on another replica: drop what is buffered for it.
    fn run_closed(&self, session_key: i64, run_id: &str);
}

/// A SearchMessages query, already validated.
#[derive(Clone, Debug)]
pub struct SearchQuery {
    /// The words, all of which must occur.
    pub words: Vec<String>,
    pub user: Option<String>,
    /// Hits to skip (the page position).
    pub offset: usize,
    pub limit: usize,
}

/// A write to a shared scope's entry (a delete ignores the value).
#[derive(Clone, Debug)]
pub struct SharedStateWrite {
    pub scope: String,
    pub key: String,
    pub value: String,
    pub expected_version: Option<i64>,
}

/// A session the sweeper should look at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SweepCandidate {
    pub tenant: String,
    pub id: String,
}

/// The storage contract every backend fulfils; the shared test suite runs
/// against each one.
pub trait Store: Clone + Send + Sync + 'static {
    /// Creates a session (revision 1) with its initial history and state;
    /// answers it with the entries of the scopes `new.state_scopes` names,
    /// read after its writes in the same transaction.
    fn create_session(
        &self,
        tenant: &str,
        new: NewSession,
    ) -> impl Future<Output = Result<(Session, Vec<StateEntry>)>> + Send;

    /// Returns a live session.
    fn get_session(&self, tenant: &str, id: &str) -> impl Future<Output = Result<Session>> + Send;

    /// SubmitInput: appended at once, queued, or refused as busy.
    fn submit_input(
        &self,
        tenant: &str,
        session_id: &str,
        input: SubmitInput,
    ) -> impl Future<Output = Result<Submitted>> + Send;

    /// TakeQueuedInput by the run holding the lease.
    fn take_queued_input(
        &self,
        tenant: &str,
        session_id: &str,
        run_id: &str,
    ) -> impl Future<Output = Result<Taken>> + Send;

    /// EndRun with `take_next`: the revision after, and the input taken.
    fn end_run_taking_next(
        &self,
        tenant: &str,
        session_id: &str,
        run_id: &str,
    ) -> impl Future<Output = Result<(i64, Option<QueuedInput>)>> + Send;

    /// A live session's waiting inputs with a position after `after`.
    fn list_queued_inputs(
        &self,
        tenant: &str,
        session_id: &str,
        after: i64,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<QueuedInput>>> + Send;

    /// WithdrawQueuedInput: the revision recording the withdrawal.
    fn withdraw_queued_input(
        &self,
        tenant: &str,
        session_id: &str,
        input_id: &str,
    ) -> impl Future<Output = Result<i64>> + Send;

    /// RequestApproval: the pending approval and the revision recording it.
    fn request_approval(
        &self,
        tenant: &str,
        session_id: &str,
        request: RequestApproval,
    ) -> impl Future<Output = Result<(Approval, i64)>> + Send;

    /// DecideApproval, once any expiry due in the session is recorded.
    fn decide_approval(
        &self,
        tenant: &str,
        session_id: &str,
        decision: DecideApproval,
    ) -> impl Future<Output = Result<Decided>> + Send;

    /// One approval of a live session, its expiry recorded first if due.
    fn get_approval(
        &self,
        tenant: &str,
        session_id: &str,
        approval_id: &str,
    ) -> impl Future<Output = Result<Approval>> + Send;

    /// The tenant's approvals (expiries due recorded first).
    fn list_approvals(
        &self,
        tenant: &str,
        query: ApprovalQuery,
    ) -> impl Future<Output = Result<Vec<Approval>>> + Send;

    /// Sessions with a pending approval past its expiry.
    fn expired_approvals(
        &self,
        now: Timestamp,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<SweepCandidate>>> + Send;

    /// Records the expiries due in a session (a revision each).
    fn expire_approvals(
        &self,
        tenant: &str,
        session_id: &str,
    ) -> impl Future<Output = Result<()>> + Send;

    /// Returns a live session with the state entries of `scopes` (`""`:
    /// its own), each scope's in key order, all read in one snapshot.
    fn get_session_with_state(
        &self,
        tenant: &str,
        id: &str,
        scopes: &[String],
    ) -> impl Future<Output = Result<(Session, Vec<StateEntry>)>> + Send;

    /// Lists live sessions, newest `update_time` first, then id descending.
    fn list_sessions(
        &self,
        tenant: &str,
        query: SessionQuery,
    ) -> impl Future<Output = Result<Vec<SessionSummary>>> + Send;

    /// Applies a patch as one revision.
    fn update_session(
        &self,
        tenant: &str,
        id: &str,
        patch: SessionPatch,
    ) -> impl Future<Output = Result<Session>> + Send;

    /// Deletes a session's messages, calls and history; records `session_deleted`.
    fn delete_session(&self, tenant: &str, id: &str) -> impl Future<Output = Result<()>> + Send;

    /// Appends an exchange atomically; returns its revision and what was stored.
    fn append_exchange(
        &self,
        tenant: &str,
        exchange: NewExchange,
    ) -> impl Future<Output = Result<(i64, AppendedExchange)>> + Send;

    /// Resolves a live session for reading.
    fn resolve(&self, tenant: &str, id: &str)
    -> impl Future<Output = Result<SessionHandle>> + Send;

    /// Resolves a live session for a run's PublishDelta, with whether
    /// CancelRun asked that run to stop (one read).
    fn resolve_run(
        &self,
        tenant: &str,
        id: &str,
        run_id: &str,
    ) -> impl Future<Output = Result<(SessionHandle, bool)>> + Send;

    /// Messages with `sequence > after`, ascending, at most `limit`.
    fn read_messages(
        &self,
        session: &SessionHandle,
        after: i64,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<StoredMessage>>> + Send;

    /// Messages with `sequence > after`, ascending, within `bound`. The
    /// engine stops stepping (sqlx stops consuming rows) at the byte bound,
    /// so a page of large messages holds no more than it needs.
    /// Decoded from [`Store::read_message_rows_bounded`]'s rows.
    fn read_messages_bounded(
        &self,
        session: &SessionHandle,
        after: i64,
        bound: ReadBound,
    ) -> impl Future<Output = Result<Page<StoredMessage>>> + Send {
        async move {
            self.read_message_rows_bounded(session, after, bound)
                .await?
                .try_map(|row| row.into_stored(&session.id))
        }
    }

    /// The messages [`Store::read_messages_bounded`] reads, as their rows,
    /// not decoded: ExportHistory sends each one's stored encoding
    /// ([`MessageRow::into_encoded`]).
    fn read_message_rows_bounded(
        &self,
        session: &SessionHandle,
        after: i64,
        bound: ReadBound,
    ) -> impl Future<Output = Result<Page<OwnedMessageRow>>> + Send;

    /// Messages with `sequence < before`, descending, at most `limit`.
    fn read_messages_before(
        &self,
        session: &SessionHandle,
        before: i64,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<StoredMessage>>> + Send;

    /// The sequence of a message of this session, if it exists.
    fn message_sequence(
        &self,
        session: &SessionHandle,
        message_id: &str,
    ) -> impl Future<Output = Result<Option<i64>>> + Send;

    /// Provider calls with `ordinal > after`, in recording order, at most `limit`.
    fn read_provider_calls(
        &self,
        session: &SessionHandle,
        after: i64,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<ListedCall>>> + Send;

    /// The origin (provider and model) of each of the session's provider
    /// calls, by call id: what an export for a target judges reasoning by.
    fn call_origins(&self, session: &SessionHandle)
    -> impl Future<Output = Result<Origins>> + Send;

    /// Events of the session with internal key `session_key` and
    /// `revision > after`, ascending, at most `limit`. Works for a deleted
    /// session too (its last event is `session_deleted`).
    fn read_events(
        &self,
        session_key: i64,
        after: i64,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<SessionEvent>>> + Send;

    /// Events as [`Store::read_events`], within `bound` (as
    /// [`Store::read_messages_bounded`]), in the form the log keeps them.
    fn read_events_bounded(
        &self,
        session_key: i64,
        after: i64,
        bound: ReadBound,
    ) -> impl Future<Output = Result<Page<EncodedEvent>>> + Send;

    /// Applies a conversation-control change to a session as one revision
    /// (or none, when it changes nothing), answering its own kind of reply.
    fn control<C: ControlOp>(
        &self,
        tenant: &str,
        id: &str,
        control: C,
    ) -> impl Future<Output = Result<C::Reply>> + Send;

    /// Creates a new session holding a copy of another's history up to a sequence.
    fn fork_session(
        &self,
        tenant: &str,
        fork: Fork,
    ) -> impl Future<Output = Result<(Session, Vec<StoredMessage>)>> + Send;

    /// Tells watchers on every replica about an ephemeral change.
    fn publish_ephemeral(
        &self,
        session: &SessionHandle,
        ephemeral: Ephemeral,
    ) -> impl Future<Output = Result<()>> + Send;

    /// One state entry of a session.
    fn get_state(
        &self,
        session: &SessionHandle,
        key: &str,
    ) -> impl Future<Output = Result<StateEntry>> + Send;

    /// State entries with keys after `after`, in key order, at most `limit`.
    fn list_state(
        &self,
        session: &SessionHandle,
        after: Option<&str>,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<StateEntry>>> + Send;

    /// A shared scope's entry (`scope` is never empty).
    fn get_shared_state(
        &self,
        tenant: &str,
        scope: &str,
        key: &str,
    ) -> impl Future<Output = Result<StateEntry>> + Send;

    /// A shared scope's entries in key order, after `after`.
    fn list_shared_state(
        &self,
        tenant: &str,
        scope: &str,
        after: Option<&str>,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<StateEntry>>> + Send;

    /// Writes a shared scope's entry at its next version, if its version
    /// is `expected_version` (when given; 0: it must not exist).
    fn set_shared_state(
        &self,
        tenant: &str,
        entry: SharedStateWrite,
    ) -> impl Future<Output = Result<StateEntry>> + Send;

    /// Deletes a shared scope's entry, if its version is
    /// `expected_version` (when given).
    fn delete_shared_state(
        &self,
        tenant: &str,
        entry: SharedStateWrite,
    ) -> impl Future<Output = Result<()>> + Send;

    /// Sums of a tenant's provider calls, grouped, ordered by key.
    fn summarize_usage(
        &self,
        tenant: &str,
        query: UsageQuery,
    ) -> impl Future<Output = Result<Vec<UsageRow>>> + Send;

    /// Erases every session of a user in `tenant` with everything attached
    /// to it, and the shared scopes named, in bounded batches; leaves a
    /// content-free record; returns once no file of the store holds what
    /// was erased.
    fn erase_user(
        &self,
        tenant: &str,
        erasure: Erasure,
    ) -> impl Future<Output = Result<Erased>> + Send;

    /// Full-text search over the current messages of a tenant's live sessions, best first.
    fn search(
        &self,
        tenant: &str,
        query: SearchQuery,
    ) -> impl Future<Output = Result<Vec<SearchHit>>> + Send;

    /// Live sessions whose lease ran out before `now`, at most `limit`.
    fn expired_leases(
        &self,
        now: Timestamp,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<SweepCandidate>>> + Send;

    /// Live sessions with no revision since `before`, at most `limit`:
    /// tenant by tenant (in order), each tenant's oldest first.
    fn idle_sessions(
        &self,
        before: Timestamp,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<SweepCandidate>>> + Send;

    /// Live sessions whose expire_time is at or before `now`, at most `limit`.
    fn expired_sessions(
        &self,
        now: Timestamp,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<SweepCandidate>>> + Send;

    /// Deletes an expired session as DeleteSession does, if it is still
    /// there and expired by `now`; whether it did.
    fn delete_expired(
        &self,
        tenant: &str,
        id: &str,
        now: Timestamp,
    ) -> impl Future<Output = Result<bool>> + Send;

    /// Deletes a session if it is still idle since `before`; whether it was.
    fn delete_idle(
        &self,
        tenant: &str,
        id: &str,
        before: Timestamp,
    ) -> impl Future<Output = Result<bool>> + Send;

    /// Removes up to `limit` tombstones of sessions deleted before `before`
    /// (and their final events); how many.
    fn purge_tombstones(
        &self,
        before: Timestamp,
        limit: usize,
    ) -> impl Future<Output = Result<u64>> + Send;

    /// The connection pool's figures, for metrics.
    fn pool_status(&self) -> crate::metrics::PoolStatus;

    /// Asks the database one trivial question: does it answer? The health
    /// reporter's probe.
    fn probe(&self) -> impl Future<Output = Result<()>> + Send;

    /// Finishes queued writes and closes the database.
    fn close(&self) -> impl Future<Output = ()> + Send;
}
