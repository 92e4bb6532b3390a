//! A FUSE filesystem, served from inside the test binary, that loses what
//! was not synced when the test cuts the power.
//!
//! It passes through to a backing directory, which plays the disk. What it
//! keeps there is only what was synced:
//!
//! - **File data.** A write goes into an in-memory overlay of the file, in
//!   [`SECTOR`]-byte sectors; reads see the overlay over the backing file.
//!   `fsync` or `fdatasync` of any handle of the file (the two are the same
//!   here) writes the file's whole overlay to the backing file: from then on
//!   it is durable. Closing a file syncs nothing.
//! - **File size.** A truncate or an extension changes the overlay's size,
//!   which becomes durable with the next sync, as the data does. Bytes cut
//!   off by an unsynced truncate read as zeros if the file grows again.
//! - **Directory operations** (create, unlink, rename, mkdir, rmdir) and
//!   permission changes go straight to the backing directory: they are
//!   durable at once, as if the filesystem journalled its metadata
//!   synchronously. (`fsync` of a directory is accepted and does nothing.)
//!
//! [`Disk::cut`] is the power cut (or [`Disk::arm`], for one that comes by
//! itself at a given write, size change or sync): from then on every
//! request fails `EIO` (the mount is dead, to be unmounted), and what was
//! not synced is lost, in one of two ways ([`Cut`]):
//!
//! - [`Cut::LoseAll`]: every overlay is dropped; the disk holds exactly what
//!   was synced.
//! - [`Cut::Torn`]: each file's unsynced size change reaches the disk or not
//!   (one coin a file, its size being one piece of metadata), then each of
//!   its dirty sectors, independently, reaches the disk whole, is lost, or
//!   is **torn**: part of it (a prefix or a suffix, cut at any byte) has the
//!   new bytes and the rest the old; a sector past the size the file ends
//!   up with is lost. Bytes a write did not touch keep their old value
//!   (SQLite's "powersafe overwrite" holds), unless an unsynced truncate
//!   cut them off before the file grew over them again: those may read as
//!   zeros.
//!
//! The kernel's page cache lives in the mount: a fresh mount over the same
//! backing directory starts cold, reading only what survived. Shared
//! writable `mmap` (SQLite's `-shm` file) works: no handle is opened with
//! `direct_io`, so the kernel pages the mapping through the page cache and
//! writes its dirty pages back as ordinary writes, into the overlay like any
//! other (the `-shm` file needs no durability: SQLite rebuilds it after a
//! crash). POSIX locks are the kernel's own (the filesystem does not ask to
//! handle them), which is right for processes on one machine.

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsStr;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt as _, MetadataExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use fuser::{
    FileAttr, FileType, Filesystem, MountOption, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory,
    ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow,
};

use tokio::sync::oneshot;

use super::Rng;

/// The overlay's unit: a disk sector.
pub const SECTOR: u64 = 512;

/// How long the kernel may cache attributes and names. Every change goes
/// through the kernel, so its caches stay right; a new mount starts cold.
const TTL: Duration = Duration::from_secs(1);

const ROOT: u64 = fuser::FUSE_ROOT_ID;

/// How a power cut treats what was not synced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cut {
    /// All of it is lost.
    LoseAll,
    /// A random part of it reaches the disk, with torn sectors.
    Torn,
}

/// What a power cut did.
#[derive(Clone, Debug, Default)]
pub struct CutReport {
    /// Files with unsynced changes: their names (in the mount's root, or
    /// their inode number), and how many sectors of each.
    pub files: Vec<(String, usize)>,
    /// Unsynced sectors: written whole, lost, torn.
    pub written: usize,
    pub lost: usize,
    pub torn: usize,
    /// Files whose unsynced size reached the disk / was lost.
    pub sizes_kept: usize,
    pub sizes_lost: usize,
}

/// The test's handle on a mounted filesystem's state: what it synced, and
/// the power switch.
#[derive(Clone)]
pub struct Disk {
    state: Arc<Mutex<State>>,
}

impl Disk {
    /// Cuts the power: what was not synced is lost (`Cut`), and every
    /// request from now on fails `EIO`.
    pub fn cut(&self, how: Cut, rng: &mut Rng) -> std::io::Result<CutReport> {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .cut(how, rng)
    }

