//! A VFS that writes a transaction's WAL frames in a few large writes.
//!
//! SQLite writes each WAL frame with two `pwrite`s, its 24-byte header and
//! then the page, and a frame straddles two pages of the file, so each
//! frame costs the kernel two calls and three page updates. An append of
//! many sessions dirties about ten pages, so about twenty calls: with
//! search off, a fifth of the server's CPU went to them (BENCHMARKS.md).
//!
//! This VFS is the platform's default VFS with one difference: a WAL file
//! opened through it gathers consecutive writes in a buffer and hands them
//! to the default VFS in writes of up to [`MAX_WRITE`] bytes. The buffer
//! is written:
//! - when the header of a **commit frame** arrives (it holds the
//!   database's size in pages; every other frame's holds 0), and again
//!   when its page does. SQLite publishes a transaction's frames in the
//!   WAL index only after writing them, the commit frame last (or, when
//!   the transaction wrote pages over frames it had spilled earlier,
//!   after rewriting the checksums of the frames after those, the commit
//!   frame's header last), so no reader can look for a frame that is not
//!   in the file yet, and the append thread's syncer, which `fdatasync`s
//!   the WAL after `COMMIT` returns, covers every frame of the commit. A
//!   failed write's error (a full disk) is that of SQLite's write of the
//!   header or the page, so the `COMMIT` fails as it did before;
//! - at the latest when SQLite publishes a transaction to readers: it
//!   writes the WAL index's header twice with a barrier between the
//!   copies (`shm_barrier`), and a reader takes the header only when both
//!   agree. This alone makes every published frame readable; the
//!   commit-frame rule above has normally written everything by then
//!   (a test counts that it has), and reports a failed write as the
//!   `COMMIT`'s error, which a barrier cannot;
//! - when it holds [`GATHER_BYTES`] (a transaction larger than that);
//! - before a write that does not follow the buffered bytes;
//! - before anything else touches the file: a read, its size, a truncate,
//!   a sync, a file control, closing it;
//! - when the connection gives up the WAL's write lock, which SQLite does
//!   through the database file (the VFS links each WAL file with its
//!   database file). A transaction larger than the page cache spills
//!   frames before its commit; if it rolls back, those frames (past the
//!   WAL's end, never read) are written then, while the lock is still
//!   held, and never later, when another connection may have committed
//!   frames at the same offsets.
//!
//! Nothing else changes: the same bytes reach the same offsets before the
//! same points, so durability and what readers see are as with the
//! default VFS. Other files (the database, the search file) go through
//! unchanged. Only the connections that write most open through it (the
//! append thread and the search indexer, `connections.rs`), and only with
//! `--sqlite-wal-writes gathered` (the default) and a SQLite release in
//! [`TESTED`] ([`available`]).

use std::ffi::{c_char, c_int, c_void};
use std::ptr;
use std::sync::OnceLock;

use rusqlite::ffi;

use crate::store::WalWrites;

/// The VFS's registered name.
pub(super) const NAME: &str = "sessionstore-gathered-wal";
const NAME_C: &std::ffi::CStr = c"sessionstore-gathered-wal";

/// The most bytes gathered before they are written.
const GATHER_BYTES: usize = 1 << 20;

/// The most bytes handed to the default VFS in one write: the unix VFS
/// writes at most 128 KiB - 1 bytes a call (and reports a disk full for
/// more).
const MAX_WRITE: usize = 124 << 10;

/// The size of a WAL frame's header.
const FRAME_HEADER: usize = 24;

/// The SQLite releases this VFS was tested with (the one sqlx bundles):
/// it relies on the order in which SQLite writes a WAL's frames and
/// publishes them, which no interface promises.
const TESTED: std::ops::Range<i32> = 3_046_000..3_047_000;

/// What `requested` becomes with the linked SQLite: gathered only where
/// that SQLite is one this VFS was tested with (else direct, and a log
/// line says why).
pub(super) fn available(requested: WalWrites) -> WalWrites {
    let linked = rusqlite::version_number();
    if requested == WalWrites::Gathered && !TESTED.contains(&linked) {
        tracing::warn!(
            sqlite = rusqlite::version(),
            "the WAL-gathering VFS was not tested with this SQLite: WAL writes are direct"
        );
        return WalWrites::Direct;
    }
    requested
}

