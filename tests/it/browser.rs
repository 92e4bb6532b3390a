//! The server from a browser: gRPC-Web and CORS on the one listener.
//!
//! `web_chat_in_chromium` builds the web example (`examples/web-chat`, with
//! npm, when `dist/` is missing or older than its sources), serves its
//! `dist/` from a small static server on a port of its own, and runs its
//! driver (`test/drive.mjs`): headless Chromium (Debian's, never a
//! downloaded one) loads the page with a bearer token, creates a session,
//! appends, follows the demo producer's answer live, is reloaded mid-answer
//! and resumes from its cursor, and a second tab stops the run; the same
//! page from an origin the server does not allow is refused. Then both tabs
//! open a second session for the run control plane: the producer's run asks
//! for approval of a tool call, both tabs show it pending, the first
//! approves and the second shows it approved; during the next run the first
//! tab types two messages (shown queued, in order, in both tabs) and a
//! third that the second tab withdraws, and the run ends taking the two in
//! order into both transcripts. The stored answers, approvals, queue and
//! event logs are then read back with the Rust client.
//! Without Chromium or Node.js it fails, saying to run `.ci/browser.sh`,
//! unless `SESSIONSTORE_TEST_SKIP` names `browser` (`support::prereq`).
//!
//! `cors_preflight_allows_listed_origins_only` needs no browser: raw
//! HTTP/1.1 preflights and gRPC-Web requests with an `Origin`; nor does
//! `export_history_over_grpc_web`, a raw gRPC-Web ExportHistory.

use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use sessionstore_client::v1 as pb;
use sessionstore_client::v1::session_event::Event;

use crate::support::{Backend, Storage, TestServer, authed, event_kind, next_event, token_line};

const TOKEN: &str = "web-chat-token";

/// How long the whole browser scenario may take (it takes seconds).
const DRIVE_DEADLINE: Duration = Duration::from_secs(180);

fn example() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/web-chat")
}

fn chromium() -> PathBuf {
    std::env::var_os("CHROMIUM").map_or_else(|| PathBuf::from("/usr/bin/chromium"), PathBuf::from)
}

fn said(output: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

fn npm(args: &[&str]) {
    let output = Command::new("npm")
        .args(args)
        .current_dir(example())
        .output()
        .unwrap_or_else(|e| panic!("cannot run npm {}: {e}", args.join(" ")));
    assert!(
        output.status.success(),
        "npm {} in examples/web-chat failed:\n{}",
        args.join(" "),
        said(&output)
    );
}

fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

/// The newest modification time of the files under `path` (or of `path`),
/// leaving out `skip`.
fn newest(path: &Path, skip: &Path) -> Option<SystemTime> {
    if path == skip {
        return None;
    }
    if !path.is_dir() {
        return modified(path);
    }
    std::fs::read_dir(path)
        .ok()?
        .filter_map(|entry| entry.ok())
        .filter_map(|entry| newest(&entry.path(), skip))
        .max()
}

/// `npm ci` if `node_modules` was not installed from this lockfile, and
/// `npm run build` if `dist/` is older than the page's sources or the
/// protos: once per test run.
fn build_example() {
    static BUILT: Mutex<bool> = Mutex::new(false);
    let mut built = BUILT.lock().unwrap_or_else(PoisonError::into_inner);
    if *built {
        return;
    }
    let dir = example();
    // As .ci/browser.sh does: npm ci again only when the lockfile changed.
    let lockfile = dir.join("package-lock.json");
    let stamp = dir.join("node_modules/.installed-from-lockfile");
    if std::fs::read(&lockfile).ok() != std::fs::read(&stamp).ok() {
        npm(&["ci", "--no-audit", "--no-fund"]);
        std::fs::copy(&lockfile, &stamp).unwrap();
    }
    let generated = dir.join("src/gen");
    let sources = [
        dir.join("package.json"),
        dir.join("package-lock.json"),
        dir.join("buf.gen.yaml"),
        dir.join("tsconfig.json"),
        dir.join("index.html"),
        dir.join("style.css"),
        dir.join("src"),
        dir.join("../../proto"),
    ]
    .iter()
    .filter_map(|path| newest(path, &generated))
    .max();
    let outputs = ["index.html", "style.css", "page.js"]
        .iter()
        .map(|name| modified(&dir.join("dist").join(name)))
        .collect::<Option<Vec<_>>>()
        .and_then(|times| times.into_iter().min());
    if outputs.is_none() || outputs < sources {
        npm(&["run", "build"]);
    }
    *built = true;
}

/// Serves the files under `root` over HTTP/1.1 on an ephemeral port of
/// 127.0.0.1, one thread per connection, for the rest of the test run.
fn serve_static(root: PathBuf) -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the page server");
    let port = listener.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let root = root.clone();
            std::thread::spawn(move || serve_file(stream, &root));
        }
    });
    port
}

