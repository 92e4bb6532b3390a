//! Calls a framework makes once per turn, each one RPC and safe to retry:
//! CreateSession with a `request_id` (a retry answers the session the
//! first call created) and with shared-scope `state_changes` (the session
//! and the shared state it starts with, atomically); GetSession with
//! `state_scopes` (a session with its state and named shared scopes in one
//! read); RollbackSession with a `request_id` (a retried pop answers the
//! messages the first one removed).

use std::collections::BTreeMap;

use sessionstore_client::SessionStoreClient;
use sessionstore_client::v1 as pb;
use tonic::Code;
use tonic::transport::Channel;

use crate::support::*;

crate::backend_tests!(
    a_create_retried_with_its_request_id_creates_once,
    a_session_and_its_shared_state_are_created_together,
    get_session_reads_the_scopes_it_names,
    a_retried_pop_answers_what_the_first_removed,
);
crate::postgres_tests!(keyed_calls_retried_on_another_replica_answer_the_first,);

fn change(scope: &str, key: &str, value: &str) -> pb::StateChange {
    pb::StateChange {
        scope: scope.into(),
        key: key.into(),
        value: value.into(),
        delete: false,
    }
}

fn keyed_create(request_id: &str) -> pb::CreateSessionRequest {
    pb::CreateSessionRequest {
        title: "keyed".into(),
        user: "alice".into(),
        request_id: request_id.into(),
        initial_history: vec![user("hello")],
        ..Default::default()
    }
}

fn reason(status: &tonic::Status) -> Option<String> {
    error_details(status).0
}

fn field(status: &tonic::Status) -> Option<String> {
    error_details(status).1
}

async fn session_count(client: &mut Client) -> usize {
    client
        .list_sessions(pb::ListSessionsRequest::default())
        .await
        .expect("list")
        .into_inner()
        .sessions
        .len()
}

type Client = SessionStoreClient<Channel>;

