//! WatchSession: replay, `caught_up`, live events, resume, errors,
//! progress, fan-out to many watchers, slow watchers and shutdown.

use std::time::Duration;

use sessionstore_client::SessionStoreClient;
use sessionstore_client::v1 as pb;
use sessionstore_client::v1::session_event::Event;
use tonic::Code;
use tonic::transport::{Channel, Endpoint};

use crate::support::{
    Backend, NEXT_EVENT, Storage, TestServer, assert_appended, assistant, call, content, create,
    error_details, event_kind, exchange, next_change, next_event, user, watch,
};

async fn watch_err(
    client: &mut SessionStoreClient<Channel>,
    id: &str,
    after_revision: i64,
) -> tonic::Status {
    let result = client
        .watch_session(pb::WatchSessionRequest {
            session_id: id.to_owned(),
            after_revision,
            include_active_deltas: false,
            ..Default::default()
        })
        .await;
    match result {
        Err(status) => status,
        // A server may also fail the stream on its first message.
        Ok(response) => {
            let mut stream = response.into_inner();
            match tokio::time::timeout(NEXT_EVENT, stream.message())
                .await
                .expect("watch answer in time")
            {
                Err(status) => status,
                Ok(event) => panic!("watch of {id} after {after_revision} succeeded: {event:?}"),
            }
        }
    }
}

/// Events that record a revision (not markers).
fn is_revision(event: &pb::SessionEvent) -> bool {
    !matches!(
        event.event,
        Some(Event::CaughtUp(_) | Event::Progress(_)) | None
    )
}

fn assert_caught_up(event: &pb::SessionEvent, revision: i64) {
    assert!(
        matches!(event.event, Some(Event::CaughtUp(_))),
        "expected caught_up, got {}: {event:?}",
        event_kind(event)
    );
    assert_eq!(event.revision, revision, "caught_up revision");
}

// ---------------------------------------------------------------------------

