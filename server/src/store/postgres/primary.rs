//! The writable primary among the hosts a database URL names, and keeping
//! every connection of this replica on it.
//!
//! sqlx connects to one host, so libpq's multi-host form
//! (`postgres://u@h1:5432,h2:5432/db?target_session_attrs=read-write`) is
//! split here into one URL per host. [`Located::find`] tries them in order
//! and keeps the first that answers as a writable primary
//! (`pg_is_in_recovery()` false, `transaction_read_only` off); every pool is
//! made for that host, and every connection a pool opens is checked the
//! same way before it is used ([`check`]): one that is not on a writable
//! primary is closed at once, and the pool tries again until its acquire
//! timeout (the caller is then answered STORAGE_UNAVAILABLE).
//!
//! [`Primary`] follows the primary while the replica runs: it keeps a
//! connection of its own to it and asks it every [`CHECK_INTERVAL`] whether
//! it is still a writable primary. When it stops answering, or answers as a
//! standby or read-only, every connection opened before that moment is
//! retired (the pools' `before_acquire` drops it when next taken: the
//! [`Epoch`]), and the hosts are tried in order again until one is a
//! writable primary; the pools are then pointed at it
//! (`Pool::set_connect_options`, which a pool reads on every connection
//! attempt, so a caller already waiting for a connection gets one there).

use std::str::FromStr as _;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use sqlx::any::{AnyConnectOptions, AnyPoolOptions};
use sqlx::pool::PoolConnectionMetadata;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::{AnyConnection, AnyPool, ConnectOptions as _, Connection as _, PgConnection};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::ACQUIRE_TIMEOUT;
use crate::store::OpenError;
use crate::store::once::TakeOnce;

/// How often the followed primary is asked whether it still is one.
const CHECK_INTERVAL: Duration = Duration::from_millis(500);
/// How long one host may take to answer while the primary is searched for.
const HOST_TIMEOUT: Duration = Duration::from_secs(2);
/// The pause between two searches that found no writable primary.
const SEARCH_PAUSE: Duration = Duration::from_millis(250);

/// Checks a connection and sets what every connection of the store runs
/// with, in one round trip.
const CHECK: &str = "SELECT pg_is_in_recovery(), current_setting('transaction_read_only'), \
     set_config('statement_timeout', '30s', false)";

/// `target_session_attrs` values this release accepts: both mean the
/// writable primary.
const SESSION_ATTRS: [&str; 2] = ["read-write", "primary"];

/// One host of the URL, as a URL of its own.
#[derive(Clone, Debug)]
pub(super) struct Host {
    /// `HOST:PORT` as written, for messages.
    pub(super) name: String,
    any: AnyConnectOptions,
    pg: PgConnectOptions,
}

/// The single-host URLs a database URL names, in order, and the URL's
/// `target_session_attrs` checked.
pub(super) fn split(url: &str) -> Result<Vec<(String, String)>, String> {
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| "the database URL has no scheme".to_owned())?;
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let (userinfo, hosts) = match authority.rsplit_once('@') {
        Some((userinfo, hosts)) => (Some(userinfo), hosts),
        None => (None, authority),
    };
    let (path, query) = match tail.split_once('?') {
        Some((path, query)) => (path, Some(query)),
        None => (tail, None),
    };
    let mut kept = Vec::new();
    for pair in query
        .unwrap_or_default()
        .split('&')
        .filter(|p| !p.is_empty())
    {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        if key == "target_session_attrs" {
            if !SESSION_ATTRS.contains(&value) {
                return Err(format!(
                    "target_session_attrs={value} is not supported: use read-write (the default) or primary; \
                     every connection is on the writable primary"
                ));
            }
        } else {
            kept.push(pair);
        }
    }
    let query = if kept.is_empty() {
        String::new()
    } else {
        format!("?{}", kept.join("&"))
    };
    let userinfo = userinfo.map(|u| format!("{u}@")).unwrap_or_default();
    let names: Vec<&str> = hosts.split(',').collect();
    if names.len() > 1 && names.iter().any(|name| name.is_empty()) {
        return Err("the database URL lists an empty host".to_owned());
    }
    Ok(names
        .into_iter()
        .map(|name| {
            (
                name.to_owned(),
                format!("{scheme}://{userinfo}{name}{path}{query}"),
            )
        })
        .collect())
}

/// The hosts a database URL names, in order.
pub(super) fn hosts(url: &str) -> Result<Vec<Host>, OpenError> {
    sqlx::any::install_default_drivers();
    split(url)
        .map_err(OpenError::Url)?
        .into_iter()
        .map(|(name, url)| {
            let any = AnyConnectOptions::from_str(&url)?;
            let pg = PgConnectOptions::from_str(&url)?;
            let name = if name.is_empty() {
                format!("{}:{}", pg.get_host(), pg.get_port())
            } else {
                name
            };
            Ok(Host { name, any, pg })
        })
        .collect()
}

