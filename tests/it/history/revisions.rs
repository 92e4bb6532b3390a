//! Every control write is exactly one revision.

use super::*;

crate::backend_tests!(every_control_write_is_one_revision,);

async fn every_control_write_is_one_revision(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    create(&mut client, "rev").await;
    exchange(&mut client, "rev", "q0", "a0").await;
    exchange(&mut client, "rev", "q1", "a1").await;
    let messages = all_messages(&mut client, "rev").await;
    let mut stream = watch_caught_up(&mut client, "rev", 3).await;

    let mut made: Vec<(i64, &str)> = Vec::new();
    let edited = edit(
        &mut client,
        "rev",
        &messages[1].id,
        Some(assistant("A0")),
        "",
    )
    .await
    .unwrap();
    made.push((edited.revision, "message_edited"));
    let redacted = redact(&mut client, "rev", &messages[0].id, "")
        .await
        .unwrap();
    made.push((redacted.revision, "message_redacted"));
    let set = set_state(&mut client, "rev", "k", "v", None).await.unwrap();
    made.push((set.version, "state_changed"));
    let deleted = delete_state(&mut client, "rev", "k", None).await.unwrap();
    made.push((deleted.revision, "state_changed"));
    let rolled = rollback(&mut client, "rev", 1).await.unwrap();
    made.push((rolled.revision, "rolled_back"));

    // Rejected or empty calls make no revision.
    edit(&mut client, "rev", "msg_nope", Some(user("x")), "")
        .await
        .unwrap_err();
    redact(&mut client, "rev", &messages[3].id, "")
        .await
        .unwrap_err();
    set_state(&mut client, "rev", "k", "v", Some(42))
        .await
        .unwrap_err();
    delete_state(&mut client, "rev", "k", None)
        .await
        .unwrap_err();
    rollback(&mut client, "rev", -7).await.unwrap_err();
    assert_eq!(
        rollback(&mut client, "rev", 1).await.unwrap().revision,
        rolled.revision
    );
    fork(&mut client, "rev", 0, "rev_fork").await.unwrap();

    let updated = rename(&mut client, "rev", "renamed").await;
    made.push((updated.revision, "session_updated"));
    let appended = exchange(&mut client, "rev", "q2", "a2").await;
    made.push((appended.revision, "exchange_appended"));

    let expected = [
        (4, "message_edited"),
        (5, "message_redacted"),
        (6, "state_changed"),
        (7, "state_changed"),
        (8, "rolled_back"),
        (9, "session_updated"),
        (10, "exchange_appended"),
    ];
    assert_eq!(made, expected, "one revision per write, consecutive");
    let mut last_time = 0;
    for (revision, kind) in expected {
        let event = next_change(&mut stream).await;
        assert_eq!((event.revision, event_kind(&event)), (revision, kind));
        let time = micros(event.time.as_ref());
        assert!(time >= last_time, "event times never go back");
        last_time = time;
    }
    let session = get(&mut client, "rev").await;
    assert_eq!(session.revision, 10);
    assert_eq!(replay(&mut client, "rev").await.len(), 10);
    server.stop().await.unwrap();
}