/// Registers the VFS (once per process) and returns its name for
/// `Connection::open_with_flags_and_vfs`.
pub(super) fn vfs() -> rusqlite::Result<&'static str> {
    static REGISTERED: OnceLock<c_int> = OnceLock::new();
    // SAFETY: `register` runs once; see there.
    let rc = *REGISTERED.get_or_init(|| unsafe { register() });
    if rc == ffi::SQLITE_OK {
        Ok(NAME)
    } else {
        Err(rusqlite::Error::SqliteFailure(
            ffi::Error::new(rc),
            Some("cannot register the WAL-gathering VFS".into()),
        ))
    }
}

/// A file opened through this VFS: SQLite's file handle (its methods are
/// [`METHODS`]), the default VFS's handle, which lives in the same
/// allocation right after this struct, and, for a WAL file, what is
/// gathered.
#[repr(C)]
struct WalFile {
    file: ffi::sqlite3_file,
    inner: *mut ffi::sqlite3_file,
    /// A WAL file: its writes are gathered. Any other file's go on as
    /// they come.
    is_wal: bool,
    /// A WAL file's database file, and a database file's WAL file, while
    /// both are open through this VFS (null otherwise). When a write
    /// transaction ends, SQLite unlocks the WAL's write lock through the
    /// database file; what its WAL file still holds then (frames of a
    /// transaction that spilled pages and rolled back) is written before
    /// the lock is given up, never later over another writer's frames.
    partner: *mut WalFile,
    gathered: Gathered,
}

/// Where the default VFS's file handle starts in SQLite's allocation.
const INNER_OFFSET: usize = size_of::<WalFile>().next_multiple_of(16);

/// Writes not yet handed on: `bytes` belong at `start` in the file.
#[derive(Default)]
struct Gathered {
    start: i64,
    bytes: Vec<u8>,
    /// The last write was a commit frame's header: its page comes next.
    commit_page_next: bool,
}

impl Gathered {
    /// Where the gathered bytes end in the file.
    fn end(&self) -> i64 {
        // A buffer is at most GATHER_BYTES and a page past it.
        self.start + self.bytes.len() as i64
    }
}

/// Registers a copy of the default VFS whose `xOpen` is [`open`], with the
/// default VFS in `pAppData` and room for a [`WalFile`] before its file
/// handles.
///
/// # Safety
/// Call once: the registered struct is leaked, as SQLite keeps it for the
/// process's life.
unsafe fn register() -> c_int {
    // SAFETY: sqlite3_vfs_find initializes SQLite and returns the default
    // VFS (or null), which SQLite never frees.
    let base = unsafe { ffi::sqlite3_vfs_find(ptr::null()) };
    // SAFETY: non-null, it points at a registered VFS.
    let Some(base_vfs) = (unsafe { base.as_ref() }) else {
        return ffi::SQLITE_ERROR;
    };
    let Some(size) = usize::try_from(base_vfs.szOsFile)
        .ok()
        .and_then(|inner| inner.checked_add(INNER_OFFSET))
        .and_then(|size| c_int::try_from(size).ok())
    else {
        return ffi::SQLITE_ERROR;
    };
    // The default VFS's other functions are called with this struct: those
    // of the platforms' VFSes read at most `mxPathname` from it (copied),
    // and `xOpen`, which reads `pAppData`, is called with the default VFS.
    let vfs = Box::leak(Box::new(ffi::sqlite3_vfs {
        szOsFile: size,
        pNext: ptr::null_mut(),
        zName: NAME_C.as_ptr(),
        pAppData: base.cast(),
        xOpen: Some(open),
        ..*base_vfs
    }));
    // SAFETY: `vfs` is valid for the process's life.
    unsafe { ffi::sqlite3_vfs_register(vfs, 0) }
}

