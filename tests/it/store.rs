//! The `Store` contract without gRPC: the same cases on every backend,
//! through `store::open` as the server opens it. The gRPC suites check what
//! a client sees; these pin what the store itself promises (numbering,
//! idempotency, refusals that write nothing, the lease, `full_history`), so
//! a backend's machinery can change under them.

use std::sync::Arc;

use sessionstore_server::domain::{
    Change, Control, Controlled, Error, Message, Metadata, NewExchange, NewSession, ProviderCall,
    Role,
};
use sessionstore_server::store::{self, SqlStore, Store, StoreOptions};
use sessionstore_server::watch::Hub;

use crate::support::{Backend, Storage};

crate::backend_tests!(
    appends_are_numbered_and_a_retry_is_answered_once,
    refusals_write_nothing,
    a_full_history_append_stores_only_its_new_tail,
    a_lease_keeps_other_writers_off,
    state_entries_are_versioned_by_revision,
    a_rollback_is_one_revision_and_the_log_holds_every_change,
);

const TENANT: &str = "acme";

/// The store over a fresh database of `backend` (kept alive by the
/// returned `Storage`).
async fn open(backend: Backend) -> (Storage, SqlStore) {
    let storage = Storage::new(backend).await;
    sessionstore_server::server::prepare_sqlite_path(&storage.url).unwrap();
    let store = store::open(
        &storage.url,
        Arc::new(Hub::default()),
        &StoreOptions::default(),
    )
    .await
    .unwrap();
    (storage, store)
}

async fn create(store: &SqlStore, id: &str) {
    let new = NewSession {
        id: Some(id.to_owned()),
        title: "t".into(),
        system_prompt: "Be brief.".into(),
        user: "u".into(),
        metadata: Metadata::default(),
        initial_history: Vec::new(),
    };
    let (session, _) = store.create_session(TENANT, new).await.unwrap();
    assert_eq!(session.revision, 1);
}

fn exchange(session_id: &str, question: &str) -> NewExchange {
    NewExchange {
        session_id: session_id.to_owned(),
        messages: vec![Message::text(Role::User, question)],
        full_history: Vec::new(),
        provider_call: Some(ProviderCall {
            provider: "openai".into(),
            model: "gpt-4o".into(),
            prompt_tokens: 10,
            completion_tokens: 2,
            cost_micros_usd: 85,
            ..ProviderCall::default()
        }),
        response_messages: vec![Message::text(Role::Assistant, "an answer")],
        expected_next_sequence: None,
        request_id: String::new(),
        run_id: String::new(),
    }
}

/// The session's current messages' texts, in order.
async fn texts(store: &SqlStore, id: &str) -> Vec<String> {
    let handle = store.resolve(TENANT, id).await.unwrap();
    store
        .read_messages(&handle, -1, 1000)
        .await
        .unwrap()
        .into_iter()
        .map(|m| m.message.content)
        .collect()
}

async fn appends_are_numbered_and_a_retry_is_answered_once(backend: Backend) {
    let (_storage, store) = open(backend).await;
    create(&store, "s").await;
    let mut first = exchange("s", "q1");
    first.request_id = "r1".into();
    first.expected_next_sequence = Some(0);
    let (revision, appended) = store.append_exchange(TENANT, first.clone()).await.unwrap();
    assert_eq!((revision, appended.next_sequence), (2, 2));
    assert!(!appended.replayed);
    let call = appended.provider_call.clone().unwrap();
    assert_eq!(call.total_tokens, 12, "total filled in from its parts");
    let sequences: Vec<i64> = appended.messages.iter().map(|m| m.sequence).collect();
    assert_eq!(sequences, [0, 1]);
    assert_eq!(appended.messages[1].produced_by_call_id, call.id);

    // The retry, even with its now stale expected sequence, is the first
    // answer again and writes nothing.
    let (again, replayed) = store.append_exchange(TENANT, first).await.unwrap();
    assert!(replayed.replayed);
    assert_eq!(again, revision);
    assert_eq!(replayed.messages, appended.messages);
    assert_eq!(texts(&store, "s").await, ["q1", "an answer"]);
    assert_eq!(store.get_session(TENANT, "s").await.unwrap().revision, 2);

    let (revision, appended) = store
        .append_exchange(TENANT, exchange("s", "q2"))
        .await
        .unwrap();
    assert_eq!((revision, appended.messages[0].sequence), (3, 2));
    store.close().await;
}

