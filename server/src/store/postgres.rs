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

use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::any::AnyPoolOptions;
use sqlx::migrate::Migrator;
use sqlx::postgres::PgListener;
use sqlx::{AnyPool, Executor, Row};
use tokio::sync::watch;

use super::ops::{self, Dialect, NOTIFY_CHANNEL, WriteOp, Written};
use super::sql::{Inner, SqlStore, WritePath, publish};
use super::{CommitSink, OpenError, StoreOptions};
use crate::domain::{Error, Result};

pub(super) static MIGRATOR: Migrator = sqlx::migrate!("../migrations/postgres");

/// Attempts per write when it loses a race to another writer.
const WRITE_ATTEMPTS: usize = 3;
/// Watched sessions whose heads are read per query when re-syncing.
const RESYNC_CHUNK: usize = 500;

pub(super) async fn connect(url: &str, max_connections: u32) -> Result<AnyPool, sqlx::Error> {
    sqlx::any::install_default_drivers();
    AnyPoolOptions::new()
        .max_connections(max_connections.max(2))
        .min_connections(1)
        .acquire_timeout(Duration::from_secs(10))
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

/// Connects, migrates, and starts the commit-hint listener.
pub(super) async fn open(
    url: &str,
    sink: Arc<dyn CommitSink>,
    options: &StoreOptions,
) -> Result<SqlStore, OpenError> {
    let pool = connect(url, options.max_connections).await?;
    MIGRATOR.run(&pool).await?;
    let closing = watch::Sender::new(false);
    let listener = tokio::spawn(listen(
        url.to_owned(),
        pool.clone(),
        Arc::clone(&sink),
        closing.subscribe(),
        options.recheck_interval,
    ));
    Ok(SqlStore::from_inner(Inner {
        pool,
        writes: WritePath::Direct,
        sink,
        tasks: Mutex::new(vec![listener]),
        closing,
    }))
}

/// Runs one write in its own transaction, retrying lost races.
pub(super) async fn write(
    pool: &AnyPool,
    sink: &dyn CommitSink,
    tenant: &str,
    op: WriteOp,
) -> Result<Written> {
    let mut attempt = 1;
    loop {
        let result = async {
            let mut tx = pool.begin().await?;
            let applied = ops::apply(&mut tx, Dialect::Postgres, tenant, op.clone()).await?;
            tx.commit().await?;
            Ok::<_, Error>(applied)
        }
        .await;
        match result {
            Ok(applied) => return Ok(publish(sink, applied)),
            Err(error) if attempt < WRITE_ATTEMPTS && ops::is_retryable(&error) => {
                tracing::debug!(attempt, "write lost a race; retrying");
                attempt += 1;
            }
            Err(error) => {
                if let Error::Storage(source) = &error {
                    tracing::error!(error = %source, "write failed");
                }
                return Err(error);
            }
        }
    }
}

/// Parses a `"<key>:<revision>"` hint.
fn parse_hint(payload: &str) -> Option<(i64, i64)> {
    let (key, revision) = payload.split_once(':')?;
    Some((key.parse().ok()?, revision.parse().ok()?))
}

async fn listen(
    url: String,
    pool: AnyPool,
    sink: Arc<dyn CommitSink>,
    mut closing: watch::Receiver<bool>,
    recheck_interval: Duration,
) {
    let mut backoff = Duration::from_millis(50);
    loop {
        if *closing.borrow() {
            return;
        }
        let mut listener = match subscribe(&url).await {
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
        resync(&pool, sink.as_ref()).await;
        let mut recheck = tokio::time::interval(recheck_interval);
        recheck.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        recheck.tick().await;
        loop {
            tokio::select! {
                _ = closing.changed() => return,
                _ = recheck.tick() => resync(&pool, sink.as_ref()).await,
                received = listener.try_recv() => match received {
                    Ok(Some(notification)) => match parse_hint(notification.payload()) {
                        Some((key, revision)) => sink.head_moved(key, revision),
                        None => tracing::warn!(payload = notification.payload(), "malformed commit hint"),
                    },
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
    listener.listen(NOTIFY_CHANNEL).await?;
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
    use super::parse_hint;

    #[test]
    fn hints_parse() {
        assert_eq!(parse_hint("12:34"), Some((12, 34)));
        assert_eq!(parse_hint("12"), None);
        assert_eq!(parse_hint("a:1"), None);
    }
}
