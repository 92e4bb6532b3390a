//! PostgreSQL servers a test makes and throws away itself: a primary, its
//! synchronous standby (`pg_basebackup -R`), promotion and rebuilding, for
//! the failover tests. Each node is a server of its own on a free port of
//! 127.0.0.1, its data and sockets in one fresh temporary directory; the
//! shared server the other tests use (`postgres_admin_url`) is never
//! touched. As root, the PostgreSQL programs run as the `postgres` OS user
//! (they refuse to run as root) in a temporary directory handed to it.
//!
//! `fsync = off`: these tests kill server processes (`pg_ctl -m immediate
//! stop`), never the machine, and a killed process loses nothing the
//! kernel already has; durability across an OS crash is not what they test.
//!
//! `sessionstore-bench` includes this file too (`bench/src/failover.rs`),
//! so it uses nothing of the tests' support but its own.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use sqlx::Connection as _;

/// How long a PostgreSQL command (initdb, start, promote, a base backup)
/// may take before the test gives up on it.
const PG_COMMAND: Duration = Duration::from_secs(120);

/// How long a standby may take to stream, or to catch up with, its primary.
const REPLICATION: Duration = Duration::from_secs(60);

/// The temporary directory the nodes of one test share, and how to run
/// PostgreSQL's programs there.
struct Place {
    dir: tempfile::TempDir,
    bin: PathBuf,
    as_postgres: bool,
    next_node: std::sync::atomic::AtomicUsize,
}

impl Place {
    fn new() -> Place {
        let bin = newest_bin_dir();
        let as_postgres = running_as_root();
        let dir = tempfile::Builder::new()
            .prefix("sessionstore-pg-")
            .tempdir()
            .expect("temporary directory for PostgreSQL");
        if as_postgres {
            // Only this fresh directory is handed over; nothing else changes owner.
            let status = std::process::Command::new("chown")
                .args(["postgres:postgres"])
                .arg(dir.path())
                .status()
                .expect("run chown");
            assert!(status.success(), "chown postgres {}", dir.path().display());
        }
        Place {
            dir,
            bin,
            as_postgres,
            next_node: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// A PostgreSQL program, as the `postgres` OS user when this runs as root.
    fn command(&self, program: &str) -> tokio::process::Command {
        tokio::process::Command::from(self.std_command(program))
    }

    fn std_command(&self, program: &str) -> std::process::Command {
        let program = self.bin.join(program);
        let mut command = if self.as_postgres {
            let mut command = std::process::Command::new("runuser");
            command.args(["-u", "postgres", "--"]).arg(program);
            command
        } else {
            std::process::Command::new(program)
        };
        // The test's own directory may not be readable by `postgres`.
        command
            .current_dir(self.path())
            .env_remove("PGDATA")
            .env_remove("PGHOST")
            .env_remove("PGPORT")
            .stdin(std::process::Stdio::null());
        command
    }

    /// Runs a PostgreSQL program to its end; panics with its output if it fails.
    async fn run(&self, program: &str, args: &[&str]) -> String {
        let mut command = self.command(program);
        command.args(args).kill_on_drop(true);
        let output = tokio::time::timeout(PG_COMMAND, command.output())
            .await
            .unwrap_or_else(|_| panic!("{program} {args:?}: not done within {PG_COMMAND:?}"))
            .unwrap_or_else(|error| panic!("run {program}: {error}"));
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            output.status.success(),
            "{program} {args:?} failed ({}):\n{stdout}\n{stderr}",
            output.status
        );
        stdout
    }
}

/// The newest installed PostgreSQL's programs: `/usr/lib/postgresql/N/bin`.
fn newest_bin_dir() -> PathBuf {
    let root = Path::new("/usr/lib/postgresql");
    let newest = std::fs::read_dir(root)
        .unwrap_or_else(|error| {
            panic!(
                "no PostgreSQL server programs under {} ({error}); install PostgreSQL \
                 (`.ci/postgres.sh` does)",
                root.display()
            )
        })
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let version: u32 = entry.file_name().to_str()?.parse().ok()?;
            let bin = entry.path().join("bin");
            bin.join("pg_basebackup").exists().then_some((version, bin))
        })
        .max();
    newest
        .unwrap_or_else(|| panic!("no {}/*/bin with pg_basebackup", root.display()))
        .1
}

