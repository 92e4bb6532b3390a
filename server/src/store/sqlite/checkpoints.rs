//! WAL checkpoints of a SQLite file database, on a thread of their own.
//!
//! SQLite's automatic checkpoint runs inside whichever commit crosses
//! 1,000 pages and holds that batch's callers up, so every connection has
//! it off (`wal_autocheckpoint = 0`). Instead this thread copies the WAL
//! back every [`CHECKPOINT_INTERVAL`], with `PASSIVE` checkpoints, which
//! never wait for the writer or a reader.
//!
//! **Keeping the WAL bounded.** SQLite starts the WAL over only after a
//! checkpoint has copied all of it back and synced the database file.
//! Under steady writes a checkpoint from another connection never gets
//! there: by the time it has copied what it found, the engine has
//! committed more, and the WAL grew without bound (432 MB after 5,000
//! appends; BENCHMARKS.md). So once the WAL holds [`RESTART_FRAMES`], this
//! thread
//! 1. syncs the database file, putting on disk what its checkpoints copied;
//! 2. asks the engine thread, the one writer of appends, for a checkpoint
//!    between two of its runs. With no write under way it copies the last
//!    few frames and completes; the engine's next transaction starts the
//!    WAL over and cuts the file back to [`WAL_SIZE_LIMIT`].
//!
//! Step 1 keeps step 2 short: a complete checkpoint syncs the database
//! file, and without step 1 that sync flushed everything the earlier
//! checkpoints had copied, holding the writer for ~150 ms.
//!
//! **Giving the WAL's space back.** Under load the WAL file keeps its size
//! when it starts over (up to [`WAL_SIZE_LIMIT`]), so that it is written
//! over in place. Once writes pause, that space serves nothing: when the
//! WAL has been wholly copied back and not written for [`QUIET`], and the
//! file is larger than [`KEEP_QUIET_WAL`], this thread cuts it to zero
//! bytes with a `TRUNCATE` checkpoint. That takes the write lock, but with
//! nothing left to copy it holds it only for the cut; it never waits: a
//! writer or a reader still on the WAL turns it away at once (this
//! connection has no busy timeout), and it is tried again at the next
//! interval.
//!
//! The sync goes through this thread's own SQLite connection's handle of
//! the file, not a descriptor of its own: closing any descriptor of a file
//! drops every POSIX lock the process holds on it, SQLite's included.

use std::sync::Arc;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant};

use rusqlite::{Connection, ffi};

use super::appends::{Checkpointed, WalCheckpoints};
#[cfg(doc)]
use super::wal::{KEEP_QUIET_WAL, WAL_SIZE_LIMIT};
use super::wal::{QUIET, cut_quiet_wal};
use crate::store::OpenError;
use crate::store::fault::{self, DiskSpace};
use crate::store::once::TakeOnce;

/// How often the WAL is copied back into the database file.
const CHECKPOINT_INTERVAL: Duration = Duration::from_millis(500);

/// WAL frames (pages; 4 KiB each by default) past which the engine is
/// asked to checkpoint, so that the WAL starts over.
pub(super) const RESTART_FRAMES: i64 = 4096;

/// The checkpointer thread's handle.
pub(super) struct Checkpointer {
    stop: mpsc::Sender<()>,
    thread: TakeOnce<std::thread::JoinHandle<()>>,
}

impl Checkpointer {
    /// Starts checkpointing the database through `conn`, a connection of
    /// its own (`Role::Checkpoints`).
    pub(super) fn start(
        conn: Connection,
        engine: WalCheckpoints,
        space: Arc<DiskSpace>,
    ) -> Result<Self, OpenError> {
        let (stop, stopping) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("sqlite-checkpoints".into())
            .spawn(move || run(&conn, &engine, &stopping, &space))
            .map_err(|error| OpenError::Engine(Box::new(error)))?;
        Ok(Checkpointer {
            stop,
            thread: TakeOnce::new(thread),
        })
    }

    /// Stops the thread and waits for it.
    pub(super) async fn stop(&self) {
        let _ = self.stop.send(());
        self.thread.join().await;
    }
}