/// Opens a file through the default VFS, inside a [`WalFile`]; a WAL file
/// is linked with its database file.
unsafe extern "C" fn open(
    vfs: *mut ffi::sqlite3_vfs,
    name: *const c_char,
    file: *mut ffi::sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
) -> c_int {
    // SAFETY: `vfs` is the struct `register` leaked; its `pAppData` is the
    // default VFS.
    let base = unsafe { (*vfs).pAppData.cast::<ffi::sqlite3_vfs>() };
    // SAFETY: as above.
    let Some(base_open) = (unsafe { (*base).xOpen }) else {
        return ffi::SQLITE_ERROR;
    };
    // SAFETY: SQLite allocated `szOsFile` bytes at `file`, 8-aligned: a
    // WalFile, then the default VFS's handle at INNER_OFFSET.
    let inner = unsafe { file.cast::<u8>().add(INNER_OFFSET) }.cast::<ffi::sqlite3_file>();
    // SAFETY: `inner` has room for the default VFS's handle.
    let rc = unsafe {
        (*file).pMethods = ptr::null();
        (*inner).pMethods = ptr::null();
        base_open(base, name, inner, flags, out_flags)
    };
    if rc != ffi::SQLITE_OK {
        // SQLite closes a file that failed to open only if its methods are
        // set: ours stay unset, so close the default VFS's handle here.
        // SAFETY: `inner`'s methods, if set, are the default VFS's.
        unsafe {
            if let Some(close) = (*inner).pMethods.as_ref().and_then(|m| m.xClose) {
                close(inner);
            }
        }
        return rc;
    }
    let is_wal = flags & ffi::SQLITE_OPEN_WAL != 0;
    let database = if is_wal && !name.is_null() {
        // SAFETY: for a WAL file SQLite passes a name from which it finds
        // the database file's handle (null if none).
        unsafe { ffi::sqlite3_database_file_object(name) }.cast::<WalFile>()
    } else {
        ptr::null_mut()
    };
    // SAFETY: the database file, if opened through this VFS (its methods
    // are ours), is a WalFile, open while its WAL is.
    let database = match unsafe { database.as_mut() } {
        Some(database) if ptr::eq(database.file.pMethods, &METHODS) => database,
        _ => ptr::null_mut(),
    };
    // SAFETY: `file` has room for a WalFile, which SQLite never touches but
    // through METHODS; it is dropped in `close`.
    unsafe {
        ptr::write(
            file.cast::<WalFile>(),
            WalFile {
                file: ffi::sqlite3_file { pMethods: &METHODS },
                inner,
                is_wal,
                partner: database,
                gathered: Gathered::default(),
            },
        );
        if let Some(database) = database.as_mut() {
            database.partner = file.cast();
        }
    }
    ffi::SQLITE_OK
}

static METHODS: ffi::sqlite3_io_methods = ffi::sqlite3_io_methods {
    iVersion: 3,
    xClose: Some(close),
    xRead: Some(read),
    xWrite: Some(write),
    xTruncate: Some(truncate),
    xSync: Some(sync),
    xFileSize: Some(file_size),
    xLock: Some(lock),
    xUnlock: Some(unlock),
    xCheckReservedLock: Some(check_reserved_lock),
    xFileControl: Some(file_control),
    xSectorSize: Some(sector_size),
    xDeviceCharacteristics: Some(device_characteristics),
    xShmMap: Some(shm_map),
    xShmLock: Some(shm_lock),
    xShmBarrier: Some(shm_barrier),
    xShmUnmap: Some(shm_unmap),
    xFetch: Some(fetch),
    xUnfetch: Some(unfetch),
};

/// The [`WalFile`] SQLite calls a method of.
///
/// # Safety
/// `file` must be a handle [`open`] filled in as a WalFile, used by one
/// thread at a time (SQLite's contract for a file handle).
unsafe fn wal<'a>(file: *mut ffi::sqlite3_file) -> &'a mut WalFile {
    // SAFETY: see above.
    unsafe { &mut *file.cast::<WalFile>() }
}

/// The default VFS's methods for `wal`'s file.
fn inner_methods(wal: &WalFile) -> &'static ffi::sqlite3_io_methods {
    // SAFETY: `inner` was opened successfully, so its methods are set, to
    // a table the default VFS keeps for the process's life.
    unsafe { &*(*wal.inner).pMethods }
}

