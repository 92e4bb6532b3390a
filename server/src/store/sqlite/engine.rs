//! The engine: every rusqlite thread of a SQLite file database, started
//! together by [`Engine::start`] and stopped together by [`Engine::stop`].
//!
//! - the append thread and its WAL syncer (`appends.rs`), which the writer
//!   task hands each run of appends;
//! - the checkpointer (`checkpoints.rs`), which copies the WAL back and
//!   asks the append thread to let it start over;
//! - the search indexer (`search.rs`), which indexes what writes log;
//! - message and event reads on tokio's blocking threads (`reads.rs`).
//!
//! Each opens its connections through `connections.rs`. `sqlite::memory:`
//! has no engine: it lives inside sqlx's one connection, and the writer
//! and reads go through sqlx alone.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicI64;

use super::appends::EngineAppends;
use super::checkpoints::Checkpointer;
use super::connections::{self, Role};
use super::reads::EngineReads;
use super::search::SearchIndexer;
use super::{search_file, wal, wal_writes};
use crate::domain::{Error, Result};
use crate::store::fault::DiskSpace;
use crate::store::ops::SearchWrites;
use crate::store::{OpenError, WalWrites};

/// How long EraseUser's WAL truncation waits before trying again when
/// another checkpoint was under way.
const TRUNCATE_RETRY: std::time::Duration = std::time::Duration::from_millis(20);

/// The engine threads of one database file.
pub(super) struct Engine {
    path: PathBuf,
    appends: EngineAppends,
    checkpointer: Checkpointer,
    /// None with search switched off.
    indexer: Option<SearchIndexer>,
    reads: Arc<EngineReads>,
}

impl Engine {
    /// Starts every engine thread on the (migrated) database file at
    /// `path`. Background work holds back while `space` says writes found
    /// the disk full. Without `search` there is no indexer, appends log
    /// nothing, and the search file is emptied ([`search::switch_off`]).
    pub(super) fn start(
        path: &Path,
        space: &Arc<DiskSpace>,
        search: bool,
        wal_writes: WalWrites,
    ) -> Result<Self, OpenError> {
        let wal_writes = wal_writes::available(wal_writes);
        let open = |role| {
            connections::engine(path, role, wal_writes)
                .map_err(|error| OpenError::Engine(Box::new(error)))
        };
        // The last search log id indexed: the append thread deletes the log
        // rows before it.
        let indexed = Arc::new(AtomicI64::new(0));
        let (indexer, writes) = if search {
            let indexer =
                SearchIndexer::start(open(Role::Search)?, Arc::clone(&indexed), Arc::clone(space))?;
            (Some(indexer), SearchWrites::Logged)
        } else {
            search_file::switch_off(&open(Role::Search)?)
                .map_err(|error| OpenError::Engine(Box::new(error)))?;
            (None, SearchWrites::Off)
        };
        let appends = EngineAppends::start(open(Role::Appends)?, path, indexed, writes)?;
        let checkpointer = Checkpointer::start(
            open(Role::Checkpoints)?,
            appends.checkpoints(),
            Arc::clone(space),
        )?;
        Ok(Engine {
            path: path.to_owned(),
            appends,
            checkpointer,
            indexer,
            reads: EngineReads::new(path.to_owned()),
        })
    }

    pub(super) fn appends(&self) -> &EngineAppends {
        &self.appends
    }

    /// The search indexer, unless search is switched off.
    pub(super) fn indexer(&self) -> Option<&SearchIndexer> {
        self.indexer.as_ref()
    }

    pub(super) fn reads(&self) -> &Arc<EngineReads> {
        &self.reads
    }

    /// Stops every thread, once the writer task has stopped (nothing
    /// appends any more), and keeps no read connection: the store's pool,
    /// closed after this, then holds the database's last connection, the
    /// one that checkpoints the WAL on its way out.
    pub(super) async fn stop(&self) {
        self.appends.stop().await;
        self.checkpointer.stop().await;
        if let Some(indexer) = &self.indexer {
            indexer.stop().await;
        }
        self.reads.close();
    }

    /// Copies every WAL frame of the search file and of the database back
    /// and cuts both WAL files to zero bytes (EraseUser: frames written
    /// before a secure delete still hold what it overwrote). The search
    /// file's on a connection of its own (only the indexer writes there,
    /// and its passes wait meanwhile), after a `PASSIVE` checkpoint of the
    /// database that copies most of its WAL back without taking a lock;
    /// then the database's on the append thread, which has little left to
    /// copy. Each waits for readers up to the busy timeout; a database
    /// still busy after that is UNAVAILABLE, and the caller tries again.
    pub(super) async fn truncate_wal(&self) -> Result<()> {
        // A checkpoint under way (the checkpointer's, or SQLite's own in
        // the search file) turns another away at once, without the busy
        // timeout: each is tried again shortly, for as long as that.
        let until = tokio::time::Instant::now() + wal::BUSY_TIMEOUT;
        let mut search_done = false;
        let mut conn = None;
        loop {
            if !search_done {
                let path = self.path.clone();
                let mut scrub = conn.take();
                let (done, kept) = tokio::task::spawn_blocking(move || -> Result<_> {
                    let conn = match scrub.take() {
                        Some(conn) => conn,
                        None => connections::engine(&path, Role::Scrub, WalWrites::Direct)?,
                    };
                    conn.query_row("PRAGMA main.wal_checkpoint(PASSIVE)", [], |_| Ok(()))?;
                    Ok((wal::truncated(&conn, "search")?, conn))
                })
                .await
                .map_err(Error::storage)??;
                search_done = done;
                conn = Some(kept);
            }
            if search_done && self.appends.truncate_wal().await? {
                return Ok(());
            }
            if tokio::time::Instant::now() >= until {
                return Err(Error::unavailable(std::io::Error::other(
                    "readers kept the WAL from being checkpointed",
                )));
            }
            tokio::time::sleep(TRUNCATE_RETRY).await;
        }
    }

    /// Once the pool is closed too: leaves the WAL and shared-memory files
    /// (and the search file's) on disk, empty, as they are after a crash.
    /// SQLite deletes them when its last connection closes, and a server
    /// started on a full disk could then not create them again, so it
    /// could not even read. One connection opens the database (which
    /// creates them) and closes without the checkpoint that would delete
    /// them ([`Role::Closing`]); every connection before it has already
    /// checkpointed everything, so they hold no frames.
    pub(super) async fn keep_wal_files(&self) {
        let path = self.path.clone();
        let kept = tokio::task::spawn_blocking(move || {
            let conn = connections::engine(&path, Role::Closing, WalWrites::Direct)?;
            conn.query_row("SELECT count(*) FROM main.sqlite_master", [], |_| Ok(()))?;
            conn.query_row("SELECT count(*) FROM search.sqlite_master", [], |_| Ok(()))
        })
        .await;
        if let Ok(Err(error)) = kept {
            tracing::warn!(%error, "cannot leave the SQLite WAL files in place");
        }
    }
}
