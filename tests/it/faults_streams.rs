//! Stalled readers: a client that stops reading an ExportHistory or a
//! WatchSession replay (a paused tab: a 64 KB HTTP/2 window, never
//! released) pins a bounded number of bytes on the server, whatever the
//! size of the messages; the streams' read-ahead, all together, stays
//! within `--max-stream-buffer-bytes`, and a new stream that cannot get its
//! share is refused. A reader that resumes gets everything, in order, once.
//!
//! The stalled clients are raw HTTP/2 connections (the `h2` crate) that
//! read nothing: their windows close after the first 64 KB.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use prost::Message as _;
use prost::bytes::{Buf as _, BufMut as _, Bytes, BytesMut};
use sessionstore_client::SessionStoreClient;
use sessionstore_client::v1 as pb;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tonic::Code;
use tonic::codegen::http;
use tonic::transport::Channel;

use crate::backend_tests;
use crate::support::{
    Backend, ServerProcess, Storage, TestServer, create, sessionstore_binary, user,
};

/// Messages in the test session, and the size of each.
const MESSAGES: usize = 120;
const MESSAGE_BYTES: usize = 250 * 1000;
/// What one stalled stream may pin at most.
const PER_STREAM_BOUND: usize = 16 * 1024 * 1024;
/// How long anything here may take.
const PATIENCE: Duration = Duration::from_secs(60);

/// The text of message `i`: ~`MESSAGE_BYTES`, distinct per message.
fn body(i: usize) -> String {
    let head = format!("message {i:04} ");
    let mut text = head.repeat(MESSAGE_BYTES / head.len() + 1);
    text.truncate(MESSAGE_BYTES);
    text
}

/// Creates `id` with `MESSAGES` large messages, two per exchange.
async fn fill(client: &mut SessionStoreClient<Channel>, id: &str) {
    create(client, id).await;
    for i in (0..MESSAGES).step_by(2) {
        client
            .append_exchange(pb::AppendExchangeRequest {
                session_id: id.to_owned(),
                messages: vec![user(&body(i)), user(&body(i + 1))],
                ..Default::default()
            })
            .await
            .expect("append");
    }
}

/// `message` as one gRPC message.
fn grpc_frame(message: &impl prost::Message) -> Bytes {
    let mut buf = BytesMut::new();
    buf.put_u8(0);
    buf.put_u32(u32::try_from(message.encoded_len()).expect("small request"));
    message.encode(&mut buf).expect("encode");
    buf.freeze()
}

/// A server-streaming call on its own HTTP/2 connection whose body is
/// not read until [`Stalled::resume`]: the window (64 KB for the stream and
/// the connection) closes and the server has to hold what it produces.
struct Stalled {
    body: h2::RecvStream,
    _request: h2::SendStream<Bytes>,
    driver: tokio::task::JoinHandle<()>,
}

