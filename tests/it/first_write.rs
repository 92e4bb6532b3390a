//! Framework calls as one RPC each. A first write: AppendExchange's
//! `create_if_missing` creates the session in the exchange's transaction,
//! once, however many first writes race for it, and a retry answers the
//! first result. A pop: RollbackSession's `remove_last` with
//! `return_removed`, no read of the session first.

use std::collections::BTreeMap;

use sessionstore_client::v1 as pb;
use tonic::Code;

use crate::support::*;

crate::backend_tests!(
    create_if_missing_makes_a_first_write_one_call,
    racing_first_writes_create_the_session_once,
    remove_last_pops_without_a_read,
);

/// The session an append creates if missing.
fn new_session(title: &str) -> pb::CreateSessionRequest {
    pb::CreateSessionRequest {
        title: title.to_owned(),
        system_prompt: "Be brief.".into(),
        user: "alice".into(),
        metadata: BTreeMap::from([("app".to_owned(), "weather".to_owned())]),
        initial_state: BTreeMap::from([("mood".to_owned(), "calm".to_owned())]),
        ..Default::default()
    }
}

fn first_write(id: &str, text: &str, request_id: &str) -> pb::AppendExchangeRequest {
    pb::AppendExchangeRequest {
        session_id: id.to_owned(),
        messages: vec![user(text)],
        request_id: request_id.to_owned(),
        create_if_missing: Some(new_session("first")),
        ..Default::default()
    }
}

async fn create_if_missing_makes_a_first_write_one_call(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;

    let first = client
        .append_exchange(first_write("ses_new", "hello", "req-1"))
        .await
        .expect("first write")
        .into_inner();
    assert!(first.session_created);
    assert_eq!(
        first.revision, 2,
        "created in revision 1, the exchange in 2"
    );
    assert_eq!(first.next_sequence, 1);
    let session = get(&mut client, "ses_new").await;
    assert_eq!(
        (
            session.title.as_str(),
            session.user.as_str(),
            session.system_prompt.as_str()
        ),
        ("first", "alice", "Be brief.")
    );
    assert_eq!(
        session.metadata.get("app").map(String::as_str),
        Some("weather")
    );
    assert_eq!(session.revision, 2);
    let mood = client
        .get_state(pb::GetStateRequest {
            session_id: "ses_new".into(),
            key: "mood".into(),
            ..Default::default()
        })
        .await
        .expect("initial state")
        .into_inner();
    assert_eq!(mood.value, "calm");

    // A retry answers the first result and writes nothing.
    let retry = client
        .append_exchange(first_write("ses_new", "hello", "req-1"))
        .await
        .expect("retry")
        .into_inner();
    assert_eq!((retry.revision, retry.next_sequence), (2, 1));
    assert!(!retry.session_created);
    assert_eq!(retry.messages[0].id, first.messages[0].id);

    // The session exists: appended to, the fields ignored.
    let mut second = first_write("ses_new", "again", "req-2");
    second.create_if_missing = Some(new_session("ignored"));
    let second = client
        .append_exchange(second)
        .await
        .expect("second write")
        .into_inner();
    assert!(!second.session_created);
    assert_eq!((second.revision, second.next_sequence), (3, 2));
    assert_eq!(get(&mut client, "ses_new").await.title, "first");

    // Refusals name the field and write nothing.
    let cases = [
        (
            pb::AppendExchangeRequest {
                create_if_missing: Some(pb::CreateSessionRequest {
                    session_id: "other".into(),
                    ..new_session("x")
                }),
                ..first_write("ses_bad", "x", "")
            },
            "create_if_missing.session_id",
        ),
        (
            pb::AppendExchangeRequest {
                create_if_missing: Some(pb::CreateSessionRequest {
                    initial_history: vec![user("earlier")],
                    ..new_session("x")
                }),
                ..first_write("ses_bad", "x", "")
            },
            "create_if_missing.initial_history",
        ),
        (first_write("has space", "x", ""), "session_id"),
    ];
    for (request, field) in cases {
        let status = client.append_exchange(request).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{field}: {status:?}");
        assert_eq!(
            error_details(&status).1.as_deref(),
            Some(field),
            "{status:?}"
        );
    }
    assert_eq!(
        client
            .get_session(pb::GetSessionRequest {
                session_id: "ses_bad".into(),
                ..Default::default()
            })
            .await
            .unwrap_err()
            .code(),
        Code::NotFound
    );
    // Without create_if_missing an unknown session is still NOT_FOUND.
    let missing = client
        .append_exchange(pb::AppendExchangeRequest {
            create_if_missing: None,
            ..first_write("ses_ghost", "x", "")
        })
        .await
        .unwrap_err();
    assert_eq!(missing.code(), Code::NotFound);
    server.stop().await.expect("stop");
}

