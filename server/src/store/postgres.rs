//! The PostgreSQL write path and cross-replica commit hints.
//!
//! Each write is its own transaction on the pool. Writers to one session
//! serialise on that session's row (`SELECT … FOR UPDATE`), so sequences stay
//! gap-free across any number of replicas without a table-wide lock; a
//! writer that loses a race (unique violation, serialization failure,
//! deadlock) retries from the start and then sees the winner's row.
//!
//! Every committed revision also sends `NOTIFY sessionstore_commits,
//! '<key>:<revision>'` — a hint, never the payload. Each replica LISTENs on
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

use sqlx::any::AnyPoolOptions;
use sqlx::migrate::Migrator;
use sqlx::pool::PoolConnection;
use sqlx::postgres::PgListener;
use sqlx::{Any, AnyPool, Connection as _, Executor, Row};
use tokio::sync::{mpsc, watch};

use super::ops::{Dialect, NOTIFY_CHANNEL, SearchWrites};
use super::rows;
use super::writer::{Job, PendingAppend, Publisher, Refused, enqueue, next_batch};
use super::{CommitSink, OpenError, StoreOptions};
use super::{batch, fault};
use crate::domain::{Ephemeral, Error, NewExchange, Result, Timestamp};

/// The channel carrying ephemeral changes between replicas.
const EPHEMERAL_CHANNEL: &str = "sessionstore_ephemeral";
/// Payloads up to this size travel inside the notification (PostgreSQL's
/// limit is 8000 bytes).
const MAX_INLINE_PAYLOAD: usize = 7000;
/// How long a spilled payload is kept for the other replicas to read.
const SPILL_TTL_MICROS: i64 = 5 * 60 * 1_000_000;

pub(super) static MIGRATOR: Migrator = sqlx::migrate!("../migrations/postgres");

/// The longest a call waits for a pool connection before it is answered
/// STORAGE_UNAVAILABLE.
pub(super) const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(3);

/// Attempts per write when it loses a race to another writer.
const WRITE_ATTEMPTS: usize = 3;
/// Watched sessions whose heads are read per query when re-syncing.
const RESYNC_CHUNK: usize = 500;

pub(super) async fn connect(url: &str, max_connections: u32) -> Result<AnyPool, sqlx::Error> {
    sqlx::any::install_default_drivers();
    AnyPoolOptions::new()
        .max_connections(max_connections.max(2))
        .min_connections(1)
        // A database that is down makes sqlx retry refused connections
        // until this timeout: it is how long a call waits before it is
        // answered STORAGE_UNAVAILABLE.
        .acquire_timeout(ACQUIRE_TIMEOUT)
        .idle_timeout(Some(Duration::from_secs(600)))
        .after_connect(|conn, _| {
            Box::pin(async move {
                conn.execute("SET statement_timeout = '30s'").await?;
                Ok(())
            })
        })
        .connect(url)
        .await
}

/// Connects once, directly, so that a database that cannot be reached at
/// start says where and why within seconds (the pool would retry a refused
/// connection until its acquire timeout and then say only that it timed
/// out).
pub(super) async fn check_reachable(url: &str) -> Result<(), OpenError> {
    use std::str::FromStr as _;
    let target = sqlx::postgres::PgConnectOptions::from_str(url).map_or_else(
        |_| "the host in the database URL".to_owned(),
        |options| format!("{}:{}", options.get_host(), options.get_port()),
    );
    let attempt = tokio::time::timeout(
        ACQUIRE_TIMEOUT,
        <sqlx::PgConnection as sqlx::Connection>::connect(url),
    )
    .await;
    match attempt {
        Ok(Ok(connection)) => {
            let _ = connection.close().await;
            Ok(())
        }
        Ok(Err(error)) => Err(OpenError::Unreachable {
            target,
            cause: error.to_string(),
        }),
        Err(_) => Err(OpenError::Unreachable {
            target,
            cause: format!("no answer within {} s", ACQUIRE_TIMEOUT.as_secs()),
        }),
    }
}