fn running_as_root() -> bool {
    use std::os::unix::fs::MetadataExt as _;
    // `/proc/self` belongs to the process's effective user.
    std::fs::metadata("/proc/self").is_ok_and(|meta| meta.uid() == 0)
}

/// A port on 127.0.0.1 nothing listens on right now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port()
}

/// One PostgreSQL server of a test: a primary or a standby. Dropping it
/// stops the server (immediately); the last node of a test to go removes
/// the temporary directory.
pub struct Cluster {
    place: Arc<Place>,
    name: String,
    pub port: u16,
    data: PathBuf,
    running: bool,
}

impl Cluster {
    /// A new primary (`initdb`), started, with no standby yet.
    pub async fn init_primary() -> Cluster {
        let place = Arc::new(
            tokio::task::spawn_blocking(Place::new)
                .await
                .expect("place"),
        );
        let mut node = Cluster::new_node(place);
        let data = node.data.to_str().expect("UTF-8 path").to_owned();
        node.place
            .run(
                "initdb",
                &[
                    "-D",
                    &data,
                    "-U",
                    "postgres",
                    "--auth=trust",
                    "-E",
                    "UTF8",
                    "--no-locale",
                    "--no-sync",
                ],
            )
            .await;
        let socket_dir = node.place.path().to_str().expect("UTF-8 path").to_owned();
        // Settings every node shares (pg_basebackup copies this file);
        // per-node ones (port, synchronous standbys) are in `node.conf`.
        let shared = format!(
            "\n# sessionstore tests\n\
             listen_addresses = '127.0.0.1'\n\
             unix_socket_directories = '{socket_dir}'\n\
             max_connections = 200\n\
             wal_level = replica\n\
             max_wal_senders = 10\n\
             wal_keep_size = '1GB'\n\
             hot_standby = on\n\
             synchronous_commit = on\n\
             fsync = off\n\
             log_line_prefix = '%m [%p] '\n\
             include_if_exists = 'node.conf'\n"
        );
        append(&node.data.join("postgresql.conf"), &shared);
        std::fs::write(
            node.data.join("pg_hba.conf"),
            "local all all trust\n\
             host all all 127.0.0.1/32 trust\n\
             local replication all trust\n\
             host replication all 127.0.0.1/32 trust\n",
        )
        .expect("write pg_hba.conf");
        node.write_node_conf("");
        node.start().await;
        node
    }

    fn new_node(place: Arc<Place>) -> Cluster {
        let index = place
            .next_node
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = format!("node{index}");
        let data = place.path().join(&name);
        Cluster {
            place,
            name,
            port: free_port(),
            data,
            running: false,
        }
    }

    /// A new standby of this primary (`pg_basebackup -R -X stream`) on a
    /// port of its own, started and streaming. It is asynchronous until
    /// the primary asks for it: [`Cluster::require_synchronous_standby`].
    pub async fn standby(&self) -> Cluster {
        let mut node = Cluster::new_node(self.place.clone());
        node.base_backup_of(self).await;
        node
    }

    /// Takes a fresh base backup of `primary` into this (stopped) node's
    /// data directory, keeping its port, and starts it as `primary`'s
    /// standby. For an old primary after a failover: its data may hold
    /// WAL the new primary never had, so it is not reused.
    pub async fn rebuild_as_standby_of(&mut self, primary: &Cluster) {
        assert!(!self.running, "{} is still running", self.name);
        assert!(
            Arc::ptr_eq(&self.place, &primary.place),
            "both nodes belong to one test"
        );
        if self.data.exists() {
            std::fs::remove_dir_all(&self.data).expect("remove the old data directory");
        }
        self.base_backup_of(primary).await;
    }

