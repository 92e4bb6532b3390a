//! Edits and redaction.

use super::*;

crate::backend_tests!(
    edit_changes_the_current_view_and_replay_keeps_the_old,
    edit_and_redact_reject_bad_requests,
    redact_erases_the_text_everywhere,
);

async fn edit_changes_the_current_view_and_replay_keeps_the_old(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    create(&mut client, "ed").await;
    let first = exchange(&mut client, "ed", "q0", "a0").await;
    exchange(&mut client, "ed", "q1", "a1").await;
    let before = all_messages(&mut client, "ed").await;
    let mut stream = watch_caught_up(&mut client, "ed", 3).await;

    let target = &first.messages[1];
    let corrected = pb::Message {
        metadata: [("edited".to_owned(), "yes".to_owned())].into(),
        ..assistant("a0, corrected")
    };
    let edited = edit(
        &mut client,
        "ed",
        &target.id,
        Some(corrected.clone()),
        "typo",
    )
    .await
    .unwrap();
    assert_eq!(edited.revision, 4);
    let stored = edited.message.clone().unwrap();
    assert_eq!(
        (
            stored.id.as_str(),
            stored.sequence,
            stored.session_id.as_str()
        ),
        (target.id.as_str(), 1, "ed")
    );
    assert_eq!(stored.message.as_ref(), Some(&corrected));
    assert!(!stored.redacted);

    let event = next_change(&mut stream).await;
    assert_eq!(event.revision, 4);
    let Some(Event::MessageEdited(message_edited)) = &event.event else {
        panic!(
            "expected message_edited, got {}: {event:?}",
            event_kind(&event)
        );
    };
    assert_eq!(message_edited.message.as_ref(), Some(&stored));
    assert_eq!(message_edited.previous.as_ref(), Some(&assistant("a0")));
    assert_eq!(message_edited.reason, "typo");

    // The current view shows the new text at the same ids and sequences.
    let after = all_messages(&mut client, "ed").await;
    assert_eq!(ids(&after), ids(&before));
    assert_eq!(texts(&after), ["q0", "a0, corrected", "q1", "a1"]);
    assert_eq!(after[1], stored);
    assert_eq!(
        export_all(&mut client, "ed", false).await,
        vec![user("q0"), corrected.clone(), user("q1"), assistant("a1")]
    );

    // The replay keeps the original text where it was appended.
    let events = replay(&mut client, "ed").await;
    assert_appended(&events[1], &first);
    assert_eq!(events[3], event);

    // A second edit's previous is the first edit.
    let again = edit(
        &mut client,
        "ed",
        &target.id,
        Some(assistant("a0, final")),
        "",
    )
    .await
    .unwrap();
    assert_eq!(again.revision, 5);
    let event = next_change(&mut stream).await;
    let Some(Event::MessageEdited(message_edited)) = &event.event else {
        panic!(
            "expected message_edited, got {}: {event:?}",
            event_kind(&event)
        );
    };
    assert_eq!(message_edited.previous.as_ref(), Some(&corrected));
    assert_eq!(event.revision, again.revision);
    assert_eq!(get(&mut client, "ed").await.revision, 5);
    server.stop().await.unwrap();
}

