//! The proto stays usable outside Rust: a Python client generated from
//! `proto/` with grpcio-tools runs a short scenario against a real server.
//! The virtualenv lives in the target directory and is made once. Without
//! Python (with venv) the test fails, saying to run `.ci/python.sh`, unless
//! `SESSIONSTORE_TEST_SKIP` names `python` (`support::prereq`).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, PoisonError};

use crate::support::{Backend, TestServer};

/// What the virtualenv holds: the generated client's needs, and
/// grpcio-reflection for the README's grpcurl stand-in
/// (`tests/python/grpcurl.py`, run by `readme.rs`).
const PACKAGES: [&str; 4] = [
    "grpcio>=1.60,<2",
    "grpcio-tools>=1.60,<2",
    "googleapis-common-protos>=1.60,<2",
    "grpcio-reflection>=1.60,<2",
];

fn run(command: &mut Command, what: &str) {
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("cannot run {what}: {e}"));
    assert!(
        output.status.success(),
        "{what} failed:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

fn pip_install(python: &Path, packages: &[&str]) {
    run(
        Command::new(python)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
            ])
            .args(packages),
        &format!("pip install {}", packages.join(" ")),
    );
}

/// The venv's python, with `PACKAGES` installed: made once, and given what
/// `PACKAGES` gained since it was made. Without python3 it is `None`, said
/// as a skip of `skipped` (what the caller will not run) if
/// `SESSIONSTORE_TEST_SKIP` names `python`; otherwise the test fails.
/// Whether `python3` with `venv` is here.
pub fn have_python() -> bool {
    Command::new("python3")
        .args(["-c", "import venv, ensurepip"])
        .output()
        .is_ok_and(|o| o.status.success())
}

pub fn venv(skipped: &str) -> Option<PathBuf> {
    venv_named("python-grpc", skipped)
}

/// As [`venv`], in a virtualenv of its own named `name` under the target
/// directory (a test that installs more into it keeps the others' as
/// they are).
pub fn venv_named(name: &str, skipped: &str) -> Option<PathBuf> {
    venv_with(name, &PACKAGES, skipped)
}

/// A virtualenv of its own named `name` under the target directory with
/// `packages` installed (pip requirement specifiers): made once, and given
/// what the list gained since it was made. Without python3 as [`venv`].
pub fn venv_with(name: &str, packages: &[&str], skipped: &str) -> Option<PathBuf> {
    // Tests run in parallel: one of them makes the venv, the others wait.
    static MAKING: Mutex<()> = Mutex::new(());
    let _making = MAKING.lock().unwrap_or_else(PoisonError::into_inner);
    let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let python = root.join("bin/python");
    let ready = root.join(".installed");
    let wanted = packages.join("\n");
    match std::fs::read_to_string(&ready) {
        Ok(installed) if installed == wanted => return Some(python),
        Ok(_) if python.exists() => {
            // Made with an older list: install what is missing.
            pip_install(&python, packages);
            std::fs::write(&ready, &wanted).unwrap();
            return Some(python);
        }
        _ => {}
    }
    if !have_python() {
        crate::support::prereq::missing(
            crate::support::prereq::Prerequisite::Python,
            skipped,
            "python3 with venv is not installed",
        );
        return None;
    }
    let _ = std::fs::remove_dir_all(&root);
    run(
        Command::new("python3").args(["-m", "venv"]).arg(&root),
        "python3 -m venv",
    );
    pip_install(&python, packages);
    std::fs::write(&ready, &wanted).unwrap();
    Some(python)
}

#[tokio::test]
async fn generated_python_client_runs_a_scenario() {
    let Some(python) = tokio::task::spawn_blocking(|| {
        venv("python::generated_python_client_runs_a_scenario (the proto checked from Python)")
    })
    .await
    .unwrap() else {
        return;
    };
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let generated = tempfile::tempdir().unwrap();
    run(
        Command::new(&python)
            .args(["-m", "grpc_tools.protoc", "-I"])
            .arg(workspace.join("proto"))
            .arg(format!("--python_out={}", generated.path().display()))
            .arg(format!("--grpc_python_out={}", generated.path().display()))
            .args([
                "sessionstore/v1/messages.proto",
                "sessionstore/v1/sessionstore.proto",
            ]),
        "grpc_tools.protoc",
    );

    let server = TestServer::start(Backend::Memory).await;
    let address = server.addr.to_string();
    let scenario = workspace.join("tests/python/scenario.py");
    let output = tokio::process::Command::new(&python)
        .arg(&scenario)
        .arg(generated.path())
        .arg(&address)
        .output()
        .await
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        output.status.success(),
        "the Python scenario failed:\n{said}"
    );
    assert!(said.contains("python scenario ok"), "{said}");
    server.stop().await.unwrap();
}
