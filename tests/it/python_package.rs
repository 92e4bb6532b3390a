//! The Python client package (`python/`, distribution `sessionstore-client`)
//! installs with pip and passes its own pytest suite against the real
//! `sessionstore` binary: plain, with bearer tokens, behind TLS, across
//! server restarts, sync and asyncio, and with the RPCs each framework
//! call costs counted by the server's own metrics (`--metrics-listen`,
//! `grpc_server_handled_total`). It does so twice: with the newest
//! releases its ranges allow (the frameworks' own session suites run there
//! too), and with the oldest (`python/constraints-oldest.txt`), so the
//! floors `pyproject.toml` declares (but the `suites` tools') are tested
//! floors. The virtualenvs
//! live in the target directory beside the generated-client test's, and
//! are made once (the oldest ones again when the constraints or
//! `pyproject.toml` change). Without Python (with venv) the tests fail,
//! saying to run `.ci/python.sh`, unless `SESSIONSTORE_TEST_SKIP` names
//! `python` (`support::prereq`).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use sha2::{Digest, Sha256};

use crate::support::sessionstore_binary;

fn said(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

fn run(command: &mut Command, what: &str) {
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("cannot run {what}: {e}"));
    assert!(output.status.success(), "{what} failed:\n{}", said(&output));
}

/// The package's virtualenv (`python-package` under the target directory),
/// or `None` (said loudly) without python3 unless Python is required.
fn venv() -> Option<PathBuf> {
    venv_at(&Path::new(env!("CARGO_TARGET_TMPDIR")).join("python-package"))
}

/// A virtualenv at `root` (made if it is not there), as [`venv`].
fn venv_at(root: &Path) -> Option<PathBuf> {
    let python = root.join("bin/python");
    if python.exists() {
        return Some(python);
    }
    if !crate::python::have_python() {
        crate::support::prereq::missing(
            crate::support::prereq::Prerequisite::Python,
            &crate::support::prereq::current_test(),
            "python3 with venv is not installed",
        );
        return None;
    }
    let _ = std::fs::remove_dir_all(root);
    run(
        Command::new("python3").args(["-m", "venv"]).arg(root),
        "python3 -m venv",
    );
    Some(python)
}

/// Copies a file, or a directory without its `__pycache__`s.
fn copy(from: &Path, to: &Path) {
    if from.is_dir() {
        std::fs::create_dir_all(to).unwrap();
        for entry in std::fs::read_dir(from).unwrap() {
            let entry = entry.unwrap();
            if entry.file_name() != "__pycache__" {
                copy(&entry.path(), &to.join(entry.file_name()));
            }
        }
    } else {
        std::fs::copy(from, to).unwrap_or_else(|e| panic!("copy {}: {e}", from.display()));
    }
}

/// `python/`.
fn package() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../python")
}

/// The package as pip is to install it: a clean copy of `package`. It is
/// installed as a user would, from a copy (pip builds in the tree it is
/// given, and a stale build/ could leak old files into the wheel), and
/// never imported from the source tree: pytest runs from a directory of
/// its own, in importlib mode (see [`pytest`]).
fn clean_copy(package: &Path) -> tempfile::TempDir {
    let source = tempfile::tempdir().unwrap();
    for entry in ["pyproject.toml", "README.md", "sessionstore"] {
        copy(&package.join(entry), &source.path().join(entry));
    }
    source
}

/// `python -m pip install --quiet`, for the caller to add what to install.
fn pip_install(python: &Path) -> Command {
    let mut pip = Command::new(python);
    pip.args([
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
    ]);
    pip
}

/// The suites of `python/framework_suites/`: each directory's pins
/// (`requirements.txt`) and the scripts it runs (`run.py`, `smoke.py`).
fn suites(package: &Path) -> Vec<(PathBuf, Vec<PathBuf>)> {
    let mut suites: Vec<_> = std::fs::read_dir(package.join("framework_suites"))
        .map(|entries| entries.filter_map(|e| e.ok()).map(|e| e.path()).collect())
        .unwrap_or_default();
    suites.sort();
    suites
        .into_iter()
        .filter(|dir| dir.is_dir())
        .map(|dir| {
            let scripts = ["run.py", "smoke.py"]
                .iter()
                .map(|name| dir.join(name))
                .filter(|script| script.exists())
                .collect();
            (dir, scripts)
        })
        .collect()
}

