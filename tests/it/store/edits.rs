//! Message edits and redaction through `Store::control`: one revision
//! each, the same id and sequence, the event log keeping an edit's old
//! text and losing a redacted one everywhere.

use sessionstore_server::domain::ToolCall;

use super::*;

crate::backend_tests!(
    an_edit_replaces_one_message_and_the_log_keeps_the_old,
    a_redaction_erases_the_text_here_and_in_the_log,
    refused_edits_and_redactions_write_nothing,
);

fn edit(message_id: &str, message: Message, run_id: &str) -> controls::Edit {
    controls::Edit {
        message_id: message_id.to_owned(),
        message,
        reason: "a typo".into(),
        run_id: run_id.to_owned(),
    }
}

/// How an edit and a redaction of `message_id` in session `id` are refused.
async fn refusals(
    store: &SqlStore,
    tenant: &str,
    id: &str,
    message_id: &str,
    run_id: &str,
) -> [Error; 2] {
    let rewrite = Message::text(Role::User, "rewritten");
    [
        store
            .control(tenant, id, edit(message_id, rewrite, run_id))
            .await
            .unwrap_err(),
        store
            .control(tenant, id, redact(message_id, run_id))
            .await
            .unwrap_err(),
    ]
}

fn redact(message_id: &str, run_id: &str) -> controls::Redact {
    controls::Redact {
        message_id: message_id.to_owned(),
        reason: "personal data".into(),
        run_id: run_id.to_owned(),
    }
}

async fn an_edit_replaces_one_message_and_the_log_keeps_the_old(backend: Backend) {
    let (_storage, store) = open(backend).await;
    create(&store, "s").await;
    let (_, first) = store
        .append_exchange(TENANT, exchange("s", "q1"))
        .await
        .unwrap();
    store
        .append_exchange(TENANT, exchange("s", "q2"))
        .await
        .unwrap();
    let before = stored(&store, "s").await;
    let target = &first.messages[0];

    let new_text = Message::text(Role::User, "q1, edited");
    let edited = store
        .control(TENANT, "s", edit(&target.id, new_text.clone(), ""))
        .await
        .unwrap();
    let controls::Edited { revision, message } = edited;
    assert_eq!(revision, 4);
    // The same id, sequence, call and creation time; the new content.
    let expected = StoredMessage {
        message: new_text,
        ..target.clone()
    };
    assert_eq!(message, expected);
    let after = stored(&store, "s").await;
    assert_eq!(after[0], expected);
    assert_eq!(after[1..], before[1..], "the other messages are untouched");
    let handle = store.resolve(TENANT, "s").await.unwrap();
    assert_eq!(
        (handle.revision, handle.next_sequence),
        (4, 4),
        "an edit is one revision and appends nothing"
    );

    let events = log(&store, "s").await;
    assert_eq!(revisions(&events), [1, 2, 3, 4]);
    assert_eq!(
        events[3].change,
        Change::MessageEdited {
            message: expected.clone(),
            previous: Message::text(Role::User, "q1"),
            reason: "a typo".into(),
        }
    );
    // The append's own event still holds what was sent.
    let Change::ExchangeAppended(appended) = &events[1].change else {
        panic!("revision 2 is the append: {:?}", events[1]);
    };
    assert_eq!(appended.messages, first.messages);

    // An edit of the edit: its `previous` is the edited text.
    let again = store
        .control(
            TENANT,
            "s",
            edit(&target.id, Message::text(Role::User, "q1, again"), ""),
        )
        .await
        .unwrap();
    assert_eq!(again.revision, 5, "{again:?}");
    let events = log(&store, "s").await;
    assert_eq!(revisions(&events), [1, 2, 3, 4, 5]);
    assert!(
        matches!(
            &events[4].change,
            Change::MessageEdited { previous, .. } if previous.content == "q1, edited"
        ),
        "{:?}",
        events[4]
    );
    assert_eq!(
        texts(&store, "s").await,
        ["q1, again", "an answer", "q2", "an answer"]
    );
    let handle = store.resolve(TENANT, "s").await.unwrap();
    let calls = store.read_provider_calls(&handle, 0, 10).await.unwrap();
    assert_eq!(calls.len(), 2, "edits keep the provider calls");
    store.close().await;
}

