//! Authentication and tenancy: bearer tokens from a reloadable file, one
//! tenant's sessions invisible to another, and the fail-closed default.

use std::path::Path;
use std::time::Duration;

use sessionstore_client::SessionStoreClient;
use sessionstore_client::v1 as pb;
use tonic::transport::Channel;
use tonic::{Code, Request};

use crate::support::{
    Backend, Storage, TestServer, authed, connect, error_details, sessionstore_binary, token_line,
    user,
};

crate::backend_tests!(tokens_gate_the_service, tenants_never_see_each_other);

type Client = SessionStoreClient<Channel>;

/// How long a token file change may take to apply (the README: within 5 s).
const RELOAD_DEADLINE: Duration = Duration::from_secs(8);

async fn start(backend: Backend, tokens: &Path) -> TestServer {
    let path = tokens.to_owned();
    TestServer::start_on(Storage::new(backend).await, move |config| {
        config.auth_tokens = Some(path);
    })
    .await
}

fn get(id: &str) -> pb::GetSessionRequest {
    pb::GetSessionRequest {
        session_id: id.to_owned(),
        ..Default::default()
    }
}

fn create_request(id: &str) -> pb::CreateSessionRequest {
    pb::CreateSessionRequest {
        session_id: id.to_owned(),
        title: format!("title of {id}"),
        ..Default::default()
    }
}

fn assert_unauthenticated(status: &tonic::Status) {
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    assert_eq!(error_details(status).0.as_deref(), Some("UNAUTHENTICATED"));
}