fn serve_file(mut stream: std::net::TcpStream, root: &Path) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    let head = String::from_utf8_lossy(&head);
    let target = head.split_whitespace().nth(1).unwrap_or("/");
    let path = target.split(['?', '#']).next().unwrap_or("/");
    let path = if path.ends_with('/') {
        format!("{path}index.html")
    } else {
        path.to_owned()
    };
    let file = (!path.contains(".."))
        .then(|| std::fs::read(root.join(path.trim_start_matches('/'))).ok())
        .flatten();
    let (status, kind, body) = match file {
        Some(body) => {
            let kind = match Path::new(&path).extension().and_then(|e| e.to_str()) {
                Some("html") => "text/html; charset=utf-8",
                Some("js") => "text/javascript; charset=utf-8",
                Some("css") => "text/css; charset=utf-8",
                Some("map" | "json") => "application/json",
                _ => "application/octet-stream",
            };
            ("200 OK", kind, body)
        }
        None => ("404 Not Found", "text/plain", b"not found".to_vec()),
    };
    let _ = write!(
        stream,
        "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\n\
         Cache-Control: no-store\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let _ = stream.write_all(&body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn web_chat_in_chromium() {
    let skipped = "browser::web_chat_in_chromium";
    // Without Chromium, node or npm the test fails, unless
    // `SESSIONSTORE_TEST_SKIP` names `browser`: then it is skipped, saying so.
    let missing = tokio::task::spawn_blocking(crate::support::prereq::browser_missing)
        .await
        .unwrap();
    if let Some(missing) = missing {
        crate::support::prereq::missing(
            crate::support::prereq::Prerequisite::Browser,
            skipped,
            &missing,
        );
        return;
    }
    tokio::task::spawn_blocking(build_example).await.unwrap();

    let page_port = serve_static(example().join("dist"));
    let page_origin = format!("http://127.0.0.1:{page_port}");
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, token_line("web", TOKEN)).unwrap();
    let allowed = page_origin.clone();
    let server = TestServer::start_on(Storage::new(Backend::File).await, move |config| {
        config.auth_tokens = Some(tokens);
        config.cors_allowed_origins = vec![allowed];
        // The smallest bound: a run's buffer is merged at nearly every
        // publish, so a tab that joins mid-answer gets a merged delta
        // (first_index < index), and one that resumes mostly gets one that
        // overlaps what it has and must keep only its new part.
        config.limits.max_run_deltas = 2;
    })
    .await;

    let screenshot = Path::new(env!("CARGO_TARGET_TMPDIR")).join("web-chat-screenshot.png");
    let started = std::time::Instant::now();
    let drive = tokio::process::Command::new("node")
        .arg("test/drive.mjs")
        .args(["--page", &format!("{page_origin}/")])
        .args(["--server", &server.endpoint()])
        .args(["--token", TOKEN])
        .args([
            "--disallowed-page",
            &format!("http://localhost:{page_port}/"),
        ])
        .arg("--screenshot")
        .arg(&screenshot)
        .env("CHROMIUM", chromium())
        .current_dir(example())
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(DRIVE_DEADLINE, drive)
        .await
        .expect("the browser scenario finishes in time")
        .expect("run node test/drive.mjs");
    let report: serde_json::Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("drive.mjs printed no JSON report ({e}):\n{}", said(&output)));
    // The whole report first, so that a failure's own message (below, kept
    // short) is the last thing the test prints, where a log's tail shows it.
    let pretty = serde_json::to_string_pretty(&report).unwrap();
    println!(
        "drive.mjs report:\n{pretty}\ndrive.mjs stderr:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        output.status.success() && report["ok"] == true,
        "the browser scenario failed: {} (last check: {})",
        report["error"],
        report["checks"]
            .as_array()
            .and_then(|checks| checks.last())
            .unwrap_or(&serde_json::Value::Null)
    );
    println!(
        "browser scenario passed in {:.1} s: {} checks; delta {} before the reload, {} restored, \
         {} live after it ({} merged); the second tab joined at {} ({} merged) and stopped \
         the run after {} pieces",
        started.elapsed().as_secs_f64(),
        report["checks"].as_array().map_or(0, Vec::len),
        report["beforeReload"]["lastIndex"],
        report["afterReload"]["restoredIndex"],
        report["afterReload"]["lastIndex"],
        report["afterReload"]["mergedDeltas"],
        report["secondTab"]["lastIndex"],
        report["secondTab"]["mergedDeltas"],
        report["producer"]["published"],
    );

    // What the page saw.
    assert_eq!(
        report["wrongToken"]["code"], "Unauthenticated",
        "report above"
    );
    assert_eq!(
        report["wrongToken"]["reason"], "UNAUTHENTICATED",
        "report above"
    );
    assert_eq!(report["cors"]["refused"], true, "report above");
    let before = report["beforeReload"]["text"].as_str().unwrap();
    let after = report["afterReload"]["text"].as_str().unwrap();
    assert!(
        !before.is_empty() && after.starts_with(before),
        "report above"
    );
    assert!(
        report["afterReload"]["restoredIndex"].as_i64()
            >= report["beforeReload"]["lastIndex"].as_i64(),
        "report above"
    );
    assert!(
        report["secondTab"]["mergedDeltas"].as_i64() > Some(0),
        "the second tab joined through a merged delta (report above)"
    );
    assert_eq!(report["producer"]["cancelled"], true, "report above");
    let run_id = report["producer"]["runId"].as_str().unwrap().to_owned();
    assert_eq!(report["cancel"]["runId"], run_id.as_str(), "report above");
    let stored_text = report["cancel"]["storedText"].as_str().unwrap().to_owned();
    assert!(stored_text.starts_with(before.trim_end()), "report above");
    if std::env::var_os("SESSIONSTORE_UPDATE_SCREENSHOT").is_some() {
        std::fs::copy(&screenshot, example().join("screenshot.png")).unwrap();
    }

    // What the server stored, read with the Rust client.
    let session_id = report["sessionId"].as_str().unwrap().to_owned();
    let mut client = server.client().await;
    let sessions = client
        .list_sessions(authed(pb::ListSessionsRequest::default(), TOKEN))
        .await
        .unwrap()
        .into_inner();
    let control = &report["control"];
    let control_session = control["sessionId"].as_str().unwrap().to_owned();
    let mut ids: Vec<_> = sessions
        .sessions
        .iter()
        .filter_map(|s| s.session.as_ref().map(|s| s.id.clone()))
        .collect();
    ids.sort();
    let mut expected = vec![session_id.clone(), control_session.clone()];
    expected.sort();
    assert_eq!(ids, expected, "the refused calls wrote nothing");
    let messages = client
        .list_messages(authed(
            pb::ListMessagesRequest {
                session_id: session_id.clone(),
                ..Default::default()
            },
            TOKEN,
        ))
        .await
        .unwrap()
        .into_inner()
        .messages;
    let stored: Vec<_> = messages.iter().filter_map(|m| m.message.as_ref()).collect();
    assert_eq!(stored.len(), 2, "{messages:?}");
    assert_eq!(stored[0].role, i32::from(pb::Role::User));
    assert!(!stored[0].incomplete);
    assert_eq!(stored[1].role, i32::from(pb::Role::Assistant));
    assert!(
        stored[1].incomplete,
        "the stopped answer is marked incomplete"
    );
    assert_eq!(stored[1].content, stored_text);

    let log = event_log(&mut client, &session_id).await;
    let kinds: Vec<_> = log
        .iter()
        .map(|event| match &event.event {
            Some(Event::RunCancelRequested(_)) => "run_cancel_requested",
            _ => event_kind(event),
        })
        .collect();
    let cancel = log
        .iter()
        .find_map(|event| match &event.event {
            Some(Event::RunCancelRequested(cancel)) => Some(cancel),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no run_cancel_requested in the log: {kinds:?}"));
    assert_eq!(cancel.run_id, run_id);
    assert_eq!(cancel.reason, "stopped from the web page");
    // The cancel comes before the answer it cut short, and the run ended after.
    let position = |kind: &str| {
        kinds
            .iter()
            .rposition(|k| *k == kind)
            .unwrap_or_else(|| panic!("no {kind} in the log: {kinds:?}"))
    };
    assert!(
        position("run_begun") < position("run_cancel_requested")
            && position("run_cancel_requested") < position("exchange_appended")
            && position("exchange_appended") < position("run_ended"),
        "{kinds:?}"
    );

    check_control(&mut client, control, &control_session).await;
    server.stop().await.unwrap();
}

/// Every event of `session_id` up to its current revision.
async fn event_log(
    client: &mut sessionstore_client::SessionStoreClient<tonic::transport::Channel>,
    session_id: &str,
) -> Vec<pb::SessionEvent> {
    let mut events = client
        .watch_session(authed(
            pb::WatchSessionRequest {
                session_id: session_id.to_owned(),
                after_revision: 0,
                ..Default::default()
            },
            TOKEN,
        ))
        .await
        .unwrap()
        .into_inner();
    let mut log = Vec::new();
    loop {
        let event = next_event(&mut events).await;
        if matches!(event.event, Some(Event::CaughtUp(_))) {
            return log;
        }
        log.push(event);
    }
}

/// The run control plane as the page left it (`control`: the driver's
/// report of steps 5 and 6): the approval decided from the first tab, the
/// two queued messages taken in order into the history, the withdrawn one
/// never taken, and the queue empty.
async fn check_control(
    client: &mut sessionstore_client::SessionStoreClient<tonic::transport::Channel>,
    control: &serde_json::Value,
    session_id: &str,
) {
    let approval_id = control["approvalId"].as_str().unwrap();
    let approvals = client
        .list_approvals(authed(
            pb::ListApprovalsRequest {
                session_id: session_id.to_owned(),
                ..Default::default()
            },
            TOKEN,
        ))
        .await
        .unwrap()
        .into_inner()
        .approvals;
    assert_eq!(approvals.len(), 1, "{approvals:?}");
    assert_eq!(approvals[0].approval_id, approval_id);
    assert_eq!(approvals[0].state, i32::from(pb::ApprovalState::Approved));
    assert_eq!(approvals[0].decided_by, "web chat");
    let waiting = client
        .list_queued_inputs(authed(
            pb::ListQueuedInputsRequest {
                session_id: session_id.to_owned(),
                ..Default::default()
            },
            TOKEN,
        ))
        .await
        .unwrap()
        .into_inner()
        .inputs;
    assert!(waiting.is_empty(), "nothing left queued: {waiting:?}");

    // The history: the call, its approved result and the answer, then the
    // two typed messages in the order typed.
    let typed = control["tabA"]["user"].clone();
    assert_eq!(control["tabB"]["user"], typed, "report above");
    let messages = client
        .list_messages(authed(
            pb::ListMessagesRequest {
                session_id: session_id.to_owned(),
                ..Default::default()
            },
            TOKEN,
        ))
        .await
        .unwrap()
        .into_inner()
        .messages;
    let stored: Vec<_> = messages.iter().filter_map(|m| m.message.as_ref()).collect();
    let roles: Vec<_> = stored.iter().map(|m| m.role).collect();
    assert_eq!(
        roles,
        [
            pb::Role::Assistant,
            pb::Role::Tool,
            pb::Role::Assistant,
            pb::Role::User,
            pb::Role::User
        ]
        .map(i32::from),
        "{messages:?}"
    );
    let tool_call = &stored[0].tool_calls[0];
    assert_eq!(approvals[0].tool_call_id, tool_call.id);
    assert_eq!(stored[1].tool_call_id, tool_call.id);
    assert!(!stored[1].tool_error, "approved: the tool ran");
    assert_eq!(typed.as_array().map(Vec::len), Some(2), "report above");
    assert_eq!(stored[3].content, typed[0].as_str().unwrap());
    assert_eq!(stored[4].content, typed[1].as_str().unwrap());

    // The log: asked, decided, then during the next run three queued, one
    // withdrawn, two taken by that run in queue order (the second by EndRun
    // take_next, just before the lease is freed).
    let log = event_log(client, session_id).await;
    let kinds: Vec<_> = log.iter().map(event_kind).collect();
    let queued: Vec<_> = log
        .iter()
        .filter_map(|event| match &event.event {
            Some(Event::InputQueued(queued)) => queued.input.as_ref(),
            _ => None,
        })
        .map(|input| input.input_id.as_str())
        .collect();
    let taken: Vec<_> = log
        .iter()
        .filter_map(|event| match &event.event {
            Some(Event::InputTaken(taken)) => Some(taken),
            _ => None,
        })
        .collect();
    let withdrawn: Vec<_> = log
        .iter()
        .filter_map(|event| match &event.event {
            Some(Event::InputWithdrawn(withdrawn)) => Some(withdrawn.input_id.as_str()),
            _ => None,
        })
        .collect();
    let run_id = control["runId"].as_str().unwrap();
    assert_eq!(queued.len(), 3, "{kinds:?}");
    assert_eq!(withdrawn, [queued[2]], "{kinds:?}");
    assert_eq!(
        taken
            .iter()
            .map(|t| t.input_id.as_str())
            .collect::<Vec<_>>(),
        queued[..2],
        "{kinds:?}"
    );
    assert!(taken.iter().all(|t| t.run_id == run_id), "{taken:?}");
    assert!(taken[0].position < taken[1].position, "{taken:?}");
    assert_eq!(
        control["taken"],
        serde_json::json!(queued[..2]),
        "report above"
    );
    assert_eq!(control["withdrawn"], queued[2], "report above");
    let first = |kind: &str| {
        kinds
            .iter()
            .position(|k| *k == kind)
            .unwrap_or_else(|| panic!("no {kind} in the log: {kinds:?}"))
    };
    let last = |kind: &str| kinds.iter().rposition(|k| *k == kind).unwrap();
    assert!(
        first("approval_requested") < first("approval_decided")
            && first("approval_decided") < last("run_begun")
            && last("run_begun") < first("input_queued")
            && last("input_queued") < first("input_withdrawn")
            && first("input_withdrawn") < first("input_taken")
            && last("input_taken") + 1 == last("run_ended")
            && last("run_ended") == kinds.len() - 1,
        "{kinds:?}"
    );
}

/// One HTTP/1.1 exchange with the server: the status code and the headers
/// (names lower-cased).
async fn http(addr: std::net::SocketAddr, request: Vec<u8>) -> (u16, Vec<(String, String)>) {
    let response = http_bytes(addr, request).await;
    let response = String::from_utf8_lossy(&response);
    let head = response.split("\r\n\r\n").next().unwrap_or_default();
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|line| line.split_whitespace().nth(1))
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP response: {response:?}"));
    let headers = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| (name.trim().to_ascii_lowercase(), value.trim().to_owned()))
        .collect();
    (status, headers)
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

