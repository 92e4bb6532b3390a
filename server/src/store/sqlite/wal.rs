//! The WAL's sizes and timings, and the two ways its file is cut back:
//! what the checkpointer, the append thread and the search indexer share.

use std::time::Duration;

use rusqlite::Connection;

/// The size (bytes) the WAL file is cut back to when it starts over: above
/// what the WAL reaches between two restarts under steady appends (50–110
/// MB on the bench machine), so that under load it is written over in
/// place. Cut back to 32 MiB, it was regrown at every restart, and the
/// filesystem allocated its blocks again and committed its own journal
/// with the WAL syncs of each regrowth (BENCHMARKS.md: appends 18% faster
/// at 16 clients without that).
pub(super) const WAL_SIZE_LIMIT: i64 = 128 << 20;

/// How long a connection waits on another's lock before failing.
pub(super) const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// How long the WAL must go unwritten before its file is cut to zero.
pub(super) const QUIET: Duration = Duration::from_secs(1);

/// The WAL file size (bytes) kept while writes pause: what SQLite's own
/// automatic checkpoints would let it reach (1,000 pages of 4 KiB).
pub(super) const KEEP_QUIET_WAL: u64 = 4 << 20;

/// Runs a `TRUNCATE` checkpoint of `schema` on `conn`: whether it copied
/// every frame back and cut the WAL file to zero bytes.
pub(super) fn truncated(conn: &Connection, schema: &str) -> rusqlite::Result<bool> {
    // (busy, frames in the WAL, frames copied back): busy is 0 once the
    // checkpoint completed and the file was cut.
    let busy: i64 = conn.query_row(
        &format!("PRAGMA {schema}.wal_checkpoint(TRUNCATE)"),
        [],
        |row| row.get(0),
    )?;
    Ok(busy == 0)
}

/// Cuts the WAL file `wal` of `schema`, unwritten for [`QUIET`], to zero
/// bytes if it is larger than [`KEEP_QUIET_WAL`]; whether it did. `conn`
/// must not wait for locks (no busy timeout).
pub(super) fn cut_quiet_wal(conn: &Connection, schema: &str, wal: Option<&str>) -> bool {
    let size = wal
        .and_then(|wal| std::fs::metadata(wal).ok())
        .map_or(0, |meta| meta.len());
    if size <= KEEP_QUIET_WAL {
        return false;
    }
    match truncated(conn, schema) {
        Ok(true) => {
            tracing::debug!(schema, bytes = size, "cut the quiet WAL to zero bytes");
            true
        }
        // A writer or a reader on the WAL: again at the next interval.
        Ok(false) => false,
        Err(error) => {
            tracing::debug!(%error, "cannot cut the quiet WAL");
            false
        }
    }
}
