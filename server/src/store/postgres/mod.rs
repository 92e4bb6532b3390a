//! The PostgreSQL write path and cross-replica commit hints.
//!
//! Each write is its own transaction on the pool. Writers to one session
//! serialise on that session's row (`SELECT … FOR UPDATE`), so sequences stay
//! gap-free across any number of replicas without a table-wide lock; a
//! writer that loses a race (unique violation, serialization failure,
//! deadlock) retries from the start and then sees the winner's row.
//!
//! Every committed revision also sends `NOTIFY sessionstore_commits,
//! '<key>:<revision>'` — a hint, never the payload — right after its
//! transaction commits and before its caller is answered (`hints.rs` says
//! why not inside the transaction). Each replica LISTENs on
//! one dedicated connection and tells its hub that a session's head moved;
//! watchers then read the event log from their own last revision. Lost
//! hints cannot lose events: after every (re)connection, and every
//! `recheck_interval`, the listener reads the heads of all watched sessions.
//! A hint for a commit that closes a run's partial output (its exchange, its
//! end) also names the run: `'<key>:<revision>:<run id>'`.
//!
//! Ephemeral changes (deltas, discarded runs) are never stored, so they
//! travel as the payload itself on a second channel,
//! `sessionstore_ephemeral`: `'<replica>:<key>:<json>'`, or
//! `'<replica>:<key>:#<id>'` naming a `delta_spill` row when the JSON is too
//! big for a notification. Each replica skips its own.

use std::sync::Arc;
use std::time::Duration;

use futures_core::future::BoxFuture;
use sqlx::AnyPool;
use sqlx::migrate::Migrator;
use sqlx::postgres::PgPool;

use super::ops::SearchWrites;
use super::rows::OwnedMessageRow;
use super::sql::{self, Backend, close_pool};
use super::writer::{Job, PendingAppend};
use super::{CommitSink, OpenError, Page, ReadBound, SessionHandle, StoreOptions};
use crate::domain::{Ephemeral, Result};
use crate::wire::EncodedEvent;
use appends::Appends;
use listen::Listener;
use primary::{Followed, Located, Primary};
use registry::Registration;
use search::SearchIndex;

mod appends;
mod hints;
pub(super) mod ledger;
mod listen;
mod primary;
mod reads;
pub(super) mod registry;
mod search;
mod writes;

pub(super) static MIGRATOR: Migrator = sqlx::migrate!("../migrations/postgres");

/// The longest a call waits for a pool connection before it is answered
/// STORAGE_UNAVAILABLE.
pub(super) const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(3);
/// How long a pooled connection may stay idle before it is closed.
const IDLE_TIMEOUT: Duration = Duration::from_secs(600);

/// A pool of `max_connections` on the writable primary among the URL's
/// hosts, for a command that does not follow the primary (`migrate`,
/// `replicas`).
pub(super) async fn connect(url: &str, max_connections: u32) -> Result<AnyPool, OpenError> {
    let located = Located::find(url).await?;
    let pool = located.any_pool(max_connections).await;
    located.close().await;
    Ok(pool?)
}

/// Checks a URL's hosts and `target_session_attrs` without connecting.
pub(super) fn check_url(url: &str) -> Result<(), OpenError> {
    primary::hosts(url).map(drop)
}

/// Finds the writable primary once, directly, so that a database that
/// cannot be reached at start says where and why within seconds (the pool
/// would retry a refused connection until its acquire timeout and then say
/// only that it timed out).
pub(super) async fn check_reachable(url: &str) -> Result<(), OpenError> {
    Located::find(url).await?.close().await;
    Ok(())
}

/// An open PostgreSQL database's machinery: the append writers, the
/// listener, and this replica's name among the replicas.
pub(super) struct Postgres {
    /// Follows the writable primary for every pool below.
    primary: Primary,
    /// LISTEN's pool of one connection.
    listening: PgPool,
    /// The store's pool (a handle to it), for writes.
    pool: AnyPool,
    /// The pool exports' and replays' pages are read through (`reads.rs`).
    reads: PgPool,
    /// The append writers' connections.
    writers: PgPool,
    sink: Arc<dyn CommitSink>,
    appends: Appends,
    listener: Listener,
    /// This process's name among the replicas (ephemeral hints).
    replica: String,
    /// Where writes put search entries (`Inline`, or `Off`).
    search: SearchWrites,
    /// With search on: whether the index is built, and its builder.
    index: Option<SearchIndex>,
    /// This replica's row in the replica registry, kept alive until close
    /// (a served store's; none for one opened without an address).
    registration: Option<Registration>,
}