/// An opened PostgreSQL database: its pool, the append writers' queues,
/// the listener and writers, and this replica's name.
pub(super) struct Opened {
    pub pool: AnyPool,
    pub appends: Appends,
    pub tasks: Vec<tokio::task::JoinHandle<()>>,
    pub closing: watch::Sender<bool>,
    /// This process's name among the replicas (ephemeral hints).
    pub replica: String,
}

/// Connects, migrates, and starts the commit-hint listener.
pub(super) async fn open(
    url: &str,
    sink: Arc<dyn CommitSink>,
    options: &StoreOptions,
) -> Result<Opened, OpenError> {
    check_reachable(url).await?;
    let pool = connect(url, options.max_connections).await?;
    MIGRATOR.run(&pool).await?;
    let closing = watch::Sender::new(false);
    let replica = uuid::Uuid::now_v7().simple().to_string();
    let listener = tokio::spawn(listen(
        Listening {
            url: url.to_owned(),
            pool: pool.clone(),
            sink: Arc::clone(&sink),
            replica: replica.clone(),
            recheck_interval: options.recheck_interval,
        },
        closing.subscribe(),
    ));
    let mut queues = Vec::new();
    let mut tasks = vec![listener];
    let publisher = Publisher::start().map_err(OpenError::Publisher)?;
    for _ in 0..append_writers(options.max_connections) {
        let (queue, jobs) = mpsc::channel(QUEUE_DEPTH);
        queues.push(queue);
        tasks.push(tokio::spawn(run_append_writer(
            pool.clone(),
            jobs,
            Arc::clone(&sink),
            publisher.clone(),
        )));
    }
    Ok(Opened {
        pool,
        appends: Appends { queues },
        tasks,
        closing,
        replica,
    })
}

/// The batch writers' queues. A session's appends always go to the same
/// writer (by a hash of its tenant and id), so they batch together and
/// writers never wait for each other's row locks on one session.
pub(super) struct Appends {
    queues: Vec<mpsc::Sender<Option<PendingAppend>>>,
}

impl Appends {
    /// Lets the writers finish what is queued, then stop.
    pub(super) async fn stop(&self) {
        for queue in &self.queues {
            let _ = queue.send(None).await;
        }
    }

    /// Appends queued and not yet taken by a writer.
    pub(super) fn queued(&self) -> usize {
        self.queues
            .iter()
            .map(|queue| queue.max_capacity() - queue.capacity())
            .sum()
    }

    fn queue_for(
        &self,
        tenant: &str,
        session_id: &str,
    ) -> Option<&mpsc::Sender<Option<PendingAppend>>> {
        use std::hash::{Hash, Hasher};
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        (tenant, session_id).hash(&mut hasher);
        let shard = usize::try_from(hasher.finish() % self.queues.len().max(1) as u64).ok()?;
        self.queues.get(shard)
    }
}

/// Appends that may wait for a writer before callers are held back.
const QUEUE_DEPTH: usize = 4096;
/// The most appends one transaction takes.
const MAX_BATCH: usize = 256;

/// Batch writers per replica: a quarter of the pool (at most 4), so batches
/// on different sessions commit side by side, leaving most of the pool to
/// reads and other writes. (More writers measured slower here: smaller
/// batches, more commits competing for the same cores.)
fn append_writers(max_connections: u32) -> usize {
    usize::try_from(max_connections / 4)
        .unwrap_or(1)
        .clamp(1, 4)
}

/// Queues an append for its session's batch writer.
pub(super) async fn submit_append(appends: &Appends, pending: PendingAppend) {
    if let Some(queue) = appends.queue_for(pending.tenant(), &pending.op().0.session_id) {
        enqueue(queue, pending).await;
    }
}

