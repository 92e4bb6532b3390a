//! `sessionstore sessions …` at the edges a new user hits first: a
//! `--server` that names the wrong scheme or no port, TLS on one side only,
//! a mistyped command, a framework session's stored objects, an unknown
//! cost. The real binary against a real server.

use rcgen::{CertificateParams, DnType, KeyPair};
use sessionstore_client::v1 as pb;
use sessionstore_client::v1::content_block::Block;

use crate::support::{
    Backend, Storage, TestServer, assistant, call, create, sessionstore_binary, user,
};

/// The binary, built once for this module's many runs.
fn binary() -> &'static std::path::Path {
    static BINARY: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    BINARY.get_or_init(sessionstore_binary)
}

/// Exit code, stdout and stderr of `sessionstore ARGS`, with `env` set.
async fn run_with(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String, String) {
    let mut command = tokio::process::Command::new(binary());
    command
        .args(args)
        .env("NO_COLOR", "1")
        .env_remove("SESSIONSTORE_SERVER")
        .env_remove("SESSIONSTORE_TOKEN");
    for (key, value) in env {
        command.env(key, value);
    }
    let output = command.output().await.unwrap();
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

async fn run(args: &[&str]) -> (Option<i32>, String, String) {
    run_with(args, &[]).await
}

/// A `--server` that is not `http://HOST:PORT`, `https://HOST:PORT` or
/// `HOST:PORT` is a usage error naming the value and the forms, and nothing
/// is sent: a token never goes out in plaintext because of a typo.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_server_is_a_usage_error_and_nothing_is_sent() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let forms = "use http://HOST:PORT, https://HOST:PORT (TLS) or HOST:PORT";
    for (server, why) in [
        (
            format!("htps://127.0.0.1:{port}"),
            "htps:// is neither http:// nor https://",
        ),
        (
            format!("grpc://127.0.0.1:{port}"),
            "grpc:// is neither http:// nor https://",
        ),
        ("http://127.0.0.1".to_owned(), "no port"),
        ("https://localhost".to_owned(), "no port"),
        ("127.0.0.1".to_owned(), "no port"),
        (format!("http://:{port}"), "no host"),
        (
            "http://127.0.0.1:http".to_owned(),
            "\"http\" is not a port (1-65535)",
        ),
        (format!("http://127.0.0.1:{port}/v1"), "not HOST:PORT"),
        (format!("http://me@127.0.0.1:{port}"), "not HOST:PORT"),
    ] {
        let (code, out, err) =
            run(&["sessions", "--server", &server, "--token", "secret", "list"]).await;
        assert_eq!(code, Some(2), "{server}: {err}");
        assert!(out.is_empty(), "{server}: {out}");
        let first = err.lines().next().unwrap_or_default();
        assert!(
            first.contains(&format!(
                "invalid value '{server}' for '--server <SERVER>': {why}: {forms}"
            )),
            "{server}: {err}"
        );
    }
    // The environment variable goes through the same check.
    let (code, _, err) = run_with(
        &["sessions", "list"],
        &[
            ("SESSIONSTORE_SERVER", &format!("htps://127.0.0.1:{port}")),
            ("SESSIONSTORE_TOKEN", "secret"),
        ],
    )
    .await;
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains(forms), "{err}");
    // `health` takes the same flag.
    let (code, _, err) = run(&["health", "--server", &format!("grpc://127.0.0.1:{port}")]).await;
    assert_eq!(code, Some(2), "{err}");
    // Not one connection reached the listener. The commands have exited,
    // so a connection they made would already be waiting to be accepted.
    listener.set_nonblocking(true).unwrap();
    assert_eq!(
        listener.accept().map(|_| ()).unwrap_err().kind(),
        std::io::ErrorKind::WouldBlock,
        "a rejected --server was still dialled"
    );
}

/// The accepted forms, and the scheme read without regard to case.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_accepted_server_forms_reach_the_server() {
    let server = TestServer::start(Backend::Memory).await;
    let port = server.addr.port();
    for form in [
        format!("http://127.0.0.1:{port}"),
        format!("HTTP://127.0.0.1:{port}/"),
        format!("127.0.0.1:{port}"),
        format!("localhost:{port}"),
    ] {
        let (code, out, err) = run(&["sessions", "--server", &form, "list"]).await;
        assert_eq!(code, Some(0), "{form}: {err}");
        assert!(out.contains("(no sessions)"), "{form}: {out}");
    }
    server.stop().await.unwrap();
}

