//! Every connection to a SQLite database is opened and configured here:
//! sqlx's pool ([`pool`]) and each engine thread's own rusqlite connection
//! ([`engine`], by [`Role`]). What they share is written once, in
//! [`SHARED`]; what a role changes, and why, is said beside it.

use std::path::{Path, PathBuf};
use std::str::FromStr as _;
use std::sync::Arc;
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};
use sqlx::any::AnyPoolOptions;
use sqlx::{AnyPool, Executor as _};

use super::search_file;
use super::wal::{BUSY_TIMEOUT, WAL_SIZE_LIMIT};
use super::wal_writes;
use crate::store::{OpenError, WalWrites};

/// How much of the database file (bytes, from its start) a read
/// connection maps into memory. Its pages are then read where the OS page
/// cache holds them instead of copied out by a `pread` each: a read
/// connection's own cache (SQLite's default 2 MB) is emptied whenever
/// another connection commits, so a long read fetched most of its pages
/// from the OS every time (about 15% of a replay's server CPU was that
/// copy; BENCHMARKS.md, "Lever taken: read connections map the database
/// file").
/// Pages whose newest version is still in the WAL are read from it as
/// before. Only reads go through the map: SQLite writes with `write`
/// calls, and nothing shrinks the file (no `VACUUM`, no auto-vacuum).
/// The price, as SQLite's documentation says: a read error from the disk
/// under a mapped page stops the process with `SIGBUS` instead of failing
/// the read.
pub(super) const READ_MMAP_SIZE: i64 = 1 << 30;

/// What every writing connection of a file database runs first:
/// - `synchronous = FULL`: an acknowledged commit survives power loss, not
///   just a crash (the append thread alone differs: see [`Role::Appends`]);
/// - foreign keys on; a 10 s busy timeout;
/// - a 32 MiB page cache, and savepoint journals in memory rather than in
///   a temporary file per transaction (each measured, BENCHMARKS.md);
/// - no automatic checkpoint: the checkpointer thread copies the WAL back,
///   off the writer's path, and a connection that starts the WAL over cuts
///   the file back to [`WAL_SIZE_LIMIT`];
/// - `secure_delete = ON`: what a delete or an update removes is
///   overwritten with zeros, in its page and in freed pages, not merely
///   unlinked (EraseUser promises no erased byte is left in the file). It
///   also holds for a database attached later, the search file.
const SHARED: &str = "PRAGMA synchronous = FULL; PRAGMA foreign_keys = ON; \
     PRAGMA busy_timeout = 10000; PRAGMA cache_size = -32768; PRAGMA temp_store = MEMORY; \
     PRAGMA wal_autocheckpoint = 0; PRAGMA secure_delete = ON";

pub(in crate::store) fn is_in_memory(url: &str) -> bool {
    url.contains(":memory:") || url.contains("mode=memory")
}

/// A file URL without an explicit mode opens read-write-create.
fn with_create_mode(url: &str) -> String {
    if is_in_memory(url) || url.contains("mode=") {
        url.to_owned()
    } else if url.contains('?') {
        format!("{url}&mode=rwc")
    } else {
        format!("{url}?mode=rwc")
    }
}

/// The database file a file URL names.
pub(super) fn file_path(url: &str) -> Result<PathBuf, sqlx::Error> {
    Ok(sqlx::sqlite::SqliteConnectOptions::from_str(url)?
        .get_filename()
        .to_path_buf())
}

