//! The Python client package (`python/`, distribution `sessionstore-client`)
//! installs with pip and passes its own pytest suite against the real
//! `sessionstore` binary: plain, with bearer tokens, behind TLS, across
//! server restarts, sync and asyncio. The virtualenv lives in the target
//! directory beside the generated-client test's, and is made once. Without
//! Python (with venv) the test fails, saying to run `.ci/python.sh`, unless
//! `SESSIONSTORE_TEST_SKIP` names `python` (`support::prereq`).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

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
    let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join("python-package");
    let python = root.join("bin/python");
    if python.exists() {
        return Some(python);
    }
    if !crate::python::have_python() {
        crate::support::prereq::missing(
            crate::support::prereq::Prerequisite::Python,
            "python_package::python_package_passes_its_tests",
            "python3 with venv is not installed",
        );
        return None;
    }
    let _ = std::fs::remove_dir_all(&root);
    run(
        Command::new("python3").args(["-m", "venv"]).arg(&root),
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
    let package = Path::new(env!("CARGO_MANIFEST_DIR")).join("../python");
    // Installed as a user would, from a clean copy (pip builds in the tree
    // it is given, and a stale build/ could leak old files into the wheel),
    // and never imported from the source tree: pytest runs from a
    // directory of its own.
    let source = tempfile::tempdir().unwrap();
    for entry in ["pyproject.toml", "README.md", "sessionstore"] {
        copy(&package.join(entry), &source.path().join(entry));
    }
    let mut pip = Command::new(&python);
    pip.args([
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
    ])
    .arg(format!(
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

/// What a Python process said, and whether it succeeded.
fn python_run(python: &Path, args: &[&std::ffi::OsStr]) -> (bool, String) {
    let cwd = tempfile::tempdir().unwrap();
    let output = Command::new(python)
        .args(args)
        .current_dir(cwd.path())
        .env("SESSIONSTORE_BIN", sessionstore_binary())
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env_remove("SESSIONSTORE_AUTH_TOKENS")
        .output()
        .expect("run python");
    (output.status.success(), said(&output))
}

#[test]
fn python_package_passes_its_tests() {
    let Some(python) = installed() else {
        return;
    };
    let tests = Path::new(env!("CARGO_MANIFEST_DIR")).join("../python/tests");
    let (passed, said) = python_run(
        &python,
        &[
            "-m".as_ref(),
            "pytest".as_ref(),
            "-p".as_ref(),
            "no:cacheprovider".as_ref(),
            "-q".as_ref(),
            "-rfEs".as_ref(),
            tests.as_os_str(),
        ],
    );
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
    println!("{summary}");
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
    let package = Path::new(env!("CARGO_MANIFEST_DIR")).join("../python");
    let suites = suites(&package);
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