    async fn base_backup_of(&mut self, primary: &Cluster) {
        let data = self.data.to_str().expect("UTF-8 path").to_owned();
        let port = primary.port.to_string();
        self.place
            .run(
                "pg_basebackup",
                &[
                    "-h",
                    "127.0.0.1",
                    "-p",
                    &port,
                    "-U",
                    "postgres",
                    "-D",
                    &data,
                    "-R",
                    "-X",
                    "stream",
                    "-c",
                    "fast",
                    "--no-sync",
                ],
            )
            .await;
        // The copied node.conf is the primary's: this node gets its own
        // port and names no synchronous standby (a standby promoted while
        // naming one would wait for it on every commit).
        self.write_node_conf("");
        self.start().await;
        self.wait_until_streaming().await;
    }

    fn write_node_conf(&self, synchronous_standby_names: &str) {
        let text = format!(
            "port = {}\nsynchronous_standby_names = '{synchronous_standby_names}'\n",
            self.port
        );
        // Written in place: the file keeps its owner where it already exists.
        std::fs::write(self.data.join("node.conf"), text).expect("write node.conf");
    }

    async fn start(&mut self) {
        let data = self.data.to_str().expect("UTF-8 path").to_owned();
        let log = self.log_path();
        let log = log.to_str().expect("UTF-8 path").to_owned();
        self.place
            .run(
                "pg_ctl",
                &["-D", &data, "-l", &log, "-w", "-t", "60", "start"],
            )
            .await;
        self.running = true;
    }

    /// The server's log file.
    pub fn log_path(&self) -> PathBuf {
        self.place.path().join(format!("{}.log", self.name))
    }

    /// Stops the server the way a crash would: `pg_ctl -m immediate stop`.
    pub async fn stop_immediate(&mut self) {
        let data = self.data.to_str().expect("UTF-8 path").to_owned();
        self.place
            .run("pg_ctl", &["-D", &data, "-m", "immediate", "-w", "stop"])
            .await;
        self.running = false;
    }

    /// Promotes this standby: `pg_ctl -w promote`, which returns once it
    /// accepts writes.
    pub async fn promote(&self) {
        let data = self.data.to_str().expect("UTF-8 path").to_owned();
        self.place
            .run("pg_ctl", &["-D", &data, "-w", "-t", "60", "promote"])
            .await;
    }

    /// Sets `synchronous_standby_names` and reloads the configuration.
    /// Clear it (`""`) on a standby before promoting it; set it (`"*"`)
    /// on a primary once its standby streams.
    pub async fn set_synchronous_standby_names(&self, names: &str) {
        self.write_node_conf(names);
        let data = self.data.to_str().expect("UTF-8 path").to_owned();
        self.place.run("pg_ctl", &["-D", &data, "reload"]).await;
        // The reload is a signal: wait until new sessions see the value.
        let wanted = names.to_owned();
        let url = self.url();
        poll_until(
            &format!("{}: synchronous_standby_names = {names:?}", self.name),
            REPLICATION,
            || {
                let url = url.clone();
                let wanted = wanted.clone();
                async move {
                    let mut conn = sqlx::PgConnection::connect(&url).await.ok()?;
                    let value: String =
                        sqlx::query_scalar("SELECT current_setting('synchronous_standby_names')")
                            .fetch_one(&mut conn)
                            .await
                            .ok()?;
                    let _ = conn.close().await;
                    (value == wanted).then_some(())
                }
            },
        )
        .await;
    }