/// One batch writer: takes every append queued for it (up to
/// [`MAX_BATCH`]) and commits them in one transaction through the bulk
/// path. Several run side by side; `None` stops one.
async fn run_append_writer(
    pool: AnyPool,
    mut jobs: mpsc::Receiver<Option<PendingAppend>>,
    sink: Arc<dyn CommitSink>,
    publisher: Publisher,
) {
    // The writer keeps its connection between batches: taking one from the
    // pool costs a round trip (its liveness check) of the five a batch
    // takes. A connection that failed is dropped and replaced.
    let mut held = None;
    while let Some((batch, stop)) = next_batch(&mut jobs, MAX_BATCH).await {
        if !batch.is_empty() {
            commit_appends(&pool, &mut held, &sink, &publisher, batch).await;
        }
        if stop {
            return;
        }
    }
}

/// Commits a batch of appends in one transaction (sessions locked in key
/// order, so batches on other writers and replicas never deadlock). If a
/// caller gives up before the commit, the batch is rolled back and redone
/// without it, so an abandoned append never commits. If a statement fails
/// (a race with another replica), every append goes through [`write`] on
/// its own, which retries lost races.
async fn commit_appends(
    pool: &AnyPool,
    held: &mut Option<PoolConnection<Any>>,
    sink: &Arc<dyn CommitSink>,
    publisher: &Publisher,
    mut jobs: Vec<PendingAppend>,
) {
    // A kept connection may have died since the last batch (the database
    // restarted): its failure is retried once on a fresh one.
    let mut kept = held.is_some();
    let outcomes = loop {
        jobs.retain(|job| !job.abandoned());
        if jobs.is_empty() {
            return;
        }
        let requests: Vec<(&str, &NewExchange)> = jobs
            .iter()
            .map(|job| (job.tenant(), job.op().0.as_ref()))
            .collect();
        let attempt = async {
            let connection = match held {
                Some(connection) => connection,
                None => held.insert(pool.acquire().await?),
            };
            let mut tx = connection.begin().await?;
            let outcomes =
                batch::append_all(&mut tx, Dialect::Postgres, SearchWrites::Inline, &requests)
                    .await?;
            if jobs.iter().any(PendingAppend::abandoned) {
                tx.rollback().await?;
                return Ok(None);
            }
            tx.commit().await?;
            Ok::<_, sqlx::Error>(Some(outcomes))
        }
        .await;
        match attempt {
            Ok(Some(outcomes)) => break Some(outcomes),
            Ok(None) => continue,
            Err(error) => {
                // It may be the connection that failed.
                *held = None;
                let error = Error::from(error);
                // An unreachable database (or a full disk) fails every
                // append alike: answer them now rather than each after its
                // own wait for the same fault.
                if std::mem::take(&mut kept) && matches!(error, Error::StorageUnavailable(_)) {
                    tracing::debug!(%error, "the kept connection failed; retrying on a fresh one");
                    continue;
                }
                if fault::is_shared(&error) {
                    tracing::warn!(%error, appends = jobs.len(), "bulk append failed");
                    for job in jobs {
                        job.fail(fault::again(&error));
                    }
                    return;
                }
                // A race with another replica is expected; anything else is worth a warning.
                if fault::is_retryable(&error) {
                    tracing::debug!(%error, "bulk append lost a race; writing the appends one by one");
                } else {
                    tracing::warn!(%error, "bulk append failed; writing the appends one by one");
                }
                break None;
            }
        }
    };
    let mut deferred = Vec::new();
    match outcomes {
        Some(outcomes) => {
            let mut done = Vec::with_capacity(outcomes.len());
            for (job, outcome) in jobs.into_iter().zip(outcomes) {
                match outcome {
                    batch::Outcome::Done(Ok(applied)) => done.push(job.applied(applied)),
                    batch::Outcome::Done(Err(error)) => job.fail(error),
                    batch::Outcome::Deferred => deferred.push(job),
                }
            }
            publisher.committed(sink, done);
        }
        None => deferred = jobs,
    }
    // In arrival order: a session's later appends were deferred with it.
    for job in deferred {
        if !job.abandoned() {
            write(pool, sink.as_ref(), Box::new(job)).await;
        }
    }
}

