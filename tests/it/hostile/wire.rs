//! Garbage on the wire: random bytes, broken HTTP/2, lying gRPC length
//! prefixes, mistyped protobuf and cancelled streams never take the server
//! down.

use super::*;

// ---------------------------------------------------------------------------
// 3. Garbage on the wire

/// SplitMix64: seeded, so a failing batch can be replayed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// Up to `max` random bytes.
    fn noise(&mut self, max: usize) -> Vec<u8> {
        let n = self.below(max);
        self.bytes(n)
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(n + 8);
        while out.len() < n {
            out.extend(self.next().to_le_bytes());
        }
        out.truncate(n);
        out
    }
}

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// An HTTP/2 frame; `declared` overrides the length field when it lies.
fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8], declared: Option<u32>) -> Vec<u8> {
    let len = declared.unwrap_or(payload.len() as u32);
    let mut out = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    out.extend(stream.to_be_bytes());
    out.extend(payload);
    out
}

/// The preface and an empty SETTINGS frame: a client saying hello.
fn hello() -> Vec<u8> {
    let mut out = PREFACE.to_vec();
    out.extend(frame(4, 0, 0, &[], None));
    out
}

/// A TLS 1.2/1.3 ClientHello record, with random bytes where randomness goes.
fn client_hello(rng: &mut Rng) -> Vec<u8> {
    let mut body = vec![0x03, 0x03];
    body.extend(rng.bytes(32));
    body.push(0); // session id
    body.extend([0x00, 0x04, 0x13, 0x01, 0x13, 0x02]); // cipher suites
    body.extend([0x01, 0x00]); // compression
    let sni = b"localhost";
    let mut ext = vec![0x00, 0x00];
    let list_len = sni.len() + 3;
    ext.extend(((list_len + 2) as u16).to_be_bytes());
    ext.extend((list_len as u16).to_be_bytes());
    ext.push(0);
    ext.extend((sni.len() as u16).to_be_bytes());
    ext.extend(sni);
    body.extend((ext.len() as u16).to_be_bytes());
    body.extend(ext);
    let mut handshake = vec![0x01];
    handshake.extend(&(body.len() as u32).to_be_bytes()[1..]);
    handshake.extend(body);
    let mut record = vec![0x16, 0x03, 0x01];
    record.extend((handshake.len() as u16).to_be_bytes());
    record.extend(handshake);
    record
}

/// One hostile connection's bytes, and whether to hang up without reading.
fn garbage(rng: &mut Rng, kind: usize) -> (Vec<u8>, bool) {
    match kind {
        // Pure noise, mostly small, sometimes up to a megabyte.
        0 => {
            let size = [0, 1, 23, 24, 25, 1000, 16 * 1024, 64 * 1024][rng.below(8)];
            (rng.bytes(size), false)
        }
        1 => (rng.bytes(1024 * 1024), false),
        // A correct preface, then random frames (some lying about their length).
        2 => {
            let mut out = hello();
            for _ in 0..1 + rng.below(20) {
                let kind = if rng.below(4) == 0 {
                    rng.below(256) as u8
                } else {
                    rng.below(10) as u8
                };
                let flags = rng.below(256) as u8;
                let stream = [0, 1, 3, 2, 0x7fff_ffff, 0xffff_ffff][rng.below(6)];
                let payload = rng.noise(64);
                let declared = (rng.below(5) == 0).then(|| rng.next() as u32 & 0x00ff_ffff);
                out.extend(frame(kind, flags, stream, &payload, declared));
            }
            (out, false)
        }
        // A frame cut short, then an abrupt hang-up.
        3 => {
            let mut out = hello();
            let mut cut = frame(1, 0x4, 1, &rng.bytes(200), Some(1000));
            cut.truncate(9 + rng.below(50));
            out.extend(cut);
            (out, true)
        }
        // A preface cut short.
        4 => (
            PREFACE[..rng.below(PREFACE.len())].to_vec(),
            rng.below(2) == 0,
        ),
        // HTTP/1.1 of several kinds.
        5 => {
            let texts: [&[u8]; 4] = [
                b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n",
                b"POST /sessionstore.v1.SessionStore/GetSession HTTP/1.1\r\nHost: a\r\nContent-Type: application/grpc\r\nContent-Length: 5\r\n\r\n\0\0\0\0\0",
                b"GET / HTTP/1.1\r\nHost: a\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\n\r\n",
                b"GET /metrics HTTP/1.0\r\n\r\n",
            ];
            (texts[rng.below(texts.len())].to_vec(), false)
        }
        // A TLS ClientHello to a plaintext port.
        6 => (client_hello(rng), false),
        // A flood of PINGs and SETTINGS.
        7 => {
            let mut out = hello();
            for _ in 0..2000 {
                if rng.below(2) == 0 {
                    out.extend(frame(6, 0, 0, &rng.bytes(8), None));
                } else {
                    out.extend(frame(4, 0, 0, &[0, 4, 0, 0, 0xff, 0xff], None));
                }
            }
            (out, false)
        }
        // HEADERS with an undecodable header block; CONTINUATION without HEADERS.
        _ => {
            let mut out = hello();
            out.extend(frame(1, 0x4, 1, &rng.noise(100), None));
            out.extend(frame(9, 0x4, 3, &rng.noise(40), None));
            (out, false)
        }
    }
}