/// The comma-separated names of a header, lower-cased.
fn listed(headers: &[(String, String)], name: &str) -> Vec<String> {
    headers
        .iter()
        .filter(|(n, _)| n == name)
        .flat_map(|(_, v)| v.split(','))
        .map(|item| item.trim().to_ascii_lowercase())
        .collect()
}

async fn preflight(addr: std::net::SocketAddr, origin: &str) -> (u16, Vec<(String, String)>) {
    http(
        addr,
        format!(
            "OPTIONS /sessionstore.v1.SessionStore/GetSession HTTP/1.1\r\n\
             Host: {addr}\r\nOrigin: {origin}\r\n\
             Access-Control-Request-Method: POST\r\n\
             Access-Control-Request-Headers: authorization,content-type,x-grpc-web\r\n\
             Connection: close\r\n\r\n"
        )
        .into_bytes(),
    )
    .await
}

/// A gRPC-Web GetSession with a token, as a page from `origin` sends it
/// (`body` already in `content_type`'s encoding, which the answer is asked
/// to use too: the text encoding is asked for with `Accept`).
async fn grpc_web_call(
    addr: std::net::SocketAddr,
    origin: &str,
    content_type: &str,
    body: &[u8],
) -> (u16, Vec<(String, String)>) {
    let mut request = format!(
        "POST /sessionstore.v1.SessionStore/GetSession HTTP/1.1\r\n\
         Host: {addr}\r\nOrigin: {origin}\r\n\
         Content-Type: {content_type}\r\nAccept: {content_type}\r\nX-Grpc-Web: 1\r\n\
         Authorization: Bearer {TOKEN}\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    request.extend_from_slice(body);
    http(addr, request).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cors_preflight_allows_listed_origins_only() {
    const ALLOWED: &str = "http://127.0.0.1:5173";
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, token_line("web", TOKEN)).unwrap();
    let server = TestServer::start_on(Storage::new(Backend::Memory).await, move |config| {
        config.auth_tokens = Some(tokens);
        config.cors_allowed_origins = vec![ALLOWED.to_owned(), "https://chat.example".to_owned()];
    })
    .await;

    // An allowed origin's preflight: 2xx, allowing the gRPC-Web headers.
    let (status, headers) = preflight(server.addr, ALLOWED).await;
    assert!((200..300).contains(&status), "{status} {headers:?}");
    assert_eq!(
        header(&headers, "access-control-allow-origin"),
        Some(ALLOWED),
        "{headers:?}"
    );
    let allowed_headers = listed(&headers, "access-control-allow-headers");
    for name in [
        "authorization",
        "content-type",
        "x-grpc-web",
        "x-user-agent",
        "grpc-timeout",
    ] {
        assert!(
            allowed_headers.iter().any(|h| h == name),
            "{name} not allowed: {headers:?}"
        );
    }
    let methods = listed(&headers, "access-control-allow-methods");
    assert!(
        methods.iter().any(|m| m == "post"),
        "POST not allowed: {headers:?}"
    );
    let (status, headers) = preflight(server.addr, "https://chat.example").await;
    assert!((200..300).contains(&status), "{status} {headers:?}");
    assert_eq!(
        header(&headers, "access-control-allow-origin"),
        Some("https://chat.example")
    );

    // The call itself, binary and text: the status headers are exposed to the page.
    let empty_request = b"\0\0\0\0\0";
    for (content_type, body) in [
        ("application/grpc-web+proto", &empty_request[..]),
        ("application/grpc-web-text", &b"AAAAAAA="[..]),
    ] {
        let (status, headers) = grpc_web_call(server.addr, ALLOWED, content_type, body).await;
        assert_eq!(status, 200, "{content_type}: {headers:?}");
        assert!(
            header(&headers, "content-type")
                .is_some_and(|t| t.starts_with(content_type.trim_end_matches("+proto"))),
            "{content_type}: {headers:?}"
        );
        assert_eq!(
            header(&headers, "access-control-allow-origin"),
            Some(ALLOWED),
            "{content_type}: {headers:?}"
        );
        let exposed = listed(&headers, "access-control-expose-headers");
        for name in ["grpc-status", "grpc-message", "grpc-status-details-bin"] {
            assert!(
                exposed.iter().any(|h| h == name),
                "{content_type}: {name} not exposed: {headers:?}"
            );
        }
    }

    // Origins not on the list get no CORS headers at all.
    for origin in ["http://localhost:5173", "https://evil.example", "null"] {
        let (_, headers) = preflight(server.addr, origin).await;
        assert_eq!(
            header(&headers, "access-control-allow-origin"),
            None,
            "{origin}: {headers:?}"
        );
        let (_, headers) = grpc_web_call(
            server.addr,
            origin,
            "application/grpc-web+proto",
            empty_request,
        )
        .await;
        assert_eq!(
            header(&headers, "access-control-allow-origin"),
            None,
            "{origin}: {headers:?}"
        );
    }
    server.stop().await.unwrap();
}

/// ExportHistory over gRPC-Web (raw HTTP/1.1, as a page's client sends
/// it): the chunks the server writes from the stored encodings reach a
/// browser as they reach a gRPC client, message for message, with the
/// status in the trailers frame.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn export_history_over_grpc_web() {
    use prost::Message as _;
    let server = TestServer::start_on(Storage::new(Backend::File).await, |_| {}).await;
    let mut client = server.client().await;
    let session = crate::support::create(&mut client, "ses_web_export")
        .await
        .id;
    // Enough to need more than one chunk of 1 MiB.
    let long = "long answer ".repeat(30_000);
    for turn in 0..6 {
        client
            .append_exchange(crate::support::exchange_request(
                &session,
                &format!("question {turn}"),
                &format!("{turn}: {long}"),
            ))
            .await
            .expect("append");
    }
    let request = pb::ExportHistoryRequest {
        session_id: session.clone(),
        include_system_prompt: true,
        ..Default::default()
    };
    let expected = crate::support::export(&mut client, request.clone()).await;
    assert_eq!(expected.len(), 13, "the prompt and 12 messages");

    let mut body = vec![0];
    let encoded = request.encode_to_vec();
    body.extend_from_slice(&u32::try_from(encoded.len()).unwrap().to_be_bytes());
    body.extend_from_slice(&encoded);
    let mut call = format!(
        "POST /sessionstore.v1.SessionStore/ExportHistory HTTP/1.1\r\n\
         Host: {}\r\nContent-Type: application/grpc-web+proto\r\nX-Grpc-Web: 1\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        server.addr,
        body.len()
    )
    .into_bytes();
    call.extend_from_slice(&body);
    let response = http_bytes(server.addr, call).await;
    let split = response
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("an HTTP head");
    let head = String::from_utf8_lossy(&response[..split]).to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 200"), "{head}");
    let payload = if head.contains("transfer-encoding: chunked") {
        dechunk(&response[split + 4..])
    } else {
        response[split + 4..].to_vec()
    };
    let mut messages = Vec::new();
    let mut chunks = 0;
    let mut trailers = None;
    let mut rest = &payload[..];
    while !rest.is_empty() {
        assert!(rest.len() >= 5, "a gRPC-Web frame cut short");
        let flag = rest[0];
        let len = u32::from_be_bytes([rest[1], rest[2], rest[3], rest[4]]) as usize;
        let frame = &rest[5..5 + len];
        rest = &rest[5 + len..];
        if flag & 0x80 != 0 {
            trailers = Some(String::from_utf8_lossy(frame).to_ascii_lowercase());
        } else {
            assert_eq!(flag, 0, "not compressed");
            let chunk = pb::ExportHistoryResponse::decode(frame).expect("a chunk");
            chunks += 1;
            messages.extend(chunk.messages);
        }
    }
    assert!(chunks > 1, "{chunks} chunk(s)");
    assert_eq!(messages, expected);
    let trailers = trailers.expect("a trailers frame");
    assert!(trailers.contains("grpc-status:0"), "{trailers}");
}

/// The whole of an HTTP/1.1 exchange's answer, head and body, as bytes.
async fn http_bytes(addr: std::net::SocketAddr, request: Vec<u8>) -> Vec<u8> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        stream.write_all(&request).await.unwrap();
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await.unwrap();
        response
    };
    tokio::time::timeout(Duration::from_secs(20), exchange)
        .await
        .expect("an HTTP answer in time")
}

/// An HTTP/1.1 chunked body, joined.
fn dechunk(mut body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let line_end = body
            .windows(2)
            .position(|w| w == b"\r\n")
            .expect("a chunk size line");
        let size_text = String::from_utf8_lossy(&body[..line_end]);
        let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)
            .expect("a chunk size");
        body = &body[line_end + 2..];
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&body[..size]);
        body = &body[size + 2..];
    }
}