    /// Arms a power cut that happens by itself, instead of the `changes`-th
    /// change (a write, a size change or a sync) from now: that one and
    /// everything after it fail `EIO`, wherever the writer is (between a
    /// transaction's writes, between its last write and its sync, in a
    /// checkpoint…). The receiver gets what the cut did.
    pub fn arm(
        &self,
        changes: u64,
        how: Cut,
        rng: Rng,
    ) -> oneshot::Receiver<std::io::Result<CutReport>> {
        let (done, report) = oneshot::channel();
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .trip = Some(Trip {
            changes: changes.max(1),
            how,
            rng,
            done,
        });
        report
    }

    /// Whether the power has been cut.
    pub fn is_cut(&self) -> bool {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .dead
    }

    /// How many syncs the filesystem has made durable so far.
    pub fn syncs(&self) -> u64 {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .syncs
    }
}

/// A mounted [`PowerLossFs`]; unmounted on drop.
pub struct Mount {
    /// `None` once unmounted.
    session: Option<fuser::BackgroundSession>,
    pub disk: Disk,
    mountpoint: PathBuf,
}

impl Mount {
    /// Mounts a filesystem over `backing` at `mountpoint`, an empty
    /// directory, new for each mount: with `auto_unmount`, a `fusermount3`
    /// waits for as long as the mount lives, to unmount it should this
    /// process die first, and it might take a later mount at the same path
    /// for its own.
    pub fn new(backing: &Path, mountpoint: &Path) -> std::io::Result<Mount> {
        let state = Arc::new(Mutex::new(State::new(backing.to_owned())));
        let fs = PowerLossFs {
            state: Arc::clone(&state),
        };
        let session = fuser::spawn_mount2(
            fs,
            mountpoint,
            &[
                MountOption::FSName("sessionstore-power-loss".into()),
                MountOption::AutoUnmount,
                MountOption::AllowRoot,
                MountOption::NoAtime,
            ],
        )?;
        Ok(Mount {
            session: Some(session),
            disk: Disk { state },
            mountpoint: mountpoint.to_owned(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.mountpoint
    }

    /// Unmounts, and waits until the session has ended: at once, unless
    /// something still holds a file of the filesystem.
    pub fn unmount(mut self) -> std::io::Result<()> {
        detach(&self.mountpoint)?;
        if let Some(session) = self.session.take() {
            session
                .guard
                .join()
                .map_err(|_| std::io::Error::other("the FUSE session's thread panicked"))??;
        }
        Ok(())
    }
}

/// Unmounts `mountpoint` lazily: it is gone from the directory tree at once,
/// and the filesystem ends when nothing holds it any more.
fn detach(mountpoint: &Path) -> std::io::Result<()> {
    let output = std::process::Command::new("fusermount3")
        .args(["-u", "-z", "--"])
        .arg(mountpoint)
        .stdin(std::process::Stdio::null())
        .output()?;
    if output.status.success() {
        Ok(())
    } else {
        Err(std::io::Error::other(format!(
            "fusermount3 -u -z {}: {}",
            mountpoint.display(),
            String::from_utf8_lossy(&output.stderr).trim()
        )))
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if let Some(session) = self.session.take() {
            // Not waiting for the session: this may run while a failing
            // test unwinds, with its server still holding files.
            let _ = detach(&self.mountpoint);
            drop(session);
        }
    }
}

/// The filesystem as the FUSE session sees it.
struct PowerLossFs {
    state: Arc<Mutex<State>>,
}

/// A power cut armed to happen by itself ([`Disk::arm`]).
struct Trip {
    /// Changes left before the cut, the one that cuts included.
    changes: u64,
    how: Cut,
    rng: Rng,
    done: oneshot::Sender<std::io::Result<CutReport>>,
}

struct State {
    /// The disk.
    backing: PathBuf,
    /// Inode numbers handed to the kernel, and the paths (relative to
    /// `backing`) they stand for; an unlinked file's number leaves these.
    paths: HashMap<u64, PathBuf>,
    inodes: HashMap<PathBuf, u64>,
    next_inode: u64,
    /// The files opened (or truncated) since the mount, with their overlays.
    files: HashMap<u64, FileState>,
    /// The power was cut: every request fails.
    dead: bool,
    /// A cut armed to happen by itself.
    trip: Option<Trip>,
    syncs: u64,
}

/// A file's backing file and unsynced changes.
struct FileState {
    file: File,
    /// The backing file's length: the durable size.
    durable_len: u64,
    /// The size the file has now.
    len: u64,
    /// Backing bytes at or past this offset are not the file's (an unsynced
    /// truncate cut them off): they read as zeros. At most `len`.
    zero_from: u64,
    /// Unsynced sectors, by index: their whole current content.
    dirty: BTreeMap<u64, Box<[u8]>>,
}

impl FileState {
    fn open(file: File) -> std::io::Result<FileState> {
        let len = file.metadata()?.len();
        Ok(FileState {
            file,
            durable_len: len,
            len,
            zero_from: len,
            dirty: BTreeMap::new(),
        })
    }

    fn is_dirty(&self) -> bool {
        !self.dirty.is_empty() || self.len != self.durable_len || self.zero_from < self.durable_len
    }

    /// The file's bytes at `offset` as if it had no dirty sectors and no
    /// end: backing bytes before `zero_from`, zeros after.
    fn read_clean(&self, offset: u64, out: &mut [u8]) -> std::io::Result<()> {
        out.fill(0);
        let limit = self.zero_from.min(self.durable_len);
        if offset < limit {
            let n = usize::try_from((limit - offset).min(out.len() as u64))
                .expect("a read's length fits usize");
            self.file.read_exact_at(&mut out[..n], offset)?;
        }
        Ok(())
    }

    fn read(&self, offset: u64, size: u64) -> std::io::Result<Vec<u8>> {
        let end = (offset + size).min(self.len);
        if offset >= end {
            return Ok(Vec::new());
        }
        let mut out = vec![0; usize::try_from(end - offset).expect("read fits usize")];
        self.read_clean(offset, &mut out)?;
        for (&index, sector) in self.dirty.range(offset / SECTOR..=(end - 1) / SECTOR) {
            let start = index * SECTOR;
            let from = start.max(offset);
            let to = (start + SECTOR).min(end);
            out[idx(from - offset)..idx(to - offset)]
                .copy_from_slice(&sector[idx(from - start)..idx(to - start)]);
        }
        Ok(out)
    }

    fn write(&mut self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        let end = offset + data.len() as u64;
        if data.is_empty() {
            return Ok(());
        }
        for index in offset / SECTOR..=(end - 1) / SECTOR {
            let start = index * SECTOR;
            if !self.dirty.contains_key(&index) {
                let mut sector = vec![0; idx(SECTOR)].into_boxed_slice();
                self.read_clean(start, &mut sector)?;
                self.dirty.insert(index, sector);
            }
            let sector = self.dirty.get_mut(&index).expect("inserted above");
            let from = start.max(offset);
            let to = (start + SECTOR).min(end);
            sector[idx(from - start)..idx(to - start)]
                .copy_from_slice(&data[idx(from - offset)..idx(to - offset)]);
        }
        self.len = self.len.max(end);
        Ok(())
    }

    fn truncate(&mut self, len: u64) {
        if len < self.len {
            let first_gone = len.div_ceil(SECTOR);
            self.dirty.split_off(&first_gone);
            if !len.is_multiple_of(SECTOR)
                && let Some(sector) = self.dirty.get_mut(&(len / SECTOR))
            {
                sector[idx(len % SECTOR)..].fill(0);
            }
        }
        self.zero_from = self.zero_from.min(len);
        self.len = len;
    }

    /// `fsync`: everything unsynced becomes durable.
    fn sync(&mut self) -> std::io::Result<()> {
        if self.zero_from < self.durable_len {
            self.file.set_len(self.zero_from)?;
        }
        for (&index, sector) in &self.dirty {
            let start = index * SECTOR;
            if start < self.len {
                let n = (self.len - start).min(SECTOR);
                self.file.write_all_at(&sector[..idx(n)], start)?;
            }
        }
        self.file.set_len(self.len)?;
        self.durable_len = self.len;
        self.zero_from = self.len;
        self.dirty.clear();
        Ok(())
    }

    /// A power cut of [`Cut::Torn`]: some of it reaches the disk.
    fn tear(self, rng: &mut Rng, report: &mut CutReport) -> std::io::Result<()> {
        let size_changed = self.len != self.durable_len || self.zero_from < self.durable_len;
        let len = if size_changed && rng.chance(1, 2) {
            report.sizes_kept += 1;
            if self.zero_from < self.durable_len {
                self.file.set_len(self.zero_from)?;
            }
            self.file.set_len(self.len)?;
            self.len
        } else {
            if size_changed {
                report.sizes_lost += 1;
            }
            self.durable_len
        };
        for (&index, sector) in &self.dirty {
            let start = index * SECTOR;
            if start >= len {
                report.lost += 1;
                continue;
            }
            let n = idx((len - start).min(SECTOR));
            match rng.below(20) {
                // Written whole.
                0..9 => {
                    report.written += 1;
                    self.file.write_all_at(&sector[..n], start)?;
                }
                // Lost.
                9..17 => report.lost += 1,
                // Torn: the new bytes on one side of a cut, the old on the other.
                _ => {
                    report.torn += 1;
                    // The backing file is `len` long now: the old bytes are there.
                    let mut torn = vec![0; n];
                    self.file.read_exact_at(&mut torn, start)?;
                    let cut = 1 + idx(rng.below((n as u64 - 1).max(1)));
                    if rng.chance(1, 2) {
                        torn[..cut].copy_from_slice(&sector[..cut]);
                    } else {
                        torn[cut..].copy_from_slice(&sector[cut..n]);
                    }
                    self.file.write_all_at(&torn, start)?;
                }
            }
        }
        Ok(())
    }
}

fn idx(n: u64) -> usize {
    usize::try_from(n).expect("an offset within a sector or a read fits usize")
}

fn errno(error: &std::io::Error) -> i32 {
    error.raw_os_error().unwrap_or(libc::EIO)
}

fn kind_of(metadata: &std::fs::Metadata) -> FileType {
    let kind = metadata.file_type();
    if kind.is_dir() {
        FileType::Directory
    } else if kind.is_symlink() {
        FileType::Symlink
    } else {
        FileType::RegularFile
    }
}

fn time(seconds: i64, nanos: i64) -> SystemTime {
    let nanos = u32::try_from(nanos).unwrap_or(0);
    match u64::try_from(seconds) {
        Ok(s) => SystemTime::UNIX_EPOCH + Duration::new(s, nanos),
        Err(_) => SystemTime::UNIX_EPOCH,
    }
}

impl State {
    fn new(backing: PathBuf) -> State {
        let mut paths = HashMap::new();
        let mut inodes = HashMap::new();
        paths.insert(ROOT, PathBuf::new());
        inodes.insert(PathBuf::new(), ROOT);
        State {
            backing,
            paths,
            inodes,
            next_inode: ROOT + 1,
            files: HashMap::new(),
            dead: false,
            trip: None,
            syncs: 0,
        }
    }

    /// See [`Disk::cut`].
    fn cut(&mut self, how: Cut, rng: &mut Rng) -> std::io::Result<CutReport> {
        self.dead = true;
        let mut report = CutReport::default();
        let mut files: Vec<(u64, FileState)> = self.files.drain().collect();
        // The same seed cuts the same way: not in hash order.
        files.sort_by_key(|(ino, _)| *ino);
        for (ino, file) in files {
            if !file.is_dirty() {
                continue;
            }
            let name = self
                .paths
                .get(&ino)
                .map_or_else(|| format!("inode {ino}"), |path| path.display().to_string());
            report.files.push((name, file.dirty.len()));
            match how {
                Cut::LoseAll => {
                    report.lost += file.dirty.len();
                    if file.len != file.durable_len || file.zero_from < file.durable_len {
                        report.sizes_lost += 1;
                    }
                }
                Cut::Torn => file.tear(rng, &mut report)?,
            }
        }
        Ok(report)
    }

    /// Counts a change towards an armed cut: `EIO` if the power goes now.
    fn change(&mut self) -> Result<(), i32> {
        let Some(trip) = &mut self.trip else {
            return Ok(());
        };
        trip.changes -= 1;
        if trip.changes > 0 {
            return Ok(());
        }
        let Trip {
            how, mut rng, done, ..
        } = self.trip.take().expect("armed");
        let report = self.cut(how, &mut rng);
        // The test may have stopped waiting (it failed): nothing to tell.
        let _ = done.send(report);
        Err(libc::EIO)
    }

    fn relative(&self, ino: u64) -> Result<&PathBuf, i32> {
        self.paths.get(&ino).ok_or(libc::ENOENT)
    }

    fn child(&self, parent: u64, name: &OsStr) -> Result<PathBuf, i32> {
        Ok(self.relative(parent)?.join(name))
    }

    fn inode(&mut self, relative: PathBuf) -> u64 {
        if let Some(&ino) = self.inodes.get(&relative) {
            return ino;
        }
        let ino = self.next_inode;
        self.next_inode += 1;
        self.paths.insert(ino, relative.clone());
        self.inodes.insert(relative, ino);
        ino
    }

    fn forget_path(&mut self, relative: &Path) {
        if let Some(ino) = self.inodes.remove(relative) {
            self.paths.remove(&ino);
        }
    }

    fn attr(&self, ino: u64) -> Result<FileAttr, i32> {
        let (metadata, len) = match self.files.get(&ino) {
            Some(file) => (file.file.metadata().map_err(|e| errno(&e))?, Some(file.len)),
            None => {
                let path = self.backing.join(self.relative(ino)?);
                (
                    std::fs::symlink_metadata(path).map_err(|e| errno(&e))?,
                    None,
                )
            }
        };
        let size = len.unwrap_or(metadata.len());
        Ok(FileAttr {
            ino,
            size,
            blocks: size.div_ceil(512),
            atime: time(metadata.atime(), metadata.atime_nsec()),
            mtime: time(metadata.mtime(), metadata.mtime_nsec()),
            ctime: time(metadata.ctime(), metadata.ctime_nsec()),
            crtime: SystemTime::UNIX_EPOCH,
            kind: kind_of(&metadata),
            perm: u16::try_from(metadata.mode() & 0o7777).expect("permission bits fit u16"),
            nlink: u32::try_from(metadata.nlink()).unwrap_or(1),
            uid: metadata.uid(),
            gid: metadata.gid(),
            rdev: 0,
            blksize: 4096,
            flags: 0,
        })
    }

    /// The open state of a file, opening its backing file on first use.
    fn file(&mut self, ino: u64) -> Result<&mut FileState, i32> {
        if !self.files.contains_key(&ino) {
            let path = self.backing.join(self.relative(ino)?);
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .open(path)
                .map_err(|e| errno(&e))?;
            let state = FileState::open(file).map_err(|e| errno(&e))?;
            self.files.insert(ino, state);
        }
        Ok(self.files.get_mut(&ino).expect("inserted above"))
    }

    fn entry(&mut self, relative: PathBuf) -> Result<(u64, FileAttr), i32> {
        std::fs::symlink_metadata(self.backing.join(&relative)).map_err(|e| errno(&e))?;
        let ino = self.inode(relative);
        Ok((ino, self.attr(ino)?))
    }
}

impl PowerLossFs {
    /// The state, or `EIO` once the power is cut.
    fn live(&self) -> Result<std::sync::MutexGuard<'_, State>, i32> {
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if state.dead {
            Err(libc::EIO)
        } else {
            Ok(state)
        }
    }
}

impl Filesystem for PowerLossFs {
    fn lookup(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEntry) {
        let result = self.live().and_then(|mut state| {
            let relative = state.child(parent, name)?;
            state.entry(relative)
        });
        match result {
            Ok((_, attr)) => reply.entry(&TTL, &attr, 0),
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&mut self, _req: &Request<'_>, ino: u64, _fh: Option<u64>, reply: ReplyAttr) {
        match self.live().and_then(|state| state.attr(ino)) {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<u64>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<u32>,
        reply: ReplyAttr,
    ) {
        let result = self.live().and_then(|mut state| {
            if let Some(mode) = mode {
                let path = state.backing.join(state.relative(ino)?);
                std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode & 0o7777))
                    .map_err(|e| errno(&e))?;
            }
            if let Some(size) = size {
                state.change()?;
                state.file(ino)?.truncate(size);
            }
            state.attr(ino)
        });
        match result {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn mkdir(
        &mut self,
        _req: &Request<'_>,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let result = self.live().and_then(|mut state| {
            let relative = state.child(parent, name)?;
            let path = state.backing.join(&relative);
            std::fs::create_dir(&path).map_err(|e| errno(&e))?;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode & !umask))
                .map_err(|e| errno(&e))?;
            state.entry(relative)
        });
        match result {
            Ok((_, attr)) => reply.entry(&TTL, &attr, 0),
            Err(e) => reply.error(e),
        }
    }