fn run(
    conn: &Connection,
    engine: &WalCheckpoints,
    stopping: &mpsc::Receiver<()>,
    space: &DiskSpace,
) {
    // After a checkpoint that found the disk full, the next waits as long
    // as writes make background work wait.
    let mut full_at: Option<Instant> = None;
    let wal = conn.path().map(|path| format!("{path}-wal"));
    // The WAL's frame count while it is wholly copied back, and since when.
    let mut quiet: Option<(i64, Instant)> = None;
    while let Err(RecvTimeoutError::Timeout) = stopping.recv_timeout(CHECKPOINT_INTERVAL) {
        // A checkpoint grows the database file: it waits while writes find
        // the disk full, so freed space goes to them first.
        if space.holding_back() || full_at.is_some_and(|at| at.elapsed() < DiskSpace::HOLD_BACK) {
            continue;
        }
        let copied = match Checkpointed::passive(conn) {
            Ok(copied) => {
                full_at = None;
                copied
            }
            Err(error) => {
                if fault::is_disk_full(&error) {
                    full_at = Some(Instant::now());
                }
                tracing::warn!(%error, "WAL checkpoint failed");
                continue;
            }
        };
        if !copied.complete() || copied.wal_frames == 0 {
            quiet = None;
        } else {
            match quiet {
                // Wholly copied back, as at the last interval: no write
                // since, so nothing to start over.
                Some((frames, since)) if frames == copied.wal_frames => {
                    if since.elapsed() >= QUIET && cut_quiet_wal(conn, "main", wal.as_deref()) {
                        quiet = None;
                    }
                    continue;
                }
                _ => quiet = Some((copied.wal_frames, Instant::now())),
            }
        }
        if copied.wal_frames < RESTART_FRAMES {
            continue;
        }
        let started = Instant::now();
        if let Err(error) = sync_database_file(conn) {
            tracing::warn!(%error, "syncing the SQLite database file failed");
            continue;
        }
        let synced = started.elapsed();
        match engine.blocking_checkpoint() {
            Some(Ok(done)) => tracing::debug!(
                wal_frames = done.wal_frames,
                complete = done.complete(),
                sync_ms = synced.as_secs_f64() * 1e3,
                checkpoint_ms = (started.elapsed() - synced).as_secs_f64() * 1e3,
                "the append writer checkpointed the WAL"
            ),
            Some(Err(error)) => tracing::warn!(%error, "WAL checkpoint on the writer failed"),
            // The engine has stopped: the store is closing.
            None => return,
        }
    }
}

/// `fsync`s the database file through `conn`'s own handle of it. `unsafe`
/// (as is `wal_writes.rs`, the VFS): rusqlite has no safe call for it, and
/// a descriptor of our own would drop SQLite's locks when closed (above).
#[allow(unsafe_code)]
fn sync_database_file(conn: &Connection) -> rusqlite::Result<()> {
    let mut file: *mut ffi::sqlite3_file = std::ptr::null_mut();
    // SAFETY: `conn` is open and used by this thread alone; for
    // SQLITE_FCNTL_FILE_POINTER SQLite writes the `sqlite3_file*` of the
    // "main" database into `file`, valid while the connection is open.
    let rc = unsafe {
        ffi::sqlite3_file_control(
            conn.handle(),
            c"main".as_ptr(),
            ffi::SQLITE_FCNTL_FILE_POINTER,
            (&raw mut file).cast(),
        )
    };
    if rc != ffi::SQLITE_OK {
        return Err(rusqlite::Error::SqliteFailure(ffi::Error::new(rc), None));
    }
    // SAFETY: `file` is the open file SQLite just handed out (or null);
    // its methods table is SQLite's own and lives as long as the file.
    let sync = unsafe { file.as_ref() }
        .and_then(|file| unsafe { file.pMethods.as_ref() })
        .and_then(|methods| methods.xSync);
    let Some(sync) = sync else {
        return Err(rusqlite::Error::SqliteFailure(
            ffi::Error::new(ffi::SQLITE_MISUSE),
            Some("the database file has no sync method".into()),
        ));
    };
    // SAFETY: as above; xSync only reads the file's descriptor and flags,
    // and nothing else uses this connection meanwhile.
    let rc = unsafe { sync(file, ffi::SQLITE_SYNC_NORMAL) };
    if rc == ffi::SQLITE_OK {
        Ok(())
    } else {
        Err(rusqlite::Error::SqliteFailure(ffi::Error::new(rc), None))
    }
}
