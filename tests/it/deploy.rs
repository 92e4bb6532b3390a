//! The deployment files in `deploy/`, used as a user would: the container
//! image built and run with podman (FROM scratch: no registry needed), and
//! the systemd unit checked by `systemd-analyze verify`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::support::{poll_until, sessionstore_binary};

fn deploy_dir() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy"))
}

/// Runs `program` and returns its exit code and what it printed.
fn run(command: &mut Command) -> (Option<i32>, String) {
    let output = command.output().expect("run a command");
    let said = String::from_utf8_lossy(&output.stdout).into_owned()
        + &String::from_utf8_lossy(&output.stderr);
    (output.status.code(), said)
}

fn have(program: &str) -> bool {
    Command::new(program)
        .arg("--version")
        .output()
        .is_ok_and(|output| output.status.success())
}

/// podman as this test runs it. The flags are for machines without
/// systemd or a cgroup v2 hierarchy of their own (a sandbox, a CI runner):
/// runc rather than crun, cgroupfs, and file and process limits no higher
/// than the caller's.
fn podman() -> Command {
    let mut command = Command::new("podman");
    command.args(["--runtime", "runc", "--cgroup-manager", "cgroupfs"]);
    command
}

/// A container, removed (and its image) when dropped.
struct Container {
    name: String,
    image: String,
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = podman().args(["rm", "-f", &self.name]).output();
        let _ = podman().args(["rmi", "-f", &self.image]).output();
    }
}

/// The CLI against the container's published port, with the test's token.
fn cli(binary: &Path, port: u16, args: &[&str]) -> (Option<i32>, String) {
    run(Command::new(binary)
        .args(["sessions", "--server", &format!("http://127.0.0.1:{port}")])
        .args(["--token", "container-test"])
        .args(args))
}

async fn wait_healthy(binary: &Path, container: &str, port: u16) {
    poll_until(
        "the container's HEALTHCHECK and `sessionstore health` from outside",
        Duration::from_secs(60),
        || async {
            let (inside, _) = run(podman().args(["healthcheck", "run", container]));
            let (outside, said) = run(Command::new(binary).args([
                "health",
                "--server",
                &format!("http://127.0.0.1:{port}"),
            ]));
            (inside == Some(0) && outside == Some(0) && said.contains("SERVING")).then_some(())
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_image_serves_and_keeps_its_data_across_a_restart() {
    // Without podman and runc the test fails, unless `SESSIONSTORE_TEST_SKIP`
    // names `container`: then it is skipped, saying so.
    let missing = tokio::task::spawn_blocking(crate::support::prereq::container_missing)
        .await
        .expect("probe podman");
    if let Some(missing) = missing {
        crate::support::prereq::missing(
            crate::support::prereq::Prerequisite::Container,
            "deploy::the_image_serves_and_keeps_its_data_across_a_restart",
            &missing,
        );
        return;
    }
    let binary = sessionstore_binary();
    let dir = tempfile::tempdir().unwrap();
    let context = dir.path().join("context");
    let (code, said) = run(Command::new(deploy_dir().join("container/stage.sh"))
        .arg(&binary)
        .arg(context.join("root")));
    assert_eq!(code, Some(0), "stage.sh failed: {said}");
    std::fs::copy(
        deploy_dir().join("container/Containerfile"),
        context.join("Containerfile"),
    )
    .unwrap();
    let name = format!("sessionstore-it-{}", std::process::id());
    let container = Container {
        name: name.clone(),
        image: format!("localhost/{name}:test"),
    };
    let (code, said) = run(podman()
        .args(["build", "-q", "--format", "docker", "-t", &container.image])
        .arg(&context));
    assert_eq!(code, Some(0), "podman build failed: {said}");

    // The data directory, owned by the image's user (65532), and a token.
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let (code, said) = run(Command::new("chown").arg("65532:65532").arg(&data));
    assert_eq!(code, Some(0), "chown of the data directory: {said}");
    let secrets = dir.path().join("secrets");
    std::fs::create_dir(&secrets).unwrap();
    std::fs::write(
        secrets.join("tokens"),
        crate::support::token_line("default", "container-test"),
    )
    .unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .unwrap()
        .port();
    let (code, said) = run(podman()
        .args(["run", "-d", "--name", &name])
        .args([
            "--ulimit",
            "nofile=4096:4096",
            "--ulimit",
            "nproc=4096:4096",
        ])
        .args(["-p", &format!("127.0.0.1:{port}:50051")])
        .arg("-v")
        .arg(format!("{}:/data", data.display()))
        .arg("-v")
        .arg(format!("{}:/run/secrets:ro", secrets.display()))
        .args(["-e", "SESSIONSTORE_AUTH_TOKENS=/run/secrets/tokens"])
        .arg(&container.image));
    assert_eq!(code, Some(0), "podman run failed: {said}");
    wait_healthy(&binary, &name, port).await;

    // A first exchange, stored with the CLI from outside.
    let (code, session) = cli(&binary, port, &["create"]);
    assert_eq!(code, Some(0), "{session}");
    let session = session.trim().to_owned();
    assert!(session.starts_with("ses_"), "{session}");
    let (code, said) = cli(
        &binary,
        port,
        &[
            "append",
            &session,
            "--user",
            "hello from outside the container",
            "--assistant",
            "hello back",
            "--model",
            "openai/gpt-4o",
        ],
    );
    assert_eq!(code, Some(0), "{said}");

    // Restarted, it serves the same data from its volume.
    let (code, said) = run(podman().args(["restart", &name]));
    assert_eq!(code, Some(0), "podman restart failed: {said}");
    wait_healthy(&binary, &name, port).await;
    let (code, shown) = cli(&binary, port, &["show", &session]);
    assert_eq!(code, Some(0), "{shown}");
    assert!(
        shown.contains("hello from outside the container"),
        "{shown}"
    );
    assert!(shown.contains("hello back"), "{shown}");
    assert!(
        data.join("sessionstore.db").exists(),
        "the database lives in the /data volume"
    );
    let (_, logs) = run(podman().args(["logs", &name]));
    assert!(logs.contains("\"level\":\"INFO\""), "JSON logs: {logs}");
}

#[test]
fn the_systemd_unit_verifies() {
    assert!(
        have("systemd-analyze"),
        "systemd-analyze is needed to check deploy/sessionstore.service: install Debian's systemd"
    );
    // The unit as shipped names /usr/local/bin/sessionstore; verified with
    // the binary the tests build at that place in the unit.
    let unit = std::fs::read_to_string(deploy_dir().join("sessionstore.service")).unwrap();
    assert!(unit.contains("ExecStart=/usr/local/bin/sessionstore serve"));
    for hardening in [
        "DynamicUser=yes",
        "StateDirectory=sessionstore",
        "ProtectSystem=strict",
        "NoNewPrivileges=yes",
        "Restart=on-failure",
    ] {
        assert!(unit.contains(hardening), "{hardening}");
    }
    let binary = sessionstore_binary();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sessionstore.service");
    std::fs::write(
        &path,
        unit.replace("/usr/local/bin/sessionstore", &binary.display().to_string()),
    )
    .unwrap();
    let (code, said) = run(Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(&path));
    assert_eq!(code, Some(0), "systemd-analyze verify: {said}");
    assert!(
        said.trim().is_empty(),
        "systemd-analyze verify said: {said}"
    );
}