/// A pool on the database `url` names, every connection configured and
/// with the search index attached as `search`: the search file beside a
/// database file (created here if missing), or an in-memory one.
/// `sqlite::memory:` is one connection, never recycled: it *is* the
/// database.
pub(in crate::store) async fn pool(url: &str) -> Result<AnyPool, OpenError> {
    sqlx::any::install_default_drivers();
    let in_memory = is_in_memory(url);
    let attach_search: Arc<str> = if in_memory {
        format!(
            "ATTACH DATABASE ':memory:' AS search; {}",
            search_file::CREATE_INDEX
        )
        .into()
    } else {
        let path = file_path(url)?;
        search_file::prepare(&path)?;
        search_file::attach(&search_file::search_path(&path)).into()
    };
    let options = if in_memory {
        AnyPoolOptions::new()
            .max_connections(1)
            .min_connections(1)
            .idle_timeout(None)
            .max_lifetime(None)
    } else {
        AnyPoolOptions::new()
            .max_connections(8)
            .acquire_timeout(Duration::from_secs(30))
    };
    options
        // A local file needs no liveness ping (a round trip to sqlx's
        // worker thread) before every batch.
        .test_before_acquire(false)
        .after_connect(move |conn, _| {
            let attach_search = Arc::clone(&attach_search);
            Box::pin(async move {
                if !in_memory {
                    conn.execute("PRAGMA journal_mode = WAL").await?;
                    conn.execute(format!("PRAGMA journal_size_limit = {WAL_SIZE_LIMIT}").as_str())
                        .await?;
                }
                conn.execute(SHARED).await?;
                conn.execute(&*attach_search).await?;
                Ok(())
            })
        })
        .connect(&with_create_mode(url))
        .await
        .map_err(OpenError::from)
}

/// A plain connection to read which migrations a database file holds
/// (`migrate --check`), creating nothing: none for a file that does not
/// exist yet or a database in memory (a new one, empty, each time).
pub(in crate::store) async fn inspection(
    url: &str,
) -> Result<Option<sqlx::AnyConnection>, OpenError> {
    use sqlx::Connection as _;
    sqlx::any::install_default_drivers();
    if is_in_memory(url) || !file_path(url)?.exists() {
        return Ok(None);
    }
    Ok(Some(sqlx::AnyConnection::connect(url).await?))
}

/// A connection with SQLite's defaults to the existing database file at
/// `path`, for `backup` and `restore` (`backup.rs`): read-only, or
/// read-write without creating it.
pub(super) fn plain(path: &Path, read_only: bool) -> rusqlite::Result<Connection> {
    let access = if read_only {
        OpenFlags::SQLITE_OPEN_READ_ONLY
    } else {
        OpenFlags::SQLITE_OPEN_READ_WRITE
    };
    Connection::open_with_flags(path, access | OpenFlags::SQLITE_OPEN_NO_MUTEX)
}

/// What an engine connection is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Role {
    /// The append thread (`appends.rs`). As the pool's, but
    /// `synchronous = NORMAL`: the syncer, not `COMMIT`, fsyncs the WAL.
    /// And without foreign key checks: a run reads the session rows it
    /// writes under in its own `BEGIN IMMEDIATE` (no other writer can
    /// delete them meanwhile) and writes the provider calls its messages
    /// reference itself, so they could never fail; and an immediate check
    /// makes SQLite keep a statement journal for every multi-row statement
    /// (`append/statements.rs`, `OR FAIL`). Deletes, and their cascades, go through
    /// sqlx's connections, which keep the checks.
    Appends,
    /// The checkpointer thread (`checkpoints.rs`): checkpoints only, never
    /// waiting for a lock.
    Checkpoints,
    /// The search indexer (`search.rs`), with the search file attached.
    /// `search.synchronous = FULL`: the log rows an applied id covers are
    /// deleted afterwards, so that id must be on disk first. The main
    /// database is only read there, and the search file has SQLite's
    /// automatic checkpoints.
    Search,
    /// A message or event read (`reads.rs`): read-only, the file mapped
    /// ([`READ_MMAP_SIZE`]).
    Read,
    /// EraseUser's last step (`Engine::truncate_wal`), with the search
    /// file attached: checkpoints that copy WAL frames back, the search
    /// file's all of them, cutting its WAL to zero bytes (waiting for
    /// readers and the indexer up to the busy timeout).
    Scrub,
    /// The last connection of a closed store, with the search file
    /// attached: it closes without a checkpoint, leaving the WAL files in
    /// place (see `Engine::stop`).
    Closing,
}

