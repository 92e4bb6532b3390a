//! The README's commands, run as written, so that it cannot rot.
//!
//! Every command of every ```sh block runs (through bash, with `pipefail`)
//! against a real server — the built binary on an ephemeral port — in
//! README order and in one temporary directory, so that a file one command
//! writes is there for the next. Before running:
//! - `127.0.0.1:50051` becomes the server's address, and
//!   `SESSIONSTORE_SERVER` points the CLI's default at it;
//! - `ses_…` becomes a real session (made by the test, and made again when a
//!   command deleted it);
//! - `sessionstore` (on `PATH`, and `./target/release/sessionstore`) is the
//!   binary the tests build;
//! - `grpcurl` is `tests/python/grpcurl.py`, a stand-in that knows the API
//!   only through server reflection;
//! - `python`, `python3` and `pip` are the test virtualenv's, and
//!   `python3 -m venv DIR` links DIR to it rather than making another;
//! - a synopsis with `[--optional parts]` runs once without them, then once
//!   with them (brackets removed).
//!
//! Commands that run until stopped (`LONG_RUNNING`) run in the background
//! from their first line of output and must end by themselves once their
//! session is deleted — by a later README command, or else by the test at
//! the end. `NAME=VALUE` lines (an environment file) must name a variable
//! `sessionstore serve --help` documents. ```python blocks run with the
//! virtualenv's python, in the same directory, when reached.
//!
//! Every command must exit 0, unless it is in `EXPECTED_TO_FAIL`. A command
//! that cannot run here is in `NOT_RUN` with the reason; a README command
//! neither run nor there fails the test, and so does an entry of either
//! table that no command matches.
//!
//! Without python3 (with venv) the test fails, and so it does without
//! `jq`, unless `SESSIONSTORE_TEST_SKIP` names `python` (the Python and
//! grpcurl commands are then skipped) or `jq` (the commands piped to it).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sessionstore_client::SessionStoreClient;
use sessionstore_client::v1 as pb;
use tokio::io::AsyncBufReadExt as _;
use tonic::transport::Channel;

use crate::python::{venv, venv_named};
use crate::support::{ServerProcess, connect, exchange, sessionstore_binary, token_line};

/// README commands that cannot run here, by how they start, and why.
const NOT_RUN: &[(&str, &str)] = &[
    (
        "cargo run --release -p sessionstore-server",
        "a release build of everything, then a server on the fixed port 50051 until stopped; \
         the test serves with the binary the tests build",
    ),
    (
        "cargo install ",
        "a release build installed into ~/.cargo/bin; the test puts the binary the tests build \
         on PATH instead",
    ),
    (
        "bash .ci/test",
        "the test suite this test is part of (after providing its prerequisites)",
    ),
    (
        "cargo test -p sessionstore-tests -- core::",
        "a part of the test suite this test is part of",
    ),
    (
        "SESSIONSTORE_TEST_SKIP=",
        "the test suite this test is part of, told to go without prerequisites",
    ),
    (
        "cargo run --release -p sessionstore-bench",
        "a release build and minutes of benchmarks; .ci/run runs its --quick smoke run",
    ),
    (
        "sessionstore backup --database-url sqlite://data/sessionstore.db --to /backups/",
        "writes under /backups, from the default database rather than the test's; \
         backup.rs backs up a served database and restores it",
    ),
    (
        "sessionstore restore --from /backups/",
        "needs a backup under /backups and a stopped server; backup.rs restores backups, \
         and is refused while a server serves the database",
    ),
    (
        "pg_dump -Fc -d \"$DATABASE_URL\"",
        "a PostgreSQL deployment's backup ($DATABASE_URL), PostgreSQL's own tool; \
         backup.rs checks `backup` points PostgreSQL URLs to it",
    ),
    (
        "createdb sessionstore_restored",
        "would create a database outside the sessionstore_test_* databases the tests make and \
         drop, for PostgreSQL's own pg_restore",
    ),
    (
        "pg_restore --no-owner -d sessionstore_restored",
        "restores a pg_dump of a PostgreSQL deployment with PostgreSQL's own tool",
    ),
    (
        "createdb sessionstore",
        "would create a database named sessionstore on the local PostgreSQL, outside the \
         sessionstore_test_* databases the tests make and drop",
    ),
    (
        "sessionstore --database-url postgres://app:secret@db.internal:",
        "needs the host db.internal",
    ),
    (
        "sessionstore serve --listen 0.0.0.0:50051 --auth-tokens /etc/",
        "listens on every interface on the fixed port and reads a tokens file under /etc; \
         auth.rs serves with tokens files",
    ),
    (
        "sessionstore serve --listen 0.0.0.0:50051 --database-url postgres://sessionstore@db.internal:",
        "needs the host db.internal, TLS files and tokens under /etc and an OTLP collector",
    ),
    (
        "sessionstore migrate --check --database-url \"$DATABASE_URL\"",
        "a deploy's steps against a PostgreSQL deployment ($DATABASE_URL); \
         rolling_upgrade.rs runs them on a database of its own",
    ),
    (
        "sessionstore replicas --database-url \"$DATABASE_URL\"",
        "a deploy's steps against a PostgreSQL deployment; rolling_upgrade.rs runs them",
    ),
    (
        "sessionstore migrate --finalize --database-url \"$DATABASE_URL\"",
        "a deploy's steps against a PostgreSQL deployment; rolling_upgrade.rs runs them",
    ),
];

