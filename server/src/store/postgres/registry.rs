//! The replica registry, `sessionstore_replicas` (migration 20): each
//! serving replica's row, inserted before it serves, its `heartbeat_time`
//! renewed every [`HEARTBEAT`] by the database's clock, deleted on a clean
//! shutdown. A row whose heartbeat is [`LIVE_FOR`] old or more is stale:
//! its replica is gone (killed, cut off), and nothing reads it. Rows are
//! the registry whoever wrote them, so a tool or another release may
//! register too.
//!
//! A failed heartbeat (the database down, failing over) is logged and
//! tried again at the next one; it never stops the replica, and the row
//! is written again (an upsert) once the database answers.

use std::time::Duration;

use sqlx::{AnyPool, Executor as _, Row as _};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::store::Replica;
use crate::store::once::TakeOnce;

/// How often a replica renews its heartbeat (the contract: at least every
/// 5 s).
const HEARTBEAT: Duration = Duration::from_secs(2);
/// The longest one heartbeat may take before it counts as failed.
const HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(4);
/// A replica is live while its heartbeat is younger than this, by the
/// database's clock.
const LIVE_FOR: &str = "20 seconds";
/// Rows stale for this long are removed when a replica registers, so
/// replicas that were killed do not pile up.
const FORGET_AFTER: &str = "1 day";

/// Inserts the row, or renews its heartbeat if it is there.
const UPSERT: &str = "INSERT INTO sessionstore_replicas \
     (replica_id, version, schema, address, start_time, heartbeat_time) \
     VALUES ($1, $2, $3, $4, now(), now()) \
     ON CONFLICT (replica_id) DO UPDATE SET heartbeat_time = now()";

/// This replica's row.
#[derive(Clone, Debug)]
pub(super) struct Entry {
    pub(super) replica_id: String,
    pub(super) schema: i64,
    /// The `HOST:PORT` it serves on.
    pub(super) address: String,
}

/// A registered replica: its heartbeat task, and what deregisters it.
pub(super) struct Registration {
    pool: AnyPool,
    entry: Entry,
    closing: watch::Sender<bool>,
    task: TakeOnce<JoinHandle<()>>,
}

impl Registration {
    /// Writes `entry`'s row (now live) and starts its heartbeat.
    pub(super) async fn register(pool: &AnyPool, entry: Entry) -> Result<Self, sqlx::Error> {
        upsert(pool, &entry).await?;
        let forget = format!(
            "DELETE FROM sessionstore_replicas WHERE heartbeat_time < now() - interval '{FORGET_AFTER}'"
        );
        if let Err(error) = pool.execute(forget.as_str()).await {
            tracing::debug!(%error, "could not remove long-stale replica rows");
        }
        tracing::info!(
            replica = %entry.replica_id,
            address = %entry.address,
            schema = entry.schema,
            "registered in the replica registry"
        );
        let closing = watch::Sender::new(false);
        let task = tokio::spawn(heartbeat(pool.clone(), entry.clone(), closing.subscribe()));
        Ok(Registration {
            pool: pool.clone(),
            entry,
            closing,
            task: TakeOnce::new(task),
        })
    }

    /// Stops the heartbeat and deletes the row: the replica is gone.
    pub(super) async fn deregister(&self) {
        self.closing.send_replace(true);
        self.task.join().await;
        let deleted = sqlx::query("DELETE FROM sessionstore_replicas WHERE replica_id = $1")
            .bind(&self.entry.replica_id)
            .execute(&self.pool)
            .await;
        match deleted {
            Ok(_) => tracing::info!(
                replica = %self.entry.replica_id,
                "left the replica registry"
            ),
            // Its row goes stale within 20 s anyway.
            Err(error) => tracing::warn!(
                %error,
                replica = %self.entry.replica_id,
                "could not remove this replica's registry row"
            ),
        }
    }
}

async fn upsert(pool: &AnyPool, entry: &Entry) -> Result<(), sqlx::Error> {
    sqlx::query(UPSERT)
        .bind(&entry.replica_id)
        .bind(format!("sessionstore {}", crate::VERSION))
        .bind(entry.schema)
        .bind(&entry.address)
        .execute(pool)
        .await?;
    Ok(())
}

/// Renews the row every [`HEARTBEAT`] until `closing` turns true.
async fn heartbeat(pool: AnyPool, entry: Entry, mut closing: watch::Receiver<bool>) {
    let mut failing = false;
    loop {
        tokio::select! {
            _ = closing.wait_for(|closing| *closing) => return,
            () = tokio::time::sleep(HEARTBEAT) => {}
        }
        let beat = tokio::time::timeout(HEARTBEAT_TIMEOUT, upsert(&pool, &entry)).await;
        let error = match beat {
            Ok(Ok(())) => {
                if failing {
                    tracing::info!(replica = %entry.replica_id, "registry heartbeat renewed again");
                }
                failing = false;
                continue;
            }
            Ok(Err(error)) => error.to_string(),
            Err(_) => format!("no answer within {HEARTBEAT_TIMEOUT:?}"),
        };
        if failing {
            tracing::debug!(%error, replica = %entry.replica_id, "registry heartbeat failed again");
        } else {
            tracing::warn!(
                %error,
                replica = %entry.replica_id,
                "registry heartbeat failed; trying again every {HEARTBEAT:?}"
            );
        }
        failing = true;
    }
}

/// The live replicas, oldest start first: none where the registry's table
/// does not exist yet (a database before migration 20).
pub(in crate::store) async fn live(
    conn: &mut sqlx::AnyConnection,
) -> Result<Vec<Replica>, sqlx::Error> {
    let statement = format!(
        "SELECT replica_id, version, schema, address, {}, {} \
         FROM sessionstore_replicas \
         WHERE heartbeat_time > now() - interval '{LIVE_FOR}' \
         ORDER BY start_time, replica_id",
        rfc3339("start_time"),
        rfc3339("heartbeat_time"),
    );
    let rows = match sqlx::query(&statement).fetch_all(&mut *conn).await {
        Ok(rows) => rows,
        Err(sqlx::Error::Database(error)) if error.code().as_deref() == Some(UNDEFINED_TABLE) => {
            return Ok(Vec::new());
        }
        Err(error) => return Err(error),
    };
    rows.iter()
        .map(|row| {
            Ok(Replica {
                replica_id: row.try_get(0)?,
                version: row.try_get(1)?,
                schema: row.try_get(2)?,
                address: row.try_get(3)?,
                start_time: row.try_get(4)?,
                heartbeat_time: row.try_get(5)?,
            })
        })
        .collect()
}

/// PostgreSQL's `undefined_table`.
const UNDEFINED_TABLE: &str = "42P01";

/// A `timestamptz` column as RFC 3339 text, in UTC to the microsecond.
fn rfc3339(column: &str) -> String {
    format!("to_char({column} AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"') AS {column}")
}
