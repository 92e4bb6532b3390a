//! What some tests need from the machine beyond Rust, and what happens
//! when it is missing: the test FAILS, with one line naming what is
//! missing and how to provide it. A test passes without running only when
//! the user says so, naming the prerequisite in `SESSIONSTORE_TEST_SKIP`
//! (a comma list of [`Prerequisite::name`]s, e.g. `postgres,browser`).
//!
//! A skipped test says so at once on stderr, written past libtest's output
//! capture (which swallows what a passing test prints with `eprintln!`),
//! and `zz_skipped_prerequisites` (in `main.rs`; its name makes it the last
//! test libtest starts) fails, listing what was not tested: a run that
//! skipped something never ends `test result: ok`. To accept the skips
//! too, leave that test out: `-- --skip zz_skipped_prerequisites`.

use std::io::Write as _;
use std::path::PathBuf;
use std::sync::{Mutex, PoisonError};

/// The variable that names the prerequisites a run goes without.
pub const SKIP_VARIABLE: &str = "SESSIONSTORE_TEST_SKIP";

/// Something a test needs that a bare machine with Rust does not have.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Prerequisite {
    /// A PostgreSQL server at `SESSIONSTORE_TEST_POSTGRES_URL` (default
    /// `postgres://postgres@127.0.0.1:5432/postgres`), the role with `CREATEDB`.
    Postgres,
    /// `python3` with `venv` (the generated Python client, the Python
    /// package's tests, the README's Python and grpcurl commands).
    Python,
    /// `jq` (the README pipes grpcurl's output to it).
    Jq,
    /// Chromium at `/usr/bin/chromium` (or `$CHROMIUM`), Node.js and npm.
    Browser,
    /// Mounting a small tmpfs (needs root), for the disk-full test.
    DiskFull,
    /// Mounting a FUSE filesystem: `/dev/fuse`, and `fusermount3` (Debian's
    /// `fuse3`), for the power-loss test.
    Fuse,
    /// podman and runc, to build and run the container image.
    Container,
}

impl Prerequisite {
    pub const ALL: [Prerequisite; 7] = [
        Prerequisite::Postgres,
        Prerequisite::Python,
        Prerequisite::Jq,
        Prerequisite::Browser,
        Prerequisite::DiskFull,
        Prerequisite::Fuse,
        Prerequisite::Container,
    ];

    /// Its name in `SESSIONSTORE_TEST_SKIP`.
    pub fn name(self) -> &'static str {
        match self {
            Prerequisite::Postgres => "postgres",
            Prerequisite::Python => "python",
            Prerequisite::Jq => "jq",
            Prerequisite::Browser => "browser",
            Prerequisite::DiskFull => "disk-full",
            Prerequisite::Fuse => "fuse",
            Prerequisite::Container => "container",
        }
    }

    /// How to provide it.
    fn provide(self) -> &'static str {
        match self {
            Prerequisite::Postgres => {
                "run `bash .ci/postgres.sh` or set SESSIONSTORE_TEST_POSTGRES_URL"
            }
            Prerequisite::Python => "run `bash .ci/python.sh` (python3 with venv, and jq)",
            Prerequisite::Jq => "run `bash .ci/python.sh` (python3 with venv, and jq)",
            Prerequisite::Browser => {
                "run `bash .ci/browser.sh` (Debian's chromium, Node.js and npm, the web example built)"
            }
            Prerequisite::DiskFull => "run the tests as root (the test mounts a small tmpfs)",
            Prerequisite::Fuse => "run `bash .ci/fuse.sh`",
            Prerequisite::Container => {
                "run `bash .ci/container.sh` (installs Debian's podman and runc)"
            }
        }
    }

    /// Whether `SESSIONSTORE_TEST_SKIP` names it.
    pub fn skipped_by_choice(self) -> bool {
        opted_out().iter().any(|name| name == self.name())
    }

    /// What is missing of it here, or `None` when it is all there.
    pub async fn missing_here(self) -> Option<String> {
        match self {
            Prerequisite::Postgres => {
                use sqlx::Connection as _;
                let url = super::postgres_admin_url();
                match sqlx::PgConnection::connect(&url).await {
                    Ok(conn) => {
                        let _ = conn.close().await;
                        None
                    }
                    Err(error) => Some(postgres_unreachable(&url, &error)),
                }
            }
            Prerequisite::Python => tokio::task::spawn_blocking(|| {
                (!succeeds("python3", &["-c", "import venv, ensurepip"]))
                    .then(|| "python3 with venv is not installed".to_owned())
            })
            .await
            .expect("probe python3"),
            Prerequisite::Jq => tokio::task::spawn_blocking(|| {
                (!succeeds("jq", &["--version"])).then(|| "jq is not installed".to_owned())
            })
            .await
            .expect("probe jq"),
            Prerequisite::Browser => tokio::task::spawn_blocking(browser_missing)
                .await
                .expect("probe the browser"),
            Prerequisite::DiskFull => tokio::task::spawn_blocking(tmpfs_missing)
                .await
                .expect("probe mounting a tmpfs"),
            Prerequisite::Fuse => tokio::task::spawn_blocking(fuse_missing)
                .await
                .expect("probe FUSE"),
            Prerequisite::Container => tokio::task::spawn_blocking(container_missing)
                .await
                .expect("probe podman"),
        }
    }
}

/// The names `SESSIONSTORE_TEST_SKIP` lists.
fn opted_out() -> Vec<String> {
    std::env::var(SKIP_VARIABLE)
        .unwrap_or_default()
        .split(',')
        .map(|name| name.trim().to_owned())
        .filter(|name| !name.is_empty())
        .collect()
}