/// Runs one write in its own transaction, retrying lost races, and
/// answers it.
pub(super) async fn write(pool: &AnyPool, sink: &dyn CommitSink, mut job: Box<dyn Job>) {
    let mut attempt = 1;
    loop {
        let mut tx = match pool.begin().await {
            Ok(tx) => tx,
            Err(error) => return job.fail(Error::from(error)),
        };
        let error = match job
            .apply(&mut tx, Dialect::Postgres, SearchWrites::Inline)
            .await
        {
            Ok(settle) => match tx.commit().await {
                Ok(()) => return settle.committed(sink),
                Err(error) => {
                    job = settle.again();
                    Error::from(error)
                }
            },
            // Rolled back as `tx` is dropped.
            Err(Refused {
                error,
                job: refused,
            }) => {
                job = refused;
                error
            }
        };
        if attempt < WRITE_ATTEMPTS && fault::is_retryable(&error) {
            tracing::debug!(attempt, "write lost a race; retrying");
            attempt += 1;
            continue;
        }
        if let Error::Storage(source) = &error {
            tracing::error!(error = %source, "write failed");
        }
        return job.fail(error);
    }
}

/// Sends an ephemeral change to the other replicas.
pub(super) async fn send_ephemeral(
    pool: &AnyPool,
    replica: &str,
    session_key: i64,
    ephemeral: &Ephemeral,
) -> Result<()> {
    let json = rows::encode(ephemeral)?;
    let body = if json.len() <= MAX_INLINE_PAYLOAD {
        json
    } else {
        let now = Timestamp::now().0;
        sqlx::query("DELETE FROM delta_spill WHERE time < $1")
            .bind(now - SPILL_TTL_MICROS)
            .execute(pool)
            .await?;
        let id: i64 =
            sqlx::query_scalar("INSERT INTO delta_spill (body, time) VALUES ($1, $2) RETURNING id")
                .bind(json)
                .bind(now)
                .fetch_one(pool)
                .await?;
        format!("#{id}")
    };
    sqlx::query("SELECT pg_notify($1, $2)")
        .bind(EPHEMERAL_CHANNEL)
        .bind(format!("{replica}:{session_key}:{body}"))
        .execute(pool)
        .await?;
    Ok(())
}

/// A parsed commit hint: `"<key>:<revision>"`, optionally `":<closed run id>"`.
#[derive(Debug, PartialEq, Eq)]
struct Hint<'a> {
    session_key: i64,
    revision: i64,
    closed_run: Option<&'a str>,
}

fn parse_hint(payload: &str) -> Option<Hint<'_>> {
    let (key, rest) = payload.split_once(':')?;
    let (revision, closed_run) = match rest.split_once(':') {
        Some((revision, run)) => (revision, Some(run)),
        None => (rest, None),
    };
    Some(Hint {
        session_key: key.parse().ok()?,
        revision: revision.parse().ok()?,
        closed_run,
    })
}

/// What the listener task needs.
struct Listening {
    url: String,
    pool: AnyPool,
    sink: Arc<dyn CommitSink>,
    replica: String,
    recheck_interval: Duration,
}

impl Listening {
    fn on_commit(&self, payload: &str) {
        let Some(hint) = parse_hint(payload) else {
            tracing::warn!(payload, "malformed commit hint");
            return;
        };
        if let Some(run_id) = hint.closed_run {
            self.sink.run_closed(hint.session_key, run_id);
        }
        self.sink.head_moved(hint.session_key, hint.revision);
    }

    async fn on_ephemeral(&self, payload: &str) {
        let mut parts = payload.splitn(3, ':');
        let (Some(replica), Some(key), Some(body)) = (parts.next(), parts.next(), parts.next())
        else {
            tracing::warn!(payload, "malformed ephemeral hint");
            return;
        };
        if replica == self.replica {
            return;
        }
        let Ok(session_key) = key.parse::<i64>() else {
            tracing::warn!(payload, "malformed ephemeral hint");
            return;
        };
        let json = match body.strip_prefix('#').map(str::parse::<i64>) {
            None => body.to_owned(),
            Some(Ok(id)) => {
                match sqlx::query_scalar("SELECT body FROM delta_spill WHERE id = $1")
                    .bind(id)
                    .fetch_optional(&self.pool)
                    .await
                {
                    Ok(Some(json)) => json,
                    Ok(None) => return,
                    Err(error) => {
                        tracing::warn!(%error, "cannot read a spilled delta");
                        return;
                    }
                }
            }
            Some(Err(_)) => {
                tracing::warn!(payload, "malformed ephemeral hint");
                return;
            }
        };
        match rows::decode::<Ephemeral>(&json) {
            Ok(ephemeral) => self.sink.ephemeral(session_key, Arc::new(ephemeral)),
            Err(_) => tracing::warn!("undecodable ephemeral payload"),
        }
    }
}

