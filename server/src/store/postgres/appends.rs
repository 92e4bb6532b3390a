//! PostgreSQL's append writers: a few tasks per replica, each committing
//! the appends queued for it in batches, through the bulk path
//! (`append/`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use sqlx::pool::PoolConnection;
use sqlx::postgres::PgPool;
use sqlx::{AnyPool, Executor as _, Postgres};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::hints::{self, Hinter};
use super::primary::Reachability;
use super::writes::write;
use crate::domain::{Error, NewExchange, Timestamp};
use crate::metrics::BatchFigures;
use crate::store::ops::{Dialect, SearchWrites};
use crate::store::writer::{PendingAppend, Publisher, by_outcome, enqueue, next_batch};
use crate::store::{CommitSink, append, fault};
use crate::wire::EncodedEvent;

/// The batch writers' queues. A session's appends always go to the same
/// writer (by a hash of its tenant and id), so they batch together and
/// writers never wait for each other's row locks on one session.
pub(super) struct Appends {
    queues: Vec<mpsc::Sender<Option<PendingAppend>>>,
    writers: Mutex<Vec<JoinHandle<()>>>,
    figures: Arc<Figures>,
}

/// The writers' running figures ([`BatchFigures`]), shared by them all.
#[derive(Default)]
struct Figures {
    batches: AtomicU64,
    appends: AtomicU64,
    round_trips: AtomicU64,
    busy_micros: AtomicU64,
    in_flight: AtomicU64,
}

impl Figures {
    /// A batch of `appends` begins; the guard counts it in flight and,
    /// when dropped, its time.
    fn batch(&self, appends: usize) -> InFlight<'_> {
        self.batches.fetch_add(1, Ordering::Relaxed);
        self.appends.fetch_add(appends as u64, Ordering::Relaxed);
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        InFlight {
            figures: self,
            began: Instant::now(),
        }
    }

    fn round_trips(&self, count: usize) {
        self.round_trips.fetch_add(count as u64, Ordering::Relaxed);
    }
}

