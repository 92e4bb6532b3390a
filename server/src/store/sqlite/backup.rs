//! `sessionstore backup` and `sessionstore restore` for a SQLite file.
//!
//! **Backup** is `VACUUM INTO` on a connection of its own: one read
//! transaction, so the copy is the database as of one commit, WAL included
//! (a reader sees the WAL's committed frames), taken beside a running
//! server, whose writes go on meanwhile (WAL lets a reader and the writer
//! run side by side). The copy is written to a temporary file beside the
//! target, switched to a rollback journal (one self-contained file), synced
//! and renamed into place. Free pages are not copied, so nothing erased is
//! in it either. The search file is not copied: it is derived from the
//! messages, and the server rebuilds a missing one at start.
//!
//! **Restore** checks the file (`integrity_check`, sessionstore's tables),
//! takes SQLite's exclusive lock on the target database (`locking_mode =
//! EXCLUSIVE`): every connection of a serving process holds a shared lock
//! on the file for as long as it is open (WAL mode keeps it between
//! transactions), so the lock is refused while a server uses it. Holding
//! it, the source is copied (again with `VACUUM INTO`) beside the target;
//! then the lock connection closes (checkpointing and removing the old
//! database's WAL, so the old file is whole up to the rename), the
//! target's leftover `-wal`, `-shm`, `-journal` and search files are
//! removed (an old WAL replayed onto the new file would corrupt it), and
//! the copy is renamed over the target.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::{Connection, ErrorCode};

use super::connections::{self, is_in_memory};
use super::search_file::search_path;

/// How long a backup waits for a lock the server holds for a moment.
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// The tables that make a SQLite file a sessionstore database.
const TABLES: [&str; 3] = ["sessions", "messages", "search_log"];

/// Why a backup or a restore did nothing.
#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    #[error(
        "`sessionstore {0}` works on SQLite files only: for PostgreSQL use `pg_dump -Fc` and \
         `pg_restore` (README, \"Backups\")"
    )]
    Postgres(&'static str),
    #[error("{0:?} is not a SQLite database file (sqlite://PATH)")]
    NotAFile(String),
    #[error("no database at {}", .0.display())]
    Missing(PathBuf),
    #[error("{} exists: give --force to replace it", .0.display())]
    Exists(PathBuf),
    #[error("{} is a server's database in use: stop the server first; nothing was changed", .0.display())]
    InUse(PathBuf),
    #[error("{} is not a sessionstore SQLite database: {reason}", path.display())]
    NotSessionstore { path: PathBuf, reason: String },
    #[error("{} and {} are the same file", .0.display(), .1.display())]
    SameFile(PathBuf, PathBuf),
    #[error("{context}: {source}")]
    Sqlite {
        context: String,
        #[source]
        source: rusqlite::Error,
    },
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
}

/// What a backup or a restore wrote.
#[derive(Debug)]
pub struct Written {
    /// The database file written.
    pub path: PathBuf,
    pub bytes: u64,
    pub sessions: i64,
    pub messages: i64,
    /// The target's files a restore removed (`-wal`, `-search`, …).
    pub removed: Vec<PathBuf>,
}

fn sqlite(context: impl Into<String>) -> impl FnOnce(rusqlite::Error) -> BackupError {
    let context = context.into();
    move |source| BackupError::Sqlite { context, source }
}

fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> BackupError {
    let context = context.into();
    move |source| BackupError::Io { context, source }
}

/// The database file a `sqlite://` URL names.
fn database_file(url: &str, postgres_command: &'static str) -> Result<PathBuf, BackupError> {
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        return Err(BackupError::Postgres(postgres_command));
    }
    if !url.starts_with("sqlite:") || is_in_memory(url) {
        return Err(BackupError::NotAFile(url.to_owned()));
    }
    connections::file_path(url).map_err(|_| BackupError::NotAFile(url.to_owned()))
}

/// A file's name with `suffix` appended (`db` → `db-wal`).
fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

/// A temporary file beside `path`, in the same directory (so a rename
/// moves it into place).
fn temporary_beside(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!(".{name}.partial-{}", std::process::id()))
}

