//! Operations: TLS and mutual TLS with certificates made at test time,
//! the configured limits, request deadlines, Prometheus metrics and JSON
//! logs.

use std::io::{BufRead as _, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use sessionstore_client::SessionStoreClient;
use sessionstore_client::v1 as pb;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tonic::Code;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};
use tonic_types::StatusExt as _;

use crate::support::{
    Backend, Storage, TestServer, all_messages, assistant, create, error_details, exchange_request,
    get, sessionstore_binary, user,
};

crate::backend_tests!(limits_name_themselves_and_write_nothing);

type Client = SessionStoreClient<Channel>;

/// An AppendExchange of client messages only.
fn appending(session_id: &str, messages: Vec<pb::Message>) -> pb::AppendExchangeRequest {
    pb::AppendExchangeRequest {
        session_id: session_id.to_owned(),
        messages,
        ..Default::default()
    }
}

/// A CA and the PEM files it signed, in a temporary directory.
struct Pki {
    dir: tempfile::TempDir,
    ca: CertifiedIssuer<'static, KeyPair>,
}

impl Pki {
    fn new(name: &str) -> Pki {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        let pki = Pki {
            dir: tempfile::tempdir().unwrap(),
            ca,
        };
        std::fs::write(pki.path("ca.pem"), pki.ca.pem()).unwrap();
        pki
    }

    fn path(&self, file: &str) -> std::path::PathBuf {
        self.dir.path().join(file)
    }

    /// Issues a certificate for `name`; writes `{file}.pem` and
    /// `{file}.key` and returns (certificate, key) PEM.
    fn issue(&self, file: &str, name: &str, usage: ExtendedKeyUsagePurpose) -> (String, String) {
        let mut params = CertificateParams::new(vec![name.to_owned()]).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params.extended_key_usages = vec![usage];
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.ca).unwrap();
        let (cert, key) = (cert.pem(), key.serialize_pem());
        std::fs::write(self.path(&format!("{file}.pem")), &cert).unwrap();
        std::fs::write(self.path(&format!("{file}.key")), &key).unwrap();
        (cert, key)
    }
}

async fn start_tls(pki: &Pki, client_ca: Option<&Path>) -> TestServer {
    pki.issue("server", "localhost", ExtendedKeyUsagePurpose::ServerAuth);
    let (cert, key) = (pki.path("server.pem"), pki.path("server.key"));
    let client_ca = client_ca.map(Path::to_owned);
    TestServer::start_on(Storage::new(Backend::Memory).await, move |config| {
        config.tls.tls_cert = Some(cert);
        config.tls.tls_key = Some(key);
        config.tls.tls_client_ca = client_ca;
    })
    .await
}

/// A TLS client trusting `ca_pem`, optionally presenting an identity.
async fn tls_client(
    server: &TestServer,
    ca_pem: &str,
    identity: Option<(String, String)>,
) -> Result<Client, tonic::transport::Error> {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca_pem))
        .domain_name("localhost");
    if let Some((cert, key)) = identity {
        tls = tls.identity(Identity::from_pem(cert, key));
    }
    let channel = Channel::from_shared(format!("https://localhost:{}", server.addr.port()))
        .unwrap()
        .tls_config(tls)?
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await?;
    Ok(SessionStoreClient::new(channel))
}

async fn create_over(client: &mut Client, id: &str) -> Result<pb::Session, tonic::Status> {
    client
        .create_session(pb::CreateSessionRequest {
            session_id: id.into(),
            ..Default::default()
        })
        .await
        .map(tonic::Response::into_inner)
}

