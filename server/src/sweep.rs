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

/// The longest wait between two looks for idle sessions.
const IDLE_SCAN_MAX: Duration = Duration::from_secs(60);

/// How often to look for idle sessions: a hundredth of the idle age,
/// within the sweep interval and [`IDLE_SCAN_MAX`]. Finding them reads the
/// listing index once per tenant (no index orders every tenant's sessions
/// by time: appends would write it), so with many tenants a look is not
/// free, and retention measured in days gains nothing from one a second.
fn idle_scan_interval(options: &SweepOptions) -> Option<Duration> {
    options
        .max_idle_age
        .map(|age| (age / 100).clamp(options.interval, IDLE_SCAN_MAX.max(options.interval)))
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
    let idle_every = idle_scan_interval(&options);
    let mut idle_next = tokio::time::Instant::now();
    loop {
        tokio::select! {
            _ = closing.changed() => return,
            _ = ticks.tick() => {}
        }
        if *closing.borrow() {
            return;
        }
        let now = tokio::time::Instant::now();
        let look_for_idle = idle_every.is_some() && now >= idle_next;
        let idle_found = sweep_pass(&store, &options, look_for_idle).await;
        if let Some(every) = idle_every.filter(|_| look_for_idle) {
            // A full batch leaves more to delete: look again next tick.
            idle_next = if idle_found >= BATCH {
                now
            } else {
                now + every
            };
        }
        hub.prune_runs(RUN_IDLE);
    }
}

/// One pass, idle sessions included; errors are logged and retried at
/// the next tick.
pub async fn sweep_once<S: Store>(store: &S, options: &SweepOptions) {
    sweep_pass(store, options, true).await;
}

/// One pass, looking for idle sessions only if `look_for_idle`; how many
/// idle sessions it found.
async fn sweep_pass<S: Store>(store: &S, options: &SweepOptions, look_for_idle: bool) -> usize {
    let mut idle_found = 0;
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
    match store.expired_approvals(now, BATCH).await {
        Ok(expired) => {
            for session in expired {
                if let Err(error) = store.expire_approvals(&session.tenant, &session.id).await {
                    tracing::debug!(%error, session_id = %session.id, "cannot record approvals' expiry");
                }
            }
        }
        Err(error) => tracing::warn!(%error, "cannot look for expired approvals"),
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
    if let Some(max_idle_age) = options.max_idle_age.filter(|_| look_for_idle) {
        let before = Timestamp(now.0.saturating_sub(micros(max_idle_age)));
        match store.idle_sessions(before, BATCH).await {
            Ok(idle) => {
                idle_found = idle.len();
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
    idle_found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(interval_ms: u64, idle: Option<Duration>) -> SweepOptions {
        SweepOptions {
            interval: Duration::from_millis(interval_ms),
            max_idle_age: idle,
        }
    }

    #[test]
    fn idle_sessions_are_looked_for_by_the_idle_age() {
        assert_eq!(idle_scan_interval(&options(1000, None)), None);
        // Days of retention: once a minute.
        let month = Duration::from_secs(30 * 86_400);
        assert_eq!(
            idle_scan_interval(&options(1000, Some(month))),
            Some(IDLE_SCAN_MAX)
        );
        // An hour: every 36 s; a few seconds: every tick.
        assert_eq!(
            idle_scan_interval(&options(1000, Some(Duration::from_secs(3600)))),
            Some(Duration::from_secs(36))
        );
        assert_eq!(
            idle_scan_interval(&options(50, Some(Duration::from_millis(1500)))),
            Some(Duration::from_millis(50))
        );
        // A sweep interval longer than the cap wins.
        assert_eq!(
            idle_scan_interval(&options(120_000, Some(month))),
            Some(Duration::from_secs(120))
        );
    }
}
