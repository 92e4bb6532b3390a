//! What the framework adapters need from the API, through real gRPC on
//! every backend: `Session.next_sequence`, `initial_state`, state changes
//! inside an exchange, `update_time` on an append, rollback with
//! `expected_next_sequence` and `return_removed` ("pop"), shared state
//! scopes, and ListSessions' `filter`.

use sessionstore_client::v1 as pb;
use sessionstore_client::v1::session_event::Event;
use tonic::Code;

use crate::support::{
    Backend, Storage, TestServer, authed, create, error_details, exchange, exchange_request, get,
    next_change, token_line, user, watch,
};

crate::backend_tests!(
    next_sequence_is_the_tail_everywhere_a_session_is_read,
    initial_state_is_written_in_revision_one,
    an_append_answers_its_revision_time,
    rollback_pops_the_tail_and_refuses_a_stale_sequence,
    state_changes_share_the_exchange_revision_all_or_nothing,
    shared_scopes_belong_to_the_tenant_not_a_session,
    list_filters_by_user_and_metadata,
);

/// The next event recording a revision (no progress, no caught_up).
async fn next_stored(stream: &mut crate::support::Events) -> pb::SessionEvent {
    loop {
        let event = next_change(stream).await;
        if !matches!(event.event, Some(Event::CaughtUp(_))) {
            return event;
        }
    }
}

fn state_change(scope: &str, key: &str, value: &str) -> pb::StateChange {
    pb::StateChange {
        scope: scope.into(),
        key: key.into(),
        value: value.into(),
        delete: false,
    }
}

fn deletion(scope: &str, key: &str) -> pb::StateChange {
    pb::StateChange {
        scope: scope.into(),
        key: key.into(),
        value: String::new(),
        delete: true,
    }
}

async fn get_state(
    client: &mut pb::session_store_client::SessionStoreClient<tonic::transport::Channel>,
    session_id: &str,
    scope: &str,
    key: &str,
) -> Result<pb::StateEntry, tonic::Status> {
    client
        .get_state(pb::GetStateRequest {
            session_id: session_id.into(),
            key: key.into(),
            scope: scope.into(),
        })
        .await
        .map(tonic::Response::into_inner)
}