/// Copies the database at `url` (a server may be serving it) to `to`:
/// refuses an existing `to` unless `force`.
pub fn backup(url: &str, to: &Path, force: bool) -> Result<Written, BackupError> {
    let source = database_file(url, "backup")?;
    if !source.exists() {
        return Err(BackupError::Missing(source));
    }
    if to.exists() && !force {
        return Err(BackupError::Exists(to.to_owned()));
    }
    if same_file(&source, to) {
        return Err(BackupError::SameFile(source, to.to_owned()));
    }
    let conn = connections::plain(&source, false)
        .map_err(sqlite(format!("cannot open {}", source.display())))?;
    conn.busy_timeout(BUSY_TIMEOUT)
        .map_err(sqlite("cannot set a busy timeout"))?;
    has_tables(&conn, &source)?;
    let written = copy_into(&conn, &source, to)?;
    drop(conn);
    Ok(written)
}

/// Replaces the database at `url` (no server may be using it) with the
/// backup `from`.
pub fn restore(from: &Path, url: &str) -> Result<Written, BackupError> {
    let target = database_file(url, "restore")?;
    if !from.exists() {
        return Err(BackupError::Missing(from.to_owned()));
    }
    if same_file(from, &target) {
        return Err(BackupError::SameFile(from.to_owned(), target));
    }
    let source = connections::plain(from, true)
        .map_err(sqlite(format!("cannot open {}", from.display())))?;
    check_whole(&source, from)?;
    let lock = if target.exists() {
        Some(lock_exclusively(&target)?)
    } else {
        if let Some(dir) = target.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(io(format!("cannot create {}", dir.display())))?;
        }
        None
    };
    let temporary = temporary_beside(&target);
    let copied = match copy_file(&source, from, &temporary) {
        Ok(copied) => copied,
        Err(error) => {
            let _ = std::fs::remove_file(&temporary);
            return Err(error);
        }
    };
    drop(source);
    // Closing checkpoints the old file's WAL into it and removes the WAL:
    // the old database stays whole until the rename replaces it.
    drop(lock);
    let mut removed = Vec::new();
    let leftovers = ["-wal", "-shm", "-journal"]
        .map(|suffix| with_suffix(&target, suffix))
        .into_iter()
        .chain(
            ["", "-wal", "-shm", "-journal"]
                .map(|suffix| with_suffix(&search_path(&target), suffix)),
        );
    for path in leftovers {
        match std::fs::remove_file(&path) {
            Ok(()) => removed.push(path),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            Err(error) => {
                let _ = std::fs::remove_file(&temporary);
                return Err(io(format!("cannot remove {}", path.display()))(error));
            }
        }
    }
    std::fs::rename(&temporary, &target).map_err(io(format!(
        "cannot rename {} to {}",
        temporary.display(),
        target.display()
    )))?;
    sync_directory(&target)?;
    Ok(Written {
        path: target,
        removed,
        ..copied
    })
}