/// Connects, migrates, and starts the commit-hint listener and the append
/// writers.
pub(super) async fn open(
    url: &str,
    sink: Arc<dyn CommitSink>,
    options: &StoreOptions,
) -> Result<(AnyPool, Postgres), OpenError> {
    let located = Located::find(url).await?;
    // The append writers hold connections of their own (beside the store's
    // pool, so they bind through PostgreSQL's own driver:
    // `append::RunConnection`), taken out of the store's share, as they
    // were when they held the store pool's.
    let writer_count = appends::append_writers(options.max_connections, options.append_writers);
    let writer_connections = u32::try_from(writer_count).unwrap_or(1);
    let pool = located
        .any_pool(options.max_connections.saturating_sub(writer_connections))
        .await?;
    let reads = located.pg_pool(
        reads::read_connections(options.max_connections),
        Some(IDLE_TIMEOUT),
    );
    let writers = located.pg_pool(writer_connections, Some(IDLE_TIMEOUT));
    // LISTEN's one connection, kept while it lasts.
    let listening = located.pg_pool(1, None);
    ledger::migrate(&pool, super::ledger::Mode::Expand).await?;
    let replica = uuid::Uuid::now_v7().simple().to_string();
    let registration = register(&pool, &replica, options).await?;
    let (search, index) = if options.search {
        let index = SearchIndex::start(&pool, &replica)
            .await
            .map_err(OpenError::Search)?;
        (SearchWrites::Inline, Some(index))
    } else {
        SearchIndex::switch_off(&pool)
            .await
            .map_err(OpenError::Search)?;
        (SearchWrites::Off, None)
    };
    let listener = Listener::start(&listening, &pool, &sink, &replica, options.recheck_interval);
    let appends = Appends::start(
        &pool,
        &writers,
        &sink,
        writer_count,
        options.append_one_trip,
        search,
        &located.reachability(),
    )
    .map_err(OpenError::Publisher)?;
    let primary = located.follow(vec![
        Followed::Any(pool.clone()),
        Followed::Pg(reads.clone()),
        Followed::Pg(writers.clone()),
        Followed::Pg(listening.clone()),
    ]);
    let postgres = Postgres {
        primary,
        listening,
        pool: pool.clone(),
        reads,
        writers,
        sink,
        appends,
        listener,
        replica,
        search,
        index,
        registration,
    };
    Ok((pool, postgres))
}

/// Registers a served store (one told the address it serves on) in the
/// replica registry as `replica`.
async fn register(
    pool: &AnyPool,
    replica: &str,
    options: &StoreOptions,
) -> Result<Option<Registration>, OpenError> {
    let Some(address) = &options.advertised_address else {
        return Ok(None);
    };
    let entry = registry::Entry {
        replica_id: replica.to_owned(),
        schema: ledger::schema(),
        address: address.clone(),
    };
    let registration = Registration::register(pool, entry)
        .await
        .map_err(OpenError::Register)?;
    Ok(Some(registration))
}

impl Backend for Postgres {
    fn write(&self, job: Box<dyn Job>) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            writes::write(&self.pool, self.sink.as_ref(), self.search, job).await;
        })
    }

    fn append(&self, pending: PendingAppend) -> BoxFuture<'_, ()> {
        Box::pin(self.appends.submit(pending))
    }

    fn snapshot_reads(&self) -> Option<&'static str> {
        Some("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
    }

    fn search_statement(&self, filters: &str, words: &[String]) -> (String, String) {
        let statement = format!(
            "SELECT s.id AS session_id, s.title, m.sequence, m.id AS message_id, m.body, m.wire, \
             CAST(NULL AS TEXT) AS snippet \
             FROM message_search f CROSS JOIN CAST($1 AS tsquery) q \
             JOIN messages m ON m.session_key = f.session_key AND m.sequence = f.sequence \
             JOIN sessions s ON s.key = f.session_key \
             WHERE f.words @@ q AND s.tenant = $2 AND s.deleted = 0{filters} \
             ORDER BY ts_rank(f.words, q) DESC, f.session_key, f.sequence LIMIT $3 OFFSET $4"
        );
        (statement, crate::domain::search::tsquery(words))
    }

    fn events<'a>(
        &'a self,
        _pool: &'a AnyPool,
        session_key: i64,
        after: i64,
        bound: ReadBound,
    ) -> BoxFuture<'a, Result<Page<EncodedEvent>>> {
        Box::pin(reads::events(&self.reads, session_key, after, bound))
    }

    fn messages<'a>(
        &'a self,
        _pool: &'a AnyPool,
        session: &'a SessionHandle,
        range: &'static str,
        value: i64,
        bound: ReadBound,
    ) -> BoxFuture<'a, Result<Page<OwnedMessageRow>>> {
        Box::pin(sql::messages(&self.reads, session, range, value, bound))
    }

    fn search_ready<'a>(&'a self, pool: &'a AnyPool) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            match &self.index {
                Some(index) => index.ready(pool).await,
                None => Ok(()),
            }
        })
    }

    fn send_ephemeral<'a>(
        &'a self,
        pool: &'a AnyPool,
        session_key: i64,
        ephemeral: &'a Ephemeral,
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(listen::send_ephemeral(
            pool,
            &self.replica,
            session_key,
            ephemeral,
        ))
    }

    fn queued_writes(&self) -> usize {
        self.appends.queued()
    }

    fn append_batches(&self) -> Option<crate::metrics::BatchFigures> {
        Some(self.appends.figures())
    }

    fn close<'a>(&'a self, pool: &'a AnyPool) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            // First: from here on this replica is gone.
            if let Some(registration) = &self.registration {
                registration.deregister().await;
            }
            self.listener.stop().await;
            self.listening.close().await;
            if let Some(index) = &self.index {
                index.stop().await;
            }
            self.appends.stop().await;
            self.writers.close().await;
            self.reads.close().await;
            close_pool(pool).await;
            self.primary.stop().await;
        })
    }
}