/// An engine connection to the (existing, migrated) database file at
/// `path`, configured for `role`. Without SQLite's per-connection mutex:
/// one thread uses it at a time.
pub(super) fn engine(path: &Path, role: Role, wal: WalWrites) -> rusqlite::Result<Connection> {
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = match (role, wal) {
        // The two connections that write the most frames gather them
        // (`wal_writes.rs`), unless told otherwise.
        (Role::Appends | Role::Search, WalWrites::Gathered) => {
            Connection::open_with_flags_and_vfs(path, flags, wal_writes::vfs()?)?
        }
        _ => Connection::open_with_flags(path, flags)?,
    };
    match role {
        Role::Appends => {
            conn.execute_batch(SHARED)?;
            conn.execute_batch("PRAGMA synchronous = NORMAL; PRAGMA foreign_keys = OFF")?;
            conn.pragma_update(None, "journal_size_limit", WAL_SIZE_LIMIT)?;
        }
        Role::Checkpoints => {
            // Its `PASSIVE` checkpoints never wait for a lock, and its
            // `TRUNCATE` ones must not: no busy timeout.
            conn.busy_timeout(Duration::ZERO)?;
            conn.execute_batch("PRAGMA wal_autocheckpoint = 0")?;
            conn.pragma_update(None, "journal_size_limit", WAL_SIZE_LIMIT)?;
        }
        Role::Search => {
            // SQLite's own checkpoints keep the search file's WAL short.
            conn.execute_batch(&search_file::attach(&search_file::search_path(path)))?;
            conn.execute_batch(
                "PRAGMA search.synchronous = FULL; PRAGMA busy_timeout = 10000; \
                 PRAGMA cache_size = -16384; PRAGMA temp_store = MEMORY; \
                 PRAGMA secure_delete = ON",
            )?;
            conn.pragma_update(
                Some(rusqlite::DatabaseName::Attached("search")),
                "journal_size_limit",
                WAL_SIZE_LIMIT,
            )?;
        }
        Role::Scrub => {
            conn.execute_batch(&search_file::attach(&search_file::search_path(path)))?;
            conn.busy_timeout(BUSY_TIMEOUT)?;
        }
        Role::Read => {
            conn.busy_timeout(BUSY_TIMEOUT)?;
            conn.execute_batch("PRAGMA query_only = ON")?;
            conn.pragma_update(None, "mmap_size", READ_MMAP_SIZE)?;
        }
        Role::Closing => {
            conn.set_db_config(
                rusqlite::config::DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE,
                true,
            )?;
            conn.execute_batch(&search_file::attach(&search_file::search_path(path)))?;
        }
    }
    Ok(conn)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A read connection maps the file and cannot write; a writing one
    /// reads through its own page cache.
    #[test]
    fn read_connections_map_the_file_and_only_read() -> rusqlite::Result<()> {
        let dir =
            std::env::temp_dir().join(format!("sessionstore-read-map-{}", std::process::id()));
        std::fs::create_dir_all(&dir)
            .map_err(|error| rusqlite::Error::ToSqlConversionFailure(error.into()))?;
        let path = dir.join("db.sqlite");
        {
            let conn = Connection::open(&path)?;
            conn.execute_batch(
                "PRAGMA journal_mode = WAL; CREATE TABLE t (body TEXT); \
                 INSERT INTO t VALUES ('kept')",
            )?;
        }
        let mapped = |conn: &Connection| -> rusqlite::Result<i64> {
            conn.query_row("PRAGMA mmap_size", [], |row| row.get(0))
        };
        let read = engine(&path, Role::Read, WalWrites::Direct)?;
        assert_eq!(mapped(&read)?, READ_MMAP_SIZE);
        let body: String = read.query_row("SELECT body FROM t", [], |row| row.get(0))?;
        assert_eq!(body, "kept");
        assert!(read.execute("INSERT INTO t VALUES ('no')", []).is_err());
        assert_eq!(
            mapped(&engine(&path, Role::Checkpoints, WalWrites::Direct)?)?,
            0
        );
        drop(read);
        let _ = std::fs::remove_dir_all(&dir);
        Ok(())
    }
}
