//! What a newcomer meets first, run through the real binary: `--version`,
//! shell completions, `sessionstore health`, what `migrate` says, a warning
//! never printed ahead of a fatal error, the per-call debug log line, and a
//! `sessions watch` that says so while the server is away.

use std::process::Stdio;
use std::time::Duration;

use sessionstore_client::v1 as pb;
use tokio::io::{AsyncBufReadExt as _, BufReader, Lines};
use tokio::process::{ChildStderr, ChildStdout, Command};

use crate::support::{Backend, ServerProcess, TestServer, create, sessionstore_binary};

/// Runs the binary with `args`: (exit code, stdout, stderr).
async fn run(args: &[&str]) -> (Option<i32>, String, String) {
    let output = Command::new(sessionstore_binary())
        .args(args)
        .env("NO_COLOR", "1")
        .env_remove("SESSIONSTORE_SERVER")
        .output()
        .await
        .unwrap();
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// The next line that contains `wanted`, within 30 s (earlier lines are
/// returned in the panic message if it never comes).
async fn line_containing<R: tokio::io::AsyncBufRead + Unpin>(
    lines: &mut Lines<R>,
    wanted: &str,
) -> String {
    let mut seen = Vec::new();
    let found = tokio::time::timeout(Duration::from_secs(30), async {
        while let Ok(Some(line)) = lines.next_line().await {
            if line.contains(wanted) {
                return Some(line);
            }
            seen.push(line);
        }
        None
    })
    .await;
    match found {
        Ok(Some(line)) => line,
        _ => panic!("no line with {wanted:?}; got:\n{}", seen.join("\n")),
    }
}

/// A free port on loopback, nobody listening.
fn unused_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[tokio::test]
async fn version_names_the_commit() {
    let (code, out, _) = run(&["--version"]).await;
    assert_eq!(code, Some(0));
    let version = env!("CARGO_PKG_VERSION");
    assert!(out.starts_with(&format!("sessionstore {version}")), "{out}");
    let head = std::process::Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    if head.status.success() {
        let commit = String::from_utf8_lossy(&head.stdout).trim().to_owned();
        assert_eq!(
            out.trim(),
            format!("sessionstore {version} (commit {commit})")
        );
    } else {
        assert_eq!(
            out.trim(),
            format!("sessionstore {version}"),
            "no git: no commit"
        );
    }
}

#[tokio::test]
async fn completions_for_each_shell() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let (code, out, err) = run(&["completions", shell]).await;
        assert_eq!(code, Some(0), "{shell}: {err}");
        for word in ["sessions", "migrate", "health", "database-url"] {
            assert!(out.contains(word), "{shell} completions lack {word}");
        }
    }
    let (code, _, err) = run(&["completions", "tcsh"]).await;
    assert_eq!(code, Some(2), "an unknown shell is a usage error");
    assert!(err.contains("bash"), "the error lists the shells: {err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_exits_zero_only_when_serving() {
    let server = TestServer::start(Backend::File).await;
    let address = server.addr.to_string();
    let (code, out, err) = run(&["health", "--server", &address]).await;
    assert_eq!((code, out.trim()), (Some(0), "SERVING"), "{err}");
    let (code, out, err) = run(&[
        "health",
        "--server",
        &server.endpoint(),
        "--service",
        "sessionstore.v1.SessionStore",
    ])
    .await;
    assert_eq!((code, out.trim()), (Some(0), "SERVING"), "{err}");

    // A service the server does not know: not serving, said in one line.
    let (code, _, err) = run(&["health", "--server", &address, "--service", "nope"]).await;
    assert_eq!(code, Some(1));
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.starts_with("sessionstore: "), "{err}");
    server.stop().await.unwrap();

    // Nobody there: exit 1 and where it looked.
    let port = unused_port();
    let (code, out, err) = run(&["health", "--server", &format!("127.0.0.1:{port}")]).await;
    assert_eq!(code, Some(1));
    assert!(out.is_empty(), "{out}");
    assert!(
        err.starts_with(&format!(
            "sessionstore: cannot reach the server at http://127.0.0.1:{port}"
        )),
        "{err}"
    );
}