/// Sends `bytes` on a fresh connection; unless `hang_up`, half-closes and
/// waits for the server to close its side. Err if it does not within
/// [`PATIENCE`].
async fn send_garbage(addr: SocketAddr, bytes: Vec<u8>, hang_up: bool) -> Result<(), String> {
    let mut stream = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    // The server may close mid-write; that is its right.
    let _ = stream.write_all(&bytes).await;
    if hang_up {
        return Ok(());
    }
    let _ = stream.shutdown().await;
    let mut buf = vec![0u8; 16 * 1024];
    let drained = async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
    };
    tokio::time::timeout(PATIENCE, drained).await.map_err(|_| {
        format!(
            "the server kept a garbage connection ({} bytes) open",
            bytes.len()
        )
    })
}

/// Two hundred hostile connections in batches, some concurrent, with idle
/// half-open connections held throughout; after each batch the server still
/// serves.
async fn garbage_connections(backend: Backend) {
    let server = TestServer::start(backend).await;
    let addr = server.addr;
    let mut rng = Rng(0x6a7b_a9e0);
    // Connections that said almost nothing and wait: they must not block others.
    let mut idle = Vec::new();
    for i in 0..8 {
        let mut stream = TcpStream::connect(addr).await.expect("connect");
        stream.write_all(&PREFACE[..i * 3]).await.expect("write");
        idle.push(stream);
    }
    let mut sent = 0;
    for batch in 0..8 {
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..25 {
            // Megabyte noise is slow in debug builds; four suffice.
            let kind = match rng.below(9) {
                _ if sent % 50 == 1 => 1,
                1 => 0,
                kind => kind,
            };
            let (bytes, hang_up) = garbage(&mut rng, kind);
            sent += 1;
            if rng.below(3) == 0 {
                // Some one after another...
                send_garbage(addr, bytes, hang_up)
                    .await
                    .unwrap_or_else(|e| panic!("batch {batch}, kind {kind}: {e}"));
            } else {
                // ...most at once.
                tasks.spawn(async move {
                    send_garbage(addr, bytes, hang_up)
                        .await
                        .map_err(|e| format!("batch {batch}, kind {kind}: {e}"))
                });
            }
        }
        while let Some(result) = tasks.join_next().await {
            result
                .expect("garbage task")
                .unwrap_or_else(|e| panic!("{e}"));
        }
        assert_serving(&server.endpoint(), &format!("garbage batch {batch}")).await;
    }
    assert_eq!(sent, 200);
    drop(idle);
    server.stop().await.expect("the server stops cleanly");
}

/// A gRPC message frame whose 5-byte prefix says `flag` and `claimed` length.
pub(crate) fn grpc_frame(flag: u8, claimed: u32, body: &[u8]) -> Vec<u8> {
    let mut out = vec![flag];
    out.extend(claimed.to_be_bytes());
    out.extend(body);
    out
}

/// What a raw HTTP/2 request got back.
#[derive(Debug)]
pub(crate) struct RawAnswer {
    pub(crate) http_status: u16,
    pub(crate) grpc_status: Option<Code>,
}