/// Runs `writers` first writes at once on `endpoints` (round robin), each
/// with its own request id: exactly one creates the session, every one is
/// appended, the sequences gap-free.
async fn race(endpoints: &[String], id: &str, writers: usize) {
    let mut tasks = Vec::new();
    for writer in 0..writers {
        let endpoint = endpoints[writer % endpoints.len()].clone();
        let id = id.to_owned();
        tasks.push(tokio::spawn(async move {
            let mut client = connect(&endpoint).await;
            client
                .append_exchange(first_write(
                    &id,
                    &format!("w{writer}"),
                    &format!("{id}-{writer}"),
                ))
                .await
                .map(tonic::Response::into_inner)
        }));
    }
    let mut created = 0;
    let mut sequences = Vec::new();
    for task in tasks {
        let response = task
            .await
            .expect("writer task")
            .expect("a racing first write");
        created += usize::from(response.session_created);
        sequences.extend(response.messages.iter().map(|m| m.sequence));
    }
    assert_eq!(created, 1, "the session was created once");
    sequences.sort_unstable();
    let expected: Vec<i64> = (0..i64::try_from(writers).expect("writers")).collect();
    assert_eq!(sequences, expected, "every write appended, gap-free");
}

async fn racing_first_writes_create_the_session_once(backend: Backend) {
    let server = TestServer::start(backend).await;
    race(&[server.endpoint()], "ses_raced", 16).await;
    let mut client = server.client().await;
    let session = get(&mut client, "ses_raced").await;
    assert_eq!(session.revision, 17);
    server.stop().await.expect("stop");
}

mod postgres_only {
    use super::*;

    /// Two replicas of one database: first writes racing on both create
    /// the session once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn first_writes_racing_on_two_replicas_create_the_session_once() {
        if !postgres_available(concat!(
            module_path!(),
            "::first_writes_racing_on_two_replicas"
        ))
        .await
        {
            return;
        }
        let storage = Storage::new(Backend::Postgres).await;
        let url = storage.url.clone();
        let a = TestServer::start_on(storage, |_| {}).await;
        let b = TestServer::start_with(url, None, |_| {}).await;
        for round in 0..5 {
            race(
                &[a.endpoint(), b.endpoint()],
                &format!("ses_two_{round}"),
                12,
            )
            .await;
        }
        b.stop().await.expect("stop b");
        a.stop().await.expect("stop a");
    }
}

async fn remove_last_pops_without_a_read(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    let mut first = first_write("ses_pop", "one", "");
    first.messages.extend([user("two"), user("three")]);
    client.append_exchange(first).await.expect("first write");
    let pop = |count: i64| pb::RollbackSessionRequest {
        session_id: "ses_pop".into(),
        remove_last: count,
        return_removed: true,
        ..Default::default()
    };
    let popped = client
        .rollback_session(pop(1))
        .await
        .expect("pop")
        .into_inner();
    let texts: Vec<String> = popped
        .removed_messages
        .iter()
        .map(|m| {
            m.message
                .as_ref()
                .map(|m| m.content.clone())
                .unwrap_or_default()
        })
        .collect();
    assert_eq!(texts, ["three"]);
    assert_eq!((popped.next_sequence, popped.revision), (2, 3));
    // More than it holds: all of them.
    let rest = client
        .rollback_session(pop(5))
        .await
        .expect("pop the rest")
        .into_inner();
    assert_eq!(rest.removed_messages.len(), 2);
    assert_eq!(rest.next_sequence, 0);
    // An empty session: nothing removed, the revision unchanged.
    let empty = client
        .rollback_session(pop(1))
        .await
        .expect("pop nothing")
        .into_inner();
    assert!(empty.removed_messages.is_empty());
    assert_eq!(empty.revision, rest.revision);
    for (request, field) in [
        (pop(-1), "remove_last"),
        (
            pb::RollbackSessionRequest {
                after_sequence: 3,
                ..pop(1)
            },
            "after_sequence",
        ),
    ] {
        let status = client.rollback_session(request).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
        assert_eq!(error_details(&status).1.as_deref(), Some(field));
    }
    server.stop().await.expect("stop");
}
