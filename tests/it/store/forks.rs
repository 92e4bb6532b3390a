//! Forks: a new session at revision 1 holding copies of another's messages
//! up to a sequence, which then goes its own way.

use sessionstore_server::domain::{Fork, SessionPatch, SessionQuery};

use super::*;

crate::backend_tests!(
    a_fork_copies_the_history_up_to_a_sequence_and_goes_its_own_way,
    refused_forks_write_nothing,
);

fn fork(source: &str, at_sequence: i64, new_id: Option<&str>) -> Fork {
    Fork {
        source_id: source.to_owned(),
        at_sequence,
        new_id: new_id.map(str::to_owned),
    }
}

/// The ids of a tenant's live sessions, sorted.
async fn session_ids(store: &SqlStore, tenant: &str) -> Vec<String> {
    let query = SessionQuery {
        user: None,
        after: None,
        limit: 100,
        metadata: Vec::new(),
    };
    let mut ids: Vec<String> = store
        .list_sessions(tenant, query)
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.session.id)
        .collect();
    ids.sort();
    ids
}

async fn a_fork_copies_the_history_up_to_a_sequence_and_goes_its_own_way(backend: Backend) {
    let (_storage, store) = open(backend).await;
    create(&store, "src").await;
    for question in ["q1", "q2"] {
        store
            .append_exchange(TENANT, exchange("src", question))
            .await
            .unwrap();
    }
    let source_messages = stored(&store, "src").await;
    // The summary is copied (as the copy's id), a redaction stays one, the
    // lease stays with the source.
    let patch = SessionPatch {
        title: None,
        system_prompt: None,
        metadata: None,
        summary_message_id: Some(source_messages[1].id.clone()),
        ..Default::default()
    };
    store.update_session(TENANT, "src", patch).await.unwrap();
    store
        .control(
            TENANT,
            "src",
            controls::Redact {
                message_id: source_messages[2].id.clone(),
                reason: String::new(),
                run_id: String::new(),
            },
        )
        .await
        .unwrap();
    store
        .control(
            TENANT,
            "src",
            controls::BeginRun {
                run_id: "run-1".into(),
                lease_micros: 600_000_000,
            },
        )
        .await
        .unwrap();
    let source = store.get_session(TENANT, "src").await.unwrap();
    assert_eq!(source.revision, 6);
    let source_messages = stored(&store, "src").await;
    let source_log = log(&store, "src").await;

    let (forked, copied) = store
        .fork_session(TENANT, fork("src", 2, Some("dst")))
        .await
        .unwrap();
    assert_eq!(forked.id, "dst");
    assert_eq!(forked.revision, 1);
    assert_eq!(
        (forked.parent_session_id.as_str(), forked.parent_sequence),
        ("src", 2)
    );
    assert_eq!(
        (
            &forked.title,
            &forked.system_prompt,
            &forked.user,
            &forked.metadata
        ),
        (
            &source.title,
            &source.system_prompt,
            &source.user,
            &source.metadata
        )
    );
    assert_eq!(forked.active_run_id, "", "the lease is not copied");
    assert_eq!(forked.create_time, forked.update_time);

    // Copies, not the originals: new ids, the same bodies and redactions,
    // no provider calls.
    let sequences: Vec<i64> = copied.iter().map(|m| m.sequence).collect();
    assert_eq!(sequences, [0, 1, 2]);
    for (copy, original) in copied.iter().zip(&source_messages) {
        assert_eq!(copy.session_id, "dst");
        assert_eq!(copy.message, original.message);
        assert_eq!(copy.redacted, original.redacted);
        assert_eq!(copy.produced_by_call_id, "");
        assert!(
            source_messages.iter().all(|m| m.id != copy.id),
            "a fork's message reuses an id: {copy:?}"
        );
    }
    assert_eq!(
        copied.iter().map(|m| m.redacted).collect::<Vec<_>>(),
        [false, false, true]
    );
    assert_eq!(forked.summary_message_id, copied[1].id);
    assert_eq!(store.get_session(TENANT, "dst").await.unwrap(), forked);
    assert_eq!(stored(&store, "dst").await, copied);
    let handle = store.resolve(TENANT, "dst").await.unwrap();
    assert_eq!(handle.next_sequence, 3);
    assert!(
        store
            .read_provider_calls(&handle, 0, 10)
            .await
            .unwrap()
            .is_empty()
    );
    let events = log(&store, "dst").await;
    assert_eq!(revisions(&events), [1]);
    assert_eq!(
        events[0].change,
        Change::SessionCreated {
            session: forked.clone(),
            messages: copied.clone(),
            state: Vec::new(),
        }
    );

    // The source is untouched, and the two go their own ways.
    assert_eq!(store.get_session(TENANT, "src").await.unwrap(), source);
    assert_eq!(log(&store, "src").await, source_log);
    let (revision, appended) = store
        .append_exchange(TENANT, exchange("dst", "only in the fork"))
        .await
        .unwrap();
    assert_eq!((revision, appended.messages[0].sequence), (2, 3));
    store
        .control(
            TENANT,
            "dst",
            controls::Edit {
                message_id: copied[0].id.clone(),
                message: Message::text(Role::User, "q1 in the fork"),
                reason: String::new(),
                run_id: String::new(),
            },
        )
        .await
        .unwrap();
    assert_eq!(stored(&store, "src").await, source_messages);
    assert_eq!(texts(&store, "dst").await[0], "q1 in the fork");

    // At -1, with no id: an empty session under a server-made id.
    let (empty, none) = store
        .fork_session(TENANT, fork("src", -1, None))
        .await
        .unwrap();
    assert!(empty.id.starts_with("ses_"), "{empty:?}");
    assert!(none.is_empty());
    assert_eq!((empty.revision, empty.parent_sequence), (1, -1));
    assert_eq!(empty.summary_message_id, "");
    assert!(stored(&store, &empty.id).await.is_empty());
    let mut expected = vec![empty.id.clone(), "dst".to_owned(), "src".to_owned()];
    expected.sort();
    assert_eq!(session_ids(&store, TENANT).await, expected);
    store.close().await;
}