async fn replay_from_zero_then_live(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    let created = create(&mut client, "ses_watch_replay").await;
    assert_eq!(created.revision, 1);
    let mut appended = Vec::new();
    for i in 0..3 {
        appended.push(exchange(&mut client, &created.id, &format!("q{i}"), &format!("a{i}")).await);
    }
    assert_eq!(
        appended.iter().map(|a| a.revision).collect::<Vec<_>>(),
        [2, 3, 4]
    );

    let mut stream = watch(&mut client, &created.id, 0).await;
    let first = next_event(&mut stream).await;
    assert_eq!(first.revision, 1);
    assert!(first.time.is_some());
    let Some(Event::SessionCreated(session_created)) = &first.event else {
        panic!(
            "expected session_created, got {}: {first:?}",
            event_kind(&first)
        );
    };
    assert_eq!(session_created.session.as_ref(), Some(&created));
    assert!(session_created.messages.is_empty());

    let mut last = first.revision;
    for expected in &appended {
        let event = next_event(&mut stream).await;
        assert_eq!(event.revision, last + 1, "revisions are consecutive");
        assert_appended(&event, expected);
        last = event.revision;
    }
    assert_caught_up(&next_event(&mut stream).await, 4);

    // Live.
    let live = exchange(&mut client, &created.id, "q3", "a3").await;
    assert_eq!(live.revision, 5);
    let event = next_event(&mut stream).await;
    assert_eq!(event.revision, last + 1);
    assert_appended(&event, &live);
    // The live event's messages are exactly what is stored.
    let listed = client
        .list_messages(pb::ListMessagesRequest {
            session_id: created.id.clone(),
            after_sequence: Some(5),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let Some(Event::ExchangeAppended(live_event)) = &event.event else {
        unreachable!()
    };
    assert_eq!(listed.messages, live_event.messages);
    let Some(call) = &live_event.provider_call else {
        unreachable!()
    };
    for m in &live_event.messages {
        let is_response = m.message.as_ref().map(|m| m.role) == Some(pb::Role::Assistant.into());
        let expected_link = if is_response { call.id.as_str() } else { "" };
        assert_eq!(m.produced_by_call_id, expected_link);
    }
    drop(stream);
    server.stop().await.unwrap();
}

async fn replay_includes_initial_history(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    let created = client
        .create_session(pb::CreateSessionRequest {
            session_id: "ses_watch_hist".into(),
            system_prompt: "be brief".into(),
            initial_history: vec![user("hi"), assistant("hello")],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut stream = watch(&mut client, &created.id, 0).await;
    let event = next_event(&mut stream).await;
    assert_eq!(event.revision, 1);
    let Some(Event::SessionCreated(session_created)) = &event.event else {
        panic!("expected session_created, got {event:?}");
    };
    let contents: Vec<_> = session_created
        .messages
        .iter()
        .map(|m| (m.sequence, m.message.as_ref().unwrap().content.as_str()))
        .collect();
    assert_eq!(contents, [(0, "hi"), (1, "hello")]);
    assert_caught_up(&next_event(&mut stream).await, 1);
}

async fn resume_after_revision(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    let created = create(&mut client, "ses_watch_resume").await;
    let mut appended = Vec::new();
    for i in 0..3 {
        appended.push(exchange(&mut client, &created.id, &format!("q{i}"), &format!("a{i}")).await);
    }

    let mut stream = watch(&mut client, &created.id, 3).await;
    let event = next_event(&mut stream).await;
    assert_appended(&event, &appended[2]);
    assert_caught_up(&next_event(&mut stream).await, 4);

    // Resuming at the head replays nothing and is caught up at once.
    let mut at_head = watch(&mut client, &created.id, 4).await;
    assert_caught_up(&next_event(&mut at_head).await, 4);
    // ... and then sees the next write live.
    let live = exchange(&mut client, &created.id, "q", "a").await;
    assert_appended(&next_event(&mut at_head).await, &live);
    assert_appended(&next_event(&mut stream).await, &live);
}

async fn watch_errors(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    let created = create(&mut client, "ses_watch_errors").await;
    exchange(&mut client, &created.id, "q", "a").await;

    let beyond = watch_err(&mut client, &created.id, 3).await;
    assert_eq!(beyond.code(), Code::OutOfRange, "{beyond:?}");
    let beyond_far = watch_err(&mut client, &created.id, i64::MAX).await;
    assert_eq!(beyond_far.code(), Code::OutOfRange, "{beyond_far:?}");

    let negative = watch_err(&mut client, &created.id, -1).await;
    assert_eq!(negative.code(), Code::InvalidArgument, "{negative:?}");
    let (reason, field) = error_details(&negative);
    assert!(reason.is_some(), "ErrorInfo missing: {negative:?}");
    assert_eq!(field.as_deref(), Some("after_revision"));
    assert!(negative.message().contains("after_revision"));

    let unknown = watch_err(&mut client, "ses_watch_nobody", 0).await;
    assert_eq!(unknown.code(), Code::NotFound, "{unknown:?}");
    let (reason, _) = error_details(&unknown);
    assert!(reason.is_some(), "ErrorInfo missing: {unknown:?}");

    let empty = watch_err(&mut client, "", 0).await;
    assert_eq!(empty.code(), Code::InvalidArgument, "{empty:?}");

    // A failed watch changes nothing.
    let session = client
        .get_session(pb::GetSessionRequest {
            session_id: created.id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(session.revision, 2);
}

async fn update_and_delete_events(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    let created = create(&mut client, "ses_watch_upd").await;
    let mut stream = watch(&mut client, &created.id, 0).await;
    assert_eq!(
        event_kind(&next_event(&mut stream).await),
        "session_created"
    );
    assert_caught_up(&next_event(&mut stream).await, 1);

    let updated = client
        .update_session(pb::UpdateSessionRequest {
            session: Some(pb::Session {
                id: created.id.clone(),
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
    assert_eq!(updated.revision, 2);
    assert_eq!(updated.title, "renamed");
    assert_eq!(updated.system_prompt, created.system_prompt);

    let event = next_event(&mut stream).await;
    assert_eq!(event.revision, 2);
    let Some(Event::SessionUpdated(session_updated)) = &event.event else {
        panic!(
            "expected session_updated, got {}: {event:?}",
            event_kind(&event)
        );
    };
    assert_eq!(session_updated.session.as_ref(), Some(&updated));

    let appended = exchange(&mut client, &created.id, "q", "a").await;
    assert_appended(&next_event(&mut stream).await, &appended);

    client
        .delete_session(pb::DeleteSessionRequest {
            session_id: created.id.clone(),
        })
        .await
        .unwrap();
    let event = next_event(&mut stream).await;
    assert!(
        matches!(event.event, Some(Event::SessionDeleted(_))),
        "expected session_deleted, got {}: {event:?}",
        event_kind(&event)
    );
    assert_eq!(
        event.revision, 4,
        "session_deleted is one past the last revision"
    );
    let end = tokio::time::timeout(NEXT_EVENT, stream.message())
        .await
        .expect("the stream ends after session_deleted");
    assert!(
        matches!(end, Ok(None)),
        "the stream must end cleanly after session_deleted, got {end:?}"
    );

    // The id is gone for new watchers, and may be reused with a fresh history.
    let gone = watch_err(&mut client, &created.id, 0).await;
    assert_eq!(gone.code(), Code::NotFound);
    let again = create(&mut client, &created.id).await;
    assert_eq!(again.revision, 1);
    let mut fresh = watch(&mut client, &again.id, 0).await;
    let event = next_event(&mut fresh).await;
    assert_eq!(event.revision, 1);
    let Some(Event::SessionCreated(session_created)) = &event.event else {
        panic!("expected session_created, got {event:?}");
    };
    assert_eq!(session_created.session.as_ref(), Some(&again));
    assert_caught_up(&next_event(&mut fresh).await, 1);
}

/// A watcher that is replaying while the session is deleted still ends
/// with `session_deleted`, cleanly.
async fn delete_while_replaying(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    let created = create(&mut client, "ses_watch_del_replay").await;
    for i in 0..5 {
        exchange(&mut client, &created.id, &format!("q{i}"), "a").await;
    }
    let mut stream = watch(&mut client, &created.id, 0).await;
    client
        .delete_session(pb::DeleteSessionRequest {
            session_id: created.id.clone(),
        })
        .await
        .unwrap();
    let mut revisions = Vec::new();
    loop {
        let item = tokio::time::timeout(NEXT_EVENT, stream.message())
            .await
            .expect("event in time")
            .expect("healthy stream");
        let Some(event) = item else { break };
        if is_revision(&event) {
            revisions.push(event.revision);
        }
        if matches!(event.event, Some(Event::SessionDeleted(_))) {
            assert_eq!(event.revision, 7);
        }
    }
    // The stream may have started replaying before or after the delete; what
    // it delivered must be a gap-free prefix that ends with the deletion.
    assert_eq!(revisions.last(), Some(&7), "{revisions:?}");
    for pair in revisions.windows(2) {
        assert_eq!(pair[1], pair[0] + 1, "gap or duplicate in {revisions:?}");
    }
}

async fn progress_when_idle(backend: Backend) {
    let storage = Storage::new(backend).await;
    let server = TestServer::start_on(storage, |c| c.progress_interval_ms = 100).await;
    let mut client = server.client().await;
    let created = create(&mut client, "ses_watch_progress").await;
    let mut stream = watch(&mut client, &created.id, 0).await;
    assert_eq!(
        event_kind(&next_event(&mut stream).await),
        "session_created"
    );
    assert_caught_up(&next_event(&mut stream).await, 1);

    let event = next_event(&mut stream).await;
    assert!(
        matches!(event.event, Some(Event::Progress(_))),
        "expected progress, got {}: {event:?}",
        event_kind(&event)
    );
    assert_eq!(event.revision, 1, "progress carries the head revision");
    assert!(event.time.is_some());

    // After a write, progress carries the new head.
    let appended = exchange(&mut client, &created.id, "q", "a").await;
    loop {
        let event = next_event(&mut stream).await;
        match &event.event {
            Some(Event::Progress(_)) => assert_eq!(event.revision, 1),
            _ => {
                assert_appended(&event, &appended);
                break;
            }
        }
    }
    let event = next_event(&mut stream).await;
    assert!(
        matches!(event.event, Some(Event::Progress(_))),
        "expected progress, got {event:?}"
    );
    assert_eq!(event.revision, 2);
}

async fn many_watchers_see_every_event(backend: Backend) {
    const WATCHERS: usize = 50;
    const EXCHANGES: i64 = 20;
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    let created = create(&mut client, "ses_watch_many").await;

    // Several connections, several streams per connection.
    let mut connections = Vec::new();
    for _ in 0..5 {
        connections.push(server.client().await);
    }
    let mut streams = Vec::new();
    for i in 0..WATCHERS {
        let n = connections.len();
        let conn = &mut connections[i % n];
        streams.push(watch(conn, &created.id, 0).await);
    }

    let last_revision = 1 + EXCHANGES;
    let mut watchers = Vec::new();
    for mut stream in streams {
        watchers.push(tokio::spawn(async move {
            let mut events: Vec<pb::SessionEvent> = Vec::new();
            let mut caught_up = 0;
            while events.last().map(|e| e.revision) != Some(last_revision) {
                let event = next_event(&mut stream).await;
                match event.event {
                    Some(Event::CaughtUp(_)) => caught_up += 1,
                    Some(Event::Progress(_)) => {}
                    _ => events.push(event),
                }
            }
            (events, caught_up)
        }));
    }

    let id = created.id.clone();
    let writer = tokio::spawn(async move {
        for i in 0..EXCHANGES {
            exchange(&mut client, &id, &format!("q{i}"), &format!("a{i}")).await;
        }
    });
    tokio::time::timeout(Duration::from_secs(60), writer)
        .await
        .expect("writer in time")
        .unwrap();

    let expected: Vec<i64> = (1..=last_revision).collect();
    let mut first: Option<Vec<pb::SessionEvent>> = None;
    for watcher in watchers {
        let (events, caught_up) = tokio::time::timeout(Duration::from_secs(60), watcher)
            .await
            .expect("watcher in time")
            .unwrap();
        let revisions: Vec<i64> = events.iter().map(|e| e.revision).collect();
        assert_eq!(revisions, expected);
        assert_eq!(caught_up, 1, "exactly one caught_up per stream");
        // A live event is encoded once for all watchers: every watcher
        // decodes the same, complete event.
        match &first {
            None => first = Some(events),
            Some(first) => assert!(&events == first, "watchers received different events"),
        }
    }
    let events = first.expect("at least one watcher");
    for i in 0..EXCHANGES {
        let event = &events[usize::try_from(i + 1).unwrap()];
        let Some(Event::ExchangeAppended(appended)) = &event.event else {
            panic!("revision {} is not an exchange: {event:?}", event.revision);
        };
        let texts: Vec<&str> = appended.messages.iter().map(content).collect();
        assert_eq!(texts, [format!("q{i}"), format!("a{i}")]);
        let call = appended.provider_call.as_ref().expect("the provider call");
        assert_eq!(call.model, "gpt-test");
    }
}

/// A watcher that does not read while far more events than the live buffer
/// holds are committed still gets every revision, once, in order.
async fn slow_watcher_loses_nothing(backend: Backend) {
    const EXCHANGES: usize = 600;
    const WRITERS: usize = 6;
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    let created = create(&mut client, "ses_watch_slow").await;

    // A small HTTP/2 window, so the server cannot push the backlog into the
    // socket and must hold (or drop and re-read) it.
    let channel = Endpoint::from_shared(server.endpoint())
        .unwrap()
        .initial_stream_window_size(Some(64 * 1024))
        .initial_connection_window_size(Some(64 * 1024))
        .connect()
        .await
        .unwrap();
    let mut slow_client = SessionStoreClient::new(channel);
    let mut stream = watch(&mut slow_client, &created.id, 0).await;
    assert_eq!(
        event_kind(&next_event(&mut stream).await),
        "session_created"
    );
    assert_caught_up(&next_event(&mut stream).await, 1);

    // ~8 KiB per event.
    let filler = "slow watcher filler ".repeat(200);
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let mut client = server.client().await;
        let id = created.id.clone();
        let filler = filler.clone();
        writers.push(tokio::spawn(async move {
            for i in 0..EXCHANGES / WRITERS {
                client
                    .append_exchange(pb::AppendExchangeRequest {
                        session_id: id.clone(),
                        messages: vec![user(&format!("w{w} q{i} {filler}"))],
                        provider_call: Some(call("gpt-slow", 1, 1, 1)),
                        response_messages: vec![assistant(&format!("w{w} a{i} {filler}"))],
                        ..Default::default()
                    })
                    .await
                    .unwrap();
            }
        }));
    }
    for writer in writers {
        tokio::time::timeout(Duration::from_secs(120), writer)
            .await
            .expect("writers in time")
            .unwrap();
    }

    let head = 1 + i64::try_from(EXCHANGES).unwrap();
    let mut revisions = Vec::new();
    let mut sequences = Vec::new();
    while revisions.last() != Some(&head) {
        let event = next_change(&mut stream).await;
        match &event.event {
            Some(Event::ExchangeAppended(appended)) => {
                revisions.push(event.revision);
                sequences.extend(appended.messages.iter().map(|m| m.sequence));
            }
            _ => panic!("unexpected {}: {event:?}", event_kind(&event)),
        }
    }
    assert_eq!(revisions, (2..=head).collect::<Vec<_>>());
    let expected_sequences: Vec<i64> = (0..i64::try_from(EXCHANGES * 2).unwrap()).collect();
    assert_eq!(sequences, expected_sequences);

    // And the stream is still live.
    let live = exchange(&mut client, &created.id, "after", "backlog").await;
    assert_appended(&next_change(&mut stream).await, &live);
}

async fn shutdown_ends_watch_cleanly(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    let created = create(&mut client, "ses_watch_shutdown").await;
    exchange(&mut client, &created.id, "q", "a").await;
    let mut stream = watch(&mut client, &created.id, 0).await;
    assert_eq!(
        event_kind(&next_event(&mut stream).await),
        "session_created"
    );
    assert_eq!(
        event_kind(&next_event(&mut stream).await),
        "exchange_appended"
    );
    assert_caught_up(&next_event(&mut stream).await, 2);

    let stopping = tokio::spawn(server.stop());
    let end = tokio::time::timeout(NEXT_EVENT, stream.message())
        .await
        .expect("the watch stream ends when the server stops");
    assert!(
        matches!(end, Ok(None)),
        "graceful shutdown must end the watch stream cleanly, got {end:?}"
    );
    drop(stream);
    drop(client);
    let stopped = tokio::time::timeout(NEXT_EVENT, stopping)
        .await
        .expect("stop finishes")
        .unwrap();
    assert!(stopped.is_ok(), "stop failed: {stopped:?}");
}

crate::backend_tests!(
    replay_from_zero_then_live,
    replay_includes_initial_history,
    resume_after_revision,
    watch_errors,
    update_and_delete_events,
    delete_while_replaying,
    progress_when_idle,
    many_watchers_see_every_event,
    slow_watcher_loses_nothing,
    shutdown_ends_watch_cleanly,
);