/// Whether a connection is on a writable primary: an error (counted as the
/// database being out of reach) when it is on a standby or read-only.
fn verdict(in_recovery: bool, read_only: &str) -> Result<(), sqlx::Error> {
    if in_recovery {
        Err(not_primary("a standby (in recovery)"))
    } else if read_only != "off" {
        Err(not_primary("read-only (transaction_read_only is on)"))
    } else {
        Ok(())
    }
}

fn not_primary(what: &str) -> sqlx::Error {
    sqlx::Error::Io(std::io::Error::new(
        std::io::ErrorKind::ConnectionRefused,
        format!("the host is {what}, not a writable primary"),
    ))
}

/// Checks a connection of the store's pool (see [`CHECK`]).
async fn check_any(connection: &mut AnyConnection) -> Result<(), sqlx::Error> {
    let (in_recovery, read_only, _): (bool, String, String) =
        sqlx::query_as(CHECK).fetch_one(connection).await?;
    verdict(in_recovery, &read_only)
}

/// Checks a connection of a PostgreSQL-driver pool (see [`CHECK`]).
pub(super) async fn check(connection: &mut PgConnection) -> Result<(), sqlx::Error> {
    let (in_recovery, read_only, _): (bool, String, String) =
        sqlx::query_as(CHECK).fetch_one(connection).await?;
    verdict(in_recovery, &read_only)
}

/// Connects to `host` and checks the connection, within `timeout`.
async fn connect_checked(host: &Host, timeout: Duration) -> Result<PgConnection, String> {
    let attempt = async {
        let mut connection = host.pg.connect().await?;
        if let Err(error) = check(&mut connection).await {
            let _ = connection.close().await;
            return Err(error);
        }
        Ok(connection)
    };
    match tokio::time::timeout(timeout, attempt).await {
        Ok(Ok(connection)) => Ok(connection),
        Ok(Err(error)) => Err(error.to_string()),
        Err(_) => Err(format!("no answer within {} s", timeout.as_secs())),
    }
}

/// When connections last had to be given up (the primary was lost or
/// changed): a pooled connection opened before then is not used again.
#[derive(Clone, Debug)]
pub(super) struct Epoch(Arc<EpochInner>);

#[derive(Debug)]
struct EpochInner {
    origin: Instant,
    /// Microseconds from `origin` to the last change.
    changed: AtomicU64,
}

impl Epoch {
    fn new() -> Self {
        Epoch(Arc::new(EpochInner {
            origin: Instant::now(),
            changed: AtomicU64::new(0),
        }))
    }

    /// Retires every connection opened until now.
    fn advance(&self) {
        let now = u64::try_from(self.0.origin.elapsed().as_micros()).unwrap_or(u64::MAX);
        self.0.changed.store(now, Ordering::Release);
    }

    /// Whether a connection of age `age` was opened after the last change.
    fn admits(&self, age: Duration) -> bool {
        let changed = Duration::from_micros(self.0.changed.load(Ordering::Acquire));
        // Opened before the origin (none is: the pools are made after it)
        // counts as opened at it.
        let opened = self.0.origin.elapsed().saturating_sub(age);
        opened >= changed
    }
}

/// The `before_acquire` hook: a pooled connection opened before the last
/// change is dropped instead of used.
fn admits<C>(
    epoch: &Epoch,
) -> impl for<'c> Fn(
    &'c mut C,
    PoolConnectionMetadata,
) -> futures_core::future::BoxFuture<'c, Result<bool, sqlx::Error>>
+ Send
+ Sync
+ 'static {
    let epoch = epoch.clone();
    move |_, meta| {
        let fresh = epoch.admits(meta.age);
        Box::pin(async move { Ok(fresh) })
    }
}

/// Whether the replica knows of no writable primary right now (it lost
/// the one it followed and has not found another yet): work queued behind
/// a failing one is then answered at once rather than after its own wait
/// for a connection.
#[derive(Clone, Debug, Default)]
pub(super) struct Reachability(Arc<AtomicBool>);

impl Reachability {
    pub(super) fn primary_lost(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }

    fn set_lost(&self, lost: bool) {
        self.0.store(lost, Ordering::Release);
    }
}

/// The primary found among a URL's hosts, and what pools to it need.
pub(super) struct Located {
    hosts: Arc<[Host]>,
    current: usize,
    epoch: Epoch,
    reachability: Reachability,
    /// A checked connection to the primary, kept to follow it.
    probe: PgConnection,
}