impl Drop for Stalled {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

/// Why a stream was not opened.
#[derive(Debug)]
struct Refused {
    code: Code,
    limit: Option<String>,
}

fn export_request(id: &str) -> Bytes {
    grpc_frame(&pb::ExportHistoryRequest {
        session_id: id.to_owned(),
        ..Default::default()
    })
}

fn watch_request(id: &str, after_revision: i64) -> Bytes {
    grpc_frame(&pb::WatchSessionRequest {
        session_id: id.to_owned(),
        after_revision,
        include_active_deltas: false,
        ..Default::default()
    })
}

const EXPORT: &str = "/sessionstore.v1.SessionStore/ExportHistory";
const WATCH: &str = "/sessionstore.v1.SessionStore/WatchSession";

/// Opens `path` with `request` and waits for the response headers. A
/// trailers-only answer (the call was refused) is an error.
async fn open_stalled(addr: SocketAddr, path: &str, request: Bytes) -> Result<Stalled, Refused> {
    let tcp = TcpStream::connect(addr).await.expect("connect");
    let (sender, connection) = h2::client::Builder::new()
        .initial_window_size(65_535)
        .initial_connection_window_size(65_535)
        .handshake::<_, Bytes>(tcp)
        .await
        .expect("handshake");
    let driver = tokio::spawn(async move {
        let _ = connection.await;
    });
    let mut sender = sender.ready().await.expect("ready");
    let head = http::Request::builder()
        .method("POST")
        .uri(format!("http://{addr}{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .expect("request");
    let (response, mut send) = sender.send_request(head, false).expect("send request");
    send.send_data(request, true).expect("send body");
    let response = tokio::time::timeout(PATIENCE, response)
        .await
        .expect("headers in time")
        .expect("response");
    let headers = response.headers();
    if let Some(status) = tonic::Status::from_header_map(headers) {
        use tonic_types::StatusExt as _;
        let limit = status
            .get_error_details()
            .error_info()
            .and_then(|info| info.metadata.get("limit").cloned());
        let code = status.code();
        return Err(Refused { code, limit });
    }
    Ok(Stalled {
        body: response.into_body(),
        _request: send,
        driver,
    })
}

impl Stalled {
    /// Reads the rest of the stream, releasing the window as it goes, and
    /// hands each gRPC message to `each` until it says stop (or the stream
    /// ends; then the status must be OK).
    async fn resume(mut self, mut each: impl FnMut(Bytes) -> bool) {
        let work = async {
            let mut buffer = BytesMut::new();
            while let Some(data) = self.body.data().await {
                let data = data.expect("stream data");
                let _ = self.body.flow_control().release_capacity(data.len());
                buffer.extend_from_slice(&data);
                while buffer.len() >= 5 {
                    let len = u32::from_be_bytes([buffer[1], buffer[2], buffer[3], buffer[4]]);
                    let len = len as usize;
                    if buffer.len() < 5 + len {
                        break;
                    }
                    buffer.advance(5);
                    let message = buffer.split_to(len).freeze();
                    if !each(message) {
                        return;
                    }
                }
            }
            assert!(buffer.is_empty(), "the stream ended inside a message");
            let trailers = self.body.trailers().await.expect("trailers");
            let status = trailers
                .as_ref()
                .and_then(|t| t.get("grpc-status"))
                .map(|v| v.to_str().unwrap().to_owned());
            assert_eq!(
                status.as_deref(),
                Some("0"),
                "the stream ended with {trailers:?}"
            );
        };
        tokio::time::timeout(PATIENCE, work)
            .await
            .expect("the resumed stream completes in time");
    }

    /// Resumes an export of the test session and checks every message
    /// arrives in order, once.
    async fn finish_export(self) {
        let mut next = 0;
        self.resume(|message| {
            let chunk = pb::ExportHistoryResponse::decode(message).expect("export chunk");
            for message in chunk.messages {
                assert!(
                    message.content == body(next),
                    "message {next} out of order or changed"
                );
                next += 1;
            }
            true
        })
        .await;
        assert_eq!(next, MESSAGES, "every message once");
    }

    /// Resumes a watch of the test session from revision 0 up to
    /// `caught_up` and checks every revision arrives in order, once, with
    /// its messages.
    async fn finish_watch(self) {
        let (mut revision, mut messages, mut caught_up) = (0, 0, false);
        self.resume(|message| {
            let event = pb::SessionEvent::decode(message).expect("event");
            match event.event {
                Some(pb::session_event::Event::CaughtUp(_)) => {
                    caught_up = true;
                    return false;
                }
                Some(pb::session_event::Event::ExchangeAppended(appended)) => {
                    for stored in appended.messages {
                        let content = stored.message.map(|m| m.content).unwrap_or_default();
                        assert!(content == body(messages), "message {messages} out of order");
                        messages += 1;
                    }
                }
                _ => {}
            }
            assert_eq!(event.revision, revision + 1, "revisions in order, once");
            revision = event.revision;
            true
        })
        .await;
        assert!(caught_up, "the replay ends with caught_up");
        assert_eq!(revision, 1 + (MESSAGES / 2) as i64);
        assert_eq!(messages, MESSAGES);
    }
}

/// The body of `GET path` on the metrics port.
async fn http_get(addr: SocketAddr, path: &str) -> String {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    stream
        .write_all(
            format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .expect("write");
    let mut response = String::new();
    stream.read_to_string(&mut response).await.expect("read");
    response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or_default()
}

/// The server's buffered stream bytes, from `/metrics`.
async fn buffered(metrics: SocketAddr) -> u64 {
    let text = http_get(metrics, "/metrics").await;
    text.lines()
        .find(|line| line.starts_with("sessionstore_stream_buffered_bytes "))
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|value| value.parse().ok())
        .expect("the sessionstore_stream_buffered_bytes gauge")
}

/// Polls `read` until it gives the same value for a second (the stalled
/// streams have read as far ahead as they will), and returns it.
async fn settled<F: std::future::Future<Output = u64>>(mut read: impl FnMut() -> F) -> u64 {
    // The last value that moved, and since when it has stayed within 64 KiB.
    let steady: std::cell::Cell<Option<(u64, Instant)>> = std::cell::Cell::new(None);
    crate::support::poll_until("the value settling", PATIENCE, || {
        let (reading, steady) = (read(), &steady);
        async move {
            let now = reading.await;
            match steady.get() {
                Some((last, since)) if now.abs_diff(last) <= 64 * 1024 => {
                    (since.elapsed() >= Duration::from_secs(1)).then_some(now)
                }
                _ => {
                    steady.set(Some((now, Instant::now())));
                    None
                }
            }
        }
    })
    .await
}

async fn metered(backend: Backend, max_stream_buffer_bytes: usize) -> TestServer {
    TestServer::start_on(Storage::new(backend).await, |config| {
        config.telemetry.metrics_listen = Some("127.0.0.1:0".into());
        config.limits.max_stream_buffer_bytes = max_stream_buffer_bytes;
    })
    .await
}

async fn stalled_streams_hold_bounded_bytes_and_resume(backend: Backend) {
    let server = metered(backend, 512 * 1024 * 1024).await;
    let metrics = server.metrics_addr.expect("metrics");
    let mut client = server.client().await;
    fill(&mut client, "ses_stalled").await;

    const EACH: usize = 4;
    let mut exports = Vec::new();
    let mut watches = Vec::new();
    for _ in 0..EACH {
        exports.push(
            open_stalled(server.addr, EXPORT, export_request("ses_stalled"))
                .await
                .expect("export"),
        );
        watches.push(
            open_stalled(server.addr, WATCH, watch_request("ses_stalled", 0))
                .await
                .expect("watch"),
        );
    }
    let held = settled(|| buffered(metrics)).await as usize;
    let streams = 2 * EACH;
    eprintln!("{streams} stalled streams buffer {held} bytes");
    assert!(held > 0, "stalled streams read ahead");
    // The read-ahead bound (2 MiB and a row), far below a whole session.
    assert!(
        held <= streams * 4 * 1024 * 1024,
        "{held} bytes read ahead by {streams} stalled streams"
    );
    assert!(held / streams <= PER_STREAM_BOUND);

    // A reader that resumes gets everything, in order, once.
    let mut done = Vec::new();
    for stalled in exports {
        done.push(tokio::spawn(stalled.finish_export()));
    }
    for stalled in watches {
        done.push(tokio::spawn(stalled.finish_watch()));
    }
    for task in done {
        task.await.expect("resumed stream");
    }
    // Every stream gave its bytes back.
    crate::support::poll_until("buffered bytes going back to 0", PATIENCE, || async {
        (buffered(metrics).await == 0).then_some(())
    })
    .await;
}

async fn a_full_budget_refuses_new_streams_until_streams_end(backend: Backend) {
    // Room for about two stalled exports' read-ahead.
    let budget = 4 * 1024 * 1024;
    let server = metered(backend, budget).await;
    let metrics = server.metrics_addr.expect("metrics");
    let mut client = server.client().await;
    fill(&mut client, "ses_budget").await;

    let mut stalled = Vec::new();
    let refused = loop {
        assert!(stalled.len() < 16, "the budget never ran out");
        match open_stalled(server.addr, EXPORT, export_request("ses_budget")).await {
            Ok(stream) => stalled.push(stream),
            Err(refused) => break refused,
        }
        settled(|| buffered(metrics)).await;
    };
    assert_eq!(refused.code, Code::ResourceExhausted, "{refused:?}");
    assert_eq!(refused.limit.as_deref(), Some("max_stream_buffer_bytes"));
    assert!(
        stalled.len() >= 2,
        "{} streams fit in the budget",
        stalled.len()
    );
    assert!(buffered(metrics).await as usize <= budget + MESSAGE_BYTES + 64 * 1024);

    // Through the ordinary client too, and for a replay; a watcher at the
    // head reads nothing ahead and is still served.
    let status = client
        .export_history(pb::ExportHistoryRequest {
            session_id: "ses_budget".into(),
            ..Default::default()
        })
        .await
        .expect_err("refused");
    assert_eq!(status.code(), Code::ResourceExhausted);
    let replay = open_stalled(server.addr, WATCH, watch_request("ses_budget", 0)).await;
    assert!(
        matches!(&replay, Err(r) if r.code == Code::ResourceExhausted),
        "{:?}",
        replay.err()
    );
    let head = crate::support::get(&mut client, "ses_budget")
        .await
        .revision;
    let live = open_stalled(server.addr, WATCH, watch_request("ses_budget", head)).await;
    assert!(live.is_ok(), "{:?}", live.err());
    drop(live);

    // One stalled reader resumes and completes; once the others go away,
    // new streams are accepted again.
    let first = stalled.remove(0);
    first.finish_export().await;
    drop(stalled);
    crate::support::poll_until("the streams' bytes coming back", PATIENCE, || async {
        (buffered(metrics).await == 0).then_some(())
    })
    .await;
    let again = open_stalled(server.addr, EXPORT, export_request("ses_budget"))
        .await
        .expect("accepted again");
    again.finish_export().await;
    let replay = open_stalled(server.addr, WATCH, watch_request("ses_budget", 0))
        .await
        .expect("replay accepted again");
    replay.finish_watch().await;
}

backend_tests!(
    stalled_streams_hold_bounded_bytes_and_resume,
    a_full_budget_refuses_new_streams_until_streams_end
);

/// The resident set of process `pid`, in bytes.
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc status");
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| {
            rest.trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .ok()
        })
        .expect("VmRSS")
        * 1024
}

/// The real binary's resident memory with stalled readers: N stalled
/// streams over a 30 MB session add far less than N times the session.
async fn stalled_streams_add_little_resident_memory(backend: Backend) {
    let storage = Storage::new(backend).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let mut process = ServerProcess::start(
        &sessionstore_binary(),
        &storage.url,
        "127.0.0.1:0",
        dir.path().join("server.log"),
        &[],
    )
    .await;
    let pid = process.child.id().expect("running");
    let addr: SocketAddr = process.listen_address().parse().expect("address");
    let mut client = crate::support::connect(&process.endpoint()).await;
    fill(&mut client, "ses_rss").await;
    // One export and one replay read to the end first, so what the first
    // reads of a session cost once (caches, the allocator's arenas) is in
    // the baseline.
    open_stalled(addr, EXPORT, export_request("ses_rss"))
        .await
        .expect("export")
        .finish_export()
        .await;
    open_stalled(addr, WATCH, watch_request("ses_rss", 0))
        .await
        .expect("watch")
        .finish_watch()
        .await;
    let before = settled(|| async { rss(pid) }).await;

    const EACH: usize = 5;
    let mut exports = Vec::new();
    let mut watches = Vec::new();
    for _ in 0..EACH {
        exports.push(
            open_stalled(addr, EXPORT, export_request("ses_rss"))
                .await
                .expect("export"),
        );
        watches.push(
            open_stalled(addr, WATCH, watch_request("ses_rss", 0))
                .await
                .expect("watch"),
        );
    }
    let during = settled(|| async { rss(pid) }).await;
    let streams = 2 * EACH as u64;
    let added = during.saturating_sub(before);
    let session = (MESSAGES * MESSAGE_BYTES) as u64;
    eprintln!(
        "RSS {} MiB → {} MiB with {streams} stalled streams: {} KiB each",
        before >> 20,
        during >> 20,
        (added / streams) >> 10
    );
    assert!(
        added <= streams * PER_STREAM_BOUND as u64,
        "{streams} stalled streams added {added} bytes"
    );
    assert!(
        added < streams * session / 3,
        "{added} bytes against sessions of {session}"
    );

    let mut done = Vec::new();
    for stalled in exports {
        done.push(tokio::spawn(stalled.finish_export()));
    }
    for stalled in watches {
        done.push(tokio::spawn(stalled.finish_watch()));
    }
    for task in done {
        task.await.expect("resumed stream");
    }
    process.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_streams_add_little_resident_memory_on_sqlite() {
    stalled_streams_add_little_resident_memory(Backend::File).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_streams_add_little_resident_memory_on_postgres() {
    if crate::support::postgres_available("faults_streams::rss_on_postgres").await {
        stalled_streams_add_little_resident_memory(Backend::Postgres).await;
    }
}