struct InFlight<'a> {
    figures: &'a Figures,
    began: Instant,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let micros = u64::try_from(self.began.elapsed().as_micros()).unwrap_or(u64::MAX);
        self.figures
            .busy_micros
            .fetch_add(micros, Ordering::Relaxed);
        self.figures.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Appends {
    /// Starts `count` writers, each with a connection of its own from
    /// `connections` (a pool of as many), and the store's `pool` for the
    /// appends the general path takes.
    pub(super) fn start(
        pool: &AnyPool,
        connections: &PgPool,
        sink: &Arc<dyn CommitSink>,
        count: usize,
        one_trip: bool,
        search: SearchWrites,
        reachability: &Reachability,
    ) -> std::io::Result<Self> {
        let publisher = Publisher::start()?;
        let hinter = Hinter::start(pool.clone());
        let figures = Arc::new(Figures::default());
        let mut queues = Vec::new();
        let mut writers = Vec::new();
        for _ in 0..count {
            let (queue, jobs) = mpsc::channel(QUEUE_DEPTH);
            queues.push(queue);
            let shared = Shared {
                pool: pool.clone(),
                connections: connections.clone(),
                sink: Arc::clone(sink),
                publisher: publisher.clone(),
                search,
                reachability: reachability.clone(),
                figures: Arc::clone(&figures),
                one_trip,
                hinter: hinter.clone(),
            };
            writers.push(tokio::spawn(run_append_writer(jobs, shared)));
        }
        Ok(Appends {
            queues,
            writers: Mutex::new(writers),
            figures,
        })
    }

    /// Queues an append for its session's writer.
    pub(super) async fn submit(&self, pending: PendingAppend) {
        if let Some(queue) = self.queue_for(pending.tenant(), &pending.op().0.session_id) {
            enqueue(queue, pending).await;
        }
    }

    /// Lets the writers finish what is queued, then stop, and waits for them.
    pub(super) async fn stop(&self) {
        for queue in &self.queues {
            let _ = queue.send(None).await;
        }
        let writers =
            std::mem::take(&mut *self.writers.lock().unwrap_or_else(PoisonError::into_inner));
        for writer in writers {
            let _ = writer.await;
        }
    }

    /// What the writers' batches have done so far.
    pub(super) fn figures(&self) -> BatchFigures {
        let figures = &self.figures;
        BatchFigures {
            writers: self.queues.len(),
            batches: figures.batches.load(Ordering::Relaxed),
            appends: figures.appends.load(Ordering::Relaxed),
            round_trips: figures.round_trips.load(Ordering::Relaxed),
            busy_micros: figures.busy_micros.load(Ordering::Relaxed),
            in_flight: figures.in_flight.load(Ordering::Relaxed),
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

/// Batch writers per replica: one per core this replica may use, at most
/// 4 and at most a quarter of the pool, so batches on different sessions
/// commit side by side, leaving most of the pool to reads and other
/// writes. More writers than cores measured slower: on two cores, 2
/// writers appended 1–29% more than 4 with 6–32% less server CPU per
/// exchange (4 made smaller batches, more commits competing for the same
/// cores), and 1 writer appended 24–29% less than 2 (BENCHMARKS.md).
/// `--append-writers`, when given, replaces the count by cores, bounded
/// by half the pool.
pub(super) fn append_writers(max_connections: u32, asked: Option<u32>) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    writers_for(max_connections, cores, asked)
}

fn writers_for(max_connections: u32, cores: usize, asked: Option<u32>) -> usize {
    match asked {
        Some(asked) => usize::try_from(asked.min(max_connections / 2))
            .unwrap_or(1)
            .max(1),
        None => usize::try_from(max_connections / 4)
            .unwrap_or(1)
            .min(cores)
            .clamp(1, 4),
    }
}

/// What every writer of a replica shares.
struct Shared {
    /// The store's pool, for the general path.
    pool: AnyPool,
    /// The writers' own connections.
    connections: PgPool,
    sink: Arc<dyn CommitSink>,
    publisher: Publisher,
    search: SearchWrites,
    reachability: Reachability,
    figures: Arc<Figures>,
    /// `--append-one-trip`.
    one_trip: bool,
    hinter: Hinter,
}

/// One batch writer: takes every append queued for it (up to
/// [`MAX_BATCH`]) and commits them in one transaction through the bulk
/// path. Several run side by side; `None` stops one.
async fn run_append_writer(mut jobs: mpsc::Receiver<Option<PendingAppend>>, shared: Shared) {
    // The writer keeps its connection between batches: taking one from the
    // pool costs a round trip (its liveness check) of the few a batch
    // takes. A connection that failed is dropped and replaced.
    let mut held: Option<Held> = None;
    let mut kept = KeptSessions::default();
    loop {
        // A transaction begun for the next batch is not left open while
        // no append comes.
        let next = match held.as_mut().filter(|held| held.begun) {
            Some(_) => {
                match tokio::time::timeout(OPEN_WHILE_IDLE, next_batch(&mut jobs, MAX_BATCH)).await
                {
                    Ok(next) => next,
                    Err(_) => {
                        end_open(&mut held).await;
                        continue;
                    }
                }
            }
            None => next_batch(&mut jobs, MAX_BATCH).await,
        };
        let Some((batch, stop)) = next else { break };
        if !batch.is_empty() {
            let writer = Writer {
                shared: &shared,
                held: &mut held,
                kept: &mut kept,
            };
            writer.commit_appends(batch).await;
        }
        if stop {
            break;
        }
    }
    // Back to the pool as it came.
    if let Some(Held { mut connection, .. }) = held.take()
        && connection
            .execute("ROLLBACK; RESET client_min_messages; RESET enable_seqscan")
            .await
            .is_err()
    {
        connection.close_on_drop();
    }
}

/// The writer's connection, and whether a transaction is open on it for
/// the next batch: each commit begins the next transaction in its own
/// round trip (`hints::commit_and_begin`), so a batch takes two round trips, the
/// write and the commit, instead of three.
struct Held {
    connection: PoolConnection<Postgres>,
    begun: bool,
}

/// How long a transaction begun for the next batch stays open while no
/// append comes. It holds no snapshot and no lock (nothing has run in it),
/// but an idle connection is better seen outside a transaction.
const OPEN_WHILE_IDLE: Duration = Duration::from_secs(1);

/// Ends the transaction begun for a batch that did not come. A connection
/// that cannot do so is dropped.
async fn end_open(held: &mut Option<Held>) {
    if let Some(open) = held.as_mut().filter(|held| held.begun) {
        match open.connection.execute("ROLLBACK").await {
            Ok(_) => open.begun = false,
            Err(error) => {
                tracing::debug!(%error, "cannot end the writer's open transaction; closing its connection");
                if let Some(mut held) = held.take() {
                    held.connection.close_on_drop();
                }
            }
        }
    }
}

/// The sessions a writer keeps between batches, as its last batch left
/// them, with their rows' versions (`xmin`). A batch whose sessions are
/// all kept neither reads nor locks them: it writes straight away, each
/// session's update checking that its row is still the version kept, and
/// is redone from rows read if one is not (another replica, or another
/// kind of write, changed it). Two round trips (the write, and `COMMIT`
/// with the hints and the next `BEGIN`) instead of three, and no session
/// read.
///
/// A session is taken out while a batch writes it and put back only if
/// the batch committed, so a failed or redone batch never leaves a stale
/// copy. Kept for [`KEPT_FOR`] at most, [`KEPT_MAX`] sessions at most.
#[derive(Default)]
struct KeptSessions {
    sessions: HashMap<(String, String), (append::Kept, Instant)>,
    /// Sessions not kept again until the instant given: a batch that
    /// wrote them as kept had to be redone (another replica, or another
    /// kind of write, had changed one of them). A session whose appends
    /// go to several replicas in turn changes under every writer that
    /// keeps it; kept, each of its batches would write once for nothing
    /// and again from rows read. Read and locked instead, it costs one
    /// read. (Which of a redone batch's kept sessions had changed is not
    /// known when a key refused the write: all of them cool down.)
    cooling: HashMap<(String, String), Instant>,
}

/// How long a session of a redone batch is not kept.
const COOL_FOR: Duration = Duration::from_secs(10);

/// How long a writer trusts a session it keeps without using it. Also
/// keeps a row's version from being compared after the 2^32 transactions
/// that could bring the same `xmin` back.
const KEPT_FOR: Duration = Duration::from_secs(60);
/// The most sessions one writer keeps.
const KEPT_MAX: usize = 10_000;

impl KeptSessions {
    /// Gives `run` the kept sessions its requests name, taking them out.
    /// `true` if it gave any.
    fn lend(
        &mut self,
        run: &mut append::Run<'_>,
        requests: &[(&str, &NewExchange)],
        now: Timestamp,
    ) -> Vec<(String, String)> {
        let mut lent = Vec::new();
        for (tenant, exchange) in requests {
            let key = ((*tenant).to_owned(), exchange.session_id.clone());
            if let Some((kept, since)) = self.sessions.remove(&key)
                && since.elapsed() < KEPT_FOR
            {
                run.add_kept(kept, now);
                lent.push(key);
            }
        }
        lent
    }

    /// Keeps none of `sessions` for [`COOL_FOR`]: a batch that wrote them
    /// as kept is being redone.
    fn cool(&mut self, sessions: Vec<(String, String)>) {
        let until = Instant::now() + COOL_FOR;
        if self.cooling.len() + sessions.len() > KEPT_MAX {
            let now = Instant::now();
            self.cooling.retain(|_, until| *until > now);
        }
        if self.cooling.len() + sessions.len() <= KEPT_MAX {
            self.cooling
                .extend(sessions.into_iter().map(|key| (key, until)));
        }
    }

    /// Keeps `sessions`, as a batch that committed left them.
    fn keep(&mut self, sessions: Vec<append::Kept>) {
        if self.sessions.len() + sessions.len() > KEPT_MAX {
            self.sessions
                .retain(|_, (_, since)| since.elapsed() < KEPT_FOR);
            if self.sessions.len() + sessions.len() > KEPT_MAX {
                self.sessions.clear();
            }
        }
        let now = Instant::now();
        for kept in sessions {
            let key = (kept.tenant.clone(), kept.loaded.session.id.clone());
            match self.cooling.get(&key) {
                Some(until) if *until > now => continue,
                Some(_) => {
                    self.cooling.remove(&key);
                }
                None => {}
            }
            self.sessions.insert(key, (kept, now));
        }
    }
}

/// A batch writer's state, for one batch.
struct Writer<'a> {
    shared: &'a Shared,
    held: &'a mut Option<Held>,
    kept: &'a mut KeptSessions,
}

/// Writes a batch's deferred appends through the general path, one after
/// another.
async fn write_deferred(
    pool: &AnyPool,
    sink: &Arc<dyn CommitSink>,
    search: SearchWrites,
    reachability: &Reachability,
    deferred: Vec<PendingAppend>,
) {
    // In arrival order: a session's later appends were deferred with it.
    // (Their sessions are not kept: the general path changes them.)
    // They are written one after another, so once one finds the
    // database out of reach (or the primary is known lost), the rest
    // are answered with that at once, not each after its own wait for
    // a connection.
    let mut shared: Option<Error> = None;
    for job in deferred {
        if job.abandoned() {
            continue;
        }
        if shared.is_none() && reachability.primary_lost() {
            shared = Some(no_primary());
        }
        match &shared {
            Some(error) => job.fail(fault::again(error)),
            None => {
                shared = write(pool, sink.as_ref(), search, Box::new(job)).await;
            }
        }
    }
}

/// How one try at a batch ended, short of a failed statement.
enum Attempt {
    Committed(append::Written),
    /// A caller gave up before the commit: rolled back.
    Abandoned,
    /// A kept session had changed: rolled back.
    Stale,
}

impl Writer<'_> {
    /// Commits a batch of appends in one transaction (sessions it reads
    /// locked in key order, so batches on other writers and replicas never
    /// deadlock). If a caller gives up before the commit, the batch is
    /// rolled back and redone without it, so an abandoned append never
    /// commits. A batch that wrote kept sessions and failed, or found one
    /// changed, is redone from rows read. If a statement fails then (a
    /// race with another replica), every append goes through [`write`] on
    /// its own, which retries lost races.
    async fn commit_appends(mut self, mut jobs: Vec<PendingAppend>) {
        // A kept connection may have died since the last batch (the
        // database restarted): its failure is retried once on a fresh one.
        let mut kept_connection = self.held.is_some();
        let outcomes = loop {
            jobs.retain(|job| !job.abandoned());
            if jobs.is_empty() {
                return;
            }
            // No writable primary (a failover): answered now, not after a
            // wait for a connection behind the batch before.
            if self.shared.reachability.primary_lost() {
                release(self.held);
                let error = no_primary();
                tracing::debug!(
                    appends = jobs.len(),
                    "no primary: appends answered unavailable"
                );
                for job in jobs {
                    job.fail(fault::again(&error));
                }
                return;
            }
            let requests: Vec<(&str, &NewExchange)> = jobs
                .iter()
                .map(|job| (job.tenant(), job.op().0.as_ref()))
                .collect();
            let mut lent = Vec::new();
            let in_flight = self.shared.figures.batch(jobs.len());
            let attempt = self.attempt(&requests, &jobs, &mut lent).await;
            drop(in_flight);
            match attempt {
                Ok(Attempt::Committed(written)) => {
                    self.kept.keep(written.sessions);
                    break Some(written.outcomes);
                }
                Ok(Attempt::Abandoned) => continue,
                Ok(Attempt::Stale) => {
                    tracing::debug!("a kept session had changed; redoing the batch from rows read");
                    self.kept.cool(lent);
                    continue;
                }
                Err(error) => {
                    // It may be the connection that failed.
                    release(self.held);
                    let error = Error::from(error);
                    // An unreachable database (or a full disk) fails every
                    // append alike: answer them now rather than each after
                    // its own wait for the same fault.
                    if std::mem::take(&mut kept_connection)
                        && matches!(error, Error::StorageUnavailable(_))
                    {
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
                    // Kept sessions skip the read of stored request ids: a
                    // retry fails the write on its key, and the batch is
                    // redone from rows read, which defers it. (The kept
                    // sessions were taken out: the redo reads them all.)
                    if !lent.is_empty() {
                        tracing::debug!(%error, "a batch on kept sessions failed; redoing it from rows read");
                        self.kept.cool(lent);
                        continue;
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
        let deferred = match outcomes {
            Some(outcomes) => {
                let (done, deferred) = by_outcome(jobs, outcomes);
                self.shared.publisher.committed(&self.shared.sink, done);
                deferred
            }
            None => jobs,
        };
        write_deferred(
            &self.shared.pool,
            &self.shared.sink,
            self.shared.search,
            &self.shared.reachability,
            deferred,
        )
        .await;
    }

    /// One try at a batch. A batch whose sessions are all kept is one
    /// statement with no transaction around it ([`Writer::one_trip`]): it
    /// commits as it succeeds, and fails, writing nothing, if a kept
    /// session changed. Any other runs in one transaction on the writer's
    /// connection (begun by the commit before it, or here): the kept
    /// sessions given and the others read and locked, the write, then
    /// `COMMIT` with the hints (and, without one-trip batches, the next
    /// `BEGIN`) unless a caller gave up or a kept session had changed.
    /// `lent` gets the kept sessions given.
    async fn attempt(
        &mut self,
        requests: &[(&str, &NewExchange)],
        jobs: &[PendingAppend],
        lent: &mut Vec<(String, String)>,
    ) -> Result<Attempt, sqlx::Error> {
        let held = match self.held {
            Some(held) => held,
            None => {
                let mut connection = self.shared.connections.acquire().await?;
                // A plain BEGIN rather than sqlx's transaction, which would
                // end with a COMMIT of its own: the commit hints (and the
                // next batch's BEGIN) share the COMMIT's round trip
                // (`hints::commit_and_begin`). That round trip ends the
                // hints' own implicit transaction with a `COMMIT`, which
                // PostgreSQL answers with a warning: the writer's
                // connection does not log warnings.
                //
                // Nor does it scan a table whole where an index would do:
                // a batch's session update joins its few keys with
                // `sessions`, and once its prepared plan is fixed on a
                // small table (a few busy sessions, as a gateway with few
                // users has), PostgreSQL scans it page by page, every row
                // version that appends left since the last vacuum
                // included: a tenth of PostgreSQL's CPU in an append run at
                // 64 clients, where the primary key's index took 2%
                // (BENCHMARKS.md). What else this connection runs reads by
                // key.
                self.shared.figures.round_trips(1);
                connection
                    .execute("SET client_min_messages = error; SET enable_seqscan = off")
                    .await?;
                self.held.insert(Held {
                    connection,
                    begun: false,
                })
            }
        };
        let mut run = append::Run::new(Dialect::Postgres, self.shared.search, requests);
        let now = Timestamp::now();
        *lent = self.kept.lend(&mut run, requests, now);
        let one_trip = self.shared.one_trip && !held.begun && run.reads_nothing();
        if !one_trip && !held.begun {
            self.shared.figures.round_trips(1);
            held.connection.execute("BEGIN").await?;
            held.begun = true;
        }
        let connection = &mut held.connection;
        let written = match append::append_run(&mut **connection, run, now).await {
            Ok(written) => written,
            // A kept session changed elsewhere: the write failed whole.
            Err(error) if stale(&error) => {
                self.shared.figures.round_trips(1);
                if held.begun {
                    self.shared.figures.round_trips(1);
                    connection.execute("ROLLBACK").await?;
                    held.begun = false;
                }
                return Ok(Attempt::Stale);
            }
            Err(error) => return Err(error),
        };
        self.shared.figures.round_trips(written.round_trips);
        if one_trip {
            // Nothing was written if the run refused an append on what a
            // kept session was; else the write has committed.
            if written.stale {
                return Ok(Attempt::Stale);
            }
            let hints = hints_of(&written);
            if hints::close_runs(applied_events(&written)) {
                self.shared.figures.round_trips(1);
                hints::send(&mut **connection, &hints).await;
            } else {
                self.shared.hinter.send(hints);
            }
            return Ok(Attempt::Committed(written));
        }
        // And one more below: the commit, or the rollback.
        self.shared.figures.round_trips(1);
        if written.stale {
            connection.execute("ROLLBACK").await?;
            held.begun = false;
            return Ok(Attempt::Stale);
        }
        if jobs.iter().any(PendingAppend::abandoned) {
            connection.execute("ROLLBACK").await?;
            held.begun = false;
            return Ok(Attempt::Abandoned);
        }
        let hints = hints_of(&written);
        // Without one-trip batches, the next batch's transaction begins in
        // the commit's round trip; with them, the next batch (on the
        // sessions kept now) needs none.
        held.begun = hints::commit_and_begin(connection, &hints, !self.shared.one_trip).await?;
        Ok(Attempt::Committed(written))
    }
}

/// The commit hints of what `written` applied.
fn hints_of(written: &append::Written) -> Vec<String> {
    hints::of(applied_events(written))
}

/// The events `written` applied: (internal session key, event).
fn applied_events(written: &append::Written) -> impl Iterator<Item = &(i64, Arc<EncodedEvent>)> {
    written.outcomes.iter().flat_map(|outcome| match outcome {
        append::Outcome::Done(Ok(applied)) => applied.events.as_slice(),
        _ => &[],
    })
}

/// Whether `error` is a write's refusal of a kept session that changed
/// (`append::STALE_SESSION`).
fn stale(error: &sqlx::Error) -> bool {
    error
        .as_database_error()
        .and_then(|error| error.code())
        .is_some_and(|code| code == append::STALE_SESSION)
}

/// Gives the writer's connection back after a failed batch, its
/// transaction perhaps still open: rolled back, in the background, and
/// returned to the pool if it still answers, closed if not.
/// What an append is answered while no writable primary is known.
fn no_primary() -> Error {
    Error::unavailable(std::io::Error::other(
        "no writable PostgreSQL primary among the listed hosts",
    ))
}

fn release(held: &mut Option<Held>) {
    if let Some(Held { mut connection, .. }) = held.take() {
        tokio::spawn(async move {
            if connection
                .execute("ROLLBACK; RESET client_min_messages; RESET enable_seqscan")
                .await
                .is_err()
            {
                connection.close_on_drop();
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::writers_for;

    #[test]
    fn writers_follow_the_cores_and_the_pool() {
        // One per core, at most four, at most a quarter of the pool, at least one.
        assert_eq!(writers_for(16, 2, None), 2);
        assert_eq!(writers_for(16, 8, None), 4);
        assert_eq!(writers_for(16, 1, None), 1);
        assert_eq!(writers_for(8, 8, None), 2);
        assert_eq!(writers_for(2, 8, None), 1);
        assert_eq!(writers_for(64, 64, None), 4);
        // Asked for: as many, at most half the pool, at least one.
        assert_eq!(writers_for(16, 2, Some(8)), 8);
        assert_eq!(writers_for(16, 2, Some(12)), 8);
        assert_eq!(writers_for(2, 2, Some(4)), 1);
    }
}
