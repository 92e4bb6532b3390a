//! Who may start a call, before any work: credentials first (checked before
//! anything else), then the tenant's request rate. Also the count of
//! each tenant's open watch streams.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tonic::{Request, Status};

use crate::auth::{Authenticator, Tenant};
use crate::domain::Error;

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The interceptor on the `SessionStore` service: authenticates, then
/// applies the tenant's rate limit, then tags the request with its tenant.
#[derive(Clone)]
pub struct Admission {
    authenticator: Authenticator,
    rate: Option<Arc<RateLimiter>>,
}

impl Admission {
    pub fn new(authenticator: Authenticator, rate: Option<Arc<RateLimiter>>) -> Self {
        Admission {
            authenticator,
            rate,
        }
    }
}

impl tonic::service::Interceptor for Admission {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        let tenant = self.authenticator.tenant(&request).map_err(Status::from)?;
        if let Some(rate) = &self.rate {
            rate.admit(&tenant).map_err(Status::from)?;
        }
        request.extensions_mut().insert(Tenant(tenant));
        Ok(request)
    }
}

/// A token bucket per tenant: `per_second` tokens a second, holding at
/// most a second's worth (the burst).
pub struct RateLimiter {
    per_second: f64,
    buckets: Mutex<HashMap<String, Bucket>>,
}

struct Bucket {
    tokens: f64,
    updated: Instant,
}

impl RateLimiter {
    /// `None` for 0 (unlimited).
    pub fn new(per_second: u32) -> Option<Arc<Self>> {
        (per_second > 0).then(|| {
            Arc::new(RateLimiter {
                per_second: f64::from(per_second),
                buckets: Mutex::new(HashMap::new()),
            })
        })
    }

    /// Takes one token of `tenant`'s, or says how long until one is there.
    pub fn admit(&self, tenant: &str) -> Result<(), Error> {
        let now = Instant::now();
        let mut buckets = lock(&self.buckets);
        let bucket = match buckets.get_mut(tenant) {
            Some(bucket) => bucket,
            None => buckets.entry(tenant.to_owned()).or_insert(Bucket {
                tokens: self.per_second,
                updated: now,
            }),
        };
        let refill = now.duration_since(bucket.updated).as_secs_f64() * self.per_second;
        bucket.tokens = (bucket.tokens + refill).min(self.per_second);
        bucket.updated = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            Ok(())
        } else {
            let wait = (1.0 - bucket.tokens) / self.per_second;
            Err(Error::RateLimited {
                per_second: self.per_second as u64,
                retry_after: Duration::from_secs_f64(wait),
            })
        }
    }
}

/// Counts open watch streams per tenant against a maximum.
pub struct WatchPermits {
    max: usize,
    open: Mutex<HashMap<String, usize>>,
}

impl WatchPermits {
    pub fn new(max: usize) -> Arc<Self> {
        Arc::new(WatchPermits {
            max,
            open: Mutex::new(HashMap::new()),
        })
    }

    /// A permit for one more stream of `tenant`'s, held until dropped.
    pub fn acquire(self: &Arc<Self>, tenant: &str) -> Result<WatchPermit, Error> {
        let mut open = lock(&self.open);
        let count = open.entry(tenant.to_owned()).or_insert(0);
        if *count >= self.max {
            return Err(Error::LimitExceeded {
                field: "session_id".into(),
                limit: "max_watch_streams_per_tenant",
                description: format!(
                    "the tenant already has {} open watch streams, the most allowed (--max-watch-streams-per-tenant)",
                    self.max
                ),
            });
        }
        *count += 1;
        Ok(WatchPermit {
            permits: Arc::clone(self),
            tenant: tenant.to_owned(),
        })
    }
}

/// One open watch stream; gives its place back when dropped.
pub struct WatchPermit {
    permits: Arc<WatchPermits>,
    tenant: String,
}

impl Drop for WatchPermit {
    fn drop(&mut self) {
        let mut open = lock(&self.permits.open);
        if let Some(count) = open.get_mut(&self.tenant) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                open.remove(&self.tenant);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_hold_a_second_per_tenant() {
        let Some(rate) = RateLimiter::new(3) else {
            panic!("3/s is a limit");
        };
        for _ in 0..3 {
            assert!(rate.admit("a").is_ok());
        }
        match rate.admit("a") {
            Err(Error::RateLimited { retry_after, .. }) => {
                assert!(retry_after <= Duration::from_millis(334), "{retry_after:?}");
            }
            other => panic!("expected RateLimited, got {other:?}"),
        }
        assert!(rate.admit("b").is_ok(), "tenants have their own buckets");
        assert!(RateLimiter::new(0).is_none());
    }

    #[test]
    fn watch_permits_come_back() {
        let permits = WatchPermits::new(1);
        let first = permits.acquire("a");
        assert!(first.is_ok());
        assert!(permits.acquire("a").is_err());
        assert!(permits.acquire("b").is_ok());
        drop(first);
        assert!(permits.acquire("a").is_ok());
    }
}