impl Located {
    /// Tries the URL's hosts in order and keeps the first writable
    /// primary; an error names every host and why it was passed over.
    pub(super) async fn find(url: &str) -> Result<Located, OpenError> {
        let hosts: Arc<[Host]> = hosts(url)?.into();
        let mut passed = Vec::new();
        for (index, host) in hosts.iter().enumerate() {
            match connect_checked(host, ACQUIRE_TIMEOUT).await {
                Ok(probe) => {
                    if !passed.is_empty() {
                        tracing::info!(primary = %host.name, "found the writable primary");
                    }
                    return Ok(Located {
                        hosts,
                        current: index,
                        epoch: Epoch::new(),
                        reachability: Reachability::default(),
                        probe,
                    });
                }
                Err(cause) => passed.push((host.name.clone(), cause)),
            }
        }
        Err(match <[_; 1]>::try_from(passed) {
            Ok([(target, cause)]) => OpenError::Unreachable { target, cause },
            Err(passed) => OpenError::Unreachable {
                target: "any listed host as a writable primary".to_owned(),
                cause: passed
                    .iter()
                    .map(|(host, cause)| format!("{host}: {cause}"))
                    .collect::<Vec<_>>()
                    .join("; "),
            },
        })
    }

    /// Whether the primary is known to be lost, as the follower sees it.
    pub(super) fn reachability(&self) -> Reachability {
        self.reachability.clone()
    }

    fn host(&self) -> &Host {
        &self.hosts[self.current]
    }

    /// The store's pool (sqlx's `Any` driver) of `max_connections` to the
    /// primary, one connection open.
    pub(super) async fn any_pool(&self, max_connections: u32) -> Result<AnyPool, sqlx::Error> {
        AnyPoolOptions::new()
            .max_connections(max_connections.max(2))
            .min_connections(1)
            // A database that is down makes sqlx retry refused connections
            // until this timeout: it is how long a call waits before it is
            // answered STORAGE_UNAVAILABLE.
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .idle_timeout(Some(Duration::from_secs(600)))
            .after_connect(|connection, _| Box::pin(check_any(connection)))
            .before_acquire(admits(&self.epoch))
            .connect_with(self.host().any.clone())
            .await
    }

    /// A pool of `connections` through PostgreSQL's own driver, connecting
    /// when first needed (`idle_timeout` `None` keeps its connections).
    pub(super) fn pg_pool(&self, connections: u32, idle_timeout: Option<Duration>) -> PgPool {
        PgPoolOptions::new()
            .max_connections(connections)
            .min_connections(0)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .idle_timeout(idle_timeout)
            .after_connect(|connection, _| Box::pin(check(connection)))
            .before_acquire(admits(&self.epoch))
            .connect_lazy_with(self.host().pg.clone())
    }

    /// Follows the primary for `pools` until [`Primary::stop`].
    pub(super) fn follow(self, pools: Vec<Followed>) -> Primary {
        let closing = watch::Sender::new(false);
        let following = Following {
            hosts: Arc::clone(&self.hosts),
            current: Arc::new(AtomicUsize::new(self.current)),
            epoch: self.epoch,
            reachability: self.reachability,
            pools: Mutex::new(pools),
        };
        let task = tokio::spawn(follow(following, Some(self.probe), closing.subscribe()));
        Primary {
            closing,
            task: TakeOnce::new(task),
        }
    }

    /// Closes the connection kept to follow the primary (a command that
    /// does not follow it).
    pub(super) async fn close(self) {
        let _ = self.probe.close().await;
    }
}

/// A pool whose connections follow the primary.
pub(super) enum Followed {
    Any(AnyPool),
    Pg(PgPool),
}

/// The task that follows the primary.
pub(super) struct Primary {
    closing: watch::Sender<bool>,
    task: TakeOnce<JoinHandle<()>>,
}

impl Primary {
    /// Stops following and waits for the task.
    pub(super) async fn stop(&self) {
        self.closing.send_replace(true);
        self.task.join().await;
    }
}

struct Following {
    hosts: Arc<[Host]>,
    current: Arc<AtomicUsize>,
    epoch: Epoch,
    reachability: Reachability,
    pools: Mutex<Vec<Followed>>,
}

impl Following {
    /// Points every pool at host `index`.
    fn switch_to(&self, index: usize) {
        let host = &self.hosts[index];
        self.current.store(index, Ordering::Release);
        self.epoch.advance();
        for pool in self
            .pools
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
        {
            match pool {
                Followed::Any(pool) => pool.set_connect_options(host.any.clone()),
                Followed::Pg(pool) => pool.set_connect_options(host.pg.clone()),
            }
        }
    }

    /// Tries the hosts in order once; the first writable primary's
    /// connection, with its index.
    async fn search(&self) -> Option<(usize, PgConnection)> {
        for (index, host) in self.hosts.iter().enumerate() {
            match connect_checked(host, HOST_TIMEOUT).await {
                Ok(connection) => return Some((index, connection)),
                Err(cause) => tracing::debug!(host = %host.name, %cause, "not the primary"),
            }
        }
        None
    }
}

