//! EraseUser: every session of a user, with all attached to it, and the
//! shared scopes named, gone from every read, from watchers (told
//! `session_deleted`) and from the store's files: the bytes of SQLite's
//! database, WAL and search files, and every live row of PostgreSQL.

use std::path::Path;

use sessionstore_client::SessionStoreClient;
use sessionstore_client::v1 as pb;
use tonic::Code;
use tonic::transport::Channel;

use crate::support::{
    Backend, ServerProcess, Storage, TestServer, assistant, call, create_owned, error_details,
    next_change, search_hits, sessionstore_binary, user,
};

crate::postgres_tests!(
    no_live_postgres_row_holds_an_erased_byte,
    another_replicas_watcher_is_told,
    two_replicas_erasing_one_user_leave_no_key_behind,
);

crate::backend_tests!(
    erase_user_deletes_everything_of_the_user,
    a_large_user_is_erased_in_batches,
    erase_user_refuses_bad_requests,
);

type Client = SessionStoreClient<Channel>;

/// The erased user's mark: in their name, session ids, messages, tool
/// arguments, metadata, titles, state, request ids and usage objects.
const CANARY: &str = "xkcdcanary7f3a9";
/// Another user's mark, which must survive.
const KEPT: &str = "bobkeepsthis42";

fn erased_user() -> String {
    format!("erin-{CANARY}")
}

fn scope_of(user: &str) -> String {
    format!("user:app:{user}")
}