async fn a_redaction_erases_the_text_here_and_in_the_log(backend: Backend) {
    let (_storage, store) = open(backend).await;
    create(&store, "s").await;
    let mut secret = exchange("s", "my card is pan4242");
    secret.response_messages = vec![Message {
        tool_calls: vec![ToolCall {
            id: "call_1".into(),
            name: "charge".into(),
            arguments: r#"{"card": "pan4242"}"#.into(),
            signature: String::new(),
        }],
        ..Message::text(Role::Assistant, "charging pan4242")
    }];
    let (_, first) = store.append_exchange(TENANT, secret).await.unwrap();
    let (question, answer) = (&first.messages[0], &first.messages[1]);
    store
        .control(
            TENANT,
            "s",
            edit(
                &question.id,
                Message::text(Role::User, "my card is pan4242, expiring"),
                "",
            ),
        )
        .await
        .unwrap();

    for (target, revision) in [(question, 4), (answer, 5)] {
        let redacted = store
            .control(TENANT, "s", redact(&target.id, ""))
            .await
            .unwrap();
        assert_eq!(redacted, revision);
    }

    // The role and the tool-call structure remain (with `{}` arguments),
    // under the same ids, sequences and call.
    let expected = [
        StoredMessage {
            message: Message::text(Role::User, ""),
            redacted: true,
            ..question.clone()
        },
        StoredMessage {
            message: Message {
                tool_calls: vec![ToolCall {
                    id: "call_1".into(),
                    name: "charge".into(),
                    arguments: "{}".into(),
                    signature: String::new(),
                }],
                ..Message::text(Role::Assistant, "")
            },
            redacted: true,
            ..answer.clone()
        },
    ];
    assert_eq!(stored(&store, "s").await, expected);
    let handle = store.resolve(TENANT, "s").await.unwrap();
    assert_eq!((handle.revision, handle.next_sequence), (5, 2));
    let calls = store.read_provider_calls(&handle, 0, 10).await.unwrap();
    assert_eq!(calls.len(), 1, "a redaction keeps the provider call");

    // Every event that carried the text carries the marker instead: the
    // append, and the edit's new and previous message.
    let events = log(&store, "s").await;
    assert_eq!(revisions(&events), [1, 2, 3, 4, 5]);
    let Change::ExchangeAppended(appended) = &events[1].change else {
        panic!("revision 2 is the append: {:?}", events[1]);
    };
    assert_eq!(appended.messages, expected);
    assert_eq!(
        events[2].change,
        Change::MessageEdited {
            message: expected[0].clone(),
            previous: Message::text(Role::User, ""),
            reason: "a typo".into(),
        }
    );
    for (event, target) in events[3..].iter().zip([question, answer]) {
        assert_eq!(
            event.change,
            Change::MessageRedacted {
                message_id: target.id.clone(),
                sequence: target.sequence,
                reason: "personal data".into(),
            }
        );
    }
    // (Letters in the marker: a timestamp or an id may hold any digits.)
    let whole_log = serde_json::to_string(&events).unwrap();
    assert!(!whole_log.contains("pan4242"), "{whole_log}");

    // Later writes go on after the redacted messages.
    let (revision, appended) = store
        .append_exchange(TENANT, exchange("s", "q2"))
        .await
        .unwrap();
    assert_eq!((revision, appended.messages[0].sequence), (6, 2));
    store.close().await;
}

async fn refused_edits_and_redactions_write_nothing(backend: Backend) {
    let (_storage, store) = open(backend).await;
    create(&store, "s").await;
    create(&store, "other").await;
    let (_, first) = store
        .append_exchange(TENANT, exchange("s", "q1"))
        .await
        .unwrap();
    let (_, elsewhere) = store
        .append_exchange(TENANT, exchange("other", "not yours"))
        .await
        .unwrap();
    let target = first.messages[0].id.clone();
    let rewrite = || Message::text(Role::User, "rewritten");

    // A message id the session does not have, even one of another session.
    for missing in ["msg_nosuch", elsewhere.messages[0].id.as_str()] {
        for refused in refusals(&store, TENANT, "s", missing, "").await {
            assert!(
                matches!(&refused, Error::MessageNotFound(id) if id == missing),
                "{refused:?}"
            );
        }
    }
    // A session that does not exist, or is another tenant's.
    for (tenant, id) in [(TENANT, "nope"), ("globex", "s")] {
        for refused in refusals(&store, tenant, id, &target, "").await {
            assert!(
                matches!(&refused, Error::SessionNotFound(_)),
                "{tenant}/{id}: {refused:?}"
            );
        }
    }
    // While a run holds the lease, only that run may change the transcript.
    store
        .control(
            TENANT,
            "s",
            controls::BeginRun {
                run_id: "run-1".into(),
                lease_micros: 600_000_000,
            },
        )
        .await
        .unwrap();
    for run_id in ["", "run-2"] {
        for busy in refusals(&store, TENANT, "s", &target, run_id).await {
            assert!(
                matches!(&busy, Error::SessionBusy { active_run_id, .. } if active_run_id == "run-1"),
                "{run_id:?}: {busy:?}"
            );
        }
    }

    let events = log(&store, "s").await;
    assert_eq!(revisions(&events), [1, 2, 3], "only the lease was written");
    assert!(matches!(events[2].change, Change::RunBegun { .. }));
    assert_eq!(stored(&store, "s").await, first.messages);
    assert_eq!(texts(&store, "other").await, ["not yours", "an answer"]);
    assert_eq!(
        store.get_session(TENANT, "other").await.unwrap().revision,
        2
    );

    // The lease's own run may.
    let edited = store
        .control(TENANT, "s", edit(&target, rewrite(), "run-1"))
        .await
        .unwrap();
    assert_eq!(edited.revision, 4, "{edited:?}");
    assert_eq!(texts(&store, "s").await, ["rewritten", "an answer"]);
    store.close().await;
}