/// Whether `a` and `b` name one existing file.
fn same_file(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

/// Fails unless `conn`'s main database has sessionstore's tables.
fn has_tables(conn: &Connection, path: &Path) -> Result<(), BackupError> {
    for table in TABLES {
        let found: bool = conn
            .query_row(
                "SELECT count(*) > 0 FROM main.sqlite_master WHERE type = 'table' AND name = ?1",
                [table],
                |row| row.get(0),
            )
            .map_err(|error| not_sessionstore(path, error))?;
        if !found {
            return Err(BackupError::NotSessionstore {
                path: path.to_owned(),
                reason: format!("it has no table {table}"),
            });
        }
    }
    Ok(())
}

fn not_sessionstore(path: &Path, error: rusqlite::Error) -> BackupError {
    match error.sqlite_error_code() {
        Some(ErrorCode::NotADatabase) => BackupError::NotSessionstore {
            path: path.to_owned(),
            reason: "not a SQLite database".to_owned(),
        },
        _ => sqlite(format!("cannot read {}", path.display()))(error),
    }
}

/// Fails unless the database is whole (`PRAGMA integrity_check`) and has
/// sessionstore's tables.
fn check_whole(conn: &Connection, path: &Path) -> Result<(), BackupError> {
    let mut statement = conn
        .prepare("PRAGMA integrity_check")
        .map_err(|error| not_sessionstore(path, error))?;
    let problems = statement
        .query_map([], |row| row.get::<_, String>(0))
        .and_then(|rows| rows.collect::<rusqlite::Result<Vec<String>>>())
        .map_err(|error| not_sessionstore(path, error))?;
    if problems != ["ok"] {
        return Err(BackupError::NotSessionstore {
            path: path.to_owned(),
            reason: format!(
                "integrity_check: {}",
                problems.into_iter().take(3).collect::<Vec<_>>().join("; ")
            ),
        });
    }
    has_tables(conn, path)
}

/// A connection holding SQLite's exclusive lock on the database file
/// `path`, or [`BackupError::InUse`] when another connection (a server's)
/// has it open.
fn lock_exclusively(path: &Path) -> Result<Connection, BackupError> {
    let conn = connections::plain(path, false)
        .map_err(sqlite(format!("cannot open {}", path.display())))?;
    conn.busy_timeout(Duration::ZERO)
        .map_err(sqlite("cannot set a busy timeout"))?;
    // In WAL mode the first read takes the exclusive lock (the WAL index
    // then lives in this process's memory); in rollback mode `BEGIN
    // EXCLUSIVE` does, and `locking_mode = EXCLUSIVE` keeps it after.
    let locked = conn
        .query_row("PRAGMA locking_mode = EXCLUSIVE", [], |_| Ok(()))
        .and_then(|()| conn.execute_batch("BEGIN EXCLUSIVE; COMMIT"));
    match locked {
        Ok(()) => Ok(conn),
        Err(error)
            if matches!(
                error.sqlite_error_code(),
                Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked)
            ) =>
        {
            Err(BackupError::InUse(path.to_owned()))
        }
        Err(error) => Err(not_sessionstore(path, error)),
    }
}

/// `VACUUM INTO` a temporary file beside `to`, then renamed to it.
fn copy_into(conn: &Connection, source: &Path, to: &Path) -> Result<Written, BackupError> {
    let temporary = temporary_beside(to);
    let copied = copy_file(conn, source, &temporary).and_then(|copied| {
        std::fs::rename(&temporary, to).map_err(io(format!(
            "cannot rename {} to {}",
            temporary.display(),
            to.display()
        )))?;
        sync_directory(to)?;
        Ok(Written {
            path: to.to_owned(),
            ..copied
        })
    });
    if copied.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
    copied
}

/// `VACUUM INTO file` (absent before) on `conn`: one self-contained file
/// (rollback journal), synced, counted.
fn copy_file(conn: &Connection, source: &Path, file: &Path) -> Result<Written, BackupError> {
    match std::fs::remove_file(file) {
        Ok(()) => {}
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => return Err(io(format!("cannot remove {}", file.display()))(error)),
    }
    conn.execute("VACUUM INTO ?1", [file.to_string_lossy()])
        .map_err(sqlite(format!(
            "cannot copy {} to {}",
            source.display(),
            file.display()
        )))?;
    let copy = connections::plain(file, false)
        .map_err(sqlite(format!("cannot open {}", file.display())))?;
    let count = |table: &str| -> Result<i64, BackupError> {
        copy.query_row(&format!("SELECT count(*) FROM {table}"), [], |row| {
            row.get(0)
        })
        .map_err(sqlite(format!(
            "cannot count the {table} of {}",
            file.display()
        )))
    };
    copy.query_row("PRAGMA journal_mode = DELETE", [], |_| Ok(()))
        .map_err(sqlite(format!(
            "cannot set {}'s journal mode",
            file.display()
        )))?;
    let sessions = count("sessions")?;
    let messages = count("messages")?;
    copy.close()
        .map_err(|(_, error)| sqlite(format!("cannot close {}", file.display()))(error))?;
    let written =
        std::fs::File::open(file).map_err(io(format!("cannot open {}", file.display())))?;
    written
        .sync_all()
        .map_err(io(format!("cannot sync {}", file.display())))?;
    let bytes = written
        .metadata()
        .map_err(io(format!("cannot read {}'s size", file.display())))?
        .len();
    Ok(Written {
        path: file.to_owned(),
        bytes,
        sessions,
        messages,
        removed: Vec::new(),
    })
}

/// Syncs the directory holding `path`, so a rename into it is durable.
fn sync_directory(path: &Path) -> Result<(), BackupError> {
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    #[cfg(unix)]
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io(format!("cannot sync {}", dir.display())))?;
    #[cfg(not(unix))]
    let _ = dir;
    Ok(())
}
