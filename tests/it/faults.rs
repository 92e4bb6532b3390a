//! The ordinary bad day of a deployment: the database goes away and comes
//! back, the disk fills up, the process is told to stop while a client
//! has stopped reading.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prost::bytes::Bytes;
use sessionstore_client::v1 as pb;
use sessionstore_client::{Client, Exchange, RetryPolicy};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tonic::Code;
use tonic::codegen::http;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use crate::support::{
    PgDatabase, TestServer, error_details, postgres_admin_url, postgres_available,
};

/// A TCP relay in front of the shared PostgreSQL server: `cut` makes the
/// database unreachable for the server under test (every relayed
/// connection dropped, the port refusing new ones) without touching the
/// PostgreSQL server itself; `restore` listens on the same port again.
struct Relay {
    port: u16,
    target: String,
    running: Mutex<Option<JoinSet<()>>>,
}

impl Relay {
    async fn start(target: String) -> Arc<Relay> {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind relay");
        let port = listener.local_addr().expect("relay address").port();
        let relay = Arc::new(Relay {
            port,
            target,
            running: Mutex::new(None),
        });
        relay.serve(listener);
        relay
    }

    fn serve(&self, listener: TcpListener) {
        let target = self.target.clone();
        let mut tasks = JoinSet::new();
        // Connections live in a set of their own, owned by the accept task:
        // aborting that task drops the listener and every connection.
        tasks.spawn(async move {
            let mut connections = JoinSet::new();
            while let Ok((mut inbound, _)) = listener.accept().await {
                let target = target.clone();
                connections.spawn(async move {
                    if let Ok(mut outbound) = TcpStream::connect(&target).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
            }
        });
        *self.running.lock().unwrap() = Some(tasks);
    }

    /// The database goes away: connections drop, new ones are refused.
    fn cut(&self) {
        drop(self.running.lock().unwrap().take());
    }

    /// The database answers again, on the same port.
    async fn restore(&self) {
        let listener = TcpListener::bind(("127.0.0.1", self.port))
            .await
            .expect("listen on the relay's port again");
        self.serve(listener);
    }

    /// `url` with its host and port replaced by the relay's.
    fn url_through(&self, url: &str) -> String {
        let (scheme, rest) = url.split_once("://").expect("URL with a scheme");
        let (userinfo, rest) = rest.rsplit_once('@').map_or(("", rest), |(u, r)| (u, r));
        let path = rest.find('/').map_or("", |slash| &rest[slash..]);
        let at = if userinfo.is_empty() { "" } else { "@" };
        format!("{scheme}://{userinfo}{at}127.0.0.1:{}{path}", self.port)
    }
}

/// `host:port` of a PostgreSQL URL.
fn host_port(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let rest = rest.rsplit_once('@').map_or(rest, |(_, rest)| rest);
    rest.split('/').next().unwrap_or(rest).to_owned()
}

/// Waits until `service`'s health is `wanted`, following the server's own
/// `grpc.health.v1.Health/Watch` stream (it sends each change as it happens).
async fn service_becomes(endpoint: &str, service: &str, wanted: ServingStatus) {
    let channel = tonic::transport::Endpoint::from_shared(endpoint.to_owned())
        .unwrap()
        .connect()
        .await
        .expect("connect for health");
    let mut changes = HealthClient::new(channel)
        .watch(HealthCheckRequest {
            service: service.to_owned(),
        })
        .await
        .expect("watch health")
        .into_inner();
    while let Some(change) = changes.message().await.expect("health change") {
        if ServingStatus::try_from(change.status) == Ok(wanted) {
            return;
        }
    }
    panic!("the health stream of {service:?} ended before {wanted:?}");
}

/// Waits until both health services report `wanted`, failing after `within`.
pub(crate) async fn health_becomes(endpoint: &str, wanted: ServingStatus, within: Duration) {
    let both = async {
        service_becomes(endpoint, "", wanted).await;
        service_becomes(endpoint, "sessionstore.v1.SessionStore", wanted).await;
    };
    tokio::time::timeout(within, both)
        .await
        .unwrap_or_else(|_| panic!("health is not {wanted:?} after {within:?}"));
}

fn assert_storage_unavailable(status: &tonic::Status, what: &str) {
    assert_eq!(status.code(), Code::Unavailable, "{what}: {status:?}");
    let (reason, _) = error_details(status);
    assert_eq!(reason.as_deref(), Some("STORAGE_UNAVAILABLE"), "{what}");
    let details = tonic_types::StatusExt::get_error_details(status);
    assert!(
        details.retry_info().is_some(),
        "{what}: STORAGE_UNAVAILABLE carries RetryInfo"
    );
    assert!(
        !status.message().contains("connection") && !status.message().contains("pool"),
        "{what}: no database error text reaches the client: {:?}",
        status.message()
    );
}

fn exchange(session_id: &str, text: &str) -> pb::AppendExchangeRequest {
    pb::AppendExchangeRequest {
        session_id: session_id.to_owned(),
        messages: vec![crate::support::user(text)],
        provider_call: Some(crate::support::call("gpt-4o", 3, 2, 1)),
        response_messages: vec![crate::support::assistant("ok")],
        request_id: format!("req-{text}"),
        ..Default::default()
    }
}

/// PostgreSQL goes away: calls fail fast with UNAVAILABLE /
/// STORAGE_UNAVAILABLE and RetryInfo, health turns NOT_SERVING; it comes
/// back: health SERVING, writes succeed, with no restart; and a client
/// call made during the outage succeeds once the database is back.
#[tokio::test]
async fn a_postgres_outage_is_unavailable_and_health_follows_it() {
    if !postgres_available("a_postgres_outage_is_unavailable_and_health_follows_it").await {
        return;
    }
    let database = PgDatabase::create().await;
    let relay = Relay::start(host_port(&postgres_admin_url())).await;
    let server = TestServer::start_with(relay.url_through(&database.url), None, |config| {
        config.telemetry.metrics_listen = Some("127.0.0.1:0".into());
    })
    .await;
    let endpoint = server.endpoint();
    let mut raw = server.client().await;
    crate::support::create(&mut raw, "ses_outage").await;
    raw.append_exchange(exchange("ses_outage", "before"))
        .await
        .expect("append before the outage");
    health_becomes(&endpoint, ServingStatus::Serving, Duration::from_secs(5)).await;

    relay.cut();
    let went_away = Instant::now();

    // Writes and reads: UNAVAILABLE within 5 s each, never INTERNAL.
    let started = Instant::now();
    let status = raw
        .append_exchange(exchange("ses_outage", "during"))
        .await
        .expect_err("no append while the database is away");
    assert_storage_unavailable(&status, "AppendExchange");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "AppendExchange answered after {:?}",
        started.elapsed()
    );
    let started = Instant::now();
    let status = raw
        .get_session(pb::GetSessionRequest {
            session_id: "ses_outage".into(),
            ..Default::default()
        })
        .await
        .expect_err("no read while the database is away");
    assert_storage_unavailable(&status, "GetSession");
    assert!(started.elapsed() < Duration::from_secs(5));
    let started = Instant::now();
    let status = raw
        .list_messages(pb::ListMessagesRequest {
            session_id: "ses_outage".into(),
            ..Default::default()
        })
        .await
        .expect_err("no list while the database is away");
    assert_storage_unavailable(&status, "ListMessages");
    assert!(started.elapsed() < Duration::from_secs(5));

    let remaining = Duration::from_secs(10).saturating_sub(went_away.elapsed());
    health_becomes(&endpoint, ServingStatus::NotServing, remaining).await;

    // A client call made now, with the client crate's ordinary retries,
    // succeeds once the database is back.
    let client = Client::builder(endpoint.clone())
        .retry_policy(RetryPolicy::default().max_attempts(10))
        .connect()
        .await
        .expect("client");
    let during = tokio::spawn(async move {
        client
            .append_exchange(
                &Exchange::new("ses_outage")
                    .message(pb::Message::user("made during the outage"))
                    .provider_call(pb::ProviderCall::new("openai", "gpt-4o").with_tokens(1, 1))
                    .response(pb::Message::assistant("stored once it was back")),
            )
            .await
    });
    // Its first attempt has been answered UNAVAILABLE before the database returns.
    let metrics = server.metrics_addr.expect("metrics are served");
    crate::support::poll_until(
        "the client's call reaching the server",
        Duration::from_secs(15),
        || async {
            let text = crate::support::scrape(metrics).await;
            text.lines()
                .any(|line| {
                    line.starts_with("grpc_server_handled_total")
                        && line.contains("grpc_method=\"AppendExchange\"")
                        && line.contains("grpc_code=\"Unavailable\"")
                        && line
                            .rsplit(' ')
                            .next()
                            .and_then(|count| count.parse::<f64>().ok())
                            .is_some_and(|count| count >= 2.0)
                })
                .then_some(())
        },
    )
    .await;

    relay.restore().await;
    let came_back = Instant::now();
    let stored = tokio::time::timeout(Duration::from_secs(30), during)
        .await
        .expect("the client's call ends")
        .expect("the client's task")
        .expect("a call made during a short outage succeeds once the database is back");
    assert_eq!(stored.messages.len(), 2);
    health_becomes(&endpoint, ServingStatus::Serving, Duration::from_secs(15)).await;
    assert!(came_back.elapsed() < Duration::from_secs(15));
    let appended = raw
        .append_exchange(exchange("ses_outage", "after"))
        .await
        .expect("writes succeed again without a restart")
        .into_inner();
    assert_eq!(appended.messages[0].sequence, 4);

    server.stop().await.expect("server stops");
    drop(database);
}

/// SIGTERM while a watcher's client never reads: the process still exits,
/// cleanly, within its grace period, and what it acknowledged is there
/// after a restart.
#[tokio::test]
async fn sigterm_with_a_stalled_watcher_exits_within_the_grace_period() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/sessions.db", dir.path().display());
    let binary = crate::support::sessionstore_binary();
    let mut process = crate::support::ServerProcess::start(
        &binary,
        &url,
        "127.0.0.1:0",
        dir.path().join("server.log"),
        &["--shutdown-grace", "3s"],
    )
    .await;
    let mut client = crate::support::connect(&process.endpoint()).await;
    crate::support::create(&mut client, "ses_stall").await;
    let big = "x".repeat(200 * 1024);
    for i in 0..4 {
        let mut request = exchange("ses_stall", &format!("{i}"));
        request.messages[0].content = big.clone();
        client.append_exchange(request).await.expect("append");
    }