/// The line saying PostgreSQL is not there.
pub fn postgres_unreachable(url: &str, error: &dyn std::fmt::Display) -> String {
    let error = error.to_string().replace('\n', " ");
    format!("PostgreSQL is not reachable at {url} ({error})")
}

/// Tests skipped so far in this run, each with what it went without.
static SKIPPED: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// `test` cannot run: `missing` (e.g. "PostgreSQL is not reachable at …")
/// says why. Fails the test with one line saying how to provide
/// `prerequisite`, unless `SESSIONSTORE_TEST_SKIP` names it: then says
/// so on stderr (past libtest's capture, so it shows) and returns, and the
/// caller returns without testing.
#[track_caller]
pub fn missing(prerequisite: Prerequisite, test: &str, missing: &str) {
    let name = prerequisite.name();
    // `module_path!()` starts with the binary's crate name.
    let test = test.strip_prefix("it::").unwrap_or(test);
    if !prerequisite.skipped_by_choice() {
        panic!(
            "{test}: {missing}: {}, or opt out with {SKIP_VARIABLE}={name}",
            prerequisite.provide()
        );
    }
    let line = format!("SKIPPED {test}: {missing} ({SKIP_VARIABLE}={name})");
    // Straight to the process's stderr: `eprintln!` in a test goes to
    // libtest's capture, shown only if the test fails.
    let _ = writeln!(std::io::stderr().lock(), "{line}");
    SKIPPED
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(format!("{test} ({name})"));
}

/// The name of the running test: libtest names each test's thread after it.
pub fn current_test() -> String {
    std::thread::current().name().unwrap_or("a test").to_owned()
}

fn succeeds(program: &str, args: &[&str]) -> bool {
    std::process::Command::new(program)
        .args(args)
        .output()
        .is_ok_and(|o| o.status.success())
}

/// What the browser test lacks, if anything.
pub fn browser_missing() -> Option<String> {
    let chromium =
        std::env::var_os("CHROMIUM").map_or_else(|| "/usr/bin/chromium".into(), PathBuf::from);
    let mut missing = Vec::new();
    if !chromium.exists() {
        missing.push(format!("Chromium ({})", chromium.display()));
    }
    for program in ["node", "npm"] {
        if !succeeds(program, &["--version"]) {
            missing.push(program.to_owned());
        }
    }
    (!missing.is_empty()).then(|| format!("{} not found", missing.join(", ")))
}

/// Why a small tmpfs cannot be mounted here, if it cannot.
fn tmpfs_missing() -> Option<String> {
    let dir = tempfile::tempdir().expect("temporary directory");
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=1048576", "tmpfs"])
        .arg(dir.path())
        .stderr(std::process::Stdio::piped())
        .output();
    match mounted {
        Ok(output) if output.status.success() => {
            let _ = std::process::Command::new("umount")
                .arg(dir.path())
                .status();
            None
        }
        Ok(output) => Some(format!(
            "cannot mount a small tmpfs (needs root): {}",
            String::from_utf8_lossy(&output.stderr).trim()
        )),
        Err(error) => Some(format!("cannot mount a small tmpfs (needs root): {error}")),
    }
}

/// What mounting a FUSE filesystem lacks here, if anything: the kernel's
/// `/dev/fuse`, readable and writable, and `fusermount3` (the power-loss
/// test mounts with `auto_unmount`, which goes through it).
pub fn fuse_missing() -> Option<String> {
    let mut missing = Vec::new();
    if let Err(error) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
    {
        missing.push(format!("/dev/fuse cannot be opened ({error})"));
    }
    if !succeeds("fusermount3", &["--version"]) {
        missing.push("fusermount3 is not installed".to_owned());
    }
    (!missing.is_empty()).then(|| missing.join(", "))
}

/// What building and running the container image lacks here: podman, and
/// runc (the OCI runtime the test runs it with).
pub fn container_missing() -> Option<String> {
    let missing: Vec<&str> = ["podman", "runc"]
        .into_iter()
        .filter(|program| !succeeds(program, &["--version"]))
        .collect();
    (!missing.is_empty()).then(|| format!("{} not installed", missing.join(" and ")))
}

/// The end-of-run summary (`zz_skipped_prerequisites`): fails on a name
/// `SESSIONSTORE_TEST_SKIP` should not hold, and, listing them, when a
/// prerequisite it names is missing, so its tests passed untested.
pub async fn summary() {
    let names = opted_out();
    let known: Vec<&str> = Prerequisite::ALL.iter().map(|p| p.name()).collect();
    for name in &names {
        assert!(
            known.contains(&name.as_str()),
            "{SKIP_VARIABLE} names `{name}`, which is none of {}",
            known.join(", ")
        );
    }
    let mut not_tested = Vec::new();
    for prerequisite in Prerequisite::ALL {
        if prerequisite.skipped_by_choice()
            && let Some(missing) = prerequisite.missing_here().await
        {
            not_tested.push(format!(
                "  {}: {missing} ({})",
                prerequisite.name(),
                prerequisite.provide()
            ));
        }
    }
    if not_tested.is_empty() {
        return;
    }
    let skipped = SKIPPED
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    let mut report = format!(
        "NOT TESTED: {SKIP_VARIABLE}={} let the tests needing these pass without running:\n{}\n",
        names.join(","),
        not_tested.join("\n")
    );
    if !skipped.is_empty() {
        report.push_str(&format!(
            "skipped so far in this run ({}; tests still running when this one started may skip too):\n  {}\n",
            skipped.len(),
            skipped.join("\n  ")
        ));
    }
    report.push_str(
        "This test fails so that a run that skipped something never ends `test result: ok`; \
         to accept the skips, add `-- --skip zz_skipped_prerequisites`.",
    );
    panic!("{report}");
}
