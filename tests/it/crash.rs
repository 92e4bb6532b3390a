//! Durability: the real `sessionstore` binary, killed with SIGKILL while
//! appends are in flight, keeps every acknowledged exchange.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use sessionstore_client::v1 as pb;

use crate::support::{
    ServerProcess, all_messages, assistant, call, sessionstore_binary, user, watch,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_keeps_every_acknowledged_exchange() {
    const WRITERS: usize = 4;
    const KILL_AFTER: usize = 200;
    let binary = tokio::task::spawn_blocking(sessionstore_binary)
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let database_url = format!("sqlite://{}/db.sqlite", dir.path().display());

    let mut server = ServerProcess::start(
        &binary,
        &database_url,
        "127.0.0.1:0",
        dir.path().join("server-1.log"),
        &[],
    )
    .await;
    let mut client = server.short_timeout_client().await;
    let session_id = client
        .create_session(pb::CreateSessionRequest {
            session_id: "ses_crash".into(),
            title: "crash".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .id;

    let acked: Arc<Mutex<Vec<pb::AppendExchangeResponse>>> = Arc::default();
    let (enough_tx, mut enough_rx) = tokio::sync::watch::channel(0_usize);
    let enough_tx = Arc::new(enough_tx);
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let mut client = server.short_timeout_client().await;
        let id = session_id.clone();
        let acked = Arc::clone(&acked);
        let enough_tx = Arc::clone(&enough_tx);
        writers.push(tokio::spawn(async move {
            let mut i = 0_usize;
            loop {
                let answer = client
                    .append_exchange(pb::AppendExchangeRequest {
                        session_id: id.clone(),
                        messages: vec![user(&format!("w{w} q{i}"))],
                        provider_call: Some(call("gpt-crash", 3, 4, 5)),
                        response_messages: vec![assistant(&format!("w{w} a{i}"))],
                        ..Default::default()
                    })
                    .await;
                match answer {
                    Ok(response) => {
                        let count = {
                            let mut acked = acked.lock().unwrap();
                            acked.push(response.into_inner());
                            acked.len()
                        };
                        enough_tx.send_replace(count);
                    }
                    // The server is gone: stop.
                    Err(_) => return i,
                }
                i += 1;
                assert!(i < 100_000, "the server was never killed");
            }
        }));
    }

    tokio::time::timeout(
        Duration::from_secs(120),
        enough_rx.wait_for(|count| *count >= KILL_AFTER),
    )
    .await
    .expect("enough acknowledgements in time")
    .unwrap();
    server.kill().await;
    for writer in writers {
        tokio::time::timeout(Duration::from_secs(60), writer)
            .await
            .expect("writers notice the dead server")
            .unwrap();
    }
    let acked = std::mem::take(&mut *acked.lock().unwrap());
    assert!(acked.len() >= KILL_AFTER);

    // Restart on the same database.
    let server = ServerProcess::start(
        &binary,
        &database_url,
        "127.0.0.1:0",
        dir.path().join("server-2.log"),
        &[],
    )
    .await;
    let mut client = server.short_timeout_client().await;
    let stored = all_messages(&mut client, &session_id).await;

    // Contiguous from 0, whole exchanges only.
    let sequences: Vec<i64> = stored.iter().map(|m| m.sequence).collect();
    let expected: Vec<i64> = (0..i64::try_from(stored.len()).unwrap()).collect();
    assert_eq!(sequences, expected, "sequences must be contiguous from 0");
    assert_eq!(stored.len() % 2, 0, "a torn exchange survived the crash");
    for pair in stored.chunks(2) {
        let role = |m: &pb::StoredMessage| m.message.as_ref().map(|m| m.role);
        assert_eq!(role(&pair[0]), Some(pb::Role::User.into()));
        assert_eq!(role(&pair[1]), Some(pb::Role::Assistant.into()));
        assert!(!pair[1].produced_by_call_id.is_empty());
    }

    // Every acknowledged message is there, unchanged.
    for response in &acked {
        for m in &response.messages {
            let index = usize::try_from(m.sequence).unwrap();
            let found = stored.get(index);
            assert_eq!(
                found,
                Some(m),
                "acknowledged message {} (sequence {}) lost or changed",
                m.id,
                m.sequence
            );
        }
    }

    println!(
        "crash: {} exchanges acknowledged before SIGKILL, {} survived",
        acked.len(),
        stored.len() / 2
    );

    // The revision and the event log agree with the messages.
    let session = client
        .get_session(pb::GetSessionRequest {
            session_id: session_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let exchanges = i64::try_from(stored.len() / 2).unwrap();
    assert_eq!(session.revision, 1 + exchanges);
    let max_acked_revision = acked.iter().map(|r| r.revision).max().unwrap();
    assert!(session.revision >= max_acked_revision);

    let mut events = watch(&mut client, &session_id, 0).await;
    let mut replayed = Vec::new();
    loop {
        let event = tokio::time::timeout(Duration::from_secs(10), events.message())
            .await
            .expect("event in time")
            .unwrap()
            .expect("stream open");
        use pb::session_event::Event;
        match event.event {
            Some(Event::CaughtUp(_)) => {
                assert_eq!(event.revision, session.revision);
                break;
            }
            Some(Event::ExchangeAppended(appended)) => replayed.extend(appended.messages),
            Some(Event::SessionCreated(_)) => assert_eq!(event.revision, 1),
            other => panic!("unexpected event {other:?}"),
        }
    }
    assert_eq!(
        replayed, stored,
        "the event log matches the stored messages"
    );

    // The restarted server takes writes where the log ends.
    let next = client
        .append_exchange(pb::AppendExchangeRequest {
            session_id: session_id.clone(),
            messages: vec![user("after the crash")],
            expected_next_sequence: Some(i64::try_from(stored.len()).unwrap()),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(next.revision, session.revision + 1);
    drop(server);
}