/// README commands that must fail, exactly as run (after `[optional
/// parts]` are dealt with, before the substitutions): the command, what its
/// output must say, and why it fails.
const EXPECTED_TO_FAIL: &[(&str, &str, &str)] = &[];

/// Commands that run until stopped, by what they contain. Each must name a
/// `ses_…` session: deleting it ends them.
const LONG_RUNNING: &[&str] = &["sessions watch ", "/WatchSession"];

/// How long one command may take.
const PATIENCE: Duration = Duration::from_secs(60);
/// How long a package install may take: it downloads, and the frameworks'
/// packages are large.
const INSTALL_PATIENCE: Duration = Duration::from_secs(600);

#[derive(Debug)]
enum Block {
    Sh(Vec<String>),
    Python(String),
}

/// The README's ```sh commands and ```python programs, in order.
fn blocks(readme: &str) -> Vec<Block> {
    let mut blocks = Vec::new();
    let mut lines = readme.lines();
    while let Some(line) = lines.next() {
        let Some(language) = line.strip_prefix("```") else {
            continue;
        };
        let body: Vec<&str> = lines
            .by_ref()
            .take_while(|line| !line.starts_with("```"))
            .collect();
        match language.trim() {
            "sh" | "bash" | "shell" => blocks.push(Block::Sh(commands(&body))),
            "python" => blocks.push(Block::Python(body.join("\n") + "\n")),
            _ => {}
        }
    }
    blocks
}

/// A shell block's commands: `\` continuations joined, newlines inside
/// quotes kept, `# …` comments dropped.
fn commands(body: &[&str]) -> Vec<String> {
    let mut commands = Vec::new();
    let mut current = String::new();
    let mut quote: Option<char> = None;
    let mut continuing = false;
    for line in body {
        let line = if continuing { line.trim_start() } else { line };
        continuing = false;
        let mut chars = line.chars().peekable();
        while let Some(c) = chars.next() {
            match (quote, c) {
                (None, '#') if current.is_empty() || current.ends_with(char::is_whitespace) => {
                    break;
                }
                (None, '\\') if chars.peek().is_none() => continuing = true,
                (None | Some('"'), '\\') => {
                    current.push(c);
                    current.extend(chars.next());
                }
                (None, '\'' | '"') => {
                    quote = Some(c);
                    current.push(c);
                }
                (Some(open), _) if c == open => {
                    quote = None;
                    current.push(c);
                }
                _ => current.push(c),
            }
        }
        if quote.is_some() {
            current.push('\n');
        } else if continuing {
            current.truncate(current.trim_end().len());
            current.push(' ');
        } else {
            let command = current.trim();
            if !command.is_empty() {
                commands.push(command.to_owned());
            }
            current.clear();
        }
    }
    assert!(
        current.trim().is_empty() && quote.is_none(),
        "a README command never ends: {current}"
    );
    commands
}