/// Writes what is gathered, in as few calls as the default VFS takes.
fn flush(wal: &mut WalFile) -> c_int {
    let Some(write) = inner_methods(wal).xWrite else {
        return ffi::SQLITE_IOERR_WRITE;
    };
    let mut rc = ffi::SQLITE_OK;
    let mut offset = wal.gathered.start;
    for chunk in wal.gathered.bytes.chunks(MAX_WRITE) {
        // A chunk is at most MAX_WRITE bytes.
        let amount = chunk.len() as c_int;
        // SAFETY: `inner` is open; `chunk` holds `amount` bytes.
        rc = unsafe { write(wal.inner, chunk.as_ptr().cast(), amount, offset) };
        if rc != ffi::SQLITE_OK {
            break;
        }
        offset += i64::from(amount);
    }
    // Written or failed, they are not written again: after a failed write
    // SQLite writes the frames anew, if at all. (`commit_page_next` stays:
    // a commit frame's header written here still has its page to come,
    // which must be written at once too.)
    wal.gathered.bytes.clear();
    rc
}

unsafe extern "C" fn write(
    file: *mut ffi::sqlite3_file,
    data: *const c_void,
    amount: c_int,
    offset: i64,
) -> c_int {
    // SAFETY: SQLite calls with its WalFile.
    let wal = unsafe { wal(file) };
    if !wal.is_wal {
        return match inner_methods(wal).xWrite {
            // SAFETY: forwarded as SQLite passed it.
            Some(write) => unsafe { write(wal.inner, data, amount, offset) },
            None => ffi::SQLITE_IOERR_WRITE,
        };
    }
    let Ok(len) = usize::try_from(amount) else {
        return ffi::SQLITE_IOERR_WRITE;
    };
    // SAFETY: SQLite passes `amount` readable bytes at `data`.
    let data = unsafe { std::slice::from_raw_parts(data.cast::<u8>(), len) };
    if !wal.gathered.bytes.is_empty() && offset != wal.gathered.end() {
        counted(Flush::Gap);
        let rc = flush(wal);
        if rc != ffi::SQLITE_OK {
            return rc;
        }
    }
    let gathered = &mut wal.gathered;
    if gathered.bytes.is_empty() {
        gathered.start = offset;
    }
    gathered.bytes.extend_from_slice(data);
    let commit_page = std::mem::take(&mut gathered.commit_page_next);
    // Bytes 4..8 of a frame header: the database's size in pages after a
    // commit, 0 in every other frame.
    let commit_header = len == FRAME_HEADER && data[4..8] != [0; 4];
    if commit_header {
        // Its page, if it comes next, is written at once too. The header
        // is written now: SQLite may also rewrite a commit frame's header
        // alone, as a transaction's last write (new checksums, after it
        // wrote pages over frames it had spilled).
        gathered.commit_page_next = true;
    }
    if commit_header || commit_page {
        counted(Flush::Commit);
        return flush(wal);
    }
    if gathered.bytes.len() >= GATHER_BYTES {
        counted(Flush::Full);
        return flush(wal);
    }
    ffi::SQLITE_OK
}

unsafe extern "C" fn close(file: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY: SQLite calls with its WalFile, and never again after this.
    let wal = unsafe { wal(file) };
    if !wal.gathered.bytes.is_empty() {
        counted(Flush::Touched);
    }
    let flushed = flush(wal);
    // SAFETY: a partner is open (each unlinks the other when it closes)
    // and used by this connection's thread alone.
    if let Some(partner) = unsafe { wal.partner.as_mut() } {
        partner.partner = ptr::null_mut();
    }
    let closed = match inner_methods(wal).xClose {
        // SAFETY: `inner` is open; closed once, here.
        Some(close) => unsafe { close(wal.inner) },
        None => ffi::SQLITE_OK,
    };
    // SAFETY: written in `open`, dropped once, here.
    unsafe { ptr::drop_in_place(&raw mut wal.gathered) };
    if flushed == ffi::SQLITE_OK {
        closed
    } else {
        flushed
    }
}

unsafe extern "C" fn fetch(
    file: *mut ffi::sqlite3_file,
    offset: i64,
    amount: c_int,
    pages: *mut *mut c_void,
) -> c_int {
    // SAFETY: SQLite calls with its WalFile.
    let wal = unsafe { wal(file) };
    if !wal.gathered.bytes.is_empty() {
        counted(Flush::Touched);
    }
    let rc = flush(wal);
    if rc != ffi::SQLITE_OK {
        return rc;
    }
    match inner_methods(wal).xFetch {
        // SAFETY: forwarded as SQLite passed it.
        Some(fetch) => unsafe { fetch(wal.inner, offset, amount, pages) },
        None => {
            // SAFETY: SQLite passes a pointer to store the mapping in.
            unsafe { *pages = ptr::null_mut() };
            ffi::SQLITE_OK
        }
    }
}