async fn tokens_gate_the_service(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    let file = format!(
        "# tenants\n{}{}not a valid line\n",
        token_line("acme", "acme-1"),
        token_line("acme", "acme-2"),
    );
    std::fs::write(&tokens, file).unwrap();
    let server = start(backend, &tokens).await;
    let mut client = server.client().await;

    // No token, a wrong one, and a header that is not Bearer.
    assert_unauthenticated(&client.get_session(get("ses_a")).await.unwrap_err());
    assert_unauthenticated(
        &client
            .create_session(authed(create_request("ses_a"), "wrong"))
            .await
            .unwrap_err(),
    );
    let mut basic = Request::new(create_request("ses_a"));
    basic
        .metadata_mut()
        .insert("authorization", "Basic YWNtZTox".parse().unwrap());
    assert_unauthenticated(&client.create_session(basic).await.unwrap_err());

    // Either of the tenant's tokens (rotation) works, and nothing was written before.
    assert_eq!(
        client
            .get_session(authed(get("ses_a"), "acme-1"))
            .await
            .unwrap_err()
            .code(),
        Code::NotFound
    );
    client
        .create_session(authed(create_request("ses_a"), "acme-1"))
        .await
        .unwrap();
    let session = client
        .get_session(authed(get("ses_a"), "acme-2"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(session.revision, 1);

    // Health needs no credentials.
    let channel = Channel::from_shared(server.endpoint())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    health
        .check(tonic_health::pb::HealthCheckRequest::default())
        .await
        .expect("health answers without a token");

    // Rewritten in place: the new token works and the removed one stops, within the deadline.
    std::fs::write(&tokens, token_line("acme", "acme-3")).unwrap();
    wait_for(&mut client, "acme-3", true).await;
    wait_for(&mut client, "acme-1", false).await;

    // Replaced by rename.
    let staged = dir.path().join("tokens.new");
    std::fs::write(&staged, token_line("acme", "acme-4")).unwrap();
    std::fs::rename(&staged, &tokens).unwrap();
    wait_for(&mut client, "acme-4", true).await;
    wait_for(&mut client, "acme-3", false).await;

    // An unreadable file keeps the old tokens.
    std::fs::remove_file(&tokens).unwrap();
    let session = client
        .get_session(authed(get("ses_a"), "acme-4"))
        .await
        .expect("the old tokens stay when the file is gone");
    assert_eq!(session.into_inner().id, "ses_a");
    server.stop().await.unwrap();
}

/// Polls until `token` is accepted (or refused), failing after the deadline.
/// The condition is the server's answer itself: a file reload has no event
/// a client could wait on.
async fn wait_for(client: &mut Client, token: &str, accepted: bool) {
    let client = tokio::sync::Mutex::new(client);
    let what = format!(
        "token {token:?} {}",
        if accepted { "accepted" } else { "refused" }
    );
    crate::support::poll_until(&what, RELOAD_DEADLINE, || {
        let client = &client;
        async move {
            let result = client
                .lock()
                .await
                .get_session(authed(get("ses_a"), token))
                .await;
            let is_accepted = !matches!(&result, Err(s) if s.code() == Code::Unauthenticated);
            (is_accepted == accepted).then_some(())
        }
    })
    .await;
}

async fn tenants_never_see_each_other(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::write(
        &tokens,
        token_line("acme", "acme-token") + &token_line("globex", "globex-token"),
    )
    .unwrap();
    let server = start(backend, &tokens).await;
    let mut client = server.client().await;
    let (acme, globex) = ("acme-token", "globex-token");

    // What globex sees for an id nobody has.
    let before = client
        .get_session(authed(get("ses_shared"), globex))
        .await
        .unwrap_err();

    client
        .create_session(authed(create_request("ses_shared"), acme))
        .await
        .unwrap();
    client
        .append_exchange(authed(
            pb::AppendExchangeRequest {
                session_id: "ses_shared".into(),
                messages: vec![user("acme's secret plan")],
                ..Default::default()
            },
            acme,
        ))
        .await
        .unwrap();

    // Another tenant's session answers exactly like an unknown one.
    let after = client
        .get_session(authed(get("ses_shared"), globex))
        .await
        .unwrap_err();
    assert_eq!(after.code(), Code::NotFound);
    assert_eq!(after.message(), before.message());
    assert_eq!(error_details(&after), error_details(&before));
    let append = client
        .append_exchange(authed(
            pb::AppendExchangeRequest {
                session_id: "ses_shared".into(),
                messages: vec![user("globex was here")],
                ..Default::default()
            },
            globex,
        ))
        .await
        .unwrap_err();
    assert_eq!(append.code(), Code::NotFound);
    let watch = client
        .watch_session(authed(
            pb::WatchSessionRequest {
                session_id: "ses_shared".into(),
                ..Default::default()
            },
            globex,
        ))
        .await;
    assert_eq!(watch.err().map(|s| s.code()), Some(Code::NotFound));

    // Ids are per tenant: globex may own its own ses_shared.
    let mine = client
        .create_session(authed(create_request("ses_shared"), globex))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(mine.revision, 1);
    let listed = client
        .list_sessions(authed(pb::ListSessionsRequest::default(), globex))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.sessions.len(), 1);
    assert_eq!(listed.sessions[0].message_count, 0, "globex's own, empty");
    let hits = client
        .search_messages(authed(
            pb::SearchMessagesRequest {
                query: "secret plan".into(),
                ..Default::default()
            },
            globex,
        ))
        .await
        .unwrap()
        .into_inner();
    assert!(hits.hits.is_empty(), "{hits:?}");

    // acme's session is untouched.
    let theirs = client
        .get_session(authed(get("ses_shared"), acme))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(theirs.revision, 2);
    let hits = client
        .search_messages(authed(
            pb::SearchMessagesRequest {
                query: "secret plan".into(),
                ..Default::default()
            },
            acme,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(hits.hits.len(), 1);
    server.stop().await.unwrap();
}

/// Without a token file the server refuses a non-loopback address, unless told otherwise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unauthenticated_server_refuses_non_loopback() {
    let dir = tempfile::tempdir().unwrap();
    let output = tokio::process::Command::new(sessionstore_binary())
        .args(["serve", "--listen", "0.0.0.0:0", "--database-url"])
        .arg(format!("sqlite://{}", dir.path().join("db").display()))
        .env_remove("SESSIONSTORE_AUTH_TOKENS")
        .env_remove("SESSIONSTORE_INSECURE_NO_AUTH")
        .output()
        .await
        .unwrap();
    assert!(!output.status.success(), "{output:?}");
    let log = String::from_utf8_lossy(&output.stderr).to_string()
        + &String::from_utf8_lossy(&output.stdout);
    assert!(log.contains("--auth-tokens"), "{log}");
    assert!(
        !dir.path().join("db").exists(),
        "refused before opening the database"
    );
}

/// On loopback without tokens, calls are the `default` tenant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loopback_without_tokens_is_the_default_tenant() {
    let server = TestServer::start(Backend::Memory).await;
    let mut client = connect(&server.endpoint()).await;
    client
        .create_session(create_request("ses_default"))
        .await
        .unwrap();
    // A token is ignored: there is nothing to check it against.
    let session = client
        .get_session(authed(get("ses_default"), "anything"))
        .await
        .unwrap();
    assert_eq!(session.into_inner().id, "ses_default");
    server.stop().await.unwrap();
}