/// `https://` to a server without TLS, and `http://` to one with it: one
/// line that says so and names the URL to use, not "is it running?".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_on_one_side_only_says_which_scheme_to_use() {
    let plain = TestServer::start(Backend::Memory).await;
    let port = plain.addr.port();
    for command in [&["sessions", "list"][..], &["health"]] {
        let mut args = vec![command[0]];
        let server = format!("https://127.0.0.1:{port}");
        args.extend(["--server", &server]);
        args.extend(&command[1..]);
        let (code, _, err) = run(&args).await;
        assert_ne!(code, Some(0), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert_eq!(
            err.trim(),
            format!(
                "sessionstore: the server at https://127.0.0.1:{port} does not speak TLS: \
                 use http://127.0.0.1:{port} (or give the server --tls-cert and --tls-key)"
            ),
            "{args:?}"
        );
    }
    plain.stop().await.unwrap();

    // A TLS server, with a certificate made here.
    let dir = tempfile::tempdir().unwrap();
    let mut params = CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
    params
        .distinguished_name
        .push(DnType::CommonName, "localhost");
    let key = KeyPair::generate().unwrap();
    let cert = params.self_signed(&key).unwrap();
    let (cert_path, key_path) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::write(&cert_path, cert.pem()).unwrap();
    std::fs::write(&key_path, key.serialize_pem()).unwrap();
    let tls = TestServer::start_on(Storage::new(Backend::Memory).await, move |config| {
        config.tls.tls_cert = Some(cert_path);
        config.tls.tls_key = Some(key_path);
    })
    .await;
    let port = tls.addr.port();
    for command in [&["sessions", "list"][..], &["health"]] {
        let mut args = vec![command[0]];
        let server = format!("127.0.0.1:{port}");
        args.extend(["--server", &server]);
        args.extend(&command[1..]);
        let (code, _, err) = run(&args).await;
        assert_ne!(code, Some(0), "{args:?}: {err}");
        assert_eq!(
            err.trim(),
            format!(
                "sessionstore: the server at http://127.0.0.1:{port} speaks TLS: \
                 use https://127.0.0.1:{port} (with --tls-ca PATH if its certificate \
                 is not publicly trusted)"
            ),
            "{args:?}"
        );
    }
    tls.stop().await.unwrap();

    // Nobody listening is still "is it running?".
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let (code, _, err) = run(&["sessions", "--server", &format!("127.0.0.1:{port}"), "list"]).await;
    assert_eq!(code, Some(1));
    assert!(err.contains("is it running?"), "{err}");
}

/// A mistyped command or flag gets a suggestion.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mistyped_command_or_flag_gets_a_suggestion() {
    let (code, _, err) = run(&["sessions", "lsit"]).await;
    assert_eq!(code, Some(2), "{err}");
    // Among the suggestions (`submit` is near too).
    assert!(
        err.contains("similar subcommand") && err.contains("'list'"),
        "{err}"
    );
    let (code, _, err) = run(&["sessions", "list", "--limt", "5"]).await;
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("similar argument exists: '--limit'"), "{err}");
    let (code, _, err) = run(&["sesions", "list"]).await;
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("'sessions'"), "{err}");
}

fn json_block(kind: &str, json: &str) -> pb::ContentBlock {
    pb::ContentBlock {
        block: Some(Block::Json(pb::JsonBlock {
            r#type: kind.to_owned(),
            json: json.to_owned(),
        })),
    }
}

