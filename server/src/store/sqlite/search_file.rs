//! The search file (`<database>-search`): its schema, how a connection
//! attaches it, and creating it before any connection does.

use std::path::{Path, PathBuf};

use rusqlite::Connection;

use crate::store::OpenError;
use crate::store::fault;

/// The FTS5 table, in the schema `search` (this file, or memory), and its
/// merge setting. `automerge` 8 rather than FTS5's 4: a level's segments
/// are merged once 8 of them have gathered, not 4, so each indexed term is
/// rewritten fewer times. Measured on 192,000 rows indexed in passes of
/// 240: 15% less CPU, searches as fast, the file the same size
/// (BENCHMARKS.md). And `secure-delete`: a deleted row's entries are
/// removed from the index's pages, not hidden by a delete marker that
/// leaves its words in the file until a merge (EraseUser). FTS5 keeps
/// both settings in the table; they are set again on every start, so a
/// file made before them gets them too.
pub(super) const CREATE_INDEX: &str = "CREATE VIRTUAL TABLE IF NOT EXISTS search.message_search \
     USING fts5 (text, tokenize = 'unicode61 remove_diacritics 2'); \
     INSERT INTO search.message_search (message_search, rank) VALUES ('automerge', 8); \
     INSERT INTO search.message_search (message_search, rank) VALUES ('secure-delete', 1)";

/// The last `search_log` id applied (one row, absent until built), and
/// the deletions applied but not yet done (see [`Range::deferred`]).
const CREATE_APPLIED: &str = "CREATE TABLE IF NOT EXISTS search.search_applied \
     (id INTEGER PRIMARY KEY CHECK (id = 1), log_id INTEGER NOT NULL); \
     CREATE TABLE IF NOT EXISTS search.unindex_backlog (log_id INTEGER PRIMARY KEY, \
     session_key INTEGER NOT NULL, from_sequence INTEGER NOT NULL, \
     until_sequence INTEGER NOT NULL); \
     CREATE INDEX IF NOT EXISTS search.unindex_backlog_session \
     ON unindex_backlog (session_key)";

/// The search file of the database file at `path`.
pub(super) fn search_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push("-search");
    PathBuf::from(name)
}

/// The statement a connection runs to see the index (as `search`).
pub(super) fn attach(path: &Path) -> String {
    let quoted = path.to_string_lossy().replace('\'', "''");
    format!("ATTACH DATABASE '{quoted}' AS search")
}

/// Creates the search file of the database at `path` (if missing) in WAL
/// mode, with its tables, before any other connection attaches it.
pub(super) fn prepare(path: &Path) -> Result<(), OpenError> {
    let failed = |error: rusqlite::Error| OpenError::Engine(Box::new(error));
    let conn = Connection::open_in_memory().map_err(failed)?;
    conn.execute_batch(&attach(&search_path(path)))
        .map_err(failed)?;
    conn.query_row("PRAGMA search.journal_mode = WAL", [], |_| Ok(()))
        .map_err(failed)?;
    let created = conn.execute_batch(&format!("{CREATE_INDEX}; {CREATE_APPLIED};"));
    match created {
        // On a full disk a search file made earlier is used as it is (its
        // settings were written when it was made): the server must start
        // and serve reads until space returns.
        Err(error) if fault::is_disk_full(&error) && tables_exist(&conn).unwrap_or(false) => {
            tracing::warn!(%error, "the disk is full: using the search file as it is");
            Ok(())
        }
        other => other.map_err(failed),
    }
}

/// Search switched off (`--search off`), on `conn`, a connection with the
/// search file attached: the index is marked unbuilt, then dropped (its
/// pages zeroed, as every delete is), and the log emptied. Switched on
/// again, the indexer finds no applied id and builds the index from the
/// messages as they then are.
pub(super) fn switch_off(conn: &Connection) -> rusqlite::Result<()> {
    conn.execute_batch(
        "DELETE FROM search.search_applied; \
         DELETE FROM search.unindex_backlog; \
         DROP TABLE IF EXISTS search.message_search; \
         DELETE FROM main.search_log",
    )
}

/// Whether the search file already holds its tables.
fn tables_exist(conn: &Connection) -> rusqlite::Result<bool> {
    conn.query_row(
        "SELECT count(*) = 3 FROM search.sqlite_master \
         WHERE name IN ('message_search', 'search_applied', 'unindex_backlog')",
        [],
        |row| row.get(0),
    )
}