async fn refusals_write_nothing(backend: Backend) {
    let (_storage, store) = open(backend).await;
    create(&store, "s").await;
    let mut stale = exchange("s", "late");
    stale.expected_next_sequence = Some(5);
    let refused = store.append_exchange(TENANT, stale).await.unwrap_err();
    assert!(
        matches!(
            refused,
            Error::SequenceMismatch {
                expected: 5,
                actual: 0
            }
        ),
        "{refused:?}"
    );
    let missing = store
        .append_exchange(TENANT, exchange("nope", "x"))
        .await
        .unwrap_err();
    assert!(matches!(missing, Error::SessionNotFound(_)), "{missing:?}");
    let other_tenant = store
        .append_exchange("globex", exchange("s", "x"))
        .await
        .unwrap_err();
    assert!(
        matches!(other_tenant, Error::SessionNotFound(_)),
        "tenants never see each other's sessions: {other_tenant:?}"
    );

    let mut keyed = exchange("s", "q");
    keyed.request_id = "k".into();
    store.append_exchange(TENANT, keyed.clone()).await.unwrap();
    keyed.messages[0].content = "another question".into();
    let reused = store.append_exchange(TENANT, keyed).await.unwrap_err();
    assert!(
        matches!(reused, Error::IdempotencyConflict(_)),
        "{reused:?}"
    );
    assert_eq!(texts(&store, "s").await, ["q", "an answer"]);
    assert_eq!(store.get_session(TENANT, "s").await.unwrap().revision, 2);
    store.close().await;
}

async fn a_full_history_append_stores_only_its_new_tail(backend: Backend) {
    let (_storage, store) = open(backend).await;
    create(&store, "s").await;
    store
        .append_exchange(TENANT, exchange("s", "q1"))
        .await
        .unwrap();
    let mut resent = exchange("s", "");
    resent.messages.clear();
    resent.full_history = vec![
        // A leading copy of the system prompt is skipped.
        Message::text(Role::System, "Be brief."),
        Message::text(Role::User, "q1"),
        Message::text(Role::Assistant, "an answer"),
        Message::text(Role::User, "q2"),
    ];
    let (revision, appended) = store.append_exchange(TENANT, resent.clone()).await.unwrap();
    assert_eq!(revision, 3);
    let stored: Vec<(i64, &str)> = appended
        .messages
        .iter()
        .map(|m| (m.sequence, m.message.content.as_str()))
        .collect();
    assert_eq!(stored, [(2, "q2"), (3, "an answer")]);

    // A history that no longer matches is refused, naming where.
    resent.full_history[1].content = "edited".into();
    let refused = store.append_exchange(TENANT, resent).await.unwrap_err();
    assert!(
        matches!(refused, Error::HistoryMismatch { .. }),
        "{refused:?}"
    );
    assert_eq!(texts(&store, "s").await.len(), 4);
    store.close().await;
}

async fn a_lease_keeps_other_writers_off(backend: Backend) {
    let (_storage, store) = open(backend).await;
    create(&store, "s").await;
    let begun = store
        .control(
            TENANT,
            "s",
            Control::BeginRun {
                run_id: "run-1".into(),
                lease_micros: 60_000_000,
            },
        )
        .await
        .unwrap();
    assert!(
        matches!(begun, Controlled::RunBegun { revision: 2, .. }),
        "{begun:?}"
    );
    let busy = store
        .append_exchange(TENANT, exchange("s", "intruder"))
        .await
        .unwrap_err();
    assert!(
        matches!(&busy, Error::SessionBusy { active_run_id, .. } if active_run_id == "run-1"),
        "{busy:?}"
    );
    let mut holder = exchange("s", "mine");
    holder.run_id = "run-1".into();
    let (revision, appended) = store.append_exchange(TENANT, holder).await.unwrap();
    assert_eq!((revision, appended.run_id.as_str()), (3, "run-1"));
    assert_eq!(texts(&store, "s").await, ["mine", "an answer"]);
    store.close().await;
}

