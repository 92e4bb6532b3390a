//! The background sweeper: records leases that ran out (so watchers see
//! `run_ended` promptly, not only at the next write), deletes sessions idle
//! longer than the retention age, purges old tombstones, and forgets
//! buffered deltas of runs that went silent.
//!
//! Every change goes through the store's ordinary write path, one small
//! session at a time, so a sweep never holds a lock across requests; with
//! several replicas each one sweeps, and the row lock makes the work
//! idempotent.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::domain::Timestamp;
use crate::domain::control::SettleLease;
use crate::store::Store;
use crate::watch::Hub;

/// Sessions handled per query; the next tick takes the rest.
const BATCH: usize = 100;
/// How long a deleted session's tombstone (and final event) is kept for
/// watchers still replaying up to it.
const TOMBSTONE_AGE: Duration = Duration::from_secs(3600);
/// Buffered deltas of a run with no delta for this long are dropped.
const RUN_IDLE: Duration = Duration::from_secs(600);

/// What the sweeper does and how often.
#[derive(Clone, Copy, Debug)]
pub struct SweepOptions {
    pub interval: Duration,
    /// Delete sessions with no revision for this long; `None` keeps them.
    pub max_idle_age: Option<Duration>,
}

fn micros(duration: Duration) -> i64 {
    i64::try_from(duration.as_micros()).unwrap_or(i64::MAX)
}

/// Runs until `closing` turns true.
pub async fn run<S: Store>(
    store: S,
    hub: Arc<Hub>,
    options: SweepOptions,
    mut closing: watch::Receiver<bool>,
) {
    let mut ticks = tokio::time::interval(options.interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = closing.changed() => return,
            _ = ticks.tick() => {}
        }
        if *closing.borrow() {
            return;
        }
        sweep_once(&store, &options).await;
        hub.prune_runs(RUN_IDLE);
    }
}

/// One pass; errors are logged and retried at the next tick.
pub async fn sweep_once<S: Store>(store: &S, options: &SweepOptions) {
    let now = Timestamp::now();
    match store.expired_leases(now, BATCH).await {
        Ok(expired) => {
            for session in expired {
                let settled = store
                    .control(&session.tenant, &session.id, SettleLease)
                    .await;
                if let Err(error) = settled {
                    tracing::debug!(%error, session_id = %session.id, "cannot settle an expired lease");
                }
            }
        }
        Err(error) => tracing::warn!(%error, "cannot look for expired leases"),
    }
    match store.expired_sessions(now, BATCH).await {
        Ok(expired) => {
            for session in expired {
                match store
                    .delete_expired(&session.tenant, &session.id, now)
                    .await
                {
                    Ok(true) => {
                        tracing::info!(session_id = %session.id, tenant = %session.tenant, "deleted an expired session")
                    }
                    Ok(false) => {}
                    Err(error) => {
                        tracing::warn!(%error, session_id = %session.id, "cannot delete an expired session")
                    }
                }
            }
        }
        Err(error) => tracing::warn!(%error, "cannot look for expired sessions"),
    }
    if let Some(max_idle_age) = options.max_idle_age {
        let before = Timestamp(now.0.saturating_sub(micros(max_idle_age)));
        match store.idle_sessions(before, BATCH).await {
            Ok(idle) => {
                for session in idle {
                    match store
                        .delete_idle(&session.tenant, &session.id, before)
                        .await
                    {
                        Ok(true) => {
                            tracing::info!(session_id = %session.id, tenant = %session.tenant, "deleted an idle session")
                        }
                        Ok(false) => {}
                        Err(error) => {
                            tracing::warn!(%error, session_id = %session.id, "cannot delete an idle session")
                        }
                    }
                }
            }
            Err(error) => tracing::warn!(%error, "cannot look for idle sessions"),
        }
    }
    let before = Timestamp(now.0.saturating_sub(micros(TOMBSTONE_AGE)));
    if let Err(error) = store.purge_tombstones(before, BATCH).await {
        tracing::warn!(%error, "cannot purge deleted sessions' tombstones");
    }
}