/// The package's virtualenv with `python/` installed, with its extras (the
/// framework adapters' frameworks, at the suites' pinned versions): made
/// and installed once per test run, whichever test gets here first.
fn installed() -> Option<PathBuf> {
    static INSTALLED: std::sync::Mutex<Option<PathBuf>> = std::sync::Mutex::new(None);
    let mut installed = INSTALLED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(python) = &*installed {
        return Some(python.clone());
    }
    let python = venv()?;
    let package = package();
    let source = clean_copy(&package);
    let mut pip = pip_install(&python);
    pip.arg(format!(
        "{}[test,openai-agents,adk,langchain,suites]",
        source.path().display()
    ));
    for (dir, _) in suites(&package) {
        let pins = dir.join("requirements.txt");
        if pins.exists() {
            pip.arg("-r").arg(pins);
        }
    }
    run(&mut pip, "pip install ./python with its extras");
    *installed = Some(python.clone());
    Some(python)
}

/// The server binary, built (or found fresh) once for the tests here.
fn binary() -> PathBuf {
    static BINARY: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BINARY.get_or_init(sessionstore_binary).clone()
}

/// What a Python process said, and whether it succeeded.
fn python_run(python: &Path, args: &[&std::ffi::OsStr]) -> (bool, String) {
    let cwd = tempfile::tempdir().unwrap();
    let output = Command::new(python)
        .args(args)
        .current_dir(cwd.path())
        .env("SESSIONSTORE_BIN", binary())
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env_remove("SESSIONSTORE_AUTH_TOKENS")
        .output()
        .expect("run python");
    (output.status.success(), said(&output))
}

/// Runs pytest in `python` on `args` (test paths, `--ignore=`s), and
/// asserts every test ran and passed. Answers pytest's summary line.
fn pytest(python: &Path, args: &[std::ffi::OsString]) -> String {
    // importlib: pytest's default import mode would put `python/` (the
    // directory above the tests' package) first on sys.path, so the tests
    // would import the source tree's `sessionstore`, not the one installed.
    let mut argv: Vec<&std::ffi::OsStr> = [
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        "--import-mode=importlib",
        "-q",
        "-rfEs",
    ]
    .iter()
    .map(|arg| arg.as_ref())
    .collect();
    argv.extend(args.iter().map(|arg| arg.as_os_str()));
    let (passed, said) = python_run(python, &argv);
    assert!(passed, "pytest failed:\n{said}");
    let summary = said
        .lines()
        .rev()
        .find(|line| line.contains(" passed"))
        .unwrap_or_default();
    assert!(
        !summary.contains("skipped") && !summary.contains("failed"),
        "the Python tests must all run and pass:\n{said}"
    );
    summary.to_owned()
}

#[test]
fn python_package_passes_its_tests() {
    let Some(python) = installed() else {
        return;
    };
    let tests = package().join("tests");
    println!("{}", pytest(&python, &[tests.into_os_string()]));
}

/// Per extra of `pyproject.toml`, what runs in its oldest virtualenv: the
/// adapter's tests (under `python/tests/`), and with the first, the
/// package's own tests (everything outside `integrations/`), whose floors
/// (grpcio, protobuf, googleapis-common-protos, the `test` extra) every
/// oldest virtualenv holds alike.
const OLDEST: [(&str, &str); 3] = [
    ("openai-agents", "integrations/test_openai_agents.py"),
    ("adk", "integrations/test_adk.py"),
    ("langchain", "integrations/test_langchain.py"),
];