async fn listen(listening: Listening, mut closing: watch::Receiver<bool>) {
    let Listening {
        url,
        pool,
        sink,
        recheck_interval,
        ..
    } = &listening;
    let mut backoff = Duration::from_millis(50);
    loop {
        if *closing.borrow() {
            return;
        }
        let mut listener = match subscribe(url).await {
            Ok(listener) => listener,
            Err(error) => {
                tracing::warn!(%error, ?backoff, "cannot LISTEN for commit hints; retrying");
                tokio::select! {
                    _ = closing.changed() => return,
                    () = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(Duration::from_secs(5));
                continue;
            }
        };
        backoff = Duration::from_millis(50);
        // LISTEN is in effect: whatever committed before it is found here.
        resync(pool, sink.as_ref()).await;
        let mut recheck = tokio::time::interval(*recheck_interval);
        recheck.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        recheck.tick().await;
        loop {
            tokio::select! {
                _ = closing.changed() => return,
                _ = recheck.tick() => resync(pool, sink.as_ref()).await,
                received = listener.try_recv() => match received {
                    Ok(Some(notification)) if notification.channel() == EPHEMERAL_CHANNEL => {
                        listening.on_ephemeral(notification.payload()).await;
                    }
                    Ok(Some(notification)) => listening.on_commit(notification.payload()),
                    Ok(None) => {
                        tracing::warn!("commit-hint connection lost; reconnecting");
                        break;
                    }
                    Err(error) => {
                        tracing::warn!(%error, "commit-hint listener failed; reconnecting");
                        break;
                    }
                },
            }
        }
    }
}

async fn subscribe(url: &str) -> Result<PgListener, sqlx::Error> {
    let mut listener = PgListener::connect(url).await?;
    listener
        .listen_all([NOTIFY_CHANNEL, EPHEMERAL_CHANNEL])
        .await?;
    Ok(listener)
}

/// Tells the hub the current head of every watched session.
async fn resync(pool: &AnyPool, sink: &dyn CommitSink) {
    let keys = sink.watched_sessions();
    for chunk in keys.chunks(RESYNC_CHUNK) {
        let placeholders: Vec<String> = (1..=chunk.len()).map(|i| format!("${i}")).collect();
        let sql = format!(
            "SELECT key, revision FROM sessions WHERE key IN ({})",
            placeholders.join(", ")
        );
        let mut query = sqlx::query(&sql);
        for key in chunk {
            query = query.bind(*key);
        }
        match query.fetch_all(pool).await {
            Ok(rows) => {
                for row in rows {
                    if let (Ok(key), Ok(revision)) = (
                        row.try_get::<i64, _>("key"),
                        row.try_get::<i64, _>("revision"),
                    ) {
                        sink.head_moved(key, revision);
                    }
                }
            }
            Err(error) => tracing::warn!(%error, "cannot re-read watched session heads"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Hint, parse_hint};

    #[test]
    fn hints_parse() {
        let hint = |session_key, revision, closed_run| Hint {
            session_key,
            revision,
            closed_run,
        };
        assert_eq!(parse_hint("12:34"), Some(hint(12, 34, None)));
        assert_eq!(parse_hint("12:34:run:1"), Some(hint(12, 34, Some("run:1"))));
        assert_eq!(parse_hint("12"), None);
        assert_eq!(parse_hint("a:1"), None);
    }
}