/// The methods handed on to the default VFS: those marked `flushed` write
/// what is gathered first (they read or change the file), the others touch
/// no file contents.
macro_rules! forward {
    ($(fn $name:ident($($arg:ident: $ty:ty),*) $($flushed:ident)? = $method:ident or $missing:expr;)*) => {
        $(
            unsafe extern "C" fn $name(file: *mut ffi::sqlite3_file $(, $arg: $ty)*) -> c_int {
                // SAFETY: SQLite calls with its WalFile.
                let wal = unsafe { wal(file) };
                $(
                    if !wal.gathered.bytes.is_empty() {
                        counted(Flush::Touched);
                    }
                    let $flushed = flush(wal);
                    if $flushed != ffi::SQLITE_OK {
                        return $flushed;
                    }
                )?
                match inner_methods(wal).$method {
                    // SAFETY: forwarded as SQLite passed it.
                    Some(method) => unsafe { method(wal.inner $(, $arg)*) },
                    None => $missing,
                }
            }
        )*
    };
}

forward! {
    fn read(data: *mut c_void, amount: c_int, offset: i64) flushed
        = xRead or ffi::SQLITE_IOERR_READ;
    fn truncate(size: i64) flushed = xTruncate or ffi::SQLITE_IOERR_TRUNCATE;
    fn sync(flags: c_int) flushed = xSync or ffi::SQLITE_IOERR_FSYNC;
    fn file_size(size: *mut i64) flushed = xFileSize or ffi::SQLITE_IOERR_FSTAT;
    fn file_control(op: c_int, arg: *mut c_void) flushed = xFileControl or ffi::SQLITE_NOTFOUND;
    fn lock(level: c_int) = xLock or ffi::SQLITE_OK;
    fn unlock(level: c_int) = xUnlock or ffi::SQLITE_OK;
    fn check_reserved_lock(reserved: *mut c_int) = xCheckReservedLock or ffi::SQLITE_OK;
    fn sector_size() = xSectorSize or 4096;
    fn device_characteristics() = xDeviceCharacteristics or 0;
    fn shm_map(page: c_int, page_size: c_int, extend: c_int, mapped: *mut *mut c_void)
        = xShmMap or ffi::SQLITE_IOERR_SHMMAP;
    fn shm_unmap(delete: c_int) = xShmUnmap or ffi::SQLITE_OK;
    fn unfetch(offset: i64, page: *mut c_void) = xUnfetch or ffi::SQLITE_OK;
}

/// The WAL's write lock: the first of the WAL index's locks.
const WAL_WRITE_LOCK: c_int = 0;

unsafe extern "C" fn shm_lock(
    file: *mut ffi::sqlite3_file,
    offset: c_int,
    count: c_int,
    flags: c_int,
) -> c_int {
    // SAFETY: SQLite calls with its WalFile.
    let database = unsafe { wal(file) };
    if flags & ffi::SQLITE_SHM_UNLOCK != 0 && offset == WAL_WRITE_LOCK {
        // A write transaction ends (committed: nothing is gathered any
        // more; rolled back: frames past the WAL's end may be). Written
        // while the lock is still held; a failure is of no consequence,
        // as no reader ever looks past the WAL's end.
        // SAFETY: the partner is open, on this connection's thread.
        if let Some(wal) = unsafe { database.partner.as_mut() } {
            if !wal.gathered.bytes.is_empty() {
                counted(Flush::Unlock);
            }
            flush(wal);
        }
    }
    match inner_methods(database).xShmLock {
        // SAFETY: forwarded as SQLite passed it.
        Some(lock) => unsafe { lock(database.inner, offset, count, flags) },
        None => ffi::SQLITE_IOERR_SHMLOCK,
    }
}