/// Fills a session of `owner` with `mark` everywhere a caller can put it:
/// title, metadata, messages (text, tool call arguments, a tool result),
/// an edited message (the event keeps the old text), a provider call's
/// usage object and request id, a state entry.
async fn fill(client: &mut Client, id: &str, owner: &str, mark: &str) {
    client
        .create_session(pb::CreateSessionRequest {
            session_id: id.into(),
            user: owner.into(),
            title: format!("about {mark}"),
            metadata: [("topic".to_owned(), mark.to_owned())].into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let mut provider_call = call("gpt-test", 10, 5, 42);
    provider_call.usage_json = format!(r#"{{"note":"{mark}"}}"#);
    let appended = client
        .append_exchange(pb::AppendExchangeRequest {
            session_id: id.into(),
            request_id: format!("req-{id}-{mark}"),
            messages: vec![user(&format!("tell me about {mark} please"))],
            provider_call: Some(provider_call),
            response_messages: vec![
                pb::Message {
                    role: pb::Role::Assistant.into(),
                    tool_calls: vec![pb::ToolCall {
                        id: "call_1".into(),
                        name: "lookup".into(),
                        arguments: format!(r#"{{"q":"{mark}"}}"#),
                        signature: String::new(),
                    }],
                    ..Default::default()
                },
                pb::Message {
                    role: pb::Role::Tool.into(),
                    tool_call_id: "call_1".into(),
                    content: format!("found {mark} twice"),
                    ..Default::default()
                },
                assistant(&format!("{mark} is a word")),
            ],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let first = appended.messages[0].id.clone();
    client
        .edit_message(pb::EditMessageRequest {
            session_id: id.into(),
            message_id: first,
            message: Some(user(&format!("tell me more about {mark}"))),
            ..Default::default()
        })
        .await
        .unwrap();
    client
        .set_state(pb::SetStateRequest {
            session_id: id.into(),
            key: "note".into(),
            value: format!("remember {mark}"),
            ..Default::default()
        })
        .await
        .unwrap();
}

/// Two sessions of the erased user (and one they deleted themselves), one
/// of another user, and a shared scope each.
async fn populate(client: &mut Client) {
    let erin = erased_user();
    for i in 0..2 {
        fill(client, &format!("chat-{CANARY}-{i}"), &erin, CANARY).await;
    }
    fill(client, &format!("chat-{CANARY}-gone"), &erin, CANARY).await;
    client
        .delete_session(pb::DeleteSessionRequest {
            session_id: format!("chat-{CANARY}-gone"),
        })
        .await
        .unwrap();
    fill(client, "chat-bob", "bob", KEPT).await;
    for (owner, mark) in [(erin.as_str(), CANARY), ("bob", KEPT)] {
        client
            .set_state(pb::SetStateRequest {
                scope: scope_of(owner),
                key: "pref".into(),
                value: format!("likes {mark}"),
                ..Default::default()
            })
            .await
            .unwrap();
    }
}

async fn erase(client: &mut Client, user: &str) -> pb::EraseUserResponse {
    client
        .erase_user(pb::EraseUserRequest {
            user: user.into(),
            scopes: vec![scope_of(user)],
        })
        .await
        .unwrap_or_else(|status| panic!("erase {user}: {status:?}"))
        .into_inner()
}

async fn usage_calls(client: &mut Client, user: &str) -> i64 {
    let rows = client
        .summarize_usage(pb::SummarizeUsageRequest {
            user: user.into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .rows;
    rows.iter().map(|row| row.calls).sum()
}

async fn erase_user_deletes_everything_of_the_user(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    populate(&mut client).await;
    let erin = erased_user();
    let watched = format!("chat-{CANARY}-0");
    let head = client
        .get_session(pb::GetSessionRequest {
            session_id: watched.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .revision;
    let mut events = crate::support::watch(&mut client, &watched, head).await;
    assert_eq!(next_change(&mut events).await.kind(), "caught_up");
    assert_eq!(
        search_hits(&mut client, CANARY).await,
        8,
        "4 messages in 2 live sessions"
    );

    let erased = erase(&mut client, &erin).await;
    assert_eq!(
        (
            erased.sessions_deleted,
            erased.messages_deleted,
            erased.provider_calls_deleted
        ),
        (2, 8, 2),
        "two live sessions of four messages and a call each"
    );

    // The watcher is told, once, and its stream ends.
    let deleted = next_change(&mut events).await;
    assert_eq!(deleted.kind(), "session_deleted");
    assert_eq!(deleted.revision, head + 1);
    assert!(events.message().await.unwrap().is_none());

    // Gone from every read.
    for i in ["0", "1", "gone"] {
        let id = format!("chat-{CANARY}-{i}");
        let status = client
            .get_session(pb::GetSessionRequest {
                session_id: id,
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::NotFound);
    }
    let listed = client
        .list_sessions(pb::ListSessionsRequest {
            user: erin.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(listed.sessions.is_empty());
    assert_eq!(search_hits(&mut client, CANARY).await, 0);
    assert_eq!(usage_calls(&mut client, &erin).await, 0);
    let status = client
        .get_state(pb::GetStateRequest {
            scope: scope_of(&erin),
            key: "pref".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::NotFound);

    // The other user keeps everything.
    let bob = crate::support::all_messages(&mut client, "chat-bob").await;
    assert_eq!(bob.len(), 4);
    assert_eq!(search_hits(&mut client, KEPT).await, 4);
    assert_eq!(usage_calls(&mut client, "bob").await, 1);
    let kept = client
        .get_state(pb::GetStateRequest {
            scope: scope_of("bob"),
            key: "pref".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(kept.value, format!("likes {KEPT}"));

    // A repeat erases nothing more; the ids are free again.
    let again = erase(&mut client, &erin).await;
    assert_eq!(again, pb::EraseUserResponse::default());
    create_owned(&mut client, &watched, &erin).await;
    server.stop().await.unwrap();
}

/// More sessions and rows than one transaction takes (100 sessions, 1,000
/// rows: the events, each with its exchange's idempotency key, are split
/// between two), while another user keeps appending.
async fn a_large_user_is_erased_in_batches(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    let sessions = 130;
    for i in 0..sessions {
        let id = format!("bulk-{i}");
        create_owned(&mut client, &id, "bulk").await;
        for j in 0..5 {
            keyed_exchange(&mut client, &id, &format!("bulk-{i}-{j}")).await;
        }
    }
    create_owned(&mut client, "other", "carol").await;
    let mut other = server.client().await;
    let appending = tokio::spawn(async move {
        for i in 0..50 {
            crate::support::exchange(&mut other, "other", &format!("q{i}"), "a").await;
        }
    });
    let erased = erase(&mut client, "bulk").await;
    assert_eq!(erased.sessions_deleted, sessions);
    assert_eq!(erased.messages_deleted, sessions * 10);
    assert_eq!(erased.provider_calls_deleted, sessions * 5);
    appending.await.unwrap();
    // The idempotency keys went with them: their request ids are new
    // again, to the first session's and the last one's events alike.
    for (request_id, revision) in [("bulk-0-0", 52), ("bulk-129-4", 53)] {
        let appended = keyed_exchange(&mut client, "other", request_id).await;
        assert_eq!(appended.revision, revision, "{request_id}");
    }
    let listed = client
        .list_sessions(pb::ListSessionsRequest {
            user: "bulk".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(listed.sessions.is_empty());
    let other = crate::support::all_messages(&mut client, "other").await;
    assert_eq!(other.len(), 104);
    server.stop().await.unwrap();
}

/// An exchange sent with the idempotency key `request_id`.
async fn keyed_exchange(
    client: &mut Client,
    session_id: &str,
    request_id: &str,
) -> pb::AppendExchangeResponse {
    let mut request = crate::support::exchange_request(session_id, "question", "answer");
    request.request_id = request_id.into();
    client
        .append_exchange(request)
        .await
        .unwrap_or_else(|status| panic!("append {request_id}: {status:?}"))
        .into_inner()
}

async fn erase_user_refuses_bad_requests(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    create_owned(&mut client, "kept", "dana").await;
    for (request, field) in [
        (pb::EraseUserRequest::default(), "user"),
        (
            pb::EraseUserRequest {
                user: "dana".into(),
                scopes: vec!["user:app:dana".into(), "not a scope".into()],
            },
            "scopes[1]",
        ),
    ] {
        let status = client.erase_user(request).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument);
        let (_, named) = error_details(&status);
        assert_eq!(named.as_deref(), Some(field), "{status:?}");
    }
    // Nothing was erased.
    let kept = crate::support::get(&mut client, "kept").await;
    assert_eq!(kept.user, "dana");
    server.stop().await.unwrap();
}

/// Every file under `dir` whose bytes contain `mark`.
fn files_holding(dir: &Path, mark: &str) -> Vec<String> {
    let mut holding = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let bytes = std::fs::read(&path).unwrap();
        if bytes
            .windows(mark.len())
            .any(|window| window == mark.as_bytes())
        {
            holding.push(path.file_name().unwrap().to_string_lossy().into_owned());
        }
    }
    holding.sort();
    holding
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_erased_byte_is_left_in_the_sqlite_files() {
    let storage = Storage::new(Backend::File).await;
    let database = storage
        .url
        .strip_prefix("sqlite://")
        .map(std::path::PathBuf::from)
        .unwrap();
    let dir = database.parent().unwrap().to_owned();
    // The storage outlives the server, for the last look.
    let server = TestServer::start_with(storage.url.clone(), None, |_| {}).await;
    let mut client = server.client().await;
    populate(&mut client).await;
    // Indexed, so the search file holds the words too.
    assert_eq!(search_hits(&mut client, CANARY).await, 8);
    let before = files_holding(&dir, CANARY);
    assert!(
        before
            .iter()
            .any(|file| file.ends_with("-search") || file.ends_with("-search-wal")),
        "the search file holds the mark before: {before:?}"
    );
    assert!(before.len() >= 2, "{before:?}");

    erase(&mut client, &erased_user()).await;

    assert_eq!(files_holding(&dir, CANARY), Vec::<String>::new());
    // The files read are the live ones: the other user's mark is there.
    assert!(!files_holding(&dir, KEPT).is_empty());
    assert_eq!(search_hits(&mut client, KEPT).await, 4);
    server.stop().await.unwrap();
    // And once the server is gone (the WAL copied back, files closed).
    assert_eq!(files_holding(&dir, CANARY), Vec::<String>::new());
    drop(storage);
}

/// The words of a deleted session are removed from the SQLite search file
/// after the writes searches wait for (a backlog kept in the search file),
/// never found meanwhile, still removed after a `kill -9`, and an erasure
/// answers only once they are gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleted_words_leave_the_sqlite_search_file_after_a_kill() {
    let binary = tokio::task::spawn_blocking(sessionstore_binary)
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let logs = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/db.sqlite", dir.path().display());
    let start = |n: usize| {
        ServerProcess::start(
            &binary,
            &url,
            "127.0.0.1:0",
            logs.path().join(format!("server-{n}.log")),
            &[],
        )
    };
    let in_search_file = || {
        files_holding(dir.path(), CANARY)
            .into_iter()
            .filter(|file| file.contains("-search"))
            .collect::<Vec<_>>()
    };
    let mut server = start(1).await;
    let mut client = Client::connect(server.endpoint()).await.unwrap();
    fill(&mut client, "s_deleted", "dora", CANARY).await;
    fill(&mut client, "s_kept", "bob", KEPT).await;
    assert_eq!(search_hits(&mut client, CANARY).await, 4);
    assert!(!in_search_file().is_empty());

    client
        .delete_session(pb::DeleteSessionRequest {
            session_id: "s_deleted".into(),
        })
        .await
        .unwrap();
    assert_eq!(search_hits(&mut client, CANARY).await, 0);
    server.kill().await;

    let server = start(2).await;
    let mut client = Client::connect(server.endpoint()).await.unwrap();
    assert_eq!(search_hits(&mut client, CANARY).await, 0);
    // Nothing of this user: the erasure only waits for the index's
    // deletions logged before it, and truncates the WAL files.
    let erased = erase(&mut client, "nobody").await;
    assert_eq!(erased.sessions_deleted, 0);
    assert_eq!(in_search_file(), Vec::<String>::new());
    assert_eq!(search_hits(&mut client, KEPT).await, 4);
    // A new session of the same id does not bring the old words back.
    fill(&mut client, "s_deleted", "dora", KEPT).await;
    assert_eq!(search_hits(&mut client, KEPT).await, 8);
    assert_eq!(search_hits(&mut client, CANARY).await, 0);
    drop(server);
}

async fn no_live_postgres_row_holds_an_erased_byte() {
    let storage = Storage::new(Backend::Postgres).await;
    let url = storage.url.clone();
    let server = TestServer::start_on(storage, |_| {}).await;
    let mut client = server.client().await;
    populate(&mut client).await;
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    assert!(rows_holding(&pool, CANARY).await.len() >= 8);

    erase(&mut client, &erased_user()).await;

    assert_eq!(rows_holding(&pool, CANARY).await, Vec::<String>::new());
    assert!(!rows_holding(&pool, KEPT).await.is_empty());
    // The record names no byte of the user, and counts what went.
    let (user_sha256, sessions): (String, i64) =
        sqlx::query_as("SELECT user_sha256, sessions_deleted FROM erasures")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(user_sha256.len(), 64);
    assert_eq!(sessions, 2);
    pool.close().await;
    server.stop().await.unwrap();
}

/// The tables (one entry per row) of the public schema with a row whose
/// text holds `mark`.
async fn rows_holding(pool: &sqlx::PgPool, mark: &str) -> Vec<String> {
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT table_name::text FROM information_schema.tables \
         WHERE table_schema = 'public' AND table_type = 'BASE TABLE'",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    let mut holding = Vec::new();
    for table in tables {
        let count: i64 = sqlx::query_scalar(&format!(
            "SELECT count(*) FROM \"{table}\" AS t WHERE t::text LIKE '%' || $1 || '%'"
        ))
        .bind(mark)
        .fetch_one(pool)
        .await
        .unwrap();
        for _ in 0..count {
            holding.push(table.clone());
        }
    }
    holding
}

async fn another_replicas_watcher_is_told() {
    let (a, b, _) = two_replicas().await;
    let (mut on_a, mut on_b) = (a.client().await, b.client().await);
    let created = create_owned(&mut on_a, "watched-elsewhere", "frank").await;
    let mut events = crate::support::watch(&mut on_b, "watched-elsewhere", created.revision).await;
    assert_eq!(next_change(&mut events).await.kind(), "caught_up");
    let erased = erase(&mut on_a, "frank").await;
    assert_eq!(erased.sessions_deleted, 1);
    let deleted = next_change(&mut events).await;
    assert_eq!(deleted.kind(), "session_deleted");
    assert!(events.message().await.unwrap().is_none());
    b.stop().await.unwrap();
    a.stop().await.unwrap();
}

/// Two replicas erasing one user at once (a client that retried on
/// another replica): between them every row goes, each batch of events
/// with the idempotency keys they name, and no key or row is left behind.
async fn two_replicas_erasing_one_user_leave_no_key_behind() {
    let (a, b, url) = two_replicas().await;
    let (mut on_a, mut on_b) = (a.client().await, b.client().await);
    for i in 0..60 {
        let id = format!("twice-{i}");
        create_owned(&mut on_a, &id, "twice").await;
        for j in 0..5 {
            keyed_exchange(&mut on_a, &id, &format!("twice-{i}-{j}")).await;
        }
    }
    create_owned(&mut on_a, "kept", "carol").await;
    keyed_exchange(&mut on_a, "kept", "kept-0").await;

    let (first, second) = tokio::join!(erase(&mut on_a, "twice"), erase(&mut on_b, "twice"));
    assert_eq!(first.sessions_deleted + second.sessions_deleted, 60);

    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    let keys: Vec<String> =
        sqlx::query_scalar("SELECT request_id FROM idempotency_keys ORDER BY 1")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(keys, ["kept-0"]);
    let events: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM events e JOIN sessions s ON s.key = e.session_key \
         WHERE s.user_name = 'twice'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(events, 0);
    // Each replica's batches skip the tables they found empty; whatever
    // the other made a tombstone meanwhile, no row outlives its session.
    for table in ["messages", "events", "provider_calls", "message_search"] {
        let orphans: i64 = sqlx::query_scalar(&format!(
            "SELECT count(*) FROM {table} t \
             WHERE NOT EXISTS (SELECT 1 FROM sessions s WHERE s.key = t.session_key)"
        ))
        .fetch_one(&pool)
        .await
        .unwrap();
        assert_eq!(orphans, 0, "{table} rows left of erased sessions");
    }
    pool.close().await;
    b.stop().await.unwrap();
    a.stop().await.unwrap();
}

/// Two servers on one new PostgreSQL database, and its URL.
async fn two_replicas() -> (TestServer, TestServer, String) {
    let storage = Storage::new(Backend::Postgres).await;
    let url = storage.url.clone();
    let a = TestServer::start_on(storage, |_| {}).await;
    let b = TestServer::start_with(url.clone(), None, |_| {}).await;
    (a, b, url)
}
