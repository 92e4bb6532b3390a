//! Retention: the idle-session sweep.

use super::*;

crate::backend_tests!(retention_deletes_idle_sessions_only,);

async fn retention_deletes_idle_sessions_only(backend: Backend) {
    const MAX_IDLE: Duration = Duration::from_millis(1_500);
    let storage = Storage::new(backend).await;
    let server = TestServer::start_on(storage, |config| {
        config.max_idle_age = Some(MAX_IDLE);
        config.sweep_interval_ms = 50;
    })
    .await;
    let mut client = server.client().await;
    // The busy session is the older one: were it idle, it would go first.
    create(&mut client, "busy").await;
    create(&mut client, "idle").await;
    let last_write = exchange(&mut client, "idle", "q", "a").await;
    let mut watcher = watch_caught_up(&mut client, "idle", 0).await;

    // Keep writing to the busy session until the idle one's watcher hears
    // of its deletion.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut ticks = tokio::time::interval(Duration::from_millis(50));
    let mut busy_writes = 0;
    let deleted = loop {
        tokio::select! {
            event = watcher.message() => {
                let event = event.expect("a healthy watch").expect("session_deleted before the end");
                match event.event {
                    Some(Event::SessionDeleted(_)) => break event,
                    Some(Event::Progress(_)) => {}
                    _ => panic!("unexpected event {event:?}"),
                }
            }
            _ = ticks.tick() => {
                assert!(Instant::now() < deadline, "the idle session was never swept");
                exchange(&mut client, "busy", "still", "here").await;
                busy_writes += 1;
            }
        }
    };
    assert_eq!(deleted.revision, last_write.revision + 1);
    let written = all_messages(&mut client, "busy").await;
    assert_eq!(
        written.len(),
        busy_writes * 2,
        "the busy session kept everything"
    );
    // Not before its time: at least the idle age after its last revision.
    let idle_for =
        micros(deleted.time.as_ref()) - micros(last_write.messages[0].create_time.as_ref());
    assert!(
        idle_for >= i64::try_from(MAX_IDLE.as_micros()).unwrap(),
        "deleted after {idle_for} µs idle"
    );
    // The watch then ends cleanly.
    let end = tokio::time::timeout(NEXT_EVENT, watcher.message())
        .await
        .expect("the stream ends");
    assert!(matches!(end, Ok(None)), "{end:?}");

    let gone = try_get(&mut client, "idle").await.unwrap_err();
    assert_eq!(gone.code(), Code::NotFound);
    assert!(get(&mut client, "busy").await.revision > 1);
    let listed = client
        .list_sessions(pb::ListSessionsRequest::default())
        .await
        .unwrap()
        .into_inner();
    let listed: Vec<&str> = listed
        .sessions
        .iter()
        .map(|s| s.session.as_ref().unwrap().id.as_str())
        .collect();
    assert_eq!(listed, ["busy"]);
    server.stop().await.unwrap();
}