/// A synopsis's forms: without its `[--optional parts]`, then, if it has
/// any, with them (brackets removed).
fn variants(command: &str) -> Vec<String> {
    let (mut without, mut with) = (String::new(), String::new());
    let mut quote: Option<char> = None;
    let (mut optional, mut any) = (false, false);
    let mut previous = ' ';
    for (at, c) in command.char_indices() {
        match (quote, c) {
            (None, '[') if previous.is_whitespace() && command[at + 1..].starts_with('-') => {
                assert!(!optional, "nested [optional parts] in: {command}");
                optional = true;
                any = true;
                without.truncate(without.trim_end().len());
            }
            (None, ']') if optional => optional = false,
            _ => {
                match (quote, c) {
                    (None, '\'' | '"') => quote = Some(c),
                    (Some(open), _) if c == open => quote = None,
                    _ => {}
                }
                with.push(c);
                if !optional {
                    without.push(c);
                }
            }
        }
        previous = c;
    }
    assert!(!optional, "an [optional part] never closes in: {command}");
    if any {
        vec![without.trim().to_owned(), with]
    } else {
        vec![with]
    }
}

/// The words of a command, split where the shell would split commands too.
fn words(command: &str) -> impl Iterator<Item = &str> {
    command.split(|c: char| c.is_whitespace() || "|;&()".contains(c))
}

fn needs_python(command: &str) -> bool {
    words(command).any(|w| {
        ["python", "python3", "pip", "pip3", "grpcurl"].contains(&w) || w.ends_with("/activate")
    })
}

fn needs_jq(command: &str) -> bool {
    words(command).any(|w| w == "jq")
}

/// `python3 -m venv DIR` → DIR.
fn venv_made(command: &str) -> Option<&str> {
    match words(command).collect::<Vec<_>>()[..] {
        ["python" | "python3", "-m", "venv", dir] => Some(dir),
        _ => None,
    }
}

/// `NAME=VALUE` with no command → NAME.
fn environment_setting(command: &str) -> Option<&str> {
    let (name, _) = command.split_once('=')?;
    let is_name = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
    (is_name && !command.contains(char::is_whitespace)).then_some(name)
}

fn entry<'a>(table: &'a [(&'a str, &'a str)], command: &str) -> Option<usize> {
    table
        .iter()
        .position(|(start, _)| command.starts_with(start))
}

