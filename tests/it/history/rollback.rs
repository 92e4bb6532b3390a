//! Rollback: removing the messages after a sequence.

use super::*;

crate::backend_tests!(
    rollback_truncates_and_later_writes_continue,
    rollback_edges_and_errors,
    rollback_past_the_summary_clears_it,
);

async fn rollback_truncates_and_later_writes_continue(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    create(&mut client, "rb").await;
    let mut appended = Vec::new();
    for i in 0..3 {
        appended.push(exchange(&mut client, "rb", &format!("q{i}"), &format!("a{i}")).await);
    }
    let mut stream = watch_caught_up(&mut client, "rb", 4).await;

    let rolled = rollback(&mut client, "rb", 2).await.unwrap();
    assert_eq!((rolled.revision, rolled.next_sequence), (5, 3));
    let event = next_change(&mut stream).await;
    assert_eq!(event.revision, 5);
    assert!(event.time.is_some());
    let Some(Event::RolledBack(rolled_back)) = &event.event else {
        panic!(
            "expected rolled_back, got {}: {event:?}",
            event_kind(&event)
        );
    };
    let removed = vec![
        appended[1].messages[1].id.clone(),
        appended[2].messages[0].id.clone(),
        appended[2].messages[1].id.clone(),
    ];
    assert_eq!(
        rolled_back,
        &pb::RolledBack {
            after_sequence: 2,
            removed_message_ids: removed,
            next_sequence: 3,
            summary_cleared: false,
        }
    );

    // Every current read agrees; the provider calls stay.
    assert_eq!(
        texts(&all_messages(&mut client, "rb").await),
        ["q0", "a0", "q1"]
    );
    let exported = export_all(&mut client, "rb", false).await;
    assert_eq!(exported, vec![user("q0"), assistant("a0"), user("q1")]);
    let calls = client
        .list_provider_calls(pb::ListProviderCallsRequest {
            session_id: "rb".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(calls.provider_calls.len(), 3, "provider calls are kept");
    let listed = client
        .list_sessions(pb::ListSessionsRequest {
            user: "alice".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.sessions.len(), 1);
    assert_eq!(listed.sessions[0].message_count, 3);
    assert_eq!(listed.sessions[0].provider_call_count, 3);
    assert_eq!(get(&mut client, "rb").await.revision, 5);

    // The removed messages are gone for good.
    let removed_id = &appended[2].messages[0].id;
    let edit_removed = edit(&mut client, "rb", removed_id, Some(user("x")), "")
        .await
        .unwrap_err();
    assert_reason(&edit_removed, Code::NotFound, "MESSAGE_NOT_FOUND");
    let redact_removed = redact(&mut client, "rb", removed_id, "").await.unwrap_err();
    assert_reason(&redact_removed, Code::NotFound, "MESSAGE_NOT_FOUND");
    let summary_removed = client
        .update_session(pb::UpdateSessionRequest {
            session: Some(pb::Session {
                id: "rb".into(),
                summary_message_id: removed_id.clone(),
                ..Default::default()
            }),
            update_mask: Some(prost_types::FieldMask {
                paths: vec!["summary_message_id".into()],
            }),
        })
        .await
        .unwrap_err();
    assert_field(
        &summary_removed,
        Code::InvalidArgument,
        "session.summary_message_id",
    );
    assert_eq!(get(&mut client, "rb").await.revision, 5);

    // expected_next_sequence sees the new end.
    let stale = client
        .append_exchange(pb::AppendExchangeRequest {
            expected_next_sequence: Some(6),
            ..exchange_request("rb", "late", "late")
        })
        .await
        .unwrap_err();
    assert_eq!(stale.code(), Code::Aborted);
    let continued = client
        .append_exchange(pb::AppendExchangeRequest {
            expected_next_sequence: Some(3),
            ..exchange_request("rb", "q3", "a3")
        })
        .await
        .unwrap()
        .into_inner();
    let sequences: Vec<i64> = continued.messages.iter().map(|m| m.sequence).collect();
    assert_eq!(sequences, [3, 4]);
    assert_eq!((continued.revision, continued.next_sequence), (6, 5));
    assert_appended(&next_change(&mut stream).await, &continued);

    // full_history compares against the rolled-back history: the old,
    // longer one no longer matches ...
    let old_history = vec![
        user("q0"),
        assistant("a0"),
        user("q1"),
        assistant("a1"),
        user("q2"),
        assistant("a2"),
        user("q9"),
    ];
    let mismatch = client
        .append_exchange(pb::AppendExchangeRequest {
            session_id: "rb".into(),
            full_history: old_history,
            provider_call: Some(call("m", 1, 1, 1)),
            response_messages: vec![assistant("a9")],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_field(&mismatch, Code::FailedPrecondition, "full_history[3]");
    // ... while the current one plus a new turn appends only the new turn.
    let current_history = vec![
        text(pb::Role::System, "You are terse."),
        user("q0"),
        assistant("a0"),
        user("q1"),
        user("q3"),
        assistant("a3"),
        user("q4"),
    ];
    let diffed = client
        .append_exchange(pb::AppendExchangeRequest {
            session_id: "rb".into(),
            full_history: current_history,
            provider_call: Some(call("m", 1, 1, 1)),
            response_messages: vec![assistant("a4")],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let new: Vec<(i64, &str)> = diffed
        .messages
        .iter()
        .map(|m| (m.sequence, content(m)))
        .collect();
    assert_eq!(new, [(5, "q4"), (6, "a4")]);
    assert_eq!(diffed.revision, 7);
    assert_appended(&next_change(&mut stream).await, &diffed);
    server.stop().await.unwrap();
}

async fn rollback_edges_and_errors(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    create(&mut client, "rbe").await;
    let first = exchange(&mut client, "rbe", "q0", "a0").await;
    let mut stream = watch_caught_up(&mut client, "rbe", 2).await;

    // At or past the end: nothing changes.
    for after in [1, 2, 100] {
        let unchanged = rollback(&mut client, "rbe", after).await.unwrap();
        assert_eq!(
            (unchanged.revision, unchanged.next_sequence),
            (2, 2),
            "rollback after {after}"
        );
    }
    let below = rollback(&mut client, "rbe", -2).await.unwrap_err();
    assert_field(&below, Code::InvalidArgument, "after_sequence");
    let ghost = rollback(&mut client, "ghost", 0).await.unwrap_err();
    assert_eq!(ghost.code(), Code::NotFound);
    assert_eq!(get(&mut client, "rbe").await.revision, 2);

    // -1 removes every message; the first event is this one, so the calls
    // above recorded nothing.
    let emptied = rollback(&mut client, "rbe", -1).await.unwrap();
    assert_eq!((emptied.revision, emptied.next_sequence), (3, 0));
    let event = next_change(&mut stream).await;
    assert_eq!(event.revision, 3);
    let Some(Event::RolledBack(rolled_back)) = &event.event else {
        panic!(
            "expected rolled_back, got {}: {event:?}",
            event_kind(&event)
        );
    };
    assert_eq!(rolled_back.after_sequence, -1);
    assert_eq!(rolled_back.removed_message_ids, ids(&first.messages));
    assert_eq!(rolled_back.next_sequence, 0);
    assert!(all_messages(&mut client, "rbe").await.is_empty());
    assert!(export_all(&mut client, "rbe", false).await.is_empty());

    // Nothing left to remove: again no revision.
    let again = rollback(&mut client, "rbe", -1).await.unwrap();
    assert_eq!((again.revision, again.next_sequence), (3, 0));

    // Appends start again at sequence 0.
    let fresh = exchange(&mut client, "rbe", "new q", "new a").await;
    let sequences: Vec<i64> = fresh.messages.iter().map(|m| m.sequence).collect();
    assert_eq!(sequences, [0, 1]);
    assert_eq!(fresh.revision, 4);
    assert_appended(&next_change(&mut stream).await, &fresh);
    server.stop().await.unwrap();
}

async fn rollback_past_the_summary_clears_it(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    create(&mut client, "sum").await;
    let mut appended = Vec::new();
    for i in 0..3 {
        appended.push(exchange(&mut client, "sum", &format!("q{i}"), &format!("a{i}")).await);
    }
    let summary_id = appended[1].messages[1].id.clone(); // a1, sequence 3
    assert_eq!(
        set_summary(&mut client, "sum", &summary_id).await.revision,
        5
    );
    let from_summary = export_all(&mut client, "sum", true).await;
    assert_eq!(
        from_summary,
        vec![assistant("a1"), user("q2"), assistant("a2")]
    );

    // Keeping the summary message keeps the marker.
    let kept = rollback(&mut client, "sum", 3).await.unwrap();
    assert_eq!(kept.revision, 6);
    assert_eq!(get(&mut client, "sum").await.summary_message_id, summary_id);
    assert_eq!(
        export_all(&mut client, "sum", true).await,
        vec![assistant("a1")]
    );

    // Removing it clears the marker: from_summary then exports everything.
    let cleared = rollback(&mut client, "sum", 2).await.unwrap();
    assert_eq!(cleared.revision, 7);
    let session = get(&mut client, "sum").await;
    assert_eq!(session.summary_message_id, "");
    assert_eq!(session.revision, 7);
    assert_eq!(
        export_all(&mut client, "sum", true).await,
        vec![user("q0"), assistant("a0"), user("q1")]
    );

    let events = replay(&mut client, "sum").await;
    let cleared_flags: Vec<(i64, bool)> = events
        .iter()
        .filter_map(|e| match &e.event {
            Some(Event::RolledBack(r)) => Some((e.revision, r.summary_cleared)),
            _ => None,
        })
        .collect();
    assert_eq!(cleared_flags, [(6, false), (7, true)]);

    // A message appended later can become the new summary.
    let later = exchange(&mut client, "sum", "q3", "a3").await;
    set_summary(&mut client, "sum", &later.messages[0].id).await;
    assert_eq!(
        export_all(&mut client, "sum", true).await,
        vec![user("q3"), assistant("a3")]
    );
    server.stop().await.unwrap();
}