async fn refused_forks_write_nothing(backend: Backend) {
    let (_storage, store) = open(backend).await;
    create(&store, "src").await;
    create(&store, "taken").await;
    store
        .append_exchange(TENANT, exchange("src", "q1"))
        .await
        .unwrap();

    let past_end = store
        .fork_session(TENANT, fork("src", 2, Some("dst")))
        .await
        .unwrap_err();
    assert!(
        matches!(&past_end, Error::InvalidArgument { field, .. } if field == "at_sequence"),
        "{past_end:?}"
    );
    for target in ["taken", "src"] {
        let exists = store
            .fork_session(TENANT, fork("src", 0, Some(target)))
            .await
            .unwrap_err();
        assert!(
            matches!(&exists, Error::SessionExists(id) if id == target),
            "{exists:?}"
        );
    }
    let missing = store
        .fork_session(TENANT, fork("nope", -1, Some("dst")))
        .await
        .unwrap_err();
    assert!(matches!(missing, Error::SessionNotFound(_)), "{missing:?}");
    let other_tenant = store
        .fork_session("globex", fork("src", 0, Some("dst")))
        .await
        .unwrap_err();
    assert!(
        matches!(other_tenant, Error::SessionNotFound(_)),
        "{other_tenant:?}"
    );

    assert_eq!(session_ids(&store, TENANT).await, ["src", "taken"]);
    assert!(session_ids(&store, "globex").await.is_empty());
    assert_eq!(revisions(&log(&store, "src").await), [1, 2]);
    assert_eq!(revisions(&log(&store, "taken").await), [1]);
    assert!(stored(&store, "taken").await.is_empty());
    store.close().await;
}
