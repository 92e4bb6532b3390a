//! Cross-replica delivery: the LISTEN task that turns commit hints into
//! head moves for this replica's watchers, and ephemeral changes sent to
//! the other replicas (see the module notes of `postgres/`).

use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::{PgListener, PgPool};
use sqlx::{AnyPool, Row};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::hints;
use crate::domain::{Ephemeral, Result, Timestamp};
use crate::store::once::TakeOnce;
use crate::store::{CommitSink, rows};

/// The channel carrying ephemeral changes between replicas.
const EPHEMERAL_CHANNEL: &str = "sessionstore_ephemeral";
/// Payloads up to this size travel inside the notification (PostgreSQL's
/// limit is 8000 bytes).
const MAX_INLINE_PAYLOAD: usize = 7000;
/// How long a spilled payload is kept for the other replicas to read.
const SPILL_TTL_MICROS: i64 = 5 * 60 * 1_000_000;
/// The longest pause between two tries to LISTEN again: short, since
/// watchers on other replicas wait for it after a failover.
const MAX_BACKOFF: Duration = Duration::from_secs(1);
/// Watched sessions whose heads are read per query when re-syncing.
const RESYNC_CHUNK: usize = 500;

/// The listener task of this replica.
pub(super) struct Listener {
    closing: watch::Sender<bool>,
    task: TakeOnce<JoinHandle<()>>,
}

impl Listener {
    /// Starts listening on a connection of `listening` for commit hints and other replicas'
    /// ephemeral changes (skipping `replica`'s own), telling `sink`.
    pub(super) fn start(
        listening: &PgPool,
        pool: &AnyPool,
        sink: &Arc<dyn CommitSink>,
        replica: &str,
        recheck_interval: Duration,
    ) -> Self {
        let closing = watch::Sender::new(false);
        let task = tokio::spawn(listen(
            Listening {
                listening: listening.clone(),
                pool: pool.clone(),
                sink: Arc::clone(sink),
                replica: replica.to_owned(),
                recheck_interval,
            },
            closing.subscribe(),
        ));
        Listener {
            closing,
            task: TakeOnce::new(task),
        }
    }

    /// Stops listening and waits for the task.
    pub(super) async fn stop(&self) {
        self.closing.send_replace(true);
        self.task.join().await;
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
        let id: i64 = sqlx::query_scalar(
            "INSERT INTO delta_spill (body, time, session_key) VALUES ($1, $2, $3) RETURNING id",
        )
        .bind(json)
        .bind(now)
        .bind(session_key)
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

/// What the listener task needs.
struct Listening {
    /// LISTEN's pool of one connection (on the primary: `primary.rs`).
    listening: PgPool,
    pool: AnyPool,
    sink: Arc<dyn CommitSink>,
    replica: String,
    recheck_interval: Duration,
}

impl Listening {
    fn on_commit(&self, payload: &str) {
        let Some(hint) = hints::parse(payload) else {
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
        listening: listening_pool,
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
        let mut listener = match subscribe(listening_pool).await {
            Ok(listener) => listener,
            Err(error) => {
                tracing::warn!(%error, ?backoff, "cannot LISTEN for commit hints; retrying");
                tokio::select! {
                    _ = closing.changed() => return,
                    () = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(MAX_BACKOFF);
                continue;
            }
        };
        backoff = Duration::from_millis(50);
        // LISTEN is in effect: whatever committed before it is found here.
        // Every (re)connection is a gap, and after a failover the new
        // primary may be on a new timeline: every watched session's head is
        // read again, and its watchers read the event log from the last
        // revision each delivered.
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

async fn subscribe(listening: &PgPool) -> Result<PgListener, sqlx::Error> {
    let mut listener = PgListener::connect_with(listening).await?;
    listener
        .listen_all([hints::CHANNEL, EPHEMERAL_CHANNEL])
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
