//! Faults at the request edge: the bearer scheme in any case, requests that
//! do not decode (INVALID_ARGUMENT on every RPC, counted as such), the
//! server-wide bound on request bytes in flight, and the per-connection
//! HTTP/2 caps.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use prost::Message as _;
use prost::bytes::Bytes;
use sessionstore_client::v1 as pb;
use tokio::net::TcpStream;
use tonic::Code;
use tonic::codegen::http;
use tonic::transport::Channel;

use crate::hostile::{RawCodec, assert_serving, grpc_frame, raw_call, raw_unary, varint};
use crate::ops::{http_get, sample};
use crate::support::*;

/// How long any single wait here may take before the test fails.
const PATIENCE: Duration = Duration::from_secs(30);

const GAUGE: &str = "sessionstore_request_bytes_in_flight";

fn assert_malformed(what: &str, status: &tonic::Status) {
    assert_eq!(
        status.code(),
        Code::InvalidArgument,
        "{what}: {status:?} (never INTERNAL)"
    );
    assert_eq!(
        error_details(status).0.as_deref(),
        Some("MALFORMED_REQUEST"),
        "{what}: {status:?}"
    );
}

// ---------------------------------------------------------------------------
// 1. Credentials

/// A call carrying `authorization: VALUE` exactly.
fn with_authorization<T>(message: T, value: &str) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request
        .metadata_mut()
        .insert("authorization", value.parse().expect("header value"));
    request
}

fn list(value: &str) -> tonic::Request<pb::ListSessionsRequest> {
    with_authorization(pb::ListSessionsRequest::default(), value)
}