    // A watcher over raw HTTP/2 whose stream window is zero: the server can
    // send it nothing at all, not even the end of the stream.
    let tcp = TcpStream::connect(("127.0.0.1", process.port))
        .await
        .expect("connect");
    let (sender, connection) = h2::client::Builder::new()
        .initial_window_size(0)
        .handshake::<_, Bytes>(tcp)
        .await
        .expect("h2 handshake");
    let driver = tokio::spawn(async move {
        let _ = connection.await;
    });
    let mut sender = sender.ready().await.expect("h2 ready");
    let request = http::Request::builder()
        .method("POST")
        .uri(format!(
            "http://127.0.0.1:{}/sessionstore.v1.SessionStore/WatchSession",
            process.port
        ))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap();
    let (response, mut stream) = sender.send_request(request, false).unwrap();
    let body = prost::Message::encode_to_vec(&pb::WatchSessionRequest {
        session_id: "ses_stall".into(),
        after_revision: 0,
        ..Default::default()
    });
    let mut framed = vec![0];
    framed.extend((body.len() as u32).to_be_bytes());
    framed.extend(body);
    stream.send_data(framed.into(), true).unwrap();
    let response = tokio::time::timeout(Duration::from_secs(10), response)
        .await
        .expect("the watch is answered")
        .expect("response headers");
    assert_eq!(response.status(), 200);

