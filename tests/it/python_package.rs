//! The Python client package (`python/`, distribution `sessionstore-client`)
//! installs with pip and passes its own pytest suite against the real
//! `sessionstore` binary: plain, with bearer tokens, behind TLS, across
//! server restarts, sync and asyncio. The virtualenv lives in the target
//! directory beside the generated-client test's, and is made once. Without
//! Python the test says loudly that it was skipped, unless
//! `SESSIONSTORE_REQUIRE_PYTHON` is set (as `.ci/run` does): then it fails.

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
    let have_python = Command::new("python3")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !have_python {
        if std::env::var_os("SESSIONSTORE_REQUIRE_PYTHON").is_some() {
            panic!("python3 is required (SESSIONSTORE_REQUIRE_PYTHON) but not found");
        }
        eprintln!(
            "\n!!! SKIPPED python_package::python_package_passes_its_tests: no python3.\n\
             !!! Install Python 3 with venv to run it.\n"
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

#[test]
fn python_package_passes_its_tests() {
    let Some(python) = venv() else {
        return;
    };
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let package = workspace.join("python");
    // Installed as a user would, from a clean copy (pip builds in the tree
    // it is given, and a stale build/ could leak old files into the wheel),
    // and never imported from the source tree: pytest runs from a
    // directory of its own.
    let source = tempfile::tempdir().unwrap();
    for entry in ["pyproject.toml", "README.md", "sessionstore"] {
        copy(&package.join(entry), &source.path().join(entry));
    }
    run(
        Command::new(&python)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
            ])
            .arg(format!("{}[test]", source.path().display())),
        "pip install ./python[test]",
    );
    let binary = sessionstore_binary();
    let cwd = tempfile::tempdir().unwrap();
    let output = Command::new(&python)
        .args(["-m", "pytest", "-p", "no:cacheprovider", "-q", "-rfEs"])
        .arg(package.join("tests"))
        .current_dir(cwd.path())
        .env("SESSIONSTORE_BIN", &binary)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env_remove("SESSIONSTORE_AUTH_TOKENS")
        .output()
        .expect("run pytest");
    let said = said(&output);
    assert!(output.status.success(), "pytest failed:\n{said}");
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