async fn state_entries_are_versioned_by_revision(backend: Backend) {
    let (_storage, store) = open(backend).await;
    create(&store, "s").await;
    let set = |key: &str, value: &str, expected_version: Option<i64>| Control::SetState {
        key: key.to_owned(),
        value: value.to_owned(),
        expected_version,
    };
    let Controlled::State(cwd) = store
        .control(TENANT, "s", set("cwd", "/home", Some(0)))
        .await
        .unwrap()
    else {
        panic!("a state entry");
    };
    assert_eq!((cwd.version, cwd.value.as_str()), (2, "/home"));
    let exists = store
        .control(TENANT, "s", set("cwd", "/tmp", Some(0)))
        .await
        .unwrap_err();
    assert!(
        matches!(
            exists,
            Error::StateVersionMismatch {
                expected: 0,
                actual: 2,
                ..
            }
        ),
        "{exists:?}"
    );
    store
        .control(TENANT, "s", set("a-first", "1", None))
        .await
        .unwrap();
    let handle = store.resolve(TENANT, "s").await.unwrap();
    assert_eq!(handle.revision, 3, "a refused write makes no revision");
    let listed: Vec<(String, i64)> = store
        .list_state(&handle, None, 10)
        .await
        .unwrap()
        .into_iter()
        .map(|e| (e.key, e.version))
        .collect();
    assert_eq!(listed, [("a-first".to_owned(), 3), ("cwd".to_owned(), 2)]);
    store
        .control(
            TENANT,
            "s",
            Control::DeleteState {
                key: "cwd".into(),
                expected_version: Some(2),
            },
        )
        .await
        .unwrap();
    let handle = store.resolve(TENANT, "s").await.unwrap();
    let gone = store.get_state(&handle, "cwd").await.unwrap_err();
    assert!(matches!(gone, Error::StateNotFound(_)), "{gone:?}");
    store.close().await;
}

async fn a_rollback_is_one_revision_and_the_log_holds_every_change(backend: Backend) {
    let (_storage, store) = open(backend).await;
    create(&store, "s").await;
    for question in ["q1", "q2"] {
        store
            .append_exchange(TENANT, exchange("s", question))
            .await
            .unwrap();
    }
    let rolled = store
        .control(
            TENANT,
            "s",
            Control::Rollback {
                after_sequence: 1,
                run_id: String::new(),
            },
        )
        .await
        .unwrap();
    assert!(
        matches!(
            rolled,
            Controlled::RolledBack {
                revision: 4,
                next_sequence: 2
            }
        ),
        "{rolled:?}"
    );
    assert_eq!(texts(&store, "s").await, ["q1", "an answer"]);
    let (revision, appended) = store
        .append_exchange(TENANT, exchange("s", "q3"))
        .await
        .unwrap();
    assert_eq!((revision, appended.messages[0].sequence), (5, 2));

    let handle = store.resolve(TENANT, "s").await.unwrap();
    let events = store.read_events(handle.key, 0, 100).await.unwrap();
    let revisions: Vec<i64> = events.iter().map(|e| e.revision).collect();
    assert_eq!(revisions, [1, 2, 3, 4, 5], "one event per revision, no gap");
    assert!(matches!(events[0].change, Change::SessionCreated { .. }));
    assert!(matches!(events[3].change, Change::RolledBack { .. }));
    let calls = store.read_provider_calls(&handle, 0, 10).await.unwrap();
    assert_eq!(calls.len(), 3, "a rollback keeps the provider calls");
    store.close().await;
}