unsafe extern "C" fn shm_barrier(file: *mut ffi::sqlite3_file) {
    // SAFETY: SQLite calls with its WalFile.
    let database = unsafe { wal(file) };
    // SQLite publishes a transaction to readers by writing the WAL index's
    // header, twice, with a barrier between the copies: a reader takes the
    // header only when both copies agree. What the WAL file still holds is
    // written here, before the second copy, so no reader can ever look for
    // a frame that is not in the file, whatever the shape of the writes
    // that came before. (The commit-frame rule in `write` has normally
    // written everything already, and reports a failed write as the
    // COMMIT's error; a barrier cannot return one.)
    // SAFETY: the partner is open, on this connection's thread.
    if let Some(wal) = unsafe { database.partner.as_mut() }
        && !wal.gathered.bytes.is_empty()
    {
        counted(Flush::Barrier);
        flush(wal);
    }
    if let Some(barrier) = inner_methods(database).xShmBarrier {
        // SAFETY: forwarded as SQLite passed it.
        unsafe { barrier(database.inner) }
    }
}

/// Why gathered bytes were written: counted in test builds, so a test can
/// check that every flush happened by rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(not(test), allow(dead_code))]
enum Flush {
    /// A commit frame's header, or its page.
    Commit,
    /// [`GATHER_BYTES`] gathered.
    Full,
    /// A write that does not follow the gathered bytes.
    Gap,
    /// A read, size, truncate, sync, file control, fetch or close.
    Touched,
    /// The end of a write transaction (the WAL's write lock given up).
    Unlock,
    /// SQLite publishing a transaction with bytes still gathered: never,
    /// if the commit-frame rule holds.
    Barrier,
}

#[cfg(test)]
static FLUSHES: [std::sync::atomic::AtomicU64; 6] =
    [const { std::sync::atomic::AtomicU64::new(0) }; 6];