#[tokio::test]
async fn migrate_says_what_it_applied_and_where() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/new/dir/s.db", dir.path().display());
    let (code, out, err) = run(&["migrate", "--database-url", &url]).await;
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("created the database's directory"), "{out}");
    assert!(out.contains("directory="), "{out}");
    let applied = out
        .lines()
        .filter(|l| l.contains("applied migration"))
        .count();
    // sqlx's files beside the ledger's (in `ledger/`).
    let sql_files = |dir: &str| {
        std::fs::read_dir(dir).map_or(0, |entries| {
            entries
                .filter(|entry| {
                    entry
                        .as_ref()
                        .is_ok_and(|e| e.path().extension().is_some_and(|x| x == "sql"))
                })
                .count()
        })
    };
    let migrations = sql_files(concat!(env!("CARGO_MANIFEST_DIR"), "/../migrations/sqlite"))
        + sql_files(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../migrations/sqlite/ledger"
        ));
    assert_eq!(
        applied, migrations,
        "one line per migration applied:\n{out}"
    );
    assert!(out.contains("the schema is up to date"), "{out}");

    let (code, out, err) = run(&["migrate", "--database-url", &url]).await;
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("the schema is current"), "{out}");
    assert!(!out.contains("applied migration"), "{out}");
    assert!(!out.contains("created the database's directory"), "{out}");
}

#[tokio::test]
async fn no_warning_before_a_fatal_configuration_error() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.pem");
    let missing = missing.to_str().unwrap();
    let (code, out, err) = run(&[
        "--listen",
        "127.0.0.1:0",
        "--database-url",
        "sqlite::memory:",
        "--tls-cert",
        missing,
        "--tls-key",
        missing,
    ])
    .await;
    assert_eq!(code, Some(1), "{out}{err}");
    let said = format!("{out}{err}");
    assert!(
        said.contains("missing.pem"),
        "the error names the file: {said}"
    );
    assert!(
        !said.contains("WARN"),
        "no warning ahead of the fatal error: {said}"
    );
}