    let asked = Instant::now();
    let exit = process.terminate().await;
    let took = asked.elapsed();
    let log = std::fs::read_to_string(&process.log).unwrap_or_default();
    assert!(exit.success(), "exit 0 after SIGTERM: {exit:?}\n{log}");
    assert!(
        took < Duration::from_secs(5),
        "exited {took:?} after SIGTERM with a 3 s grace period\n{log}"
    );
    driver.abort();
    drop(response);

    let mut restarted = crate::support::ServerProcess::start(
        &binary,
        &url,
        "127.0.0.1:0",
        dir.path().join("again.log"),
        &[],
    )
    .await;
    let mut client = crate::support::connect(&restarted.endpoint()).await;
    let messages = crate::support::all_messages(&mut client, "ses_stall").await;
    assert_eq!(messages.len(), 8, "every acknowledged write survives");
    restarted.kill().await;
}

/// A small filesystem of its own (tmpfs), unmounted on drop. Mounting
/// needs root: without it the disk-full test fails, unless
/// `SESSIONSTORE_TEST_SKIP` names `disk-full` (`support::prereq`).
struct SmallDisk {
    dir: tempfile::TempDir,
}

impl SmallDisk {
    fn mount(test: &str, bytes: u64) -> Option<SmallDisk> {
        let dir = tempfile::tempdir().unwrap();
        let mounted = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes}")])
            .arg("tmpfs")
            .arg(dir.path())
            .stderr(std::process::Stdio::piped())
            .output();
        match mounted {
            Ok(output) if output.status.success() => Some(SmallDisk { dir }),
            other => {
                let why = match other {
                    Ok(output) => String::from_utf8_lossy(&output.stderr).trim().to_owned(),
                    Err(error) => error.to_string(),
                };
                crate::support::prereq::missing(
                    crate::support::prereq::Prerequisite::DiskFull,
                    test,
                    &format!("cannot mount a small tmpfs (needs root): {why}"),
                );
                None
            }
        }
    }

    fn path(&self) -> &std::path::Path {
        self.dir.path()
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

/// Every stored message of a session, in small pages (its messages are large).
async fn stored_messages(
    client: &mut sessionstore_client::SessionStoreClient<tonic::transport::Channel>,
    id: &str,
) -> Vec<pb::StoredMessage> {
    crate::support::messages_in_pages(client, id, 8).await
}

fn assert_storage_full(status: &tonic::Status, what: &str) {
    assert_eq!(status.code(), Code::ResourceExhausted, "{what}: {status:?}");
    let (reason, _) = error_details(status);
    assert_eq!(
        reason.as_deref(),
        Some("STORAGE_FULL"),
        "{what}: {status:?}"
    );
}

/// SQLite on a full disk: writes are RESOURCE_EXHAUSTED / STORAGE_FULL,
/// reads keep working (also after a restart while full), acknowledged data
/// is intact, and writes resume by themselves once space is freed.
#[tokio::test]
async fn sqlite_on_a_full_disk_refuses_writes_serves_reads_and_recovers() {
    let test = "faults::sqlite_on_a_full_disk_refuses_writes_serves_reads_and_recovers";
    let Some(disk) = SmallDisk::mount(test, 24 << 20) else {
        return;
    };
    // Space to give back later.
    let ballast = disk.path().join("ballast");
    std::fs::write(&ballast, vec![7_u8; 6 << 20]).unwrap();
    let url = format!("sqlite://{}/sessions.db", disk.path().display());
    let binary = crate::support::sessionstore_binary();
    let logs = tempfile::tempdir().unwrap();
    let start = |log: &str| {
        crate::support::ServerProcess::start(
            &binary,
            &url,
            "127.0.0.1:0",
            logs.path().join(log),
            &[],
        )
    };
    let mut server = start("first.log").await;
    let mut client = crate::support::connect(&server.endpoint()).await;
    crate::support::create(&mut client, "ses_full").await;

    let body = "y".repeat(256 * 1024);
    let mut acknowledged = 0;
    let mut refused = None;
    for i in 0..400 {
        let mut request = exchange("ses_full", &format!("fill-{i}"));
        request.messages[0].content = body.clone();
        match client.append_exchange(request).await {
            Ok(_) => acknowledged += 1,
            Err(status) => {
                refused = Some(status);
                break;
            }
        }
    }
    let refused = refused.expect("the disk fills up");
    assert_storage_full(&refused, "AppendExchange on a full disk");
    assert!(acknowledged > 0);
    // Other writes are refused the same way (or fit), never INTERNAL.
    for i in 0..3 {
        let created = client
            .create_session(pb::CreateSessionRequest {
                session_id: format!("ses_more_{i}"),
                system_prompt: body.clone(),
                ..Default::default()
            })
            .await;
        if let Err(status) = created {
            assert_storage_full(&status, "CreateSession on a full disk");
        }
    }
    // Reads work.
    let messages = stored_messages(&mut client, "ses_full").await;
    assert_eq!(messages.len(), acknowledged * 2);
    let exported = crate::support::export(
        &mut client,
        pb::ExportHistoryRequest {
            session_id: "ses_full".into(),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(exported.len(), acknowledged * 2);

    // A restart while the disk is still full serves reads.
    let stopped = server.terminate().await;
    assert!(stopped.success(), "the server stops cleanly on a full disk");
    let mut server = start("second.log").await;
    let mut client = crate::support::connect(&server.endpoint()).await;
    let messages = stored_messages(&mut client, "ses_full").await;
    assert_eq!(
        messages.len(),
        acknowledged * 2,
        "acknowledged data is intact after a restart on a full disk"
    );
    // Writes are refused again once what the restart found is used up; the
    // last refusal starts the server's hold-back of its background work
    // (`DiskSpace::HOLD_BACK`), which the space freed next is measured in.
    let mut refused = false;
    for i in 0..64 {
        let mut request = exchange("ses_full", &format!("still-full-{i}"));
        request.messages[0].content = body.clone();
        if let Err(status) = client.append_exchange(request).await {
            assert_storage_full(&status, "AppendExchange after a restart on a full disk");
            refused = true;
            break;
        }
    }
    assert!(refused, "the disk never filled again after the restart");

    // Space comes back: writes resume by themselves, ahead of the
    // server's own background work.
    std::fs::remove_file(&ballast).unwrap();
    let small = format!("afterwards {}", "z".repeat(16 * 1024));
    let before = stored_messages(&mut client, "ses_full").await.len();
    for i in 0..20 {
        let mut request = exchange("ses_full", &format!("after-{i}"));
        request.messages[0].content = small.clone();
        client
            .append_exchange(request)
            .await
            .unwrap_or_else(|status| panic!("append {i} after space was freed: {status:?}"));
    }
    let messages = stored_messages(&mut client, "ses_full").await;
    assert_eq!(messages.len(), before + 40);
    // Search answers (the index may still be catching up, in whatever
    // space is left), never with an internal error.
    if let Err(status) = client
        .search_messages(pb::SearchMessagesRequest {
            query: "afterwards".into(),
            page_size: 100,
            ..Default::default()
        })
        .await
    {
        let (reason, _) = error_details(&status);
        assert_eq!(
            (status.code(), reason.as_deref()),
            (Code::Unavailable, Some("SEARCH_INDEX_BEHIND")),
            "{status:?}"
        );
    }
    assert!(server.terminate().await.success());

    // Stopped cleanly, then the disk fills up from elsewhere, to the last
    // byte: a server started now still serves reads.
    let filler = disk.path().join("filler");
    {
        use std::io::Write as _;
        let mut file = std::fs::File::create(&filler).unwrap();
        let chunk = vec![1_u8; 64 * 1024];
        while file.write_all(&chunk).is_ok() {}
        let mut byte = [1_u8];
        while file.write_all(&byte).is_ok() {
            byte[0] = 2;
        }
    }
    let mut server = start("third.log").await;
    let mut client = crate::support::connect(&server.endpoint()).await;
    let messages = stored_messages(&mut client, "ses_full").await;
    assert_eq!(messages.len(), before + 40, "reads on a disk full at start");
    assert!(server.terminate().await.success());
}