    fn unlink(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEmpty) {
        let result = self.live().and_then(|mut state| {
            let relative = state.child(parent, name)?;
            std::fs::remove_file(state.backing.join(&relative)).map_err(|e| errno(&e))?;
            // An open file keeps its backing file and overlay (by inode).
            state.forget_path(&relative);
            Ok(())
        });
        match result {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn rmdir(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEmpty) {
        let result = self.live().and_then(|mut state| {
            let relative = state.child(parent, name)?;
            std::fs::remove_dir(state.backing.join(&relative)).map_err(|e| errno(&e))?;
            state.forget_path(&relative);
            Ok(())
        });
        match result {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn rename(
        &mut self,
        _req: &Request<'_>,
        parent: u64,
        name: &OsStr,
        newparent: u64,
        newname: &OsStr,
        flags: u32,
        reply: ReplyEmpty,
    ) {
        let result = self.live().and_then(|mut state| {
            if flags != 0 {
                return Err(libc::EINVAL);
            }
            let from = state.child(parent, name)?;
            let to = state.child(newparent, newname)?;
            std::fs::rename(state.backing.join(&from), state.backing.join(&to))
                .map_err(|e| errno(&e))?;
            state.forget_path(&to);
            // The inode (and everything under it, for a directory) moves.
            let moved: Vec<(PathBuf, u64)> = state
                .inodes
                .iter()
                .filter(|(path, _)| path.starts_with(&from))
                .map(|(path, &ino)| (path.clone(), ino))
                .collect();
            for (path, ino) in moved {
                let new = to.join(path.strip_prefix(&from).expect("filtered on the prefix"));
                state.inodes.remove(&path);
                state.inodes.insert(new.clone(), ino);
                state.paths.insert(ino, new);
            }
            Ok(())
        });
        match result {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn open(&mut self, _req: &Request<'_>, ino: u64, _flags: i32, reply: ReplyOpen) {
        let result = self.live().and_then(|mut state| {
            let kind = state.attr(ino)?.kind;
            if kind == FileType::RegularFile {
                state.file(ino)?;
            }
            Ok(())
        });
        match result {
            Ok(()) => reply.opened(0, 0),
            Err(e) => reply.error(e),
        }
    }

    fn create(
        &mut self,
        _req: &Request<'_>,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let result = self.live().and_then(|mut state| {
            let relative = state.child(parent, name)?;
            let mut options = OpenOptions::new();
            options.read(true).write(true).mode(mode & !umask & 0o7777);
            if flags & libc::O_EXCL != 0 {
                options.create_new(true);
            } else {
                options.create(true);
            }
            // The new (empty) file is durable at once: a directory operation.
            let file = options
                .open(state.backing.join(&relative))
                .map_err(|e| errno(&e))?;
            let ino = state.inode(relative);
            if let std::collections::hash_map::Entry::Vacant(entry) = state.files.entry(ino) {
                entry.insert(FileState::open(file).map_err(|e| errno(&e))?);
            }
            if flags & libc::O_TRUNC != 0 {
                state.change()?;
                state.file(ino)?.truncate(0);
            }
            state.attr(ino)
        });
        match result {
            Ok(attr) => reply.created(&TTL, &attr, 0, 0, 0),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        _fh: u64,
        offset: i64,
        size: u32,
        _flags: i32,
        _lock_owner: Option<u64>,
        reply: ReplyData,
    ) {
        let result = self.live().and_then(|mut state| {
            let offset = u64::try_from(offset).map_err(|_| libc::EINVAL)?;
            state
                .file(ino)?
                .read(offset, u64::from(size))
                .map_err(|e| errno(&e))
        });
        match result {
            Ok(data) => reply.data(&data),
            Err(e) => reply.error(e),
        }
    }

    fn write(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        _fh: u64,
        offset: i64,
        data: &[u8],
        _write_flags: u32,
        _flags: i32,
        _lock_owner: Option<u64>,
        reply: ReplyWrite,
    ) {
        let result = self.live().and_then(|mut state| {
            let offset = u64::try_from(offset).map_err(|_| libc::EINVAL)?;
            state.change()?;
            state.file(ino)?.write(offset, data).map_err(|e| errno(&e))
        });
        match result {
            Ok(()) => reply.written(u32::try_from(data.len()).expect("a FUSE write fits u32")),
            Err(e) => reply.error(e),
        }
    }

    fn flush(&mut self, _req: &Request<'_>, _ino: u64, _fh: u64, _owner: u64, reply: ReplyEmpty) {
        // Closing syncs nothing.
        match self.live() {
            Ok(_) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn fsync(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        _fh: u64,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let result = self.live().and_then(|mut state| {
            state.change()?;
            state.file(ino)?.sync().map_err(|e| errno(&e))?;
            state.syncs += 1;
            Ok(())
        });
        match result {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn fsyncdir(
        &mut self,
        _req: &Request<'_>,
        _ino: u64,
        _fh: u64,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        // Directory operations are durable at once.
        match self.live() {
            Ok(_) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn fallocate(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        _fh: u64,
        offset: i64,
        length: i64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let result = self.live().and_then(|mut state| {
            if mode != 0 {
                return Err(libc::EOPNOTSUPP);
            }
            let end = u64::try_from(offset.saturating_add(length)).map_err(|_| libc::EINVAL)?;
            state.change()?;
            let file = state.file(ino)?;
            if end > file.len {
                // Growing: the new bytes are zeros, unsynced like a truncate.
                file.truncate(end);
            }
            Ok(())
        });
        match result {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn readdir(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        _fh: u64,
        offset: i64,
        mut reply: ReplyDirectory,
    ) {
        let result = self.live().and_then(|mut state| {
            let relative = state.relative(ino)?.clone();
            let mut names = Vec::new();
            for entry in std::fs::read_dir(state.backing.join(&relative)).map_err(|e| errno(&e))? {
                let entry = entry.map_err(|e| errno(&e))?;
                let kind = match entry.file_type() {
                    Ok(kind) if kind.is_dir() => FileType::Directory,
                    Ok(kind) if kind.is_symlink() => FileType::Symlink,
                    _ => FileType::RegularFile,
                };
                names.push((entry.file_name(), kind));
            }
            names.sort_by(|a, b| a.0.cmp(&b.0));
            let mut entries = vec![
                (ino, FileType::Directory, OsStr::new(".").to_owned()),
                (ino, FileType::Directory, OsStr::new("..").to_owned()),
            ];
            for (name, kind) in names {
                let child = state.inode(relative.join(&name));
                entries.push((child, kind, name));
            }
            Ok(entries)
        });
        match result {
            Ok(entries) => {
                let skip = usize::try_from(offset).unwrap_or(0);
                for (i, (ino, kind, name)) in entries.into_iter().enumerate().skip(skip) {
                    let next = i64::try_from(i + 1).expect("a directory's size fits i64");
                    if reply.add(ino, next, kind, name) {
                        break;
                    }
                }
                reply.ok();
            }
            Err(e) => reply.error(e),
        }
    }

    fn statfs(&mut self, _req: &Request<'_>, _ino: u64, reply: ReplyStatfs) {
        reply.statfs(1 << 24, 1 << 23, 1 << 23, 1 << 20, 1 << 19, 4096, 255, 4096);
    }

    fn access(&mut self, _req: &Request<'_>, _ino: u64, _mask: i32, reply: ReplyEmpty) {
        match self.live() {
            Ok(_) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }
}