async fn next_sequence_is_the_tail_everywhere_a_session_is_read(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    let created = client
        .create_session(pb::CreateSessionRequest {
            session_id: "ns".into(),
            initial_history: vec![user("hello"), user("again")],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(created.next_sequence, 2);
    assert_eq!(create(&mut client, "empty").await.next_sequence, 0);

    let appended = exchange(&mut client, "ns", "q", "a").await;
    assert_eq!(appended.next_sequence, 4);
    assert_eq!(get(&mut client, "ns").await.next_sequence, 4);
    let listed = client
        .list_sessions(pb::ListSessionsRequest::default())
        .await
        .unwrap()
        .into_inner();
    let summary = listed
        .sessions
        .iter()
        .find(|s| s.session.as_ref().is_some_and(|s| s.id == "ns"))
        .expect("listed");
    assert_eq!(summary.session.as_ref().unwrap().next_sequence, 4);

    client
        .rollback_session(pb::RollbackSessionRequest {
            session_id: "ns".into(),
            after_sequence: 0,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(get(&mut client, "ns").await.next_sequence, 1);
    let forked = client
        .fork_session(pb::ForkSessionRequest {
            session_id: "ns".into(),
            at_sequence: 0,
            new_session_id: "ns-fork".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(forked.next_sequence, 1);
    // A session_updated event carries the session as it is.
    let mut events = watch(&mut client, "ns", 3).await;
    let renamed = client
        .update_session(pb::UpdateSessionRequest {
            session: Some(pb::Session {
                id: "ns".into(),
                title: "renamed".into(),
                ..Default::default()
            }),
            update_mask: Some(prost_types::FieldMask {
                paths: vec!["title".into()],
            }),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(renamed.next_sequence, 1);
    let event = next_stored(&mut events).await;
    let Some(Event::SessionUpdated(updated)) = event.event else {
        panic!("expected session_updated: {event:?}");
    };
    assert_eq!(updated.session.unwrap().next_sequence, 1);
    server.stop().await.unwrap();
}

async fn initial_state_is_written_in_revision_one(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    let created = client
        .create_session(pb::CreateSessionRequest {
            session_id: "is".into(),
            initial_state: [("plan".into(), "draft".into()), ("step".into(), "1".into())]
                .into_iter()
                .collect(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(created.revision, 1);
    let entry = get_state(&mut client, "is", "", "plan").await.unwrap();
    assert_eq!((entry.value.as_str(), entry.version), ("draft", 1));
    let listed = client
        .list_state(pb::ListStateRequest {
            session_id: "is".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let keys: Vec<_> = listed.entries.iter().map(|e| e.key.as_str()).collect();
    assert_eq!(keys, ["plan", "step"]);

    // The session_created event carries them.
    let mut events = watch(&mut client, "is", 0).await;
    let event = next_stored(&mut events).await;
    let Some(Event::SessionCreated(created_event)) = event.event else {
        panic!("expected session_created: {event:?}");
    };
    let state: Vec<_> = created_event
        .initial_state
        .iter()
        .map(|e| (e.key.as_str(), e.value.as_str(), e.version))
        .collect();
    assert_eq!(state, [("plan", "draft", 1), ("step", "1", 1)]);

    // A bad entry refuses the whole session.
    let status = client
        .create_session(pb::CreateSessionRequest {
            session_id: "bad".into(),
            initial_state: [(String::new(), "x".into())].into_iter().collect(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert_eq!(error_details(&status).1.as_deref(), Some("initial_state"));
    let status = client
        .create_session(pb::CreateSessionRequest {
            session_id: "bad".into(),
            initial_state: [("k".into(), "x".repeat(64 * 1024 + 1))]
                .into_iter()
                .collect(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    let missing = client
        .get_session(pb::GetSessionRequest {
            session_id: "bad".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(missing.code(), Code::NotFound);
    server.stop().await.unwrap();
}

async fn an_append_answers_its_revision_time(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    create(&mut client, "ut").await;
    let mut events = watch(&mut client, "ut", 1).await;
    let mut request = exchange_request("ut", "q", "a");
    request.request_id = "req-1".into();
    let appended = client
        .append_exchange(request.clone())
        .await
        .unwrap()
        .into_inner();
    let time = appended.update_time.expect("update_time");
    let event = next_stored(&mut events).await;
    assert_eq!(event.time.as_ref(), Some(&time));
    assert_eq!(get(&mut client, "ut").await.update_time, Some(time));
    // A retry is answered the first result's time.
    let replayed = client.append_exchange(request).await.unwrap().into_inner();
    assert_eq!(replayed.update_time, Some(time));
    server.stop().await.unwrap();
}

async fn rollback_pops_the_tail_and_refuses_a_stale_sequence(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    create(&mut client, "pop").await;
    let appended = exchange(&mut client, "pop", "q", "a").await;
    assert_eq!(appended.next_sequence, 2);

    // A stale expected sequence: nothing changes.
    let status = client
        .rollback_session(pb::RollbackSessionRequest {
            session_id: "pop".into(),
            after_sequence: 0,
            expected_next_sequence: Some(3),
            return_removed: true,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Aborted, "{status:?}");
    assert_eq!(
        error_details(&status).0.as_deref(),
        Some("SEQUENCE_MISMATCH")
    );
    {
        use tonic_types::StatusExt as _;
        let details = status.get_error_details();
        let info = details.error_info().expect("ErrorInfo");
        assert_eq!(
            info.metadata
                .get("actual_next_sequence")
                .map(String::as_str),
            Some("2")
        );
    }
    let session = get(&mut client, "pop").await;
    assert_eq!((session.revision, session.next_sequence), (2, 2));

    // Pop the last item: one call, the removed message back.
    let popped = client
        .rollback_session(pb::RollbackSessionRequest {
            session_id: "pop".into(),
            after_sequence: 0,
            expected_next_sequence: Some(2),
            return_removed: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((popped.revision, popped.next_sequence), (3, 1));
    assert_eq!(popped.removed_messages.len(), 1);
    assert_eq!(popped.removed_messages[0], appended.messages[1]);
    // Without return_removed nothing comes back.
    let plain = client
        .rollback_session(pb::RollbackSessionRequest {
            session_id: "pop".into(),
            after_sequence: -1,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((plain.revision, plain.next_sequence), (4, 0));
    assert!(plain.removed_messages.is_empty());
    server.stop().await.unwrap();
}

async fn state_changes_share_the_exchange_revision_all_or_nothing(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    create(&mut client, "sc").await;
    let mut events = watch(&mut client, "sc", 1).await;
    let mut request = exchange_request("sc", "q", "a");
    request.request_id = "with-state".into();
    request.state_changes = vec![
        state_change("", "mood", "curious"),
        state_change("", "gone", "soon"),
        deletion("", "gone"),
        state_change("app:weather", "units", "metric"),
    ];
    let appended = client
        .append_exchange(request.clone())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(appended.revision, 2, "one revision for messages and state");
    let mood = get_state(&mut client, "sc", "", "mood").await.unwrap();
    assert_eq!((mood.value.as_str(), mood.version), ("curious", 2));
    let gone = get_state(&mut client, "sc", "", "gone").await.unwrap_err();
    assert_eq!(gone.code(), Code::NotFound);
    let units = get_state(&mut client, "", "app:weather", "units")
        .await
        .unwrap();
    assert_eq!((units.value.as_str(), units.version), ("metric", 1));
    assert_eq!(units.scope, "app:weather");

    // The event carries them, as requested.
    let event = next_stored(&mut events).await;
    assert_eq!(event.revision, 2);
    let Some(Event::ExchangeAppended(appended_event)) = event.event else {
        panic!("expected exchange_appended: {event:?}");
    };
    assert_eq!(appended_event.state_changes, request.state_changes);

    // A retry writes nothing again: the shared version stays.
    let replayed = client.append_exchange(request).await.unwrap().into_inner();
    assert_eq!(replayed.revision, 2);
    let units = get_state(&mut client, "", "app:weather", "units")
        .await
        .unwrap();
    assert_eq!(units.version, 1);

    // A refused exchange writes none of its state.
    let mut stale = exchange_request("sc", "q2", "a2");
    stale.expected_next_sequence = Some(0);
    stale.state_changes = vec![
        state_change("", "mood", "stale"),
        state_change("app:weather", "units", "imperial"),
    ];
    let status = client.append_exchange(stale).await.unwrap_err();
    assert_eq!(status.code(), Code::Aborted);
    let mut too_big = exchange_request("sc", "q3", "a3");
    too_big.state_changes = vec![
        state_change("app:weather", "units", "imperial"),
        state_change("", "big", &"x".repeat(64 * 1024 + 1)),
    ];
    let status = client.append_exchange(too_big).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    let mut bad_scope = exchange_request("sc", "q4", "a4");
    bad_scope.state_changes = vec![state_change("no spaces", "k", "v")];
    let status = client.append_exchange(bad_scope).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert_eq!(
        error_details(&status).1.as_deref(),
        Some("state_changes[0].scope")
    );
    let mood = get_state(&mut client, "sc", "", "mood").await.unwrap();
    assert_eq!(mood.value, "curious");
    let units = get_state(&mut client, "", "app:weather", "units")
        .await
        .unwrap();
    assert_eq!((units.value.as_str(), units.version), ("metric", 1));
    assert_eq!(get(&mut client, "sc").await.revision, 2);

    // A later exchange moves the shared version on.
    let mut later = exchange_request("sc", "q5", "a5");
    later.state_changes = vec![state_change("app:weather", "units", "kelvin")];
    let appended = client.append_exchange(later).await.unwrap().into_inner();
    assert_eq!(appended.revision, 3);
    let units = get_state(&mut client, "", "app:weather", "units")
        .await
        .unwrap();
    assert_eq!((units.value.as_str(), units.version), ("kelvin", 2));
    server.stop().await.unwrap();
}

async fn shared_scopes_belong_to_the_tenant_not_a_session(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::write(
        &tokens,
        format!("{}{}", token_line("acme", "a"), token_line("other", "o")),
    )
    .unwrap();
    let path = tokens.clone();
    let server = TestServer::start_on(Storage::new(backend).await, move |config| {
        config.auth_tokens = Some(path);
    })
    .await;
    let mut client = server.client().await;
    let set = |scope: &str, key: &str, value: &str, expected: Option<i64>| pb::SetStateRequest {
        session_id: String::new(),
        key: key.into(),
        value: value.into(),
        expected_version: expected,
        scope: scope.into(),
    };
    let first = client
        .set_state(authed(set("user:app:alice", "lang", "fr", Some(0)), "a"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!((first.version, first.scope.as_str()), (1, "user:app:alice"));
    let second = client
        .set_state(authed(set("user:app:alice", "lang", "de", None), "a"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(second.version, 2, "a shared entry counts its own writes");
    let stale = client
        .set_state(authed(set("user:app:alice", "lang", "en", Some(1)), "a"))
        .await
        .unwrap_err();
    assert_eq!(stale.code(), Code::Aborted);
    client
        .set_state(authed(set("user:app:alice", "tz", "CET", None), "a"))
        .await
        .unwrap();

    // Get and List by scope; another tenant sees nothing.
    let got = client
        .get_state(authed(
            pb::GetStateRequest {
                session_id: String::new(),
                key: "lang".into(),
                scope: "user:app:alice".into(),
            },
            "a",
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!((got.value.as_str(), got.version), ("de", 2));
    let list = |token: &str, page_token: &str| {
        authed(
            pb::ListStateRequest {
                session_id: String::new(),
                page_size: 1,
                page_token: page_token.into(),
                scope: "user:app:alice".into(),
            },
            token,
        )
    };
    let page = client.list_state(list("a", "")).await.unwrap().into_inner();
    assert_eq!(page.entries[0].key, "lang");
    let page = client
        .list_state(list("a", &page.next_page_token))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(page.entries[0].key, "tz");
    assert!(page.next_page_token.is_empty());
    let theirs = client.list_state(list("o", "")).await.unwrap().into_inner();
    assert!(theirs.entries.is_empty());
    let missing = client
        .get_state(authed(
            pb::GetStateRequest {
                session_id: String::new(),
                key: "lang".into(),
                scope: "user:app:alice".into(),
            },
            "o",
        ))
        .await
        .unwrap_err();
    assert_eq!(missing.code(), Code::NotFound);

    // A scope takes no session, and must be well-formed.
    client
        .create_session(authed(
            pb::CreateSessionRequest {
                session_id: "s".into(),
                ..Default::default()
            },
            "a",
        ))
        .await
        .unwrap();
    let mut both = set("app:x", "k", "v", None);
    both.session_id = "s".into();
    let status = client.set_state(authed(both, "a")).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert_eq!(error_details(&status).1.as_deref(), Some("session_id"));
    let status = client
        .set_state(authed(set("app x", "k", "v", None), "a"))
        .await
        .unwrap_err();
    assert_eq!(error_details(&status).1.as_deref(), Some("scope"));

    // Deleting a session leaves shared scopes alone; a delete by scope
    // checks the version.
    client
        .delete_session(authed(
            pb::DeleteSessionRequest {
                session_id: "s".into(),
            },
            "a",
        ))
        .await
        .unwrap();
    let delete = |expected| {
        authed(
            pb::DeleteStateRequest {
                session_id: String::new(),
                key: "lang".into(),
                expected_version: expected,
                scope: "user:app:alice".into(),
            },
            "a",
        )
    };
    let status = client.delete_state(delete(Some(1))).await.unwrap_err();
    assert_eq!(status.code(), Code::Aborted);
    let deleted = client
        .delete_state(delete(Some(2)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(deleted.revision, 0);
    let status = client.delete_state(delete(None)).await.unwrap_err();
    assert_eq!(status.code(), Code::NotFound);
    server.stop().await.unwrap();
}

async fn list_filters_by_user_and_metadata(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    for (id, user, app) in [
        ("w1", "alice", "weather"),
        ("w2", "bob", "weather"),
        ("w3", "alice", "weather"),
        ("c1", "alice", "chess"),
    ] {
        client
            .create_session(pb::CreateSessionRequest {
                session_id: id.into(),
                user: user.into(),
                metadata: [
                    ("app".into(), app.into()),
                    ("quote".into(), "a \"b\"".into()),
                ]
                .into_iter()
                .collect(),
                ..Default::default()
            })
            .await
            .unwrap();
    }
    let list = |filter: &str, page_token: &str| pb::ListSessionsRequest {
        page_size: 1,
        page_token: page_token.into(),
        filter: filter.into(),
        ..Default::default()
    };
    async fn ids(
        client: &mut pb::session_store_client::SessionStoreClient<tonic::transport::Channel>,
        mut request: pb::ListSessionsRequest,
    ) -> Vec<String> {
        let mut ids = Vec::new();
        loop {
            let page = client
                .list_sessions(request.clone())
                .await
                .unwrap()
                .into_inner();
            ids.extend(page.sessions.into_iter().map(|s| s.session.unwrap().id));
            if page.next_page_token.is_empty() {
                return ids;
            }
            request.page_token = page.next_page_token;
        }
    }
    // Newest update first, paged as without a filter.
    assert_eq!(
        ids(&mut client, list(r#"metadata.app = "weather""#, "")).await,
        ["w3", "w2", "w1"]
    );
    assert_eq!(
        ids(
            &mut client,
            list(r#"metadata.app = "weather" AND user = "alice""#, "")
        )
        .await,
        ["w3", "w1"]
    );
    assert_eq!(
        ids(&mut client, list(r#"metadata.quote = "a \"b\"""#, "")).await,
        ["c1", "w3", "w2", "w1"]
    );
    assert!(
        ids(&mut client, list(r#"metadata.app = "none""#, ""))
            .await
            .is_empty()
    );
    // Values are matched exactly, U+0000 and backslashes included.
    client
        .create_session(pb::CreateSessionRequest {
            session_id: "odd".into(),
            metadata: [("odd".into(), "a\u{0}b\\c".into())].into_iter().collect(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        ids(&mut client, list("metadata.odd = \"a\u{0}b\\\\c\"", "")).await,
        ["odd"]
    );
    assert!(
        ids(&mut client, list(r#"metadata.odd = "a""#, ""))
            .await
            .is_empty()
    );
    client
        .delete_session(pb::DeleteSessionRequest {
            session_id: "odd".into(),
        })
        .await
        .unwrap();

    // An update moves a session in or out; a deleted one is gone.
    client
        .update_session(pb::UpdateSessionRequest {
            session: Some(pb::Session {
                id: "c1".into(),
                metadata: [("app".into(), "weather".into())].into_iter().collect(),
                ..Default::default()
            }),
            update_mask: Some(prost_types::FieldMask {
                paths: vec!["metadata".into()],
            }),
        })
        .await
        .unwrap();
    client
        .delete_session(pb::DeleteSessionRequest {
            session_id: "w2".into(),
        })
        .await
        .unwrap();
    assert_eq!(
        ids(&mut client, list(r#"metadata.app = "weather""#, "")).await,
        ["c1", "w3", "w1"]
    );

    // A token is for its own filter; bad filters name the field.
    let page = client
        .list_sessions(list(r#"metadata.app = "weather""#, ""))
        .await
        .unwrap()
        .into_inner();
    let status = client
        .list_sessions(list(r#"metadata.app = "chess""#, &page.next_page_token))
        .await
        .unwrap_err();
    assert_eq!(error_details(&status).1.as_deref(), Some("page_token"));
    for bad in [
        r#"metadata.app = weather"#,
        r#"metadata.app = "weather" and user = "alice""#,
        r#"user = "a" OR user = "b""#,
        r#"user != "alice""#,
        r#"title = "x""#,
    ] {
        let status = client.list_sessions(list(bad, "")).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{bad}");
        assert_eq!(error_details(&status).1.as_deref(), Some("filter"), "{bad}");
    }
    server.stop().await.unwrap();
}