async fn edit_and_redact_reject_bad_requests(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    create(&mut client, "bad").await;
    create(&mut client, "other").await;
    let mine = exchange(&mut client, "bad", "q", "a").await;
    let theirs = exchange(&mut client, "other", "q", "a").await;
    let id = mine.messages[0].id.clone();
    let foreign = theirs.messages[0].id.clone();
    let new = || Some(user("new"));

    let unknown = edit(&mut client, "bad", "msg_nope", new(), "")
        .await
        .unwrap_err();
    assert_reason(&unknown, Code::NotFound, "MESSAGE_NOT_FOUND");
    let elsewhere = edit(&mut client, "bad", &foreign, new(), "")
        .await
        .unwrap_err();
    assert_reason(&elsewhere, Code::NotFound, "MESSAGE_NOT_FOUND");
    let missing = edit(&mut client, "bad", &id, None, "").await.unwrap_err();
    assert_field(&missing, Code::InvalidArgument, "message");
    let roleless = edit(&mut client, "bad", &id, Some(pb::Message::default()), "")
        .await
        .unwrap_err();
    assert_field(&roleless, Code::InvalidArgument, "message.role");
    let no_id = edit(&mut client, "bad", "", new(), "").await.unwrap_err();
    assert_field(&no_id, Code::InvalidArgument, "message_id");
    let ghost = edit(&mut client, "ghost", &id, new(), "")
        .await
        .unwrap_err();
    assert_reason(&ghost, Code::NotFound, "SESSION_NOT_FOUND");

    let unknown = redact(&mut client, "bad", "msg_nope", "")
        .await
        .unwrap_err();
    assert_reason(&unknown, Code::NotFound, "MESSAGE_NOT_FOUND");
    let elsewhere = redact(&mut client, "bad", &foreign, "").await.unwrap_err();
    assert_reason(&elsewhere, Code::NotFound, "MESSAGE_NOT_FOUND");
    let no_id = redact(&mut client, "bad", "", "").await.unwrap_err();
    assert_field(&no_id, Code::InvalidArgument, "message_id");
    let ghost = redact(&mut client, "ghost", &id, "").await.unwrap_err();
    assert_reason(&ghost, Code::NotFound, "SESSION_NOT_FOUND");

    // Nothing was written anywhere.
    assert_eq!(get(&mut client, "bad").await.revision, 2);
    assert_eq!(get(&mut client, "other").await.revision, 2);
    assert_eq!(all_messages(&mut client, "bad").await, mine.messages);
    assert_eq!(all_messages(&mut client, "other").await, theirs.messages);
    server.stop().await.unwrap();
}