/// One request on its own raw HTTP/2 connection; dropping it drops the
/// connection.
pub(crate) struct RawStream {
    response: Option<h2::client::ResponseFuture>,
    _stream: h2::SendStream<Bytes>,
    driver: tokio::task::JoinHandle<()>,
}

impl Drop for RawStream {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

/// Opens a connection and sends one request with `body` as its DATA,
/// ending the stream unless `keep_open`.
pub(crate) async fn raw_h2(
    addr: SocketAddr,
    path: &str,
    content_type: &str,
    body: Vec<u8>,
    keep_open: bool,
) -> Result<RawStream, String> {
    let tcp = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let (sender, connection) = h2::client::handshake(tcp)
        .await
        .map_err(|e| e.to_string())?;
    let driver = tokio::spawn(async move {
        let _ = connection.await;
    });
    let mut sender = sender.ready().await.map_err(|e| e.to_string())?;
    let request = http::Request::builder()
        .method("POST")
        .uri(format!("http://{addr}{path}"))
        .header("content-type", content_type)
        .header("te", "trailers")
        .body(())
        .map_err(|e| e.to_string())?;
    let (response, mut stream) = sender
        .send_request(request, false)
        .map_err(|e| e.to_string())?;
    // The server may answer (and close the stream) before the body is sent,
    // as it does for an unknown method: the body is then refused as sent on
    // an inactive stream, and the answer is what the caller reads.
    let _ = stream.send_data(Bytes::from(body), !keep_open);
    Ok(RawStream {
        response: Some(response),
        _stream: stream,
        driver,
    })
}

/// The status line and grpc-status of a raw request's answer.
pub(crate) async fn raw_answer(raw: &mut RawStream) -> Result<RawAnswer, String> {
    let response = raw.response.take().ok_or("already answered")?;
    let work = async {
        let response = response.await.map_err(|e| e.to_string())?;
        let grpc_status = |headers: &http::HeaderMap| {
            headers
                .get("grpc-status")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<i32>().ok())
                .map(Code::from)
        };
        let mut answer = RawAnswer {
            http_status: response.status().as_u16(),
            grpc_status: grpc_status(response.headers()),
        };
        if answer.grpc_status.is_none() {
            let mut body = response.into_body();
            while let Some(chunk) = body.data().await {
                let chunk = chunk.map_err(|e| e.to_string())?;
                let _ = body.flow_control().release_capacity(chunk.len());
            }
            let trailers = body.trailers().await.map_err(|e| e.to_string())?;
            answer.grpc_status = trailers.as_ref().and_then(grpc_status);
        }
        Ok(answer)
    };
    tokio::time::timeout(PATIENCE, work)
        .await
        .map_err(|_| "no answer within the patience".to_owned())?
}

/// Sends one request on a fresh connection and reads its answer.
pub(crate) async fn raw_call(
    addr: SocketAddr,
    path: &str,
    content_type: &str,
    body: Vec<u8>,
) -> Result<RawAnswer, String> {
    let mut raw = raw_h2(addr, path, content_type, body, false).await?;
    raw_answer(&mut raw).await
}

/// Passes bytes through untouched, so a test can send any protobuf at all.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct RawCodec;

#[derive(Debug)]
pub(crate) struct RawEncoder;

#[derive(Debug)]
pub(crate) struct RawDecoder;

impl Encoder for RawEncoder {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), tonic::Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for RawDecoder {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, tonic::Status> {
        let mut out = vec![0; src.remaining()];
        src.copy_to_slice(&mut out);
        Ok(Some(out))
    }
}

impl Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawEncoder;
    type Decoder = RawDecoder;

    fn encoder(&mut self) -> RawEncoder {
        RawEncoder
    }

    fn decoder(&mut self) -> RawDecoder {
        RawDecoder
    }
}

/// Calls `method` of SessionStore with `body` as the encoded request.
pub(crate) async fn raw_unary(
    channel: Channel,
    method: &str,
    body: Vec<u8>,
) -> Result<Vec<u8>, tonic::Status> {
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready()
        .await
        .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    let path = http::uri::PathAndQuery::try_from(format!("/sessionstore.v1.SessionStore/{method}"))
        .expect("path");
    grpc.unary(tonic::Request::new(body), path, RawCodec)
        .await
        .map(tonic::Response::into_inner)
}