/// `sessions show` of a session a framework adapter wrote: the
/// conversation only, the stored framework objects with `--raw`, and the
/// id as the heading of a session without a title.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn show_prints_a_framework_session_as_a_conversation() {
    let server = TestServer::start(Backend::Memory).await;
    let mut client = server.client().await;
    client
        .create_session(pb::CreateSessionRequest {
            session_id: "ses_agent".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    // As the LangChain adapter stores a turn: the native fields, plus the
    // framework's own message verbatim in a `json` block.
    let mut question = user("What's the weather in Paris?");
    question.content_blocks.push(json_block(
        "langchain_message",
        r#"{"type":"human","data":{"content":"What's the weather in Paris?"}}"#,
    ));
    let mut answer = assistant("");
    answer.tool_calls.push(pb::ToolCall {
        id: "call_1".into(),
        name: "weather".into(),
        arguments: r#"{"city":"Paris"}"#.into(),
        ..Default::default()
    });
    answer.content_blocks.push(json_block(
        "langchain_message",
        r#"{"type":"ai","data":{"tool_calls":[{"id":"call_1"}]}}"#,
    ));
    let mut result = pb::Message {
        role: pb::Role::Tool.into(),
        content: "18°C, clear".into(),
        tool_call_id: "call_1".into(),
        ..Default::default()
    };
    result.content_blocks.push(json_block(
        "langchain_message",
        r#"{"type":"tool","data":{"tool_call_id":"call_1"}}"#,
    ));
    client
        .append_exchange(pb::AppendExchangeRequest {
            session_id: "ses_agent".into(),
            messages: vec![question],
            provider_call: Some(call("gpt-test", 10, 5, 0)),
            response_messages: vec![answer],
            ..Default::default()
        })
        .await
        .unwrap();
    client
        .append_exchange(pb::AppendExchangeRequest {
            session_id: "ses_agent".into(),
            messages: vec![result],
            ..Default::default()
        })
        .await
        .unwrap();

    let endpoint = server.endpoint();
    let (code, out, err) = run(&["sessions", "--server", &endpoint, "show", "ses_agent"]).await;
    assert_eq!(code, Some(0), "{err}");
    assert!(out.starts_with("# ses_agent\n"), "the id heads it: {out}");
    assert!(!out.contains("# \n"), "{out}");
    assert!(
        out.contains("## User\n\nWhat's the weather in Paris?"),
        "{out}"
    );
    assert!(out.contains("**Tool call** `weather` (`call_1`)"), "{out}");
    assert!(out.contains("18°C, clear"), "{out}");
    assert!(
        !out.contains("langchain_message") && !out.contains(r#""type":"human""#),
        "no stored framework objects without --raw: {out}"
    );
    assert!(
        err.contains("3 stored framework object(s) not shown: --raw"),
        "{err}"
    );

    let (code, raw, err) = run(&[
        "sessions",
        "--server",
        &endpoint,
        "show",
        "ses_agent",
        "--raw",
    ])
    .await;
    assert_eq!(code, Some(0), "{err}");
    assert!(raw.contains("**langchain_message** block"), "{raw}");
    assert!(raw.contains(r#""type":"human""#), "{raw}");
    assert!(raw.contains("What's the weather in Paris?"), "{raw}");
    assert!(err.is_empty(), "{err}");
    server.stop().await.unwrap();
}

/// A cost nobody recorded reads as unknown, not as `$0.000000`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unrecorded_cost_reads_as_unknown() {
    let server = TestServer::start(Backend::Memory).await;
    let mut client = server.client().await;
    // No provider call at all.
    create(&mut client, "ses_quiet").await;
    // A call recorded without a cost.
    create(&mut client, "ses_free").await;
    client
        .append_exchange(pb::AppendExchangeRequest {
            session_id: "ses_free".into(),
            messages: vec![user("hi")],
            provider_call: Some(call("gpt-nocost", 3, 1, 0)),
            response_messages: vec![assistant("hello")],
            ..Default::default()
        })
        .await
        .unwrap();
    // A call with one.
    create(&mut client, "ses_paid").await;
    client
        .append_exchange(pb::AppendExchangeRequest {
            session_id: "ses_paid".into(),
            messages: vec![user("hi")],
            provider_call: Some(call("gpt-paid", 12, 1, 85)),
            response_messages: vec![assistant("hello")],
            ..Default::default()
        })
        .await
        .unwrap();
    let endpoint = server.endpoint();

    let (code, out, err) = run(&["sessions", "--server", &endpoint, "list"]).await;
    assert_eq!(code, Some(0), "{err}");
    let row = |id: &str| {
        out.lines()
            .find(|line| line.starts_with(id))
            .unwrap_or_else(|| panic!("{id} missing: {out}"))
            .to_owned()
    };
    assert!(row("ses_quiet").contains(" unknown "), "{out}");
    assert!(row("ses_free").contains(" unknown "), "{out}");
    assert!(row("ses_paid").contains(" $0.000085 "), "{out}");
    assert!(!out.contains("$0.000000"), "{out}");

    let (code, out, err) =
        run(&["sessions", "--server", &endpoint, "usage", "--by", "model"]).await;
    assert_eq!(code, Some(0), "{err}");
    let line = |model: &str| {
        out.lines()
            .find(|line| line.starts_with(model))
            .unwrap_or_else(|| panic!("{model} missing: {out}"))
            .to_owned()
    };
    assert!(line("openai/gpt-nocost").ends_with(" unknown"), "{out}");
    assert!(line("openai/gpt-paid").ends_with(" $0.000085"), "{out}");
    server.stop().await.unwrap();
}