async fn follow(
    following: Following,
    mut probe: Option<PgConnection>,
    mut closing: watch::Receiver<bool>,
) {
    let mut lost_at: Option<Instant> = None;
    loop {
        let pause = if probe.is_some() {
            CHECK_INTERVAL
        } else {
            SEARCH_PAUSE
        };
        tokio::select! {
            _ = closing.changed() => break,
            () = tokio::time::sleep(pause) => {}
        }
        if let Some(connection) = probe.as_mut() {
            match tokio::time::timeout(HOST_TIMEOUT, check(connection)).await {
                Ok(Ok(())) => continue,
                Ok(Err(error)) => {
                    tracing::warn!(%error, "the primary was lost; searching the hosts")
                }
                Err(_) => tracing::warn!(
                    "the primary did not answer within {} s; searching the hosts",
                    HOST_TIMEOUT.as_secs()
                ),
            }
            if let Some(connection) = probe.take() {
                drop(connection);
            }
            // Connections opened until now are not used again.
            following.epoch.advance();
            following.reachability.set_lost(true);
            lost_at = Some(Instant::now());
        }
        if let Some((index, connection)) = following.search().await {
            let host = &following.hosts[index].name;
            if index == following.current.load(Ordering::Acquire) {
                tracing::info!(primary = %host, "the primary answers again");
                following.epoch.advance();
            } else {
                tracing::warn!(primary = %host, "a new writable primary: connecting there");
                following.switch_to(index);
            }
            if let Some(since) = lost_at.take() {
                tracing::info!(primary = %host, after = ?since.elapsed(), "writing again");
            }
            following.reachability.set_lost(false);
            probe = Some(connection);
        }
    }
    if let Some(connection) = probe {
        let _ = connection.close().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_host_stays_one_url() {
        assert_eq!(
            split("postgres://u:p@db:5433/app?sslmode=disable").unwrap_or_default(),
            vec![(
                "db:5433".to_owned(),
                "postgres://u:p@db:5433/app?sslmode=disable".to_owned()
            )]
        );
        assert_eq!(
            split("postgres:///app").unwrap_or_default(),
            vec![(String::new(), "postgres:///app".to_owned())]
        );
    }

    #[test]
    fn several_hosts_become_one_url_each_without_the_attrs() {
        let urls = split(
            "postgresql://u@h1:5432,h2:6543,[::1]:7000/db?target_session_attrs=read-write&sslmode=prefer",
        )
        .unwrap_or_default();
        assert_eq!(
            urls,
            vec![
                (
                    "h1:5432".to_owned(),
                    "postgresql://u@h1:5432/db?sslmode=prefer".to_owned()
                ),
                (
                    "h2:6543".to_owned(),
                    "postgresql://u@h2:6543/db?sslmode=prefer".to_owned()
                ),
                (
                    "[::1]:7000".to_owned(),
                    "postgresql://u@[::1]:7000/db?sslmode=prefer".to_owned()
                ),
            ]
        );
        let urls = split("postgres://h1,h2/db?target_session_attrs=primary").unwrap_or_default();
        assert_eq!(
            urls.iter().map(|(_, url)| url.as_str()).collect::<Vec<_>>(),
            ["postgres://h1/db", "postgres://h2/db"]
        );
    }

    #[test]
    fn other_session_attrs_are_refused_by_name() {
        for value in ["read-only", "standby", "prefer-standby", "any", ""] {
            let error = split(&format!(
                "postgres://u@h1,h2/db?target_session_attrs={value}"
            ))
            .err()
            .unwrap_or_default();
            assert!(error.contains("target_session_attrs"), "{value}: {error}");
        }
        assert!(split("postgres://u@h1,,h2/db").is_err());
    }

    #[test]
    fn a_standby_or_read_only_host_is_not_the_primary() {
        assert!(verdict(false, "off").is_ok());
        assert!(verdict(true, "off").is_err());
        assert!(verdict(false, "on").is_err());
        // Counted as the database out of reach: STORAGE_UNAVAILABLE.
        assert!(matches!(
            crate::domain::Error::from(not_primary("a standby")),
            crate::domain::Error::StorageUnavailable(_)
        ));
    }

    #[test]
    fn the_epoch_retires_connections_opened_before_it() {
        let origin = Instant::now()
            .checked_sub(Duration::from_secs(60))
            .unwrap_or_else(Instant::now);
        let epoch = Epoch(Arc::new(EpochInner {
            origin,
            changed: AtomicU64::new(0),
        }));
        // Opened 30 s ago, after the origin, before any change: admitted.
        assert!(epoch.admits(Duration::from_secs(30)));
        epoch.advance();
        assert!(!epoch.admits(Duration::from_secs(30)));
        // Opened now, after the change.
        assert!(epoch.admits(Duration::ZERO));
    }
}
