//! Forks.

use super::*;

crate::backend_tests!(
    fork_copies_history_and_stays_independent,
    fork_rejects_bad_requests,
);

async fn fork_copies_history_and_stays_independent(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    let metadata: std::collections::BTreeMap<String, String> =
        [("team".to_owned(), "blue".to_owned())].into();
    client
        .create_session(pb::CreateSessionRequest {
            session_id: "src".into(),
            title: "Source".into(),
            system_prompt: "Be kind.".into(),
            user: "carol".into(),
            metadata: metadata.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    for i in 0..3 {
        exchange(&mut client, "src", &format!("q{i}"), &format!("a{i}")).await;
    }
    let source_messages = all_messages(&mut client, "src").await;
    set_summary(&mut client, "src", &source_messages[1].id).await;
    redact(&mut client, "src", &source_messages[2].id, "")
        .await
        .unwrap();
    set_state(&mut client, "src", "cwd", "/src", None)
        .await
        .unwrap();
    let source_messages = all_messages(&mut client, "src").await;
    let source_revision = get(&mut client, "src").await.revision;

    let forked = fork(&mut client, "src", 3, "dst").await.unwrap();
    assert_eq!(forked.id, "dst");
    assert_eq!(forked.parent_session_id, "src");
    assert_eq!(forked.parent_sequence, 3);
    assert_eq!(forked.title, "Source");
    assert_eq!(forked.system_prompt, "Be kind.");
    assert_eq!(forked.user, "carol");
    assert_eq!(forked.metadata, metadata);
    assert_eq!(forked.revision, 1);
    assert_eq!(get(&mut client, "dst").await, forked);
    assert_eq!(
        get(&mut client, "src").await.revision,
        source_revision,
        "forking does not change the source"
    );

    // The history up to the sequence, same content, new ids, no call links,
    // the redaction marker still redacted.
    let copied = all_messages(&mut client, "dst").await;
    assert_eq!(copied.len(), 4);
    for (copy, original) in copied.iter().zip(&source_messages) {
        assert_eq!(copy.sequence, original.sequence);
        assert_eq!(copy.message, original.message);
        assert_eq!(copy.redacted, original.redacted);
        assert_eq!(copy.session_id, "dst");
        assert_eq!(copy.produced_by_call_id, "");
        assert!(copy.id.starts_with("msg_"), "{}", copy.id);
        assert!(
            source_messages.iter().all(|m| m.id != copy.id),
            "copies get new ids"
        );
    }
    assert!(copied[2].redacted);

    // The summary marker points at the copy of the summary message.
    assert_eq!(forked.summary_message_id, copied[1].id);
    let from_summary = export_all(&mut client, "dst", true).await;
    assert_eq!(from_summary.len(), 3);
    assert_eq!(from_summary[0], assistant("a0"));

    // State is not copied.
    let state = get_state(&mut client, "dst", "cwd").await.unwrap_err();
    assert_reason(&state, Code::NotFound, "STATE_NOT_FOUND");
    assert!(
        list_state(&mut client, "dst", 0, "")
            .await
            .unwrap()
            .entries
            .is_empty()
    );

    // One session_created event with the copied history.
    let events = replay(&mut client, "dst").await;
    assert_eq!(events.len(), 1);
    let Some(Event::SessionCreated(created)) = &events[0].event else {
        panic!("expected session_created, got {:?}", events[0]);
    };
    assert_eq!(created.session.as_ref(), Some(&forked));
    assert_eq!(created.messages, copied);

    // Later writes to either never affect the other.
    let appended = exchange(&mut client, "dst", "fork q", "fork a").await;
    assert_eq!(appended.messages[0].sequence, 4);
    assert_eq!(all_messages(&mut client, "src").await, source_messages);
    edit(
        &mut client,
        "src",
        &source_messages[0].id,
        Some(user("changed")),
        "",
    )
    .await
    .unwrap();
    rollback(&mut client, "src", -1).await.unwrap();
    client
        .delete_session(pb::DeleteSessionRequest {
            session_id: "src".into(),
        })
        .await
        .unwrap();
    let fork_now = all_messages(&mut client, "dst").await;
    assert_eq!(texts(&fork_now), ["q0", "a0", "", "a1", "fork q", "fork a"]);
    assert_eq!(fork_now[..4], copied[..]);
    let dst = get(&mut client, "dst").await;
    assert_eq!(dst.parent_session_id, "src");
    assert_eq!(dst.revision, 2);
    let listed = client
        .list_sessions(pb::ListSessionsRequest {
            user: "carol".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.sessions.len(), 1);
    assert_eq!(listed.sessions[0].message_count, 6);
    server.stop().await.unwrap();
}

async fn fork_rejects_bad_requests(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    create(&mut client, "fsrc").await;
    create(&mut client, "taken").await;
    let appended = exchange(&mut client, "fsrc", "q", "a").await;
    set_summary(&mut client, "fsrc", &appended.messages[1].id).await;

    for at in [2, 100, -2] {
        let past = fork(&mut client, "fsrc", at, "").await.unwrap_err();
        assert_field(&past, Code::InvalidArgument, "at_sequence");
    }
    let ghost = fork(&mut client, "ghost", 0, "").await.unwrap_err();
    assert_reason(&ghost, Code::NotFound, "SESSION_NOT_FOUND");
    let taken = fork(&mut client, "fsrc", 0, "taken").await.unwrap_err();
    assert_eq!(taken.code(), Code::AlreadyExists);
    assert_eq!(get(&mut client, "taken").await.revision, 1);

    // -1: no messages; the server makes the id.
    let empty = fork(&mut client, "fsrc", -1, "").await.unwrap();
    assert!(empty.id.starts_with("ses_"), "{}", empty.id);
    assert_eq!(empty.parent_sequence, -1);
    assert_eq!(empty.summary_message_id, "", "the summary was not copied");
    assert!(all_messages(&mut client, &empty.id).await.is_empty());
    let appended = exchange(&mut client, &empty.id, "first", "reply").await;
    assert_eq!(appended.messages[0].sequence, 0);

    // A summary past the copied range is not carried over.
    let head = fork(&mut client, "fsrc", 0, "").await.unwrap();
    assert_eq!(head.summary_message_id, "");
    assert_ne!(head.id, empty.id);
    assert_eq!(texts(&all_messages(&mut client, &head.id).await), ["q"]);
    assert_eq!(get(&mut client, "fsrc").await.revision, 3);
    server.stop().await.unwrap();
}