/// Polls until a call with `authorization: value` is accepted (or refused),
/// failing after 8 s (the file is reloaded within 5 s). A reload has no
/// event a client could wait on; the pause is only the poll interval.
async fn wait_until_accepted(
    client: &mut sessionstore_client::SessionStoreClient<Channel>,
    value: &str,
    accepted: bool,
) {
    let what = format!(
        "{value:?} {}",
        if accepted { "accepted" } else { "refused" }
    );
    crate::support::poll_until(&what, Duration::from_secs(8), || {
        let mut client = client.clone();
        async move {
            let result = client.list_sessions(list(value)).await;
            let is_accepted = !matches!(&result, Err(s) if s.code() == Code::Unauthenticated);
            (is_accepted == accepted).then_some(())
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bearer_scheme_is_matched_in_any_case_and_the_token_taken_as_sent() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    // "tok" is acme's; " tok" (with its leading space) is globex's.
    std::fs::write(
        &tokens,
        token_line("acme", "tok") + &token_line("globex", " tok"),
    )
    .unwrap();
    let path = tokens.clone();
    let server = TestServer::start_on(Storage::new(Backend::Memory).await, move |config| {
        config.auth_tokens = Some(path);
    })
    .await;
    let mut client = server.client().await;

    for scheme in ["Bearer", "bearer", "BEARER", "BeArEr"] {
        client
            .create_session(with_authorization(
                pb::CreateSessionRequest {
                    session_id: format!("ses_{}", scheme.to_lowercase().len() + scheme.len()),
                    ..Default::default()
                },
                &format!("{scheme} tok"),
            ))
            .await
            .map(|_| ())
            .or_else(|status| match status.code() {
                // The same id again: authenticated, as acme.
                Code::AlreadyExists => Ok(()),
                _ => Err(status),
            })
            .unwrap_or_else(|status| panic!("{scheme} tok: {status:?}"));
    }
    // Two spaces: the token is " tok", globex's, which sees none of acme's sessions.
    client
        .create_session(with_authorization(
            pb::CreateSessionRequest {
                session_id: "ses_globex".into(),
                ..Default::default()
            },
            "Bearer  tok",
        ))
        .await
        .expect("\"Bearer  tok\" is globex's token \" tok\"");
    let globex = client
        .list_sessions(list("bearer  tok"))
        .await
        .unwrap()
        .into_inner();
    let ids: Vec<&str> = globex
        .sessions
        .iter()
        .filter_map(|s| s.session.as_ref().map(|s| s.id.as_str()))
        .collect();
    assert_eq!(ids, ["ses_globex"]);
    let acme = client.list_sessions(list("Bearer tok")).await.unwrap();
    assert_eq!(acme.into_inner().sessions.len(), 1, "acme's one session");
    // Not the bearer scheme, or no token after it.
    for value in ["Basic tok", "Bearertok", "Bearer", "Bearer ", "Bearer tok2"] {
        let status = client.list_sessions(list(value)).await.unwrap_err();
        assert_eq!(
            status.code(),
            Code::Unauthenticated,
            "{value:?}: {status:?}"
        );
    }

    // A reloaded file with no valid token line replaces the tokens: every
    // call is refused (and the server logs it as an error).
    std::fs::write(&tokens, "# every token revoked\nnot a token line\n").unwrap();
    wait_until_accepted(&mut client, "Bearer tok", false).await;
    let status = client.list_sessions(list("Bearer  tok")).await.unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    // And a good file brings them back.
    std::fs::write(&tokens, token_line("acme", "tok")).unwrap();
    wait_until_accepted(&mut client, "BEARER tok", true).await;
    server.stop().await.unwrap();
}

// ---------------------------------------------------------------------------
// 2. Requests that do not decode

/// `depth` groups of an unknown field opened, then closed.
fn nested_groups(depth: usize) -> Vec<u8> {
    let start = varint((99 << 3) | 3);
    let end = varint((99 << 3) | 4);
    let mut out = Vec::with_capacity(depth * (start.len() + end.len()));
    for _ in 0..depth {
        out.extend(&start);
    }
    for _ in 0..depth {
        out.extend(&end);
    }
    out
}

/// Bodies no request of the service decodes from.
fn undecodable() -> Vec<(&'static str, Vec<u8>)> {
    vec![
        ("field 1 not UTF-8", vec![0x0a, 0x02, 0xff, 0xfe]),
        ("a varint of 11 bytes", [&[0x08][..], &[0xff; 11]].concat()),
        ("a length past the end", vec![0x0a, 0xe8, 0x07, b'a', b'b']),
        ("5,000 nested groups", nested_groups(5_000)),
        ("50,000 nested groups", nested_groups(50_000)),
    ]
}

const UNARY: [&str; 29] = [
    "CreateSession",
    "GetSession",
    "ListSessions",
    "UpdateSession",
    "DeleteSession",
    "AppendExchange",
    "ListMessages",
    "ListProviderCalls",
    "PublishDelta",
    "DiscardRun",
    "BeginRun",
    "EndRun",
    "RollbackSession",
    "EditMessage",
    "RedactMessage",
    "ForkSession",
    "SetState",
    "GetState",
    "ListState",
    "DeleteState",
    "SearchMessages",
    "RequestApproval",
    "DecideApproval",
    "GetApproval",
    "ListApprovals",
    "SubmitInput",
    "TakeQueuedInput",
    "ListQueuedInputs",
    "WithdrawQueuedInput",
];

const STREAMING: [&str; 3] = ["ExportHistory", "ExportTranscript", "WatchSession"];

/// Calls server-streaming `method` with `body` and reads to its end.
async fn raw_streaming(channel: Channel, method: &str, body: Vec<u8>) -> Result<(), tonic::Status> {
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready()
        .await
        .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    let path = http::uri::PathAndQuery::try_from(format!("/sessionstore.v1.SessionStore/{method}"))
        .expect("path");
    let mut stream = grpc
        .server_streaming(tonic::Request::new(body), path, RawCodec)
        .await?
        .into_inner();
    while stream.message().await?.is_some() {}
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undecodable_requests_are_invalid_argument_on_every_rpc() {
    let server = TestServer::start_on(Storage::new(Backend::Memory).await, |config| {
        config.telemetry.metrics_listen = Some("127.0.0.1:0".into());
    })
    .await;
    let metrics = server.metrics_addr.expect("metrics are served");
    let channel = Channel::from_shared(server.endpoint())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let bodies = undecodable();
    for method in UNARY.iter().chain(&STREAMING) {
        for (what, body) in &bodies {
            let call = async {
                if STREAMING.contains(method) {
                    raw_streaming(channel.clone(), method, body.clone()).await
                } else {
                    raw_unary(channel.clone(), method, body.clone())
                        .await
                        .map(|_| ())
                }
            };
            let result = tokio::time::timeout(PATIENCE, call)
                .await
                .unwrap_or_else(|_| panic!("{method} with {what}: no answer"));
            let status = result.expect_err(&format!("{method} accepted {what}"));
            assert_malformed(&format!("{method} with {what}"), &status);
        }
    }
    // The decoder's message names what was wrong.
    let status = raw_unary(channel.clone(), "GetSession", bodies[0].1.clone())
        .await
        .unwrap_err();
    assert!(
        status.message().contains("invalid string value"),
        "{status:?}"
    );
    let status = raw_unary(channel, "GetSession", nested_groups(5_000))
        .await
        .unwrap_err();
    assert!(status.message().contains("recursion limit"), "{status:?}");

    // Counted as client errors, by method.
    let text = http_get(metrics, "/metrics").await.1;
    for method in [
        "GetSession",
        "AppendExchange",
        "WatchSession",
        "ExportHistory",
    ] {
        let line = format!(
            "grpc_server_handled_total{{grpc_service=\"sessionstore.v1.SessionStore\",grpc_method=\"{method}\",grpc_code=\"InvalidArgument\"}}"
        );
        assert!(
            sample(&text, &line).is_some_and(|n| n >= bodies.len() as f64),
            "{line} in\n{text}"
        );
    }
    assert!(!text.contains("grpc_code=\"Internal\""), "{text}");
    assert_serving(&server.endpoint(), "undecodable requests").await;
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broken_grpc_framing_is_invalid_argument() {
    let server = TestServer::start(Backend::Memory).await;
    let addr = server.addr;
    let valid = pb::GetSessionRequest {
        session_id: "nope".into(),
        ..Default::default()
    }
    .encode_to_vec();
    let cases = [
        ("claims 10 bytes, sends 3", grpc_frame(0, 10, &[1, 2, 3])),
        ("half a prefix", vec![0, 0]),
        (
            "claims 1 MB, sends 1 KB",
            grpc_frame(0, 1 << 20, &[0; 1024]),
        ),
        ("flag 0x80", grpc_frame(0x80, 0, &[])),
        (
            "compressed without grpc-encoding",
            grpc_frame(1, 3, &[1, 2, 3]),
        ),
        ("no message at all", Vec::new()),
        (
            "a whole message, then half a prefix",
            [grpc_frame(0, valid.len() as u32, &valid), vec![0, 0, 0]].concat(),
        ),
    ];
    for method in [
        "GetSession",
        "AppendExchange",
        "ExportHistory",
        "WatchSession",
    ] {
        let path = format!("/sessionstore.v1.SessionStore/{method}");
        for (what, body) in &cases {
            let answer = raw_call(addr, &path, "application/grpc", body.clone())
                .await
                .unwrap_or_else(|e| panic!("{method}, {what}: {e}"));
            assert_eq!(
                answer.grpc_status,
                Some(Code::InvalidArgument),
                "{method}, {what}: {answer:?}"
            );
        }
    }
    // Health too: its Check takes one message.
    let answer = raw_call(
        addr,
        "/grpc.health.v1.Health/Check",
        "application/grpc",
        vec![0, 0, 0, 0, 9, 1],
    )
    .await
    .unwrap();
    assert_eq!(
        answer.grpc_status,
        Some(Code::InvalidArgument),
        "{answer:?}"
    );
    assert_serving(&server.endpoint(), "broken framing").await;
    server.stop().await.unwrap();
}

// ---------------------------------------------------------------------------
// 3. Request bytes in flight

/// One raw HTTP/2 connection on which requests are opened and left
/// unfinished.
struct RawConnection {
    sender: h2::client::SendRequest<Bytes>,
    driver: tokio::task::JoinHandle<()>,
    addr: SocketAddr,
}

impl RawConnection {
    async fn open(addr: SocketAddr) -> RawConnection {
        let tcp = TcpStream::connect(addr).await.expect("connect");
        let (sender, connection) = h2::client::handshake(tcp).await.expect("handshake");
        let driver = tokio::spawn(async move {
            let _ = connection.await;
        });
        RawConnection {
            sender,
            driver,
            addr,
        }
    }

    /// Opens a call of `method` that sends `data` and leaves its body open.
    async fn start(
        &mut self,
        method: &str,
        authorization: Option<&str>,
        data: Vec<u8>,
    ) -> (h2::client::ResponseFuture, h2::SendStream<Bytes>) {
        let sender = self.sender.clone().ready().await.expect("ready");
        self.sender = sender;
        let mut request = http::Request::builder()
            .method("POST")
            .uri(format!(
                "http://{}/sessionstore.v1.SessionStore/{method}",
                self.addr
            ))
            .header("content-type", "application/grpc")
            .header("te", "trailers");
        if let Some(value) = authorization {
            request = request.header("authorization", value);
        }
        let (response, mut stream) = self
            .sender
            .send_request(request.body(()).expect("request"), false)
            .expect("send request");
        // A call the server refuses on its headers alone may already be
        // answered and reset when the body goes out: its answer is what
        // the caller checks.
        let _ = stream.send_data(Bytes::from(data), false);
        (response, stream)
    }
}

impl Drop for RawConnection {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

/// The status of a trailers-only answer (every refusal of a request).
async fn refusal(response: h2::client::ResponseFuture) -> tonic::Status {
    let response = tokio::time::timeout(PATIENCE, response)
        .await
        .expect("an answer while the body is unfinished")
        .expect("response");
    tonic::Status::from_header_map(response.headers())
        .unwrap_or_else(|| panic!("no grpc-status in {response:?}"))
}

async fn gauge(metrics: SocketAddr) -> f64 {
    let text = http_get(metrics, "/metrics").await.1;
    sample(&text, &format!("{GAUGE} ")).unwrap_or_else(|| panic!("no {GAUGE} in\n{text}"))
}

/// Polls the gauge until `done` holds of it, checking every reading
/// against `bound`; returns the last reading.
async fn watch_gauge(metrics: SocketAddr, bound: f64, done: impl Fn(f64) -> bool) -> f64 {
    let start = Instant::now();
    loop {
        let value = gauge(metrics).await;
        assert!(value <= bound, "{GAUGE} {value} is past the bound {bound}");
        if done(value) {
            return value;
        }
        assert!(start.elapsed() < PATIENCE, "{GAUGE} stuck at {value}");
        tokio::task::yield_now().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_bytes_in_flight_are_bounded_server_wide() {
    const BOUND: usize = 8 << 20;
    const CLAIMED: usize = 3 << 20;
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, token_line("acme", "tok")).unwrap();
    let path = tokens.clone();
    let server = TestServer::start_on(Storage::new(Backend::Memory).await, move |config| {
        config.auth_tokens = Some(path);
        config.limits.max_request_bytes_in_flight = BOUND;
        config.telemetry.metrics_listen = Some("127.0.0.1:0".into());
    })
    .await;
    let metrics = server.metrics_addr.expect("metrics are served");
    let bound = BOUND as f64;
    assert_eq!(gauge(metrics).await, 0.0);
    let half_sent = || grpc_frame(0, CLAIMED as u32, &[0; 64 * 1024]);
    let mut connection = RawConnection::open(server.addr).await;

    // Without credentials nothing is read, so nothing is held.
    let (response, _unauthenticated) = connection.start("AppendExchange", None, half_sent()).await;
    assert_eq!(refusal(response).await.code(), Code::Unauthenticated);
    assert_eq!(gauge(metrics).await, 0.0);

    // Two half-sent requests of 3 MiB each fit in 8 MiB: each holds its
    // whole message from its prefix on, and waits for the rest.
    let mut open = Vec::new();
    for held in 1..=2 {
        let (response, stream) = connection
            .start("AppendExchange", Some("Bearer tok"), half_sent())
            .await;
        let expected = (held * (CLAIMED + 5)) as f64;
        watch_gauge(metrics, bound, |value| value == expected).await;
        open.push((response, stream));
    }
    // The third would pass the bound: refused while its body is unfinished,
    // as is any other, on this connection or another.
    let mut other = RawConnection::open(server.addr).await;
    for (what, connection) in [("same", &mut connection), ("other", &mut other)] {
        for method in ["AppendExchange", "CreateSession"] {
            let (response, _stream) = connection
                .start(method, Some("Bearer tok"), half_sent())
                .await;
            let status = refusal(response).await;
            assert_eq!(
                status.code(),
                Code::ResourceExhausted,
                "{what} connection, {method}: {status:?}"
            );
            let details = {
                use tonic_types::StatusExt as _;
                status.get_error_details()
            };
            let info = details.error_info().expect("ErrorInfo");
            assert_eq!(info.reason, "LIMIT_EXCEEDED");
            assert_eq!(
                info.metadata.get("limit").map(String::as_str),
                Some("max_request_bytes_in_flight")
            );
        }
    }
    watch_gauge(metrics, bound, |value| value == (2 * (CLAIMED + 5)) as f64).await;
    // Small requests wait for nothing but room: one that fits is served.
    let mut client = server.client().await;
    let status = client
        .get_session(authed(
            pb::GetSessionRequest {
                session_id: "ses_none".into(),
                ..Default::default()
            },
            "tok",
        ))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::NotFound, "{status:?}");

    // Reset the half-sent requests: everything comes back.
    for (_, mut stream) in open {
        stream.send_reset(h2::Reason::CANCEL);
    }
    watch_gauge(metrics, bound, |value| value == 0.0).await;
    drop(connection);
    drop(other);
    create_authed(&mut client, "ses_after").await;
    client
        .append_exchange(authed(
            exchange_request("ses_after", "still there?", "yes"),
            "tok",
        ))
        .await
        .expect("an ordinary append after the bound was reached");
    assert_eq!(gauge(metrics).await, 0.0);
    server.stop().await.unwrap();
}

async fn create_authed(client: &mut sessionstore_client::SessionStoreClient<Channel>, id: &str) {
    client
        .create_session(authed(
            pb::CreateSessionRequest {
                session_id: id.to_owned(),
                ..Default::default()
            },
            "tok",
        ))
        .await
        .expect("create session");
}

// ---------------------------------------------------------------------------
// 4. Per-connection caps

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_advertise_the_stream_cap() {
    let server = TestServer::start_on(Storage::new(Backend::Memory).await, |config| {
        config.limits.max_concurrent_streams_per_connection = 7;
    })
    .await;
    let tcp = TcpStream::connect(server.addr).await.unwrap();
    let (sender, mut connection) = h2::client::handshake(tcp).await.unwrap();
    let mut sender = sender.ready().await.unwrap();
    let request = http::Request::builder()
        .method("POST")
        .uri(format!(
            "http://{}/grpc.health.v1.Health/Check",
            server.addr
        ))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap();
    let valid = tonic_health::pb::HealthCheckRequest::default().encode_to_vec();
    let (response, mut stream) = sender.send_request(request, false).unwrap();
    stream
        .send_data(Bytes::from(grpc_frame(0, valid.len() as u32, &valid)), true)
        .unwrap();
    // Drive the connection until the answer, by which time the server's
    // SETTINGS have arrived.
    let response = tokio::select! {
        response = response => response.expect("response"),
        ended = &mut connection => panic!("the connection ended: {ended:?}"),
    };
    assert_eq!(response.status(), 200);
    assert_eq!(connection.max_concurrent_send_streams(), 7);
    drop((sender, stream, connection));

    // The default leaves room for a gateway's thousand watchers on one
    // connection.
    let defaults = sessionstore_server::config::LimitsConfig::default();
    assert!(defaults.max_concurrent_streams_per_connection >= 1_000);
    server.stop().await.unwrap();
}