/// What a command printed, for failure messages.
fn said(output: &std::process::Output) -> String {
    format!(
        "--- stdout ---\n{}--- stderr ---\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// Where the README's commands run, and with what.
struct Shell {
    dir: tempfile::TempDir,
    /// Stand-ins for `sessionstore` and `grpcurl`, first on `PATH`.
    _bin: tempfile::TempDir,
    path: std::ffi::OsString,
    server: String,
}

/// Copies what `pip install ./python` reads, without `__pycache__`s.
fn copy_python_package(from: &Path, to: &Path) {
    if from.is_dir() {
        std::fs::create_dir_all(to).unwrap();
        for entry in std::fs::read_dir(from).unwrap() {
            let entry = entry.unwrap();
            let name = entry.file_name();
            if name != "__pycache__"
                && name != "build"
                && !name.to_string_lossy().ends_with(".egg-info")
            {
                copy_python_package(&entry.path(), &to.join(name));
            }
        }
    } else {
        std::fs::copy(from, to).unwrap();
    }
}

impl Shell {
    fn new(binary: &Path, python: Option<&Path>, address: &str) -> Shell {
        let dir = tempfile::tempdir().unwrap();
        let bin = tempfile::tempdir().unwrap();
        let workspace = workspace();
        // The commands run "from the repository root": the protos are there,
        // and the Python package (a copy: pip builds inside the tree it is
        // given).
        std::os::unix::fs::symlink(workspace.join("proto"), dir.path().join("proto")).unwrap();
        copy_python_package(&workspace.join("python"), &dir.path().join("python"));
        std::os::unix::fs::symlink(binary, bin.path().join("sessionstore")).unwrap();
        let mut path = vec![bin.path().to_owned()];
        if let Some(python) = python {
            let grpcurl = bin.path().join("grpcurl");
            std::fs::write(
                &grpcurl,
                format!(
                    "#!/bin/sh\nexec '{}' '{}' \"$@\"\n",
                    python.display(),
                    workspace.join("tests/python/grpcurl.py").display()
                ),
            )
            .unwrap();
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::set_permissions(&grpcurl, std::fs::Permissions::from_mode(0o755)).unwrap();
            path.push(python.parent().unwrap().to_owned());
        }
        path.extend(std::env::split_paths(
            &std::env::var_os("PATH").unwrap_or_default(),
        ));
        Shell {
            dir,
            _bin: bin,
            path: std::env::join_paths(path).unwrap(),
            server: format!("http://{address}"),
        }
    }

    /// A process in the commands' directory and environment, in a process
    /// group of its own (so that what it started goes with it).
    fn command(&self, program: &Path) -> tokio::process::Command {
        let mut command = tokio::process::Command::new(program);
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("SESSIONSTORE_") {
                command.env_remove(name);
            }
        }
        command
            .current_dir(self.dir.path())
            .env("PATH", &self.path)
            .env("SESSIONSTORE_SERVER", &self.server)
            .env("NO_COLOR", "1")
            .env("PIP_DISABLE_PIP_VERSION_CHECK", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        command
    }

    fn bash(&self, line: &str) -> tokio::process::Command {
        let mut command = self.command(Path::new("bash"));
        command.arg("-c").arg(format!("set -o pipefail\n{line}"));
        command
    }

    /// Runs to the end (within `PATIENCE`, or `INSTALL_PATIENCE` for a
    /// `pip install`).
    async fn run(&self, mut command: tokio::process::Command, what: &str) -> std::process::Output {
        let patience = if what.contains("pip install") {
            INSTALL_PATIENCE
        } else {
            PATIENCE
        };
        let child = command.spawn().unwrap();
        let group = child.id().unwrap();
        match tokio::time::timeout(patience, child.wait_with_output()).await {
            Ok(output) => output.unwrap(),
            Err(_) => {
                kill_group(group);
                panic!("{what}: still running after {patience:?}");
            }
        }
    }
}

fn kill_group(group: u32) {
    let _ = std::process::Command::new("kill")
        .args(["-KILL", "--", &format!("-{group}")])
        .status();
}

/// A long-running command, read in the background.
struct Background {
    command: String,
    session: String,
    child: tokio::process::Child,
    output: Arc<Mutex<String>>,
    reader: tokio::task::JoinHandle<()>,
}

impl Background {
    /// Starts `command` and returns once it printed its first line (its
    /// stream is open).
    async fn start(shell: &Shell, command: String, session: String) -> Background {
        let mut child = shell
            .bash(&format!("exec 2>&1\n{command}"))
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let output = Arc::new(Mutex::new(String::new()));
        let (first, first_line) = tokio::sync::oneshot::channel();
        let reader = tokio::spawn({
            let output = Arc::clone(&output);
            async move {
                let mut lines = tokio::io::BufReader::new(stdout).lines();
                let mut first = Some(first);
                while let Ok(Some(line)) = lines.next_line().await {
                    let mut output = output.lock().unwrap();
                    output.push_str(&line);
                    output.push('\n');
                    if let Some(first) = first.take() {
                        let _ = first.send(());
                    }
                }
            }
        });
        let started = tokio::time::timeout(PATIENCE, first_line).await;
        assert!(
            matches!(started, Ok(Ok(()))),
            "{command}: printed nothing (ended: {:?})\n{}",
            child.try_wait(),
            output.lock().unwrap()
        );
        Background {
            command,
            session,
            child,
            output,
            reader,
        }
    }

    /// Waits for it to end by itself, which it must do once its session is
    /// deleted, and checks that it succeeded.
    async fn finish(mut self, client: &mut SessionStoreClient<Channel>) {
        // Deleting a session twice is NOT_FOUND: it may be gone already.
        let _ = client
            .delete_session(pb::DeleteSessionRequest {
                session_id: self.session.clone(),
            })
            .await;
        let group = self.child.id();
        let status = match tokio::time::timeout(PATIENCE, self.child.wait()).await {
            Ok(status) => status.unwrap(),
            Err(_) => {
                if let Some(group) = group {
                    kill_group(group);
                }
                panic!(
                    "{}: still running after its session was deleted",
                    self.command
                );
            }
        };
        (&mut self.reader).await.unwrap();
        let output = self.output.lock().unwrap();
        assert!(
            status.success(),
            "{}: ended with {status}\n{output}",
            self.command
        );
        eprintln!("ran (in the background): {}\n{output}", self.command);
    }
}

impl Drop for Background {
    /// A test that failed half-way leaves nothing running.
    fn drop(&mut self) {
        if let Some(group) = self.child.id() {
            kill_group(group);
        }
    }
}

/// The `ses_…` session: the current one, or a new one (with one exchange)
/// when there is none or a command deleted it.
async fn live_session(
    client: &mut SessionStoreClient<Channel>,
    current: &mut Option<String>,
) -> String {
    if let Some(id) = current {
        match client
            .get_session(pb::GetSessionRequest {
                session_id: id.clone(),
                ..Default::default()
            })
            .await
        {
            Ok(_) => return id.clone(),
            Err(status) if status.code() == tonic::Code::NotFound => {}
            Err(status) => panic!("GetSession {id}: {status}"),
        }
    }
    let id = client
        .create_session(pb::CreateSessionRequest {
            title: "from the README test".into(),
            user: "readme".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .id;
    exchange(client, &id, "What is 2+2?", "4").await;
    *current = Some(id.clone());
    id
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn have_jq() -> bool {
    std::process::Command::new("jq")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_readme_command_runs() {
    let test_started = std::time::Instant::now();
    let readme = std::fs::read_to_string(workspace().join("README.md")).unwrap();
    let blocks = blocks(&readme);
    let binary = tokio::task::spawn_blocking(sessionstore_binary)
        .await
        .unwrap();
    let python = tokio::task::spawn_blocking(|| {
        // Its own: the README installs the Python package into it.
        venv_named(
            "python-readme",
            "the README's Python and grpcurl commands (readme::every_readme_command_runs)",
        )
    })
    .await
    .unwrap();
    if let Some(python) = &python {
        // As a reader's: without the client package until the README
        // installs it (an earlier run's copy would hide the generated
        // modules of "Call it from other languages").
        let removed = std::process::Command::new(python)
            .args([
                "-m",
                "pip",
                "uninstall",
                "--yes",
                "--quiet",
                "sessionstore-client",
            ])
            .output()
            .expect("run pip uninstall");
        assert!(
            removed.status.success(),
            "pip uninstall sessionstore-client failed"
        );
    }
    let jq = have_jq();
    if !jq {
        crate::support::prereq::missing(
            crate::support::prereq::Prerequisite::Jq,
            "readme::every_readme_command_runs (the README's commands piped to jq)",
            "jq is not installed",
        );
    }

    let logs = tempfile::tempdir().unwrap();
    let mut server = ServerProcess::start(
        &binary,
        "sqlite::memory:",
        "127.0.0.1:0",
        logs.path().join("server.log"),
        &[],
    )
    .await;
    let address = server.listen_address();
    let mut client = connect(&server.endpoint()).await;
    let shell = Shell::new(&binary, python.as_deref(), &address);
    let help = shell
        .run(
            {
                let mut command = shell.command(&binary);
                command.args(["serve", "--help"]);
                command
            },
            "sessionstore serve --help",
        )
        .await;
    let help = String::from_utf8_lossy(&help.stdout).into_owned();

    let mut not_run_used = vec![false; NOT_RUN.len()];
    let mut expected_failures_used = vec![false; EXPECTED_TO_FAIL.len()];
    let mut current_session = None;
    let mut background = Vec::new();
    let mut python_said = String::new();
    let (mut ran, mut skipped) = (0, 0);
    for (number, block) in blocks.iter().enumerate() {
        let lines = match block {
            Block::Python(program) => {
                let Some(python) = &python else {
                    skipped += 1;
                    continue;
                };
                let file = format!("readme-{number}.py");
                std::fs::write(
                    shell.dir.path().join(&file),
                    program.replace("127.0.0.1:50051", &address),
                )
                .unwrap();
                let mut command = shell.command(python);
                command.arg(&file);
                let output = shell.run(command, "the README's Python program").await;
                assert!(
                    output.status.success(),
                    "the README's Python program failed:\n{program}\n{}",
                    said(&output)
                );
                python_said.push_str(&String::from_utf8_lossy(&output.stdout));
                ran += 1;
                continue;
            }
            Block::Sh(lines) => lines,
        };
        for line in lines {
            if let Some(at) = entry(NOT_RUN, line) {
                not_run_used[at] = true;
                continue;
            }
            if let Some(name) = environment_setting(line) {
                let named = help.match_indices(name).any(|(at, _)| {
                    !help[at + name.len()..].starts_with(|c: char| c == '_' || c.is_alphanumeric())
                });
                assert!(
                    named,
                    "the README sets {name}, which `sessionstore serve --help` does not name"
                );
                ran += 1;
                continue;
            }
            if (needs_python(line) && python.is_none()) || (needs_jq(line) && !jq) {
                eprintln!("SKIPPED (see above): {line}");
                skipped += 1;
                continue;
            }
            for form in variants(line) {
                let expected_failure = EXPECTED_TO_FAIL
                    .iter()
                    .position(|(command, _, _)| *command == form);
                if let Some(at) = expected_failure {
                    expected_failures_used[at] = true;
                }
                let mut command = form
                    .replace("./target/release/sessionstore", "sessionstore")
                    .replace("127.0.0.1:50051", &address);
                let session = if command.contains("ses_…") {
                    let id = live_session(&mut client, &mut current_session).await;
                    command = command.replace("ses_…", &id);
                    Some(id)
                } else {
                    None
                };
                if let (Some(dir), Some(python)) = (venv_made(&command), &python) {
                    // The test's virtualenv, already made, stands in.
                    let venv = python.parent().unwrap().parent().unwrap();
                    command = format!("ln -s '{}' {dir}", venv.display());
                }
                if LONG_RUNNING.iter().any(|marker| command.contains(marker)) {
                    let session = session.unwrap_or_else(|| {
                        panic!("{line}: runs until stopped, but names no ses_… session to delete")
                    });
                    background.push(Background::start(&shell, command, session).await);
                    ran += 1;
                    continue;
                }
                let started = std::time::Instant::now();
                let output = shell.run(shell.bash(&command), &command).await;
                match expected_failure {
                    None => assert!(
                        output.status.success(),
                        "README command failed ({}): {line}\nran: {command}\n{}",
                        output.status,
                        said(&output)
                    ),
                    Some(at) => {
                        let (_, must_say, why) = EXPECTED_TO_FAIL[at];
                        assert!(
                            !output.status.success() && said(&output).contains(must_say),
                            "README command expected to fail saying {must_say:?} ({why}): \
                             {line}\nran: {command}\n{}",
                            said(&output)
                        );
                    }
                }
                eprintln!(
                    "ran in {:?} (at {:?}): {command}\n{}",
                    started.elapsed(),
                    test_started.elapsed(),
                    said(&output)
                );
                ran += 1;
            }
        }
    }
    for job in background {
        job.finish(&mut client).await;
    }

    for ((start, reason), used) in NOT_RUN.iter().zip(not_run_used) {
        assert!(
            used,
            "NOT_RUN lists `{start}…` ({reason}), which is no longer in the README"
        );
    }
    for ((command, _, _), used) in EXPECTED_TO_FAIL.iter().zip(expected_failures_used) {
        assert!(
            used,
            "EXPECTED_TO_FAIL lists `{command}`, which is no longer in the README"
        );
    }
    if python.is_some() {
        assert!(
            python_said.contains("NOT_FOUND SESSION_NOT_FOUND"),
            "the README's Python program reads an error's reason: {python_said}"
        );
    }
    eprintln!(
        "README: {ran} commands and programs run, {skipped} skipped, in {:?}",
        test_started.elapsed()
    );
    assert!(ran > 20, "only {ran} README commands ran");
    assert!(
        server.child.try_wait().unwrap().is_none(),
        "the server died during the README's commands"
    );
    assert!(server.terminate().await.success());
}

/// The grpcurl stand-in knows `google.rpc`'s error details only through the
/// server's reflection: ErrorInfo, BadRequest and RetryInfo must decode, as
/// they do in grpcurl, and its `-H` carries a bearer token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpcurl_decodes_error_details_through_reflection() {
    let Some(python) = tokio::task::spawn_blocking(|| {
        venv("readme::grpcurl_decodes_error_details_through_reflection")
    })
    .await
    .unwrap() else {
        return;
    };
    let binary = tokio::task::spawn_blocking(sessionstore_binary)
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    let lines: String = ["acme", "globex", "initech"]
        .iter()
        .map(|tenant| token_line(tenant, &format!("{tenant}-token")))
        .collect();
    std::fs::write(&tokens, lines).unwrap();
    let mut server = ServerProcess::start(
        &binary,
        "sqlite::memory:",
        "127.0.0.1:0",
        dir.path().join("server.log"),
        &[
            "--auth-tokens",
            tokens.to_str().unwrap(),
            // One call a second per tenant: each tenant below has its own.
            "--max-requests-per-second",
            "1",
        ],
    )
    .await;
    let address = server.listen_address();
    let grpcurl = workspace().join("tests/python/grpcurl.py");
    let call = async |tenant: Option<&str>, data: &str, method: &str| {
        let mut command = tokio::process::Command::new(&python);
        command.arg(&grpcurl).arg("-plaintext").args(["-d", data]);
        if let Some(tenant) = tenant {
            command.args(["-H", &format!("authorization: Bearer {tenant}-token")]);
        }
        let output = command
            .arg(&address)
            .arg(format!("sessionstore.v1.SessionStore/{method}"))
            .output()
            .await
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        assert!(
            !stderr.contains("not recognized") && !stderr.contains("Traceback"),
            "{stderr}"
        );
        (output.status.code(), stderr)
    };

    // Without -H: no tenant. grpcurl's exit code is 64 + the status code.
    let (code, said) = call(None, "{}", "ListSessions").await;
    assert_eq!(code, Some(64 + 16), "{said}");
    assert!(said.contains("Code: Unauthenticated"), "{said}");

    let (code, said) = call(Some("acme"), r#"{"session_id": "ses_none"}"#, "GetSession").await;
    assert_eq!(code, Some(64 + 5), "{said}");
    for part in [
        "Code: NotFound",
        r#""@type": "type.googleapis.com/google.rpc.ErrorInfo""#,
        r#""reason": "SESSION_NOT_FOUND""#,
        r#""session_id": "ses_none""#,
    ] {
        assert!(said.contains(part), "no {part} in:\n{said}");
    }

    let long = format!(r#"{{"session_id": "{}"}}"#, "x".repeat(200));
    let (code, said) = call(Some("globex"), &long, "CreateSession").await;
    assert_eq!(code, Some(64 + 3), "{said}");
    for part in [
        "Code: InvalidArgument",
        r#""@type": "type.googleapis.com/google.rpc.BadRequest""#,
        r#""fieldViolations": ["#,
        r#""field": "session_id""#,
    ] {
        assert!(said.contains(part), "no {part} in:\n{said}");
    }

    // A second call within the second is refused, with a retry delay.
    let mut refused = None;
    for _ in 0..10 {
        let (code, said) = call(Some("initech"), "{}", "ListSessions").await;
        if code != Some(0) {
            refused = Some((code, said));
            break;
        }
    }
    let (code, said) = refused.expect("a tenant over one call a second is refused");
    assert_eq!(code, Some(64 + 8), "{said}");
    for part in [
        "Code: ResourceExhausted",
        r#""reason": "RATE_LIMITED""#,
        r#""@type": "type.googleapis.com/google.rpc.RetryInfo""#,
        r#""retryDelay": "#,
    ] {
        assert!(said.contains(part), "no {part} in:\n{said}");
    }
    assert!(server.terminate().await.success());
}