async fn a_create_retried_with_its_request_id_creates_once(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;

    // A server-made id: without the key, a retry would make a second one.
    let first = client
        .create_session(keyed_create("create-1"))
        .await
        .expect("create")
        .into_inner();
    assert!(first.id.starts_with("ses_"), "{}", first.id);
    let retry = client
        .create_session(keyed_create("create-1"))
        .await
        .expect("retry")
        .into_inner();
    assert_eq!(retry, first, "the retry answers the first session whole");
    assert_eq!(session_count(&mut client).await, 1);

    // Later writes do not change what the retry answers.
    client
        .append_exchange(pb::AppendExchangeRequest {
            session_id: first.id.clone(),
            messages: vec![user("more")],
            ..Default::default()
        })
        .await
        .expect("append");
    let later = client
        .create_session(keyed_create("create-1"))
        .await
        .expect("a later retry")
        .into_inner();
    assert_eq!((later.id.as_str(), later.revision), (first.id.as_str(), 1));

    // The same key with another body, or on another kind of call.
    let other = client
        .create_session(pb::CreateSessionRequest {
            title: "another".into(),
            ..keyed_create("create-1")
        })
        .await
        .unwrap_err();
    assert_eq!(other.code(), Code::AlreadyExists, "{other:?}");
    assert_eq!(reason(&other).as_deref(), Some("REQUEST_ID_REUSED"));
    let append = client
        .append_exchange(pb::AppendExchangeRequest {
            session_id: first.id.clone(),
            messages: vec![user("x")],
            request_id: "create-1".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(append.code(), Code::AlreadyExists, "{append:?}");
    assert_eq!(session_count(&mut client).await, 1);

    // Concurrent retries of one create: one session.
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let endpoint = server.endpoint();
        tasks.push(tokio::spawn(async move {
            let mut client = connect(&endpoint).await;
            client
                .create_session(keyed_create("create-2"))
                .await
                .map(|r| r.into_inner().id)
        }));
    }
    let mut ids = Vec::new();
    for task in tasks {
        ids.push(task.await.expect("task").expect("a concurrent create"));
    }
    ids.dedup();
    assert_eq!(ids.len(), 1, "{ids:?}");
    assert_eq!(session_count(&mut client).await, 2);

    // The key goes with its session: the same create makes a new one.
    client
        .delete_session(pb::DeleteSessionRequest {
            session_id: first.id.clone(),
        })
        .await
        .expect("delete");
    let again = client
        .create_session(keyed_create("create-1"))
        .await
        .expect("create after the deletion")
        .into_inner();
    assert_ne!(again.id, first.id);

    // Inside create_if_missing, the append's own key covers it.
    let nested = client
        .append_exchange(pb::AppendExchangeRequest {
            session_id: "ses_nested".into(),
            messages: vec![user("x")],
            create_if_missing: Some(pb::CreateSessionRequest {
                initial_history: Vec::new(),
                ..keyed_create("inner")
            }),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(nested.code(), Code::InvalidArgument);
    assert_eq!(
        field(&nested).as_deref(),
        Some("create_if_missing.request_id")
    );
    server.stop().await.expect("stop");
}

async fn a_session_and_its_shared_state_are_created_together(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    // Stored before: the create answers it with what it writes.
    client
        .set_state(pb::SetStateRequest {
            scope: "app:weather".into(),
            key: "lang".into(),
            value: "en".into(),
            ..Default::default()
        })
        .await
        .expect("set app state");
    let created = client
        .create_session(pb::CreateSessionRequest {
            session_id: "ses_adk".into(),
            state_scopes: vec!["app:weather".into(), "user:weather:alice".into()],
            initial_state: BTreeMap::from([("mood".to_owned(), "calm".to_owned())]),
            state_changes: vec![
                change("", "topic", "weather"),
                change("app:weather", "units", "metric"),
                change("user:weather:alice", "city", "Oslo"),
            ],
            ..Default::default()
        })
        .await
        .expect("create with shared state")
        .into_inner();
    assert_eq!(created.revision, 1);
    let answered: Vec<(&str, &str, &str)> = created
        .state
        .iter()
        .map(|e| (e.scope.as_str(), e.key.as_str(), e.value.as_str()))
        .collect();
    assert_eq!(
        answered,
        [
            ("app:weather", "lang", "en"),
            ("app:weather", "units", "metric"),
            ("user:weather:alice", "city", "Oslo"),
        ]
    );
    let read = client
        .get_session(pb::GetSessionRequest {
            session_id: "ses_adk".into(),
            state_scopes: vec!["".into(), "app:weather".into(), "user:weather:alice".into()],
        })
        .await
        .expect("get with state")
        .into_inner();
    let entries: Vec<(String, String, String, i64)> = read
        .state
        .iter()
        .map(|e| (e.scope.clone(), e.key.clone(), e.value.clone(), e.version))
        .collect();
    let entry = |scope: &str, key: &str, value: &str| {
        (scope.to_owned(), key.to_owned(), value.to_owned(), 1)
    };
    assert_eq!(
        entries,
        [
            entry("", "mood", "calm"),
            entry("", "topic", "weather"),
            entry("app:weather", "lang", "en"),
            entry("app:weather", "units", "metric"),
            entry("user:weather:alice", "city", "Oslo"),
        ]
    );

    // A refused create writes nothing: not the session, not the scopes.
    let bad = [
        (
            vec![
                change("app:fresh", "k", "v"),
                change("bad scope!", "k", "v"),
            ],
            "state_changes[1].scope",
        ),
        (vec![change("", "mood", "sad")], "state_changes[0].key"),
        (
            vec![change("app:fresh", "k", &"v".repeat(70_000))],
            "state_changes[0].value",
        ),
    ];
    for (changes, named) in bad {
        let status = client
            .create_session(pb::CreateSessionRequest {
                session_id: "ses_refused".into(),
                initial_state: BTreeMap::from([("mood".to_owned(), "calm".to_owned())]),
                state_changes: changes,
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert!(
            matches!(
                status.code(),
                Code::InvalidArgument | Code::ResourceExhausted
            ),
            "{status:?}"
        );
        assert_eq!(field(&status).as_deref(), Some(named), "{status:?}");
    }
    // The id taken: the shared change that came with it is not written.
    let taken = client
        .create_session(pb::CreateSessionRequest {
            session_id: "ses_adk".into(),
            state_changes: vec![change("app:fresh", "k", "v")],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(taken.code(), Code::AlreadyExists);
    let missing = client
        .get_session(pb::GetSessionRequest {
            session_id: "ses_refused".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(missing.code(), Code::NotFound);
    let fresh = client
        .list_state(pb::ListStateRequest {
            scope: "app:fresh".into(),
            ..Default::default()
        })
        .await
        .expect("list the scope")
        .into_inner();
    assert!(fresh.entries.is_empty(), "{:?}", fresh.entries);
    server.stop().await.expect("stop");
}

async fn get_session_reads_the_scopes_it_names(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    client
        .create_session(pb::CreateSessionRequest {
            session_id: "ses_scopes".into(),
            ..Default::default()
        })
        .await
        .expect("create");
    let get = |scopes: Vec<String>| pb::GetSessionRequest {
        session_id: "ses_scopes".into(),
        state_scopes: scopes,
    };
    // Named but empty scopes, and none named: no entries.
    let empty = client
        .get_session(get(vec!["".into(), "app:none".into()]))
        .await
        .expect("empty scopes")
        .into_inner();
    assert!(empty.state.is_empty());
    let plain = client
        .get_session(get(Vec::new()))
        .await
        .expect("plain")
        .into_inner();
    assert_eq!(plain, empty, "the same session either way");

    for (scopes, named) in [
        (
            vec!["app:ok".to_owned(), "not a scope".to_owned()],
            "state_scopes[1]",
        ),
        (vec!["app:x".to_owned(); 17], "state_scopes"),
    ] {
        let status = client.get_session(get(scopes)).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
        assert_eq!(field(&status).as_deref(), Some(named));
    }
    let unknown = client
        .get_session(pb::GetSessionRequest {
            session_id: "ses_unknown".into(),
            state_scopes: vec!["".into()],
        })
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), Code::NotFound);
    server.stop().await.expect("stop");
}

fn keyed_pop(request_id: &str) -> pb::RollbackSessionRequest {
    pb::RollbackSessionRequest {
        session_id: "ses_pop".into(),
        remove_last: 1,
        return_removed: true,
        request_id: request_id.into(),
        ..Default::default()
    }
}

fn texts(messages: &[pb::StoredMessage]) -> Vec<String> {
    messages
        .iter()
        .map(|m| {
            m.message
                .as_ref()
                .map(|m| m.content.clone())
                .unwrap_or_default()
        })
        .collect()
}

async fn a_retried_pop_answers_what_the_first_removed(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    client
        .create_session(pb::CreateSessionRequest {
            session_id: "ses_pop".into(),
            initial_history: vec![user("one"), user("two"), user("three")],
            ..Default::default()
        })
        .await
        .expect("create");
    let first = client
        .rollback_session(keyed_pop("pop-1"))
        .await
        .expect("pop")
        .into_inner();
    assert_eq!(texts(&first.removed_messages), ["three"]);
    let retry = client
        .rollback_session(keyed_pop("pop-1"))
        .await
        .expect("retry")
        .into_inner();
    assert_eq!(retry, first, "the retry answers the first pop whole");

    // After another write, the retry still removes nothing more.
    client
        .append_exchange(pb::AppendExchangeRequest {
            session_id: "ses_pop".into(),
            messages: vec![user("four")],
            ..Default::default()
        })
        .await
        .expect("append");
    let later = client
        .rollback_session(keyed_pop("pop-1"))
        .await
        .expect("a later retry")
        .into_inner();
    assert_eq!(later, first);
    let history = client
        .list_messages(pb::ListMessagesRequest {
            session_id: "ses_pop".into(),
            ..Default::default()
        })
        .await
        .expect("list")
        .into_inner();
    assert_eq!(texts(&history.messages), ["one", "two", "four"]);

    // The same key with another body.
    let other = client
        .rollback_session(pb::RollbackSessionRequest {
            remove_last: 2,
            ..keyed_pop("pop-1")
        })
        .await
        .unwrap_err();
    assert_eq!(other.code(), Code::AlreadyExists, "{other:?}");
    assert_eq!(reason(&other).as_deref(), Some("REQUEST_ID_REUSED"));

    // A keyed pop of an empty session answers nothing, and keeps answering
    // nothing after the session has messages again.
    client
        .rollback_session(pb::RollbackSessionRequest {
            session_id: "ses_pop".into(),
            after_sequence: -1,
            ..Default::default()
        })
        .await
        .expect("empty it");
    let nothing = client
        .rollback_session(keyed_pop("pop-2"))
        .await
        .expect("pop nothing")
        .into_inner();
    assert!(nothing.removed_messages.is_empty());
    client
        .append_exchange(pb::AppendExchangeRequest {
            session_id: "ses_pop".into(),
            messages: vec![user("five")],
            ..Default::default()
        })
        .await
        .expect("append");
    let still = client
        .rollback_session(keyed_pop("pop-2"))
        .await
        .expect("retry of the empty pop")
        .into_inner();
    assert_eq!(still, nothing);
    server.stop().await.expect("stop");
}

/// A retry answered by another replica of the same database.
async fn keyed_calls_retried_on_another_replica_answer_the_first() {
    let storage = Storage::new(Backend::Postgres).await;
    let url = storage.url.clone();
    let a = TestServer::start_on(storage, |_| {}).await;
    let b = TestServer::start_with(url, None, |_| {}).await;
    let (mut on_a, mut on_b) = (a.client().await, b.client().await);
    let created = on_a
        .create_session(pb::CreateSessionRequest {
            session_id: "ses_pop".into(),
            initial_history: vec![user("one"), user("two")],
            request_id: "create-pop".into(),
            ..Default::default()
        })
        .await
        .expect("create on a")
        .into_inner();
    let retried = on_b
        .create_session(pb::CreateSessionRequest {
            session_id: "ses_pop".into(),
            initial_history: vec![user("one"), user("two")],
            request_id: "create-pop".into(),
            ..Default::default()
        })
        .await
        .expect("retry on b")
        .into_inner();
    assert_eq!(retried, created);
    let popped = on_a
        .rollback_session(keyed_pop("pop-a"))
        .await
        .expect("pop on a")
        .into_inner();
    let again = on_b
        .rollback_session(keyed_pop("pop-a"))
        .await
        .expect("retry on b")
        .into_inner();
    assert_eq!(again, popped);
    assert_eq!(texts(&again.removed_messages), ["two"]);
    b.stop().await.expect("stop b");
    a.stop().await.expect("stop a");
}