#[cfg(test)]
fn counted(why: Flush) {
    FLUSHES[why as usize].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

#[cfg(not(test))]
fn counted(_: Flush) {}

#[cfg(test)]
mod tests {
    use rusqlite::{Connection, OpenFlags};

    use super::*;

    fn through_vfs(path: &std::path::Path) -> rusqlite::Result<Connection> {
        let conn = Connection::open_with_flags_and_vfs(
            path,
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE,
            vfs()?,
        )?;
        conn.execute_batch(
            "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL; \
             PRAGMA wal_autocheckpoint = 0; PRAGMA cache_size = 10",
        )?;
        Ok(conn)
    }

    fn rows(conn: &Connection) -> rusqlite::Result<(i64, i64)> {
        conn.query_row(
            "SELECT count(*), coalesce(sum(length(body)), 0) FROM t",
            [],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )
    }

    fn io(error: std::io::Error) -> rusqlite::Error {
        rusqlite::Error::ToSqlConversionFailure(error.into())
    }

    /// What a fresh connection recovers from copies of the database file
    /// and its WAL alone (as after a `kill -9`: without the WAL index,
    /// checking every frame's checksum), and whether the copy is intact.
    fn recovered(dir: &std::path::Path, step: usize) -> rusqlite::Result<((i64, i64), String)> {
        let copy = dir.join(format!("copy-{step}.sqlite"));
        std::fs::copy(dir.join("db.sqlite"), &copy).map_err(io)?;
        std::fs::copy(
            dir.join("db.sqlite-wal"),
            dir.join(format!("copy-{step}.sqlite-wal")),
        )
        .map_err(io)?;
        let conn = Connection::open(&copy)?;
        let check = conn.query_row("PRAGMA integrity_check", [], |row| row.get(0))?;
        Ok((rows(&conn)?, check))
    }

    #[test]
    fn what_a_commit_wrote_is_in_the_wal_file_when_it_returns() -> rusqlite::Result<()> {
        let dir = std::env::temp_dir().join(format!("sessionstore-wal-vfs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(io)?;
        let writer = through_vfs(&dir.join("db.sqlite"))?;
        writer.execute_batch("CREATE TABLE t (id INTEGER PRIMARY KEY, body BLOB NOT NULL)")?;
        // A reader through the default VFS, with its own file handles.
        let reader = Connection::open(dir.join("db.sqlite"))?;
        let mut expected = (0, 0);
        let mut step = 0;
        let mut check = |expected: (i64, i64)| -> rusqlite::Result<()> {
            assert_eq!(rows(&reader)?, expected, "read beside the writer");
            step += 1;
            assert_eq!(
                recovered(&dir, step)?,
                (expected, "ok".to_owned()),
                "recovered from the files"
            );
            Ok(())
        };

        // Small commits, one after the other.
        for _ in 0..20 {
            writer.execute("INSERT INTO t (body) VALUES (zeroblob(300))", [])?;
            expected = (expected.0 + 1, expected.1 + 300);
            check(expected)?;
        }
        // A transaction larger than what is gathered at once, and than the
        // page cache: SQLite spills frames before the commit, reads some
        // back, writes pages it spilled again over their frames, and then
        // rewrites the checksums of the frames after them, the commit
        // frame's header last.
        writer.execute_batch(
            "BEGIN; \
             WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 2000) \
             INSERT INTO t (body) SELECT randomblob(1500) FROM n; \
             UPDATE t SET body = zeroblob(1500) WHERE id > 20 AND id % 7 = 0; \
             COMMIT",
        )?;
        expected = (expected.0 + 2000, expected.1 + 2000 * 1500);
        check(expected)?;
        // A rolled-back transaction leaves nothing, and the next commit
        // writes over its frames.
        writer.execute_batch(
            "BEGIN; \
             WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 500) \
             INSERT INTO t (body) SELECT randomblob(2000) FROM n; \
             ROLLBACK",
        )?;
        writer.execute("INSERT INTO t (body) VALUES (zeroblob(10))", [])?;
        expected = (expected.0 + 1, expected.1 + 10);
        check(expected)?;
        // Checkpointed and started over: the WAL is written from its start.
        writer.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
        writer.execute("INSERT INTO t (body) VALUES (zeroblob(20))", [])?;
        expected = (expected.0 + 1, expected.1 + 20);
        check(expected)?;
        drop(writer);
        let _ = std::fs::remove_dir_all(&dir);
        Ok(())
    }

    #[test]
    fn gathered_with_the_sqlite_it_was_tested_with() {
        assert!(TESTED.contains(&rusqlite::version_number()));
        assert_eq!(available(WalWrites::Gathered), WalWrites::Gathered);
        assert_eq!(available(WalWrites::Direct), WalWrites::Direct);
    }

    fn flushes(why: Flush) -> u64 {
        FLUSHES[why as usize].load(std::sync::atomic::Ordering::Relaxed)
    }

    /// A reader thread on its own connection (through this VFS if `ours`)
    /// until `done`: each read sees at least the rows `committed` said
    /// before it began. Returns how many reads it made.
    fn read_beside(
        path: std::path::PathBuf,
        ours: bool,
        committed: std::sync::Arc<std::sync::atomic::AtomicI64>,
        done: std::sync::Arc<std::sync::atomic::AtomicBool>,
    ) -> std::thread::JoinHandle<rusqlite::Result<u64>> {
        use std::sync::atomic::Ordering;
        std::thread::spawn(move || {
            let conn = if ours {
                Connection::open_with_flags_and_vfs(
                    &path,
                    OpenFlags::SQLITE_OPEN_READ_ONLY,
                    vfs()?,
                )?
            } else {
                Connection::open_with_flags(&path, OpenFlags::SQLITE_OPEN_READ_ONLY)?
            };
            conn.busy_timeout(std::time::Duration::from_secs(10))?;
            let mut reads = 0;
            while !done.load(Ordering::Acquire) {
                let floor = committed.load(Ordering::Acquire);
                let (rows, _) = rows(&conn)?;
                assert!(
                    rows >= floor,
                    "a reader saw {rows} rows after a COMMIT of {floor} returned"
                );
                reads += 1;
            }
            Ok(reads)
        })
    }

    /// Readers on other connections (through SQLite's default VFS, as
    /// sqlx's, and through this one, as the search indexer's) see every
    /// transaction the moment its COMMIT returns, while the writer commits
    /// small transactions, ones that spill frames before their commit and
    /// rewrite them, rollbacks and checkpoints; and no flush was left to
    /// the barrier (the commit-frame rule wrote everything first).
    #[test]
    fn readers_on_other_connections_see_each_commit_when_it_returns() -> rusqlite::Result<()> {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

        let dir = std::env::temp_dir().join(format!(
            "sessionstore-wal-vfs-readers-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(io)?;
        let path = dir.join("db.sqlite");
        let writer = through_vfs(&path)?;
        writer.execute_batch("CREATE TABLE t (id INTEGER PRIMARY KEY, body BLOB NOT NULL)")?;
        let commits_before = flushes(Flush::Commit);
        let barrier_before = flushes(Flush::Barrier);
        // Rows committed so far: published after each COMMIT returns.
        let committed = Arc::new(AtomicI64::new(0));
        let done = Arc::new(AtomicBool::new(false));
        let readers: Vec<_> = [false, false, true]
            .into_iter()
            .map(|ours| read_beside(path.clone(), ours, committed.clone(), done.clone()))
            .collect();

        let mut total = 0;
        let mut commits = 0;
        for round in 0..240 {
            match round % 40 {
                // A transaction larger than the page cache (10 pages) and
                // than what is gathered at once: it spills frames, reads
                // some back and writes them again.
                7 => {
                    writer.execute_batch(
                        "BEGIN; \
                         WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 800) \
                         INSERT INTO t (body) SELECT randomblob(1500) FROM n; \
                         UPDATE t SET body = zeroblob(1500) WHERE id % 11 = 0; \
                         COMMIT",
                    )?;
                    total += 800;
                    commits += 1;
                }
                // One that spills and rolls back.
                19 => writer.execute_batch(
                    "BEGIN; \
                     WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 300) \
                     INSERT INTO t (body) SELECT randomblob(1000) FROM n; \
                     ROLLBACK",
                )?,
                // A checkpoint while the readers read.
                29 => writer.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()))?,
                _ => {
                    writer.execute("INSERT INTO t (body) VALUES (randomblob(300))", [])?;
                    total += 1;
                    commits += 1;
                }
            }
            committed.store(total, Ordering::Release);
        }
        done.store(true, Ordering::Release);
        for reader in readers {
            let Ok(reads) = reader.join() else {
                panic!("a reader panicked");
            };
            let reads = reads?;
            assert!(reads > 0, "a reader never read");
        }
        assert_eq!(rows(&writer)?.0, total);
        assert!(
            flushes(Flush::Commit) - commits_before >= commits,
            "every commit's frames were written by the commit-frame rule"
        );
        assert_eq!(
            flushes(Flush::Barrier),
            barrier_before,
            "a transaction was published with frames still gathered"
        );
        drop(writer);
        let _ = std::fs::remove_dir_all(&dir);
        Ok(())
    }

    #[test]
    fn frames_of_a_rolled_back_transaction_never_land_on_later_commits() -> rusqlite::Result<()> {
        let dir =
            std::env::temp_dir().join(format!("sessionstore-wal-vfs-undo-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(io)?;
        let ours = through_vfs(&dir.join("db.sqlite"))?;
        ours.execute_batch("CREATE TABLE t (id INTEGER PRIMARY KEY, body BLOB NOT NULL)")?;
        // Another writer through the default VFS (as sqlx's connections).
        let other = Connection::open(dir.join("db.sqlite"))?;
        other.execute_batch("PRAGMA busy_timeout = 5000")?;
        let mut expected = (0, 0);
        for round in 0..5 {
            // All of the WAL copied back: the rollback below then reads
            // nothing from the WAL (it rereads page 1 from the database).
            ours.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
            // A transaction that spills frames (beyond the small cache),
            // some of them still gathered when it rolls back.
            ours.execute_batch(&format!(
                "BEGIN; \
                 WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < {}) \
                 INSERT INTO t (body) SELECT randomblob(1000) FROM n; \
                 ROLLBACK",
                300 + 97 * round
            ))?;
            // The other writer commits where those frames were...
            other.execute("INSERT INTO t (body) VALUES (zeroblob(700))", [])?;
            expected = (expected.0 + 1, expected.1 + 700);
            // ...and ours commits after it.
            ours.execute("INSERT INTO t (body) VALUES (zeroblob(50))", [])?;
            expected = (expected.0 + 1, expected.1 + 50);
            assert_eq!(rows(&other)?, expected, "read beside the writers");
            let check: String = other.query_row("PRAGMA integrity_check", [], |row| row.get(0))?;
            assert_eq!(check, "ok");
            assert_eq!(
                recovered(&dir, round)?,
                (expected, "ok".to_owned()),
                "recovered"
            );
        }
        drop(ours);
        let _ = std::fs::remove_dir_all(&dir);
        Ok(())
    }
}