/// The oldest virtualenv of `extra`: `python/` installed with the `test`
/// extra and `extra` under `python/constraints-oldest.txt` (the floors of
/// `pyproject.toml`'s ranges). One per extra, as the extras' floors need
/// different versions of what they share (see the constraints file). The
/// directory is named after a digest of the constraints, `pyproject.toml`
/// and `extra`, so a change to either makes a new one; it is made once,
/// and the package alone is reinstalled when its files change.
fn oldest(extra: &str) -> Option<PathBuf> {
    let package = package();
    let constraints = package.join("constraints-oldest.txt");
    let mut key = Sha256::new();
    for file in [&constraints, &package.join("pyproject.toml")] {
        digest_file(&mut key, file);
    }
    key.update(extra.as_bytes());
    let key = hex(&key.finalize()[..8]);
    let prefix = format!("python-oldest-{extra}-");
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    // Older keys' virtualenvs are of no more use.
    for entry in std::fs::read_dir(tmp).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with(&prefix) && name != format!("{prefix}{key}") {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
    let root = tmp.join(format!("{prefix}{key}"));
    // What `root` holds, once made: the digest of the package's files.
    let stamp = root.join(".installed");
    let installed = std::fs::read_to_string(&stamp).ok();
    if installed.is_none() {
        let _ = std::fs::remove_dir_all(&root);
    }
    let python = venv_at(&root)?;
    let mut files = Sha256::new();
    for entry in ["pyproject.toml", "README.md", "sessionstore"] {
        digest_tree(&mut files, &package.join(entry));
    }
    let files = hex(&files.finalize());
    if installed.as_deref() == Some(files.as_str()) {
        return Some(python);
    }
    let source = clean_copy(&package);
    let mut pip = pip_install(&python);
    if installed.is_some() {
        // The key says the rest is as it was: only the package changed.
        pip.args(["--no-deps", "--force-reinstall"])
            .arg(source.path());
    } else {
        pip.arg("-c")
            .arg(&constraints)
            .arg(format!("{}[test,{extra}]", source.path().display()));
    }
    run(
        &mut pip,
        &format!("pip install ./python[test,{extra}] at the oldest releases"),
    );
    std::fs::write(&stamp, files).unwrap();
    Some(python)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

fn digest_file(digest: &mut Sha256, file: &Path) {
    let bytes = std::fs::read(file).unwrap_or_else(|e| panic!("read {}: {e}", file.display()));
    digest.update((bytes.len() as u64).to_le_bytes());
    digest.update(&bytes);
}

/// Adds a file, or a directory's files (without `__pycache__`s) with their
/// names, in a stable order.
fn digest_tree(digest: &mut Sha256, path: &Path) {
    if path.is_dir() {
        let mut entries: Vec<_> = std::fs::read_dir(path)
            .unwrap()
            .filter_map(|entry| entry.ok())
            .filter(|entry| entry.file_name() != "__pycache__")
            .collect();
        entries.sort_by_key(|entry| entry.file_name());
        for entry in entries {
            digest.update(entry.file_name().as_encoded_bytes());
            digest.update([0]);
            digest_tree(digest, &entry.path());
        }
    } else {
        digest_file(digest, path);
    }
}

/// The package's tests with the oldest releases each range of
/// `pyproject.toml` allows: for each extra, its adapter's tests in a
/// virtualenv of its own (see [`OLDEST`]).
#[test]
fn python_package_passes_its_tests_at_the_oldest_releases() {
    let tests = package().join("tests");
    // Every adapter's tests are in the table.
    let mut adapters: Vec<String> = std::fs::read_dir(tests.join("integrations"))
        .unwrap()
        .filter_map(|entry| entry.ok())
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with("test_") && name.ends_with(".py"))
        .map(|name| format!("integrations/{name}"))
        .collect();
    adapters.sort();
    let mut listed: Vec<String> = OLDEST.iter().map(|(_, file)| file.to_string()).collect();
    listed.sort();
    assert_eq!(adapters, listed, "OLDEST must list every adapter's tests");
    if !crate::python::have_python() {
        crate::support::prereq::missing(
            crate::support::prereq::Prerequisite::Python,
            &crate::support::prereq::current_test(),
            "python3 with venv is not installed",
        );
        return;
    }
    // Made side by side (the first time, each is minutes of pip).
    let pythons: Vec<PathBuf> = std::thread::scope(|scope| {
        let making: Vec<_> = OLDEST
            .iter()
            .map(|(extra, _)| scope.spawn(move || oldest(extra)))
            .collect();
        making
            .into_iter()
            .map(|made| {
                made.join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
                    .expect("python3 with venv is here")
            })
            .collect()
    });
    for (index, ((extra, file), python)) in OLDEST.iter().zip(&pythons).enumerate() {
        let args: Vec<std::ffi::OsString> = if index == 0 {
            // The package's own tests and this adapter's: all but the
            // other adapters'.
            std::iter::once(tests.clone().into_os_string())
                .chain(
                    OLDEST
                        .iter()
                        .filter(|(_, other)| other != file)
                        .map(|(_, other)| {
                            format!("--ignore={}", tests.join(other).display()).into()
                        }),
                )
                .collect()
        } else {
            vec![tests.join(file).into_os_string()]
        };
        println!("oldest {extra}: {}", pytest(python, &args));
    }
}

/// The frameworks' own session test suites, run against a real server
/// through the adapters (`python/framework_suites/*/run.py`, which fetch
/// the pinned framework release's tests from PyPI), and the smoke tests
/// against the frameworks' newest releases (`smoke.py`).
#[test]
fn framework_suites_pass_against_the_adapters() {
    let Some(python) = installed() else {
        return;
    };
    let suites = suites(&package());
    assert!(!suites.is_empty(), "no framework suites found");
    for (dir, scripts) in suites {
        assert!(!scripts.is_empty(), "{} has nothing to run", dir.display());
        for script in scripts {
            let (passed, said) = python_run(&python, &[script.as_os_str()]);
            assert!(passed, "{} failed:\n{said}", script.display());
            let summary = said.lines().rev().find(|line| !line.trim().is_empty());
            println!("{}: {}", script.display(), summary.unwrap_or_default());
        }
    }
}