#[tokio::test]
async fn live_run_and_browser_settings_are_checked_at_start() {
    let base = [
        "--listen",
        "127.0.0.1:0",
        "--database-url",
        "sqlite::memory:",
    ];
    for (flags, says) in [
        (
            &["--cors-allowed-origins", "*"][..],
            "--cors-allowed-origins '*' lets any web page call the service: it needs --auth-tokens",
        ),
        (
            &[
                "--cors-allowed-origins",
                "http://ok.example,chat.example.com",
            ][..],
            "\"chat.example.com\" is not an origin (scheme://host[:port]",
        ),
        (
            &["--max-run-output-bytes", "1048576"][..],
            "--max-run-output-bytes must be at least 16777216 (16 MiB)",
        ),
    ] {
        let args: Vec<&str> = base.iter().chain(flags).copied().collect();
        let (code, out, err) = tokio::time::timeout(std::time::Duration::from_secs(60), run(&args))
            .await
            .unwrap_or_else(|_| panic!("{flags:?}: the server started instead of refusing"));
        assert_eq!(code, Some(1), "{flags:?}: {out}{err}");
        assert!(
            format!("{out}{err}").contains(says),
            "{flags:?}: {out}{err}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_call_logs_one_debug_line() {
    let mut child = Command::new(sessionstore_binary())
        .args([
            "--listen",
            "127.0.0.1:0",
            "--database-url",
            "sqlite::memory:",
        ])
        .args(["--log-format", "json"])
        .env("SESSIONSTORE_LOG", "info,sessionstore_server::rpc=debug")
        .env_remove("SESSIONSTORE_AUTH_TOKENS")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let serving = line_containing(&mut lines, "sessionstore serving").await;
    let serving: serde_json::Value = serde_json::from_str(&serving).unwrap();
    let address = serving["address"].as_str().unwrap().to_owned();
    let mut client = crate::support::connect(&format!("http://{address}")).await;
    let missing = client
        .get_session(pb::GetSessionRequest {
            session_id: "ses_nope".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(missing.code(), tonic::Code::NotFound);

    let line = line_containing(&mut lines, "sessionstore_server::rpc").await;
    let event: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(event["level"], "DEBUG", "{line}");
    let fields = &event;
    assert_eq!(
        fields["method"], "sessionstore.v1.SessionStore/GetSession",
        "{line}"
    );
    assert_eq!(fields["session_id"], "ses_nope", "{line}");
    assert_eq!(fields["code"], "NotFound", "{line}");
    assert!(fields["duration"].is_string(), "{line}");
    child.kill().await.unwrap();
}

/// Reads `sessions watch`'s stdout and stderr.
struct Tail {
    out: Lines<BufReader<ChildStdout>>,
    err: Lines<BufReader<ChildStderr>>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_says_reconnecting_while_the_server_is_away() {
    let binary = sessionstore_binary();
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/tail.db", dir.path().display());
    let mut server =
        ServerProcess::start(&binary, &url, "127.0.0.1:0", dir.path().join("1.log"), &[]).await;
    let mut client = crate::support::connect(&server.endpoint()).await;
    create(&mut client, "tail").await;

    let mut watch = Command::new(&binary)
        .args([
            "sessions",
            "--server",
            &server.listen_address(),
            "watch",
            "tail",
        ])
        .env("NO_COLOR", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut tail = Tail {
        out: BufReader::new(watch.stdout.take().unwrap()).lines(),
        err: BufReader::new(watch.stderr.take().unwrap()).lines(),
    };
    line_containing(&mut tail.out, "caught_up").await;
    client
        .set_state(pb::SetStateRequest {
            session_id: "tail".into(),
            key: "cwd".into(),
            value: "/home/agent".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let changed = line_containing(&mut tail.out, "state_changed").await;
    assert!(
        changed.ends_with("state_changed  cwd = /home/agent"),
        "{changed}"
    );

    assert!(server.terminate().await.success());
    line_containing(&mut tail.err, "reconnecting…").await;

    let listen = server.listen_address();
    let server = ServerProcess::start(&binary, &url, &listen, dir.path().join("2.log"), &[]).await;
    let mut client = crate::support::connect(&server.endpoint()).await;
    let said = line_containing(&mut tail.err, "reconnected").await;
    assert!(said.contains("after revision 2"), "{said}");
    client
        .delete_state(pb::DeleteStateRequest {
            session_id: "tail".into(),
            key: "cwd".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let deleted = line_containing(&mut tail.out, "state_changed").await;
    assert!(deleted.ends_with("state_changed  cwd deleted"), "{deleted}");
    watch.kill().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_or_wrong_token_names_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, crate::support::token_line("acme", "right")).unwrap();
    let server = TestServer::start_on(crate::support::Storage::new(Backend::Memory).await, {
        let tokens = tokens.clone();
        move |config| config.auth_tokens = Some(tokens)
    })
    .await;
    let address = server.addr.to_string();
    let (code, _, err) = run(&["sessions", "--server", &address, "list"]).await;
    assert_eq!(code, Some(1));
    assert_eq!(
        err,
        format!(
            "sessionstore: the server at http://{address} wants a bearer token: pass --token TOKEN (or set SESSIONSTORE_TOKEN)\n"
        )
    );
    let (code, _, err) = run(&["sessions", "--server", &address, "--token", "wrong", "list"]).await;
    assert_eq!(code, Some(1));
    assert_eq!(
        err,
        format!(
            "sessionstore: the server at http://{address} refused the bearer token: check --token (or SESSIONSTORE_TOKEN)\n"
        )
    );
    let (code, out, err) =
        run(&["sessions", "--server", &address, "--token", "right", "list"]).await;
    assert_eq!(
        (code, out.trim()),
        (
            Some(0),
            "ID  TITLE  USER  MESSAGES  COST  UPDATED\n(no sessions)"
        ),
        "{err}"
    );
    server.stop().await.unwrap();
}