#[tokio::test]
async fn tls_serves_with_a_certificate_made_at_test_time() {
    let pki = Pki::new("sessionstore test CA");
    let server = start_tls(&pki, None).await;

    let mut client = tls_client(&server, &pki.ca.pem(), None).await.unwrap();
    let session = create_over(&mut client, "over-tls").await.unwrap();
    assert_eq!(session.id, "over-tls");

    // Plaintext against a TLS port gets nowhere.
    let plaintext = Channel::from_shared(server.endpoint())
        .unwrap()
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(5))
        .connect()
        .await;
    if let Ok(channel) = plaintext {
        let refused = SessionStoreClient::new(channel)
            .get_session(pb::GetSessionRequest {
                session_id: "over-tls".into(),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_ne!(refused.code(), Code::Ok);
    }

    // A client that trusts another CA refuses the server.
    let stranger = Pki::new("another CA");
    let untrusted = match tls_client(&server, &stranger.ca.pem(), None).await {
        Err(_) => true,
        Ok(mut client) => create_over(&mut client, "x").await.is_err(),
    };
    assert!(untrusted, "a certificate from an untrusted CA was accepted");
    server.stop().await.unwrap();
}

#[tokio::test]
async fn mutual_tls_requires_a_certificate_from_the_client_ca() {
    let server_pki = Pki::new("server CA");
    let client_pki = Pki::new("client CA");
    let server = start_tls(&server_pki, Some(&client_pki.path("ca.pem"))).await;
    let ca = server_pki.ca.pem();

    let accepted = client_pki.issue("alice", "alice", ExtendedKeyUsagePurpose::ClientAuth);
    let mut alice = tls_client(&server, &ca, Some(accepted)).await.unwrap();
    assert_eq!(create_over(&mut alice, "mtls").await.unwrap().id, "mtls");

    let refused = |client: Result<Client, tonic::transport::Error>| async move {
        match client {
            Err(_) => true,
            Ok(mut client) => create_over(&mut client, "intruder").await.is_err(),
        }
    };
    assert!(
        refused(tls_client(&server, &ca, None).await).await,
        "a client without a certificate got in"
    );
    let rogue_pki = Pki::new("rogue CA");
    let rogue = rogue_pki.issue("mallory", "mallory", ExtendedKeyUsagePurpose::ClientAuth);
    assert!(
        refused(tls_client(&server, &ca, Some(rogue)).await).await,
        "a certificate from another CA got in"
    );
    let get = alice
        .get_session(pb::GetSessionRequest {
            session_id: "intruder".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(
        get.code(),
        Code::NotFound,
        "the refused calls wrote nothing"
    );
    server.stop().await.unwrap();
}

#[tokio::test]
async fn a_half_tls_configuration_stops_the_binary() {
    let pki = Pki::new("ca");
    pki.issue("server", "localhost", ExtendedKeyUsagePurpose::ServerAuth);
    let bad_key = pki.path("broken.key");
    std::fs::write(&bad_key, "not a key").unwrap();
    let cases: [Vec<String>; 2] = [
        vec![
            "--tls-cert".into(),
            pki.path("server.pem").display().to_string(),
        ],
        vec![
            "--tls-cert".into(),
            pki.path("server.pem").display().to_string(),
            "--tls-key".into(),
            bad_key.display().to_string(),
        ],
    ];
    for args in cases {
        let output = Command::new(sessionstore_binary())
            .args(["serve", "--listen", "127.0.0.1:0"])
            .args(["--database-url", "sqlite::memory:"])
            .args(&args)
            .env_remove("SESSIONSTORE_LOG_FORMAT")
            .output()
            .unwrap();
        assert!(!output.status.success(), "{args:?} should not start");
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(said.to_lowercase().contains("tls"), "{args:?}: {said}");
    }
}

fn limit_name(status: &tonic::Status) -> Option<String> {
    status
        .get_details_error_info()
        .and_then(|info| info.metadata.get("limit").cloned())
}

fn assert_limit(status: &tonic::Status, limit: &str, field: &str) {
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert_eq!(limit_name(status).as_deref(), Some(limit), "{status:?}");
    let (_, named) = error_details(status);
    assert_eq!(named.as_deref(), Some(field), "{status:?}");
    assert!(
        status
            .message()
            .contains(&format!("--{}", limit.replace('_', "-"))),
        "the message names the flag: {status:?}"
    );
}

async fn limits_name_themselves_and_write_nothing(backend: Backend) {
    let server = TestServer::start_on(Storage::new(backend).await, |config| {
        config.limits.max_messages_per_exchange = 3;
        config.limits.max_message_bytes = 2048;
        config.limits.max_metadata_entries = 2;
        config.limits.max_page_size = 4;
        config.max_request_bytes = 64 * 1024;
    })
    .await;
    let mut client = server.client().await;
    let session = create(&mut client, "limited").await;

    let mut too_many = exchange_request("limited", "1", "2");
    too_many.messages.push(user("1b"));
    too_many.response_messages.push(assistant("2b"));
    let refused = client.append_exchange(too_many).await.unwrap_err();
    assert_limit(&refused, "max_messages_per_exchange", "messages");

    let big = user(&"x".repeat(4096));
    let refused = client
        .append_exchange(appending("limited", vec![user("ok"), big.clone()]))
        .await
        .unwrap_err();
    assert_limit(&refused, "max_message_bytes", "messages[1]");

    let mut tagged = user("tagged");
    for key in ["a", "b", "c"] {
        tagged.metadata.insert(key.into(), "v".into());
    }
    let refused = client
        .append_exchange(appending("limited", vec![tagged.clone()]))
        .await
        .unwrap_err();
    assert_limit(&refused, "max_metadata_entries", "messages[0].metadata");
    let refused = client
        .create_session(pb::CreateSessionRequest {
            session_id: "tagged".into(),
            metadata: tagged.metadata.clone(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_limit(&refused, "max_metadata_entries", "metadata");
    let refused = client
        .create_session(pb::CreateSessionRequest {
            session_id: "long".into(),
            initial_history: vec![user("1"), user("2"), big.clone()],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_limit(&refused, "max_message_bytes", "initial_history[2]");
    let refused = client
        .update_session(pb::UpdateSessionRequest {
            session: Some(pb::Session {
                id: "limited".into(),
                metadata: tagged.metadata.clone(),
                ..Default::default()
            }),
            update_mask: Some(prost_types::FieldMask {
                paths: vec!["metadata".into()],
            }),
        })
        .await
        .unwrap_err();
    assert_limit(&refused, "max_metadata_entries", "session.metadata");

    // Over --max-request-bytes: RESOURCE_EXHAUSTED, as the API promises (tonic
    // itself would say OUT_OF_RANGE).
    let huge = client
        .append_exchange(appending("limited", vec![user(&"y".repeat(128 * 1024))]))
        .await
        .unwrap_err();
    assert_eq!(huge.code(), Code::ResourceExhausted, "{huge:?}");
    assert!(huge.message().contains("--max-request-bytes"), "{huge:?}");

    // Nothing of the refused calls was written.
    let after = crate::support::get(&mut client, "limited").await;
    assert_eq!(after.revision, session.revision);
    for id in ["tagged", "long"] {
        let missing = client
            .get_session(pb::GetSessionRequest {
                session_id: id.into(),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(missing.code(), Code::NotFound);
    }

    // Within the limits, the same shapes go through; pages are served at
    // most --max-page-size long (AIP-158 coerces larger requests).
    for i in 0..6 {
        client
            .append_exchange(appending("limited", vec![user(&format!("m{i}"))]))
            .await
            .unwrap();
    }
    let page = client
        .list_messages(pb::ListMessagesRequest {
            session_id: "limited".into(),
            page_size: 1000,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(page.messages.len(), 4);
    assert!(!page.next_page_token.is_empty());
    server.stop().await.unwrap();
}

/// A server with tenants `acme` (token `acme-token`) and `zenith`
/// (`zenith-token`), with limits adjusted by `limits`; keep the directory
/// (the token file) as long as the server.
async fn two_tenants(
    limits: impl FnOnce(&mut sessionstore_server::config::LimitsConfig),
) -> (TestServer, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::write(
        &tokens,
        format!(
            "{}{}",
            crate::support::token_line("acme", "acme-token"),
            crate::support::token_line("zenith", "zenith-token")
        ),
    )
    .unwrap();
    let server = TestServer::start_on(Storage::new(Backend::Memory).await, move |config| {
        config.auth_tokens = Some(tokens);
        limits(&mut config.limits);
    })
    .await;
    (server, dir)
}

#[tokio::test]
async fn watch_streams_are_capped_per_tenant() {
    let (server, _tokens) = two_tenants(|limits| limits.max_watch_streams_per_tenant = 2).await;
    let mut client = server.client().await;
    for (tenant, token) in [("acme", "acme-token"), ("zenith", "zenith-token")] {
        client
            .create_session(crate::support::authed(
                pb::CreateSessionRequest {
                    session_id: format!("{tenant}-s"),
                    ..Default::default()
                },
                token,
            ))
            .await
            .unwrap();
    }
    let watch = |token: &'static str, id: &'static str| {
        let mut client = client.clone();
        async move {
            client
                .watch_session(crate::support::authed(
                    pb::WatchSessionRequest {
                        session_id: id.into(),
                        ..Default::default()
                    },
                    token,
                ))
                .await
        }
    };
    let first = watch("acme-token", "acme-s").await.unwrap();
    let _second = watch("acme-token", "acme-s").await.unwrap();
    let third = watch("acme-token", "acme-s").await.unwrap_err();
    assert_limit(&third, "max_watch_streams_per_tenant", "session_id");
    // Another tenant has its own allowance.
    let _other = watch("zenith-token", "zenith-s").await.unwrap();

    // A closed stream gives its place back once the server sees the
    // client go (an HTTP/2 reset, with no reply to wait for): retry until
    // then, within a bound.
    drop(first);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match watch("acme-token", "acme-s").await {
            Ok(_stream) => break,
            Err(status) if Instant::now() < deadline => {
                assert_eq!(status.code(), Code::ResourceExhausted);
                tokio::task::yield_now().await;
            }
            Err(status) => panic!("the closed stream's place never came back: {status:?}"),
        }
    }
    server.stop().await.unwrap();
}

#[tokio::test]
async fn request_rate_is_limited_per_tenant() {
    let (server, _tokens) = two_tenants(|limits| limits.max_requests_per_second = 5).await;
    let mut client = server.client().await;
    let get = |token: &str| {
        crate::support::authed(
            pb::GetSessionRequest {
                session_id: "none".into(),
                ..Default::default()
            },
            token,
        )
    };
    let started = Instant::now();
    let mut admitted = 0;
    let limited = loop {
        match client.get_session(get("acme-token")).await {
            Err(status) if status.code() == Code::ResourceExhausted => break status,
            Err(status) => {
                assert_eq!(status.code(), Code::NotFound);
                admitted += 1;
            }
            Ok(_) => panic!("no such session"),
        }
        assert!(admitted < 1000, "the rate limit never applied");
    };
    // A burst of a second's worth, plus what refilled meanwhile.
    let allowed = 5.0 + 5.0 * started.elapsed().as_secs_f64() + 1.0;
    assert!(
        f64::from(admitted) <= allowed,
        "{admitted} admitted, {allowed} allowed"
    );
    assert!(admitted >= 5, "the burst is a second's worth: {admitted}");
    let info = limited.get_details_error_info().unwrap();
    assert_eq!(info.reason, "RATE_LIMITED");
    assert_eq!(
        info.metadata.get("limit").map(String::as_str),
        Some("max_requests_per_second")
    );
    let retry = limited
        .get_details_retry_info()
        .and_then(|r| r.retry_delay)
        .unwrap();
    assert!(retry <= Duration::from_millis(200), "{retry:?}");

    // Another tenant is not slowed by this one.
    let other = client.get_session(get("zenith-token")).await.unwrap_err();
    assert_eq!(other.code(), Code::NotFound);
    // After the advertised delay, the tenant is admitted again.
    tokio::time::sleep_until((Instant::now() + retry).into()).await;
    let again = client.get_session(get("acme-token")).await.unwrap_err();
    assert_eq!(again.code(), Code::NotFound, "{again:?}");
    server.stop().await.unwrap();
}

/// A write stuck behind a row lock the test holds outlives its deadline:
/// the caller hears so when the deadline passes, and the abandoned write is
/// never committed.
#[tokio::test]
async fn deadlines_are_honoured() {
    use sqlx::Connection as _;
    if !crate::support::postgres_available("ops::deadlines_are_honoured").await {
        return;
    }
    let storage = Storage::new(Backend::Postgres).await;
    let url = storage.url.clone();
    let (server, metrics) = metered(storage).await;
    let mut client = server.client().await;
    let session = create(&mut client, "deadline").await;

    let mut locker = sqlx::PgConnection::connect(&url).await.unwrap();
    let mut lock = locker.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM sessions WHERE id = 'deadline' FOR UPDATE")
        .execute(&mut *lock)
        .await
        .unwrap();
    let mut request = tonic::Request::new(appending("deadline", vec![user("late")]));
    request.set_timeout(Duration::from_millis(300));
    let started = Instant::now();
    let status = client.append_exchange(request).await.unwrap_err();
    assert!(
        matches!(status.code(), Code::DeadlineExceeded | Code::Cancelled),
        "{status:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the deadline was not kept"
    );
    // The client keeps the deadline itself, and on a loaded machine the
    // server's clock for it started later: release the lock only once the
    // server has given up on the call too.
    let gave_up = |text: &str| {
        ["Canceled", "DeadlineExceeded"].iter().any(|code| {
            let prefix = format!(
                "grpc_server_handled_total{{grpc_service=\"sessionstore.v1.SessionStore\",grpc_method=\"AppendExchange\",grpc_code=\"{code}\"}}"
            );
            sample(text, &prefix).is_some_and(|n| n >= 1.0)
        })
    };
    let waiting = Instant::now();
    while !gave_up(&http_get(metrics, "/metrics").await.1) {
        assert!(
            waiting.elapsed() < Duration::from_secs(10),
            "the server never gave up on the late append"
        );
        tokio::task::yield_now().await;
    }
    lock.rollback().await.unwrap();

    // The next write is the very next revision: the late one never landed.
    let next = client
        .append_exchange(appending("deadline", vec![user("on time")]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(next.revision, session.revision + 1);
    let messages = crate::support::all_messages(&mut client, "deadline").await;
    assert_eq!(messages.len(), 1, "{messages:?}");
    server.stop().await.unwrap();
}

/// `GET path` over plain HTTP/1.1; the status line and the body.
/// A server on `storage` that serves `/metrics`, and where.
async fn metered(storage: Storage) -> (TestServer, std::net::SocketAddr) {
    let server = TestServer::start_on(storage, |config| {
        config.telemetry.metrics_listen = Some("127.0.0.1:0".into());
    })
    .await;
    let metrics = server.metrics_addr.expect("metrics are served");
    (server, metrics)
}

pub(crate) async fn http_get(addr: std::net::SocketAddr, path: &str) -> (String, String) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(
            format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    (head.lines().next().unwrap().to_owned(), body.to_owned())
}

/// The value of the sample line that starts with `prefix` (labels included).
pub(crate) fn sample(text: &str, prefix: &str) -> Option<f64> {
    text.lines()
        .find(|line| line.starts_with(prefix))
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|value| value.parse().ok())
}

#[tokio::test]
async fn metrics_count_calls_by_method_and_code() {
    let (server, metrics) = metered(Storage::new(Backend::File).await).await;
    let mut client = server.client().await;
    create(&mut client, "metered").await;
    let keyed = pb::AppendExchangeRequest {
        request_id: "metered-1".into(),
        ..exchange_request("metered", "hi", "hello")
    };
    // A retry answers with the first result and writes nothing: it is a
    // handled call, not an appended exchange.
    for _ in 0..2 {
        client.append_exchange(keyed.clone()).await.unwrap();
    }
    for _ in 0..3 {
        let missing = client
            .get_session(pb::GetSessionRequest {
                session_id: "absent".into(),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(missing.code(), Code::NotFound);
    }
    let _watching = client
        .watch_session(pb::WatchSessionRequest {
            session_id: "metered".into(),
            ..Default::default()
        })
        .await
        .unwrap();

    let (status, text) = http_get(metrics, "/metrics").await;
    assert!(status.contains("200"), "{status}");
    let service = "grpc_service=\"sessionstore.v1.SessionStore\"";
    let handled = |method: &str, code: &str| {
        sample(
            &text,
            &format!(
                "grpc_server_handled_total{{{service},grpc_method=\"{method}\",grpc_code=\"{code}\"}}"
            ),
        )
    };
    assert_eq!(handled("CreateSession", "OK"), Some(1.0), "{text}");
    assert_eq!(handled("AppendExchange", "OK"), Some(2.0), "{text}");
    assert_eq!(handled("GetSession", "NotFound"), Some(3.0), "{text}");
    assert_eq!(
        sample(
            &text,
            &format!("grpc_server_handling_seconds_count{{{service},grpc_method=\"GetSession\"}}")
        ),
        Some(3.0),
        "{text}"
    );
    assert_eq!(
        sample(
            &text,
            &format!(
                "grpc_server_handling_seconds_bucket{{{service},grpc_method=\"GetSession\",le=\"+Inf\"}}"
            )
        ),
        Some(3.0),
        "{text}"
    );
    assert!(text.contains("# TYPE grpc_server_handling_seconds histogram"));
    assert_eq!(
        sample(&text, "sessionstore_exchanges_appended_total"),
        Some(1.0),
        "idempotent replays are not counted: {text}"
    );
    assert_eq!(
        sample(&text, "sessionstore_messages_appended_total"),
        Some(2.0)
    );
    assert_eq!(sample(&text, "sessionstore_watch_streams "), Some(1.0));
    assert!(sample(&text, "sessionstore_db_pool_connections ").is_some_and(|n| n >= 1.0));
    assert!(sample(&text, "sessionstore_db_pool_max_connections ").is_some());

    let (status, _) = http_get(metrics, "/elsewhere").await;
    assert!(status.contains("404"), "{status}");
    server.stop().await.unwrap();
}

#[tokio::test]
async fn logs_are_json_when_asked() {
    let mut child = Command::new(sessionstore_binary())
        .args(["serve", "--listen", "127.0.0.1:0", "--log-format", "json"])
        .args(["--database-url", "sqlite::memory:"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    let serving = loop {
        let line = lines.next().expect("the server exited").unwrap();
        let event: serde_json::Value = serde_json::from_str(&line)
            .unwrap_or_else(|e| panic!("not a JSON log line ({e}): {line}"));
        if event["message"] == "sessionstore serving" {
            break event;
        }
    };
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(serving["level"], "INFO", "{serving}");
    assert!(
        serving["address"]
            .as_str()
            .is_some_and(|a| a.contains("127.0.0.1")),
        "{serving}"
    );
    assert!(serving["timestamp"].is_string(), "{serving}");
}

mod collector {
    //! A stand-in OTLP collector: the real protocol, spans forwarded to the test.
    use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::TraceService;
    use opentelemetry_proto::tonic::collector::trace::v1::{
        ExportTraceServiceRequest, ExportTraceServiceResponse,
    };
    use tokio::sync::mpsc::UnboundedSender;

    pub struct Collector(pub UnboundedSender<ExportTraceServiceRequest>);

    #[tonic::async_trait]
    impl TraceService for Collector {
        async fn export(
            &self,
            request: tonic::Request<ExportTraceServiceRequest>,
        ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
            let _ = self.0.send(request.into_inner());
            Ok(tonic::Response::new(ExportTraceServiceResponse {
                partial_success: None,
            }))
        }
    }
}

/// With `--otlp-endpoint`, each call's `rpc` span (method, session id)
/// reaches an OTLP collector, from a service named `sessionstore`.
#[tokio::test]
async fn traces_reach_an_otlp_collector() {
    use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::TraceServiceServer;
    use opentelemetry_proto::tonic::common::v1::any_value::Value;

    let (spans, mut received) = tokio::sync::mpsc::unbounded_channel();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let collector_addr = listener.local_addr().unwrap();
    let (stop_collector, collector_stopping) = tokio::sync::oneshot::channel::<()>();
    let collector = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(collector::Collector(spans)))
            .serve_with_incoming_shutdown(
                tokio_stream::wrappers::TcpListenerStream::new(listener),
                async {
                    let _ = collector_stopping.await;
                },
            ),
    );

    let mut child = Command::new(sessionstore_binary())
        .args(["serve", "--listen", "127.0.0.1:0"])
        .args(["--database-url", "sqlite::memory:"])
        .args(["--otlp-endpoint", &format!("http://{collector_addr}")])
        .env("OTEL_BSP_SCHEDULE_DELAY", "50")
        .env_remove("SESSIONSTORE_LOG_FORMAT")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let port = tokio::task::spawn_blocking(move || {
        let mut lines = BufReader::new(stdout).lines();
        loop {
            let line = lines.next().expect("the server exited").unwrap();
            if line.contains("sessionstore serving") {
                let start = line.find("127.0.0.1:").unwrap() + "127.0.0.1:".len();
                let digits: String = line[start..]
                    .chars()
                    .take_while(char::is_ascii_digit)
                    .collect();
                // Keep draining so the server never blocks on a full pipe.
                std::thread::spawn(move || for _ in lines {});
                break digits.parse::<u16>().unwrap();
            }
        }
    })
    .await
    .unwrap();

    let mut client = crate::support::connect(&format!("http://127.0.0.1:{port}")).await;
    let missing = client
        .get_session(pb::GetSessionRequest {
            session_id: "traced-session".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(missing.code(), Code::NotFound);

    let string = |value: &Option<opentelemetry_proto::tonic::common::v1::AnyValue>| match value
        .as_ref()
        .and_then(|v| v.value.as_ref())
    {
        Some(Value::StringValue(s)) => s.clone(),
        _ => String::new(),
    };
    let found = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(export) = received.recv().await {
            for resource_spans in export.resource_spans {
                let service = resource_spans
                    .resource
                    .iter()
                    .flat_map(|r| &r.attributes)
                    .find(|kv| kv.key == "service.name")
                    .map(|kv| string(&kv.value))
                    .unwrap_or_default();
                for span in resource_spans.scope_spans.into_iter().flat_map(|s| s.spans) {
                    let attribute = |key: &str| {
                        span.attributes
                            .iter()
                            .find(|kv| kv.key == key)
                            .map(|kv| string(&kv.value))
                    };
                    if span.name == "rpc"
                        && attribute("method").as_deref() == Some("GetSession")
                        && attribute("session_id").as_deref() == Some("traced-session")
                    {
                        return service;
                    }
                }
            }
        }
        panic!("the collector stopped");
    })
    .await
    .expect("no rpc span reached the collector within 30 s");
    assert_eq!(found, "sessionstore");

    let _ = child.kill();
    let _ = child.wait();
    let _ = stop_collector.send(());
    let _ = collector.await;
}

/// On a SQLite file, a run of appends that fails on the engine writes
/// nothing and falls back to one request at a time: the requests that can
/// be written are, and only the one that cannot fails. The test holds the
/// write lock so that its appends queue up into one run, and a trigger it
/// adds refuses one of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_engine_run_falls_back_to_one_request_at_a_time() {
    use sqlx::Connection as _;
    const QUEUED: usize = 7;
    let storage = Storage::new(Backend::File).await;
    let url = storage.url.clone();
    let (server, metrics) = metered(storage).await;
    let mut client = server.client().await;
    let first = create(&mut client, "fallback_first").await.id;
    let mut queued = Vec::new();
    for index in 0..QUEUED {
        queued.push(create(&mut client, &format!("fallback_{index}")).await.id);
    }
    let refused = queued[QUEUED / 2].clone();

    let mut locker = sqlx::SqliteConnection::connect(&url).await.unwrap();
    sqlx::query(
        "CREATE TRIGGER test_refuses BEFORE INSERT ON messages \
         WHEN instr(NEW.wire, CAST('refuse this message' AS BLOB)) > 0 \
         BEGIN SELECT RAISE(ABORT, 'refused by the test'); END",
    )
    .execute(&mut locker)
    .await
    .unwrap();
    sqlx::query("BEGIN IMMEDIATE")
        .execute(&mut locker)
        .await
        .unwrap();

    // The first append takes the writer, which then waits for the lock;
    // the others queue behind it and become one run.
    let send = |session: String, question: &'static str| {
        let mut client = client.clone();
        tokio::spawn(async move {
            let answer = client
                .append_exchange(exchange_request(&session, question, "an answer"))
                .await;
            (session, answer)
        })
    };
    let mut appends = vec![send(first, "the first question")];
    let figure =
        |name: &'static str| async move { sample(&http_get(metrics, "/metrics").await.1, name) };
    let started = "grpc_server_started_total{grpc_service=\"sessionstore.v1.SessionStore\",grpc_method=\"AppendExchange\"}";
    let waiting = Instant::now();
    while figure(started).await != Some(1.0) {
        assert!(
            waiting.elapsed() < Duration::from_secs(5),
            "the first append never started"
        );
        tokio::task::yield_now().await;
    }
    for session in &queued {
        let question = if *session == refused {
            "please refuse this message"
        } else {
            "a question"
        };
        appends.push(send(session.clone(), question));
    }
    let waiting = Instant::now();
    while figure("sessionstore_db_queued_writes").await != Some(QUEUED as f64) {
        assert!(
            waiting.elapsed() < Duration::from_secs(5),
            "the appends never queued up behind the first"
        );
        tokio::task::yield_now().await;
    }
    sqlx::query("COMMIT").execute(&mut locker).await.unwrap();

    for append in appends {
        let (session, answer) = append.await.unwrap();
        let stored = get(&mut client, &session).await;
        if session == refused {
            let status = answer.expect_err("the refused append failed");
            assert_eq!(status.code(), Code::Internal, "{status:?}");
            assert!(
                !status.message().contains("refused by the test"),
                "{status:?}"
            );
            assert_eq!(stored.revision, 1, "the refused append wrote nothing");
            assert!(all_messages(&mut client, &session).await.is_empty());
        } else {
            let answer = answer.unwrap_or_else(|status| panic!("{session}: {status:?}"));
            assert_eq!(answer.into_inner().revision, 2);
            assert_eq!(stored.revision, 2, "{session}");
            assert_eq!(
                all_messages(&mut client, &session).await.len(),
                2,
                "{session}"
            );
        }
    }
}
