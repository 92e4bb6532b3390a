//! PostgreSQL's general write path: each write a transaction of its own
//! on the pool, retried from the start when it loses a race, and its
//! commit hints sent after it commits.

use sqlx::{AnyPool, Connection as _};

use super::hints;

use crate::domain::Error;
use crate::store::ops::{Dialect, SearchWrites};
use crate::store::writer::{Job, Refused};
use crate::store::{CommitSink, fault};

/// Attempts per write when it loses a race to another writer.
const WRITE_ATTEMPTS: usize = 3;

/// Runs one write in its own transaction, retrying lost races, and
/// answers it. Returns the fault when it failed for the database's state
/// (out of reach, disk full), which the next write would meet too.
pub(super) async fn write(
    pool: &AnyPool,
    sink: &dyn CommitSink,
    search: SearchWrites,
    mut job: Box<dyn Job>,
) -> Option<Error> {
    let fail = |job: Box<dyn Job>, error: Error| {
        let shared = fault::is_shared(&error).then(|| fault::again(&error));
        job.fail(error);
        shared
    };
    let mut attempt = 1;
    loop {
        let mut conn = match pool.acquire().await {
            Ok(conn) => conn,
            Err(error) => return fail(job, Error::from(error)),
        };
        let mut tx = match conn.begin().await {
            Ok(tx) => tx,
            Err(error) => return fail(job, Error::from(error)),
        };
        let error = match job.apply(&mut tx, Dialect::Postgres, search).await {
            Ok(settle) => match tx.commit().await {
                Ok(()) => {
                    let hints = hints::of(settle.events());
                    if !hints::send(&mut *conn, &hints).await {
                        // It may be the connection that failed.
                        conn.close_on_drop();
                    }
                    settle.committed(sink);
                    return None;
                }
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
        return fail(job, error);
    }
}