    /// Makes every commit on this primary wait for its standby
    /// (`synchronous_standby_names = '*'`) and waits until the standby is
    /// synchronous and has flushed everything written so far.
    pub async fn require_synchronous_standby(&self) {
        self.set_synchronous_standby_names("*").await;
        let url = self.url();
        let mut conn = sqlx::PgConnection::connect(&url)
            .await
            .expect("connect to the primary");
        let lsn: String = sqlx::query_scalar("SELECT pg_current_wal_lsn()::text")
            .fetch_one(&mut conn)
            .await
            .expect("current WAL position");
        let conn = tokio::sync::Mutex::new(conn);
        poll_until(
            &format!("{}: a synchronous standby that flushed {lsn}", self.name),
            REPLICATION,
            || {
                let conn = &conn;
                let lsn = lsn.clone();
                async move {
                    let caught_up: Option<bool> = sqlx::query_scalar(
                        "SELECT bool_or(sync_state = 'sync' AND flush_lsn >= $1::pg_lsn) \
                         FROM pg_stat_replication",
                    )
                    .bind(lsn)
                    .fetch_one(&mut *conn.lock().await)
                    .await
                    .expect("read pg_stat_replication");
                    caught_up.unwrap_or(false).then_some(())
                }
            },
        )
        .await;
        let _ = conn.into_inner().close().await;
    }

    /// Waits until this standby's WAL receiver streams from its primary.
    pub async fn wait_until_streaming(&self) {
        let url = self.url();
        poll_until(
            &format!("{} streaming from its primary", self.name),
            REPLICATION,
            || {
                let url = url.clone();
                async move {
                    let mut conn = sqlx::PgConnection::connect(&url).await.ok()?;
                    let status: Option<String> =
                        sqlx::query_scalar("SELECT status FROM pg_stat_wal_receiver")
                            .fetch_optional(&mut conn)
                            .await
                            .ok()?;
                    let _ = conn.close().await;
                    (status.as_deref() == Some("streaming")).then_some(())
                }
            },
        )
        .await;
    }

    /// Whether this node is a standby (in recovery).
    pub async fn in_recovery(&self) -> bool {
        let mut conn = sqlx::PgConnection::connect(&self.url())
            .await
            .expect("connect");
        let in_recovery: bool = sqlx::query_scalar("SELECT pg_is_in_recovery()")
            .fetch_one(&mut conn)
            .await
            .expect("pg_is_in_recovery");
        let _ = conn.close().await;
        in_recovery
    }

    /// `127.0.0.1:PORT`.
    pub fn host_port(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// This node alone: `postgres://postgres@127.0.0.1:PORT/postgres`.
    pub fn url(&self) -> String {
        format!("postgres://postgres@{}/postgres", self.host_port())
    }
}

/// libpq's multi-host form: every node in the order given, then
/// `?target_session_attrs=ATTRS`.
pub fn multi_host_url(nodes: &[&Cluster], target_session_attrs: &str) -> String {
    let hosts: Vec<String> = nodes.iter().map(|node| node.host_port()).collect();
    format!(
        "postgres://postgres@{}/postgres?target_session_attrs={target_session_attrs}",
        hosts.join(",")
    )
}

/// Calls `check` every 20 ms until it finds something; panics after
/// `patience`. (This file's own, so that the bench can include it too.)
async fn poll_until<T, F: std::future::Future<Output = Option<T>>>(
    what: &str,
    patience: Duration,
    mut check: impl FnMut() -> F,
) -> T {
    let deadline = tokio::time::Instant::now() + patience;
    let mut interval = tokio::time::interval(Duration::from_millis(20));
    loop {
        interval.tick().await;
        if let Some(found) = check().await {
            return found;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: not within {patience:?}"
        );
    }
}

fn append(path: &Path, text: &str) {
    use std::io::Write as _;
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .unwrap_or_else(|error| panic!("open {}: {error}", path.display()));
    file.write_all(text.as_bytes())
        .unwrap_or_else(|error| panic!("append to {}: {error}", path.display()));
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if self.running {
            let _ = self
                .place
                .std_command("pg_ctl")
                .arg("-D")
                .arg(&self.data)
                .args(["-m", "immediate", "-w", "stop"])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status();
        }
    }
}
