//! What a database error means for the caller: the database is out of reach
//! (`StorageUnavailable`, transient), its disk is full (`StorageFull`), or
//! something else failed (`Storage`, a bug or a broken database). Every
//! database error becomes a domain error here, at the storage boundary.

use crate::domain::Error;

/// PostgreSQL SQLSTATEs that mean "the database cannot serve you right now":
/// class 08 (connection exceptions), 57P01–57P05 (admin or crash shutdown,
/// cannot connect now, idle session timeout), 53300 (too many connections),
/// and 25006 (a read-only transaction: the node was demoted to a standby or
/// made read-only; `postgres/primary.rs` finds the writable primary again).
fn postgres_unavailable(code: &str) -> bool {
    code.starts_with("08") || code.starts_with("57P") || code == "53300" || code == "25006"
}

/// PostgreSQL's `disk_full`.
const POSTGRES_DISK_FULL: &str = "53100";
/// SQLite's primary result code `SQLITE_FULL` (sqlx reports the extended
/// code as a number; the primary code is its low byte).
const SQLITE_FULL: i64 = 13;

impl From<sqlx::Error> for Error {
    fn from(error: sqlx::Error) -> Self {
        match &error {
            sqlx::Error::Io(_)
            | sqlx::Error::Tls(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed => Error::unavailable(error),
            sqlx::Error::Database(db) => {
                let code = db.code();
                let code = code.as_deref().unwrap_or_default();
                if code == POSTGRES_DISK_FULL || sqlite_code(code) == Some(SQLITE_FULL) {
                    Error::full(error)
                } else if postgres_unavailable(code) {
                    Error::unavailable(error)
                } else {
                    Error::storage(error)
                }
            }
            _ => Error::storage(error),
        }
    }
}

/// The primary result code of a SQLite error code as sqlx gives it (a
/// decimal number, possibly extended).
fn sqlite_code(code: &str) -> Option<i64> {
    code.parse::<i64>().ok().map(|code| code & 0xff)
}

impl From<rusqlite::Error> for Error {
    fn from(error: rusqlite::Error) -> Self {
        match error.sqlite_error_code() {
            Some(rusqlite::ErrorCode::DiskFull) => Error::full(error),
            _ => Error::storage(error),
        }
    }
}

/// When writes last failed for want of disk space. The server's own
/// background work (search indexing, WAL checkpoints) holds back while
/// they fail and for [`DiskSpace::HOLD_BACK`] after, so that space freed
/// on a full disk goes to the callers' writes first.
#[derive(Debug, Default)]
pub struct DiskSpace {
    last_full: std::sync::Mutex<Option<std::time::Instant>>,
}

impl DiskSpace {
    /// How long background work waits after the last write that found the
    /// disk full.
    pub const HOLD_BACK: std::time::Duration = std::time::Duration::from_secs(5);

    /// Notes a caller's write's failure, if it was for want of space.
    pub fn note(&self, error: &Error) {
        if matches!(error, Error::StorageFull(_)) {
            *self
                .last_full
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) =
                Some(std::time::Instant::now());
        }
    }

    /// Whether background work should wait: a write found the disk full
    /// less than [`Self::HOLD_BACK`] ago.
    pub fn holding_back(&self) -> bool {
        self.last_full
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .is_some_and(|at| at.elapsed() < Self::HOLD_BACK)
    }
}

/// Whether a SQLite error is `SQLITE_FULL`.
pub fn is_disk_full(error: &rusqlite::Error) -> bool {
    error.sqlite_error_code() == Some(rusqlite::ErrorCode::DiskFull)
}

/// Whether a failed PostgreSQL write is worth retrying from the start: a
/// serialization failure, a deadlock, or a unique violation from a racing
/// writer (the retry then sees the winner's row and answers accordingly).
pub fn is_retryable(error: &Error) -> bool {
    let Error::Storage(source) = error else {
        return false;
    };
    let Some(sqlx::Error::Database(db)) = source.downcast_ref::<sqlx::Error>() else {
        return false;
    };
    db.is_unique_violation() || matches!(db.code().as_deref(), Some("40001" | "40P01"))
}

/// Whether `error` is the database's state rather than the request's
/// (unreachable, disk full): every request in a batch would fail alike, so
/// retrying each on its own would only wait for the same fault again.
pub fn is_shared(error: &Error) -> bool {
    matches!(error, Error::StorageUnavailable(_) | Error::StorageFull(_))
}

/// The same fault again, for another caller (storage errors are not
/// `Clone`: their sources are boxed).
pub fn again(error: &Error) -> Error {
    let source = |source: &(dyn std::error::Error + Send + Sync)| {
        Box::new(std::io::Error::other(source.to_string()))
    };
    match error {
        Error::StorageUnavailable(inner) => Error::StorageUnavailable(source(inner.as_ref())),
        Error::StorageFull(inner) => Error::StorageFull(source(inner.as_ref())),
        other => Error::storage(std::io::Error::other(other.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn postgres_states_are_classified() {
        for code in [
            "08006", "08001", "57P01", "57P02", "57P03", "53300", "25006",
        ] {
            assert!(postgres_unavailable(code), "{code}");
        }
        for code in ["23505", "40001", "53100", "42P01"] {
            assert!(!postgres_unavailable(code), "{code}");
        }
    }

    #[test]
    fn sqlite_full_is_found_in_extended_codes() {
        assert_eq!(sqlite_code("13"), Some(SQLITE_FULL));
        assert_eq!(sqlite_code("2067"), Some(19));
        assert_eq!(sqlite_code("57P01"), None);
    }

    #[test]
    fn broken_connections_are_unavailable() {
        let refused = sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert!(matches!(Error::from(refused), Error::StorageUnavailable(_)));
        assert!(matches!(
            Error::from(sqlx::Error::PoolTimedOut),
            Error::StorageUnavailable(_)
        ));
        assert!(matches!(
            Error::from(sqlx::Error::RowNotFound),
            Error::Storage(_)
        ));
    }
}