async fn redact_erases_the_text_everywhere(backend: Backend) {
    const SECRETS: [&str; 8] = [
        "secretcard",
        "secretcity",
        "secretedit",
        "secrettooltext",
        "secretarg",
        "secretthought",
        "secretblock",
        "secretresult",
    ];
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    // Sequence 0 arrives with the session (in its session_created event).
    client
        .create_session(pb::CreateSessionRequest {
            session_id: "red".into(),
            user: "alice".into(),
            initial_history: vec![user("my card is secretcard"), assistant("noted")],
            ..Default::default()
        })
        .await
        .unwrap();
    let asks = pb::Message {
        content_blocks: vec![thinking("secretthought"), text_block("secretblock")],
        tool_calls: vec![tool_call("call_9", "weather", r#"{"city":"secretarg"}"#)],
        ..assistant("calling secrettooltext")
    };
    let first_request = pb::AppendExchangeRequest {
        session_id: "red".into(),
        messages: vec![user("weather in secretcity")],
        provider_call: Some(call("m", 1, 1, 1)),
        response_messages: vec![asks.clone()],
        request_id: "req-1".into(),
        ..Default::default()
    };
    let first = client
        .append_exchange(first_request.clone())
        .await
        .unwrap()
        .into_inner();
    let answer = pb::Message {
        name: "weather".into(),
        ..tool_result("call_9", "secretresult sunny")
    };
    client
        .append_exchange(pb::AppendExchangeRequest {
            session_id: "red".into(),
            messages: vec![answer.clone()],
            provider_call: Some(call("m", 1, 1, 1)),
            response_messages: vec![assistant("it is sunny")],
            ..Default::default()
        })
        .await
        .unwrap();
    // An edit first, so its event carries the text twice (new and previous).
    edit(
        &mut client,
        "red",
        &first.messages[0].id,
        Some(user("weather in secretedit")),
        "fix",
    )
    .await
    .unwrap();
    let before = all_messages(&mut client, "red").await;
    assert_eq!(before.len(), 6);
    let mut stream = watch_caught_up(&mut client, "red", 4).await;

    // Redact sequences 0 (initial history), 2 (edited), 3 (tool calls), 4 (tool result).
    for (n, sequence) in [0_usize, 2, 3, 4].into_iter().enumerate() {
        let target = &before[sequence];
        let redacted = redact(&mut client, "red", &target.id, "pii").await.unwrap();
        assert_eq!(redacted.revision, 5 + i64::try_from(n).unwrap());
        let event = next_change(&mut stream).await;
        assert_eq!(event.revision, redacted.revision);
        let Some(Event::MessageRedacted(message_redacted)) = &event.event else {
            panic!(
                "expected message_redacted, got {}: {event:?}",
                event_kind(&event)
            );
        };
        assert_eq!(
            message_redacted,
            &pb::MessageRedacted {
                message_id: target.id.clone(),
                sequence: target.sequence,
                reason: "pii".into(),
            }
        );
    }

    // Current reads: markers at the same ids and sequences, with only the
    // role and tool-call structure left.
    let after = all_messages(&mut client, "red").await;
    assert_eq!(ids(&after), ids(&before));
    let marker = |role: pb::Role| pb::Message {
        role: role.into(),
        ..Default::default()
    };
    let expected_markers = [
        (0, marker(pb::Role::User)),
        (2, marker(pb::Role::User)),
        (
            3,
            pb::Message {
                tool_calls: vec![tool_call("call_9", "weather", "{}")],
                ..marker(pb::Role::Assistant)
            },
        ),
        (
            4,
            pb::Message {
                tool_call_id: "call_9".into(),
                ..marker(pb::Role::Tool)
            },
        ),
    ];
    for (sequence, expected) in &expected_markers {
        let stored = &after[*sequence];
        assert!(stored.redacted, "sequence {sequence} is marked redacted");
        assert_eq!(stored.sequence, before[*sequence].sequence);
        assert_eq!(
            stored.message.as_ref(),
            Some(expected),
            "sequence {sequence}"
        );
    }
    for sequence in [1, 5] {
        assert!(!after[sequence].redacted);
        assert_eq!(after[sequence], before[sequence]);
    }
    let exported = export_all(&mut client, "red", false).await;
    assert_eq!(exported.len(), 6);
    assert_eq!(exported[3], expected_markers[2].1);
    assert_eq!(exported[1], assistant("noted"));

    // The replay from the beginning holds none of the erased text ...
    let events = replay(&mut client, "red").await;
    let dump = format!("{events:?}").to_lowercase();
    for secret in SECRETS {
        assert!(!dump.contains(secret), "{secret:?} survives in the replay");
    }
    // ... but still every event, with the markers in place.
    let kinds: Vec<&str> = events.iter().map(event_kind).collect();
    assert_eq!(
        kinds,
        [
            "session_created",
            "exchange_appended",
            "exchange_appended",
            "message_edited",
            "message_redacted",
            "message_redacted",
            "message_redacted",
            "message_redacted",
        ]
    );
    let Some(Event::SessionCreated(created)) = &events[0].event else {
        unreachable!()
    };
    assert!(created.messages[0].redacted);
    assert_eq!(content(&created.messages[0]), "");
    assert_eq!(content(&created.messages[1]), "noted");
    let Some(Event::MessageEdited(edited)) = &events[3].event else {
        unreachable!()
    };
    let edited_now = edited.message.as_ref().unwrap();
    assert!(edited_now.redacted);
    assert_eq!(content(edited_now), "");
    assert_eq!(
        edited.previous.as_ref().map(|m| m.content.as_str()),
        Some("")
    );
    assert_eq!(edited.reason, "fix");

    // An idempotent retry of the first exchange answers with the markers.
    let retried = client
        .append_exchange(first_request)
        .await
        .unwrap()
        .into_inner();
    assert_eq!(retried.revision, first.revision);
    assert_eq!(ids(&retried.messages), ids(&first.messages));
    let dump = format!("{retried:?}").to_lowercase();
    for secret in SECRETS {
        assert!(!dump.contains(secret), "{secret:?} survives in a retry");
    }

    // Search finds none of it, but still the rest.
    for secret in SECRETS {
        assert!(
            found(&mut client, secret, "").await.is_empty(),
            "search still finds {secret:?}"
        );
    }
    assert_eq!(found(&mut client, "noted", "").await, [at("red", 1)].into());
    server.stop().await.unwrap();
}