/// Protobuf varint.
pub(crate) fn varint(mut n: u64) -> Vec<u8> {
    let mut out = Vec::new();
    while n >= 0x80 {
        out.push((n as u8) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
    out
}

/// Request bodies that are not what the method expects: wrong wire types,
/// invalid UTF-8, truncation, overlong varints, deep group nesting, a
/// role far out of range, and noise.
fn mistyped_bodies(rng: &mut Rng) -> Vec<(&'static str, Vec<u8>)> {
    let mut deep_groups = Vec::new();
    let start = varint((99 << 3) | 3);
    let end = varint((99 << 3) | 4);
    for _ in 0..50_000 {
        deep_groups.extend(&start);
    }
    for _ in 0..50_000 {
        deep_groups.extend(&end);
    }
    let mut huge_role = vec![0x0a, 0x03, b's', b'-', b'1', 0x12];
    let message = [&[0x08][..], &varint(u64::MAX)].concat();
    huge_role.extend(varint(message.len() as u64));
    huge_role.extend(message);
    let mut bodies = vec![
        ("session_id as a varint", vec![0x08, 0x96, 0x01]),
        ("messages as fixed32", vec![0x15, 1, 2, 3, 4]),
        ("session_id not UTF-8", vec![0x0a, 0x02, 0xff, 0xfe]),
        ("length past the end", vec![0x0a, 0xe8, 0x07, b'a', b'b']),
        ("overlong varint", [&[0x08][..], &[0xff; 11]].concat()),
        ("wire type 7", vec![0x0f, 0x00]),
        ("field number 0", vec![0x00, 0x00]),
        ("role as a string", vec![0x12, 0x03, 0x0a, 0x01, b'x']),
        ("unterminated group", varint((7 << 3) | 3)),
        ("deeply nested groups", deep_groups),
        ("role out of range", huge_role),
        ("empty", Vec::new()),
    ];
    for _ in 0..40 {
        let size = rng.below(200);
        bodies.push(("noise", rng.bytes(size)));
    }
    bodies
}

async fn malformed_grpc(backend: Backend) {
    let server = TestServer::start(backend).await;
    let addr = server.addr;
    let mut rng = Rng(0xbad_b0d1e5);
    let append = "/sessionstore.v1.SessionStore/AppendExchange";

    // Lying or broken 5-byte prefixes in an otherwise ordinary call. A claim
    // over --max-request-bytes is RESOURCE_EXHAUSTED (the error table: "request over the
    // configured size limits"); a body that is cut short, a bad flag or no
    // message at all is malformed: INVALID_ARGUMENT, never INTERNAL.
    let oversize = [Code::ResourceExhausted, Code::InvalidArgument];
    let broken = [Code::InvalidArgument];
    let cases: Vec<(&str, Vec<u8>, &[Code])> = vec![
        (
            "claims 4 GB",
            grpc_frame(0, u32::MAX, &rng.bytes(1000)),
            &oversize,
        ),
        (
            "claims 4 GB, sends nothing",
            grpc_frame(0, u32::MAX, &[]),
            &oversize,
        ),
        ("claims 65 MB", grpc_frame(0, 65 << 20, &[0; 10]), &oversize),
        (
            "claims 60 MB, sends 1 KB",
            grpc_frame(0, 60 << 20, &rng.bytes(1024)),
            &broken,
        ),
        ("claims 10, sends 3", grpc_frame(0, 10, &[1, 2, 3]), &broken),
        ("half a prefix", vec![0, 0], &broken),
        (
            "compressed without grpc-encoding",
            grpc_frame(1, 3, &[1, 2, 3]),
            &broken,
        ),
        ("flag 0x80", grpc_frame(0x80, 0, &[]), &broken),
        ("no message at all", Vec::new(), &broken),
    ];
    for (what, body, allowed) in cases {
        let answer = raw_call(addr, append, "application/grpc", body)
            .await
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(answer.http_status, 200, "{what}: {answer:?}");
        let code = answer
            .grpc_status
            .unwrap_or_else(|| panic!("{what}: no grpc-status: {answer:?}"));
        assert!(
            allowed.contains(&code),
            "{what}: {code:?}, expected one of {allowed:?}"
        );
    }
    // Two messages in a unary call, an unknown method, a foreign content type:
    // any answer will do, as long as there is one.
    let valid = pb::GetSessionRequest {
        session_id: "nope".into(),
        ..Default::default()
    }
    .encode_to_vec();
    let one = grpc_frame(0, valid.len() as u32, &valid);
    let two = [one.clone(), one].concat();
    for (what, path, content_type, body) in [
        (
            "two messages",
            "/sessionstore.v1.SessionStore/GetSession",
            "application/grpc",
            two,
        ),
        (
            "unknown method",
            "/sessionstore.v1.SessionStore/Nope",
            "application/grpc",
            vec![0; 5],
        ),
        ("unknown service", "/x.Y/Z", "application/grpc", vec![0; 5]),
        ("JSON body", append, "application/json", b"{}".to_vec()),
    ] {
        raw_call(addr, path, content_type, body)
            .await
            .unwrap_or_else(|e| panic!("{what}: {e}"));
    }
    // Prefixes promising more than ever comes, on streams left open: the
    // 4 GB claim is refused at once; the others wait for a body that never
    // comes while the server goes on serving, then the connections drop.
    let mut open = Vec::new();
    for claimed in [u32::MAX, 60 << 20, 1 << 20] {
        for _ in 0..4 {
            let body = grpc_frame(0, claimed, &[0; 64]);
            let mut raw = raw_h2(addr, append, "application/grpc", body, true)
                .await
                .unwrap_or_else(|e| panic!("claiming {claimed}: {e}"));
            if claimed == u32::MAX {
                let answer = raw_answer(&mut raw)
                    .await
                    .unwrap_or_else(|e| panic!("claiming {claimed}: {e}"));
                assert!(
                    answer.grpc_status.is_some_and(|c| oversize.contains(&c)),
                    "an open stream claiming {claimed} bytes: {answer:?}"
                );
            }
            open.push(raw);
        }
    }
    assert_serving(&server.endpoint(), "streams with lying prefixes held open").await;
    drop(open);
    assert_serving(&server.endpoint(), "lying gRPC prefixes").await;

    // Well-framed bodies that are not the protobuf the method expects.
    let channel = Channel::from_shared(server.endpoint())
        .expect("endpoint")
        .connect()
        .await
        .expect("connect");
    let methods = [
        "AppendExchange",
        "CreateSession",
        "UpdateSession",
        "SetState",
        "BeginRun",
    ];
    for (what, body) in mistyped_bodies(&mut rng) {
        for method in methods {
            let result =
                tokio::time::timeout(PATIENCE, raw_unary(channel.clone(), method, body.clone()))
                    .await
                    .unwrap_or_else(|_| panic!("{method} with {what}: no answer"));
            let undecodable = [
                "session_id not UTF-8",
                "length past the end",
                "overlong varint",
                "wire type 7",
                "field number 0",
                "unterminated group",
                "deeply nested groups",
            ];
            let Err(status) = result else {
                assert!(!undecodable.contains(&what), "{method} accepted {what}");
                continue;
            };
            let (reason, _) = error_details(&status);
            if undecodable.contains(&what) {
                assert_eq!(
                    (status.code(), reason.as_deref()),
                    (Code::InvalidArgument, Some("MALFORMED_REQUEST")),
                    "{method} with {what}: {status:?}"
                );
            }
            // Undecodable protobuf is INVALID_ARGUMENT, never INTERNAL.
            let ok = SPEC_CODES.contains(&status.code())
                && (status.code() != Code::InvalidArgument
                    || reason.as_deref() == Some("MALFORMED_REQUEST")
                    || reason.as_deref() == Some("INVALID_ARGUMENT"));
            assert!(
                ok,
                "{method} with {what} ({body:02x?}): {:?} {:?} {reason:?}",
                status.code(),
                status.message()
            );
        }
    }
    let unknown = raw_unary(channel, "Nope", Vec::new()).await.unwrap_err();
    assert_eq!(unknown.code(), Code::Unimplemented);
    assert_serving(&server.endpoint(), "mistyped protobuf").await;
    server.stop().await.expect("the server stops cleanly");
}

/// Appends sent over raw HTTP/2 and reset at once or a moment later (a
/// rapid-reset storm): each exchange commits whole or not at all.
async fn cancelled_appends(backend: Backend) {
    let server = TestServer::start(backend).await;
    let addr = server.addr;
    let mut client = server.client().await;
    let id = "ses_cancelled";
    create(&mut client, id).await;

    let mut connections = tokio::task::JoinSet::new();
    for connection in 0..4u64 {
        let id = id.to_owned();
        connections.spawn(async move {
            let mut rng = Rng(connection);
            let mut sent = 0;
            // The server answers a reset storm with GOAWAY; come back on a
            // new connection until every append has been sent.
            while sent < 150 {
                let tcp = TcpStream::connect(addr).await.expect("connect");
                let Ok((sender, driver)) = h2::client::handshake(tcp).await else {
                    continue;
                };
                let driver = tokio::spawn(async move {
                    let _ = driver.await;
                });
                let mut sender = sender;
                while sent < 150 {
                    let Ok(ready) = sender.ready().await else {
                        break;
                    };
                    sender = ready;
                    let request = exchange_request(
                        &id,
                        &format!("q{connection}-{sent}"),
                        &format!("a{connection}-{sent}"),
                    );
                    let encoded = request.encode_to_vec();
                    let body = grpc_frame(0, encoded.len() as u32, &encoded);
                    let http_request = http::Request::builder()
                        .method("POST")
                        .uri(format!(
                            "http://{addr}/sessionstore.v1.SessionStore/AppendExchange"
                        ))
                        .header("content-type", "application/grpc")
                        .header("te", "trailers")
                        .body(())
                        .expect("request");
                    let Ok((response, mut stream)) = sender.send_request(http_request, false)
                    else {
                        break;
                    };
                    sent += 1;
                    let _ = stream.send_data(Bytes::from(body), true);
                    // Reset at once, a moment later, a while later (often
                    // mid-transaction), or not at all.
                    let yields =
                        [0, 1 + rng.below(3), 10 + rng.below(100), usize::MAX][rng.below(4)];
                    if yields == usize::MAX {
                        let _ = tokio::time::timeout(PATIENCE, response).await;
                        continue;
                    }
                    for _ in 0..yields {
                        tokio::task::yield_now().await;
                    }
                    stream.send_reset(h2::Reason::CANCEL);
                }
                driver.abort();
            }
        });
    }
    while let Some(result) = connections.join_next().await {
        result.expect("connection task");
    }

    // A read between two equal revisions is a consistent one; cancelled
    // calls still running on the server may move it, so look until it holds.
    let mut consistent = None;
    for _ in 0..200 {
        let before = get(&mut client, id).await.revision;
        let messages = all_messages(&mut client, id).await;
        let calls = client
            .list_provider_calls(pb::ListProviderCallsRequest {
                session_id: id.to_owned(),
                page_size: 1000,
                ..Default::default()
            })
            .await
            .expect("list calls")
            .into_inner();
        if get(&mut client, id).await.revision == before {
            consistent = Some((before, messages, calls));
            break;
        }
    }
    let (revision, messages, calls) = consistent.expect("the session settles");
    let exchanges = usize::try_from(revision - 1).expect("revision");
    assert_eq!(messages.len(), 2 * exchanges, "every exchange is whole");
    assert!(calls.provider_calls.len() == exchanges || !calls.next_page_token.is_empty());
    for (i, pair) in messages.chunks(2).enumerate() {
        assert_eq!(pair[0].sequence, 2 * i as i64);
        assert_eq!(pair[1].sequence, 2 * i as i64 + 1);
        let question = content(&pair[0]);
        let answer = content(&pair[1]);
        assert_eq!(
            question.strip_prefix('q'),
            answer.strip_prefix('a'),
            "exchange {i} is one request's"
        );
        assert!(pair[0].produced_by_call_id.is_empty());
        assert!(!pair[1].produced_by_call_id.is_empty());
    }
    let exported = export(
        &mut client,
        pb::ExportHistoryRequest {
            session_id: id.to_owned(),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(exported, plain(&messages));
    assert_serving(&server.endpoint(), "cancelled appends").await;
    drop(client);
    server.stop().await.expect("the server stops cleanly");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_connections_leave_the_server_serving() {
    garbage_connections(Backend::Memory).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_grpc_bodies_get_a_status() {
    malformed_grpc(Backend::Memory).await;
}

crate::backend_tests!(cancelled_appends);
