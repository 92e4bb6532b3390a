//! AppendExchange under concurrency: many writers on one transcript,
//! optimistic concurrency and idempotent retries.

use std::collections::HashMap;
use std::time::Duration;

use sessionstore_client::SessionStoreClient;
use sessionstore_client::v1 as pb;
use tonic::Code;
use tonic::transport::Channel;

use crate::support::{
    Backend, TestServer, all_messages, assert_appended, call, content, create, error_details,
    event_kind, exchange, exchange_request, watch,
};

async fn revision(client: &mut SessionStoreClient<Channel>, id: &str) -> i64 {
    client
        .get_session(pb::GetSessionRequest {
            session_id: id.to_owned(),
            ..Default::default()
        })
        .await
        .expect("get session")
        .into_inner()
        .revision
}

async fn concurrent_writers_one_session(backend: Backend) {
    const WRITERS: usize = 16;
    const EACH: usize = 25;
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    let created = create(&mut client, "ses_conc_writers").await;

    let mut tasks = Vec::new();
    for w in 0..WRITERS {
        // A separate connection per writer.
        let mut client = server.client().await;
        let id = created.id.clone();
        tasks.push(tokio::spawn(async move {
            let mut responses = Vec::new();
            for i in 0..EACH {
                let response = client
                    .append_exchange(exchange_request(
                        &id,
                        &format!("w{w} q{i}"),
                        &format!("w{w} a{i}"),
                    ))
                    .await
                    .expect("append exchange")
                    .into_inner();
                responses.push((format!("w{w} q{i}"), format!("w{w} a{i}"), response));
            }
            responses
        }));
    }
    let mut responses = Vec::new();
    for task in tasks {
        let mine = tokio::time::timeout(Duration::from_secs(120), task)
            .await
            .expect("writer in time")
            .unwrap();
        // One writer's own appends land in the order it made them.
        for pair in mine.windows(2) {
            assert!(pair[0].2.revision < pair[1].2.revision);
            assert!(pair[0].2.messages[1].sequence < pair[1].2.messages[0].sequence);
        }
        responses.extend(mine);
    }
    let total = WRITERS * EACH;
    assert_eq!(responses.len(), total);

    // Every exchange got its own revision and two contiguous sequences.
    let mut revisions: Vec<i64> = responses.iter().map(|r| r.2.revision).collect();
    revisions.sort_unstable();
    let expected_revisions: Vec<i64> = (2..=1 + i64::try_from(total).unwrap()).collect();
    assert_eq!(revisions, expected_revisions);
    let mut by_sequence = HashMap::new();
    for (question, answer, response) in &responses {
        assert_eq!(response.messages.len(), 2, "{response:?}");
        let (input, output) = (&response.messages[0], &response.messages[1]);
        assert_eq!(output.sequence, input.sequence + 1, "{response:?}");
        assert_eq!(response.next_sequence, output.sequence + 1);
        assert_eq!(content(input), question);
        assert_eq!(content(output), answer);
        let call = response.provider_call.as_ref().expect("provider call");
        assert_eq!(input.produced_by_call_id, "");
        assert_eq!(output.produced_by_call_id, call.id);
        for m in [input, output] {
            assert!(
                by_sequence.insert(m.sequence, m.clone()).is_none(),
                "sequence {} handed out twice",
                m.sequence
            );
        }
    }

    let stored = all_messages(&mut client, &created.id).await;
    let sequences: Vec<i64> = stored.iter().map(|m| m.sequence).collect();
    let expected_sequences: Vec<i64> = (0..i64::try_from(total * 2).unwrap()).collect();
    assert_eq!(sequences, expected_sequences);
    for m in &stored {
        assert_eq!(
            by_sequence.get(&m.sequence),
            Some(m),
            "stored message differs from the ack"
        );
    }
    assert_eq!(
        revision(&mut client, &created.id).await,
        1 + i64::try_from(total).unwrap()
    );

    let summary = client
        .list_sessions(pb::ListSessionsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .sessions
        .into_iter()
        .find(|s| s.session.as_ref().is_some_and(|s| s.id == created.id))
        .expect("session listed");
    assert_eq!(summary.message_count, i64::try_from(total * 2).unwrap());
    assert_eq!(summary.provider_call_count, i64::try_from(total).unwrap());
}

async fn expected_next_sequence_conflict(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    let created = create(&mut client, "ses_conc_expected").await;
    exchange(&mut client, &created.id, "q0", "a0").await;
    exchange(&mut client, &created.id, "q1", "a1").await;

    for stale in [0, 2, 5] {
        let status = client
            .append_exchange(pb::AppendExchangeRequest {
                expected_next_sequence: Some(stale),
                ..exchange_request(&created.id, "lost", "lost")
            })
            .await
            .expect_err("stale expected_next_sequence must fail");
        assert_eq!(status.code(), Code::Aborted, "{status:?}");
        assert!(
            status.message().contains('4'),
            "the message must say the actual next sequence (4): {:?}",
            status.message()
        );
        let (reason, _) = error_details(&status);
        assert!(reason.is_some(), "ErrorInfo missing: {status:?}");
    }
    // Nothing was written.
    assert_eq!(all_messages(&mut client, &created.id).await.len(), 4);
    assert_eq!(revision(&mut client, &created.id).await, 3);

    let ok = client
        .append_exchange(pb::AppendExchangeRequest {
            expected_next_sequence: Some(4),
            ..exchange_request(&created.id, "q2", "a2")
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ok.messages[0].sequence, 4);
    assert_eq!(ok.next_sequence, 6);
    assert_eq!(ok.revision, 4);
}

/// Two writers racing with the same expected_next_sequence: exactly one wins.
async fn expected_next_sequence_race(backend: Backend) {
    const RACERS: usize = 8;
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    let created = create(&mut client, "ses_conc_race").await;
    let mut tasks = Vec::new();
    for r in 0..RACERS {
        let mut client = server.client().await;
        let id = created.id.clone();
        tasks.push(tokio::spawn(async move {
            client
                .append_exchange(pb::AppendExchangeRequest {
                    expected_next_sequence: Some(0),
                    ..exchange_request(&id, &format!("r{r}"), "a")
                })
                .await
        }));
    }
    let mut won = 0;
    for task in tasks {
        match task.await.unwrap() {
            Ok(_) => won += 1,
            Err(status) => assert_eq!(status.code(), Code::Aborted, "{status:?}"),
        }
    }
    assert_eq!(won, 1);
    assert_eq!(all_messages(&mut client, &created.id).await.len(), 2);
    assert_eq!(revision(&mut client, &created.id).await, 2);
}

async fn idempotent_retry(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    let created = create(&mut client, "ses_conc_idem").await;
    let first_request = pb::AppendExchangeRequest {
        request_id: "req-1".into(),
        ..exchange_request(&created.id, "q", "a")
    };
    let first = client
        .append_exchange(first_request.clone())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(first.revision, 2);
    let messages = all_messages(&mut client, &created.id).await;
    let calls = client
        .list_provider_calls(pb::ListProviderCallsRequest {
            session_id: created.id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .provider_calls;
    assert_eq!(messages.len(), 2);
    assert_eq!(calls.len(), 1);

    let mut watch = watch(&mut client, &created.id, 0).await;

    for _ in 0..3 {
        let retry = client
            .append_exchange(first_request.clone())
            .await
            .unwrap()
            .into_inner();
        assert_eq!(retry, first, "a retry returns the first result");
    }
    assert_eq!(all_messages(&mut client, &created.id).await, messages);
    assert_eq!(revision(&mut client, &created.id).await, 2);
    let calls_after = client
        .list_provider_calls(pb::ListProviderCallsRequest {
            session_id: created.id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .provider_calls;
    assert_eq!(calls_after, calls);

    // Same key, different body.
    for different in [
        pb::AppendExchangeRequest {
            request_id: "req-1".into(),
            ..exchange_request(&created.id, "q changed", "a")
        },
        pb::AppendExchangeRequest {
            request_id: "req-1".into(),
            ..exchange_request(&created.id, "q", "a changed")
        },
        pb::AppendExchangeRequest {
            request_id: "req-1".into(),
            provider_call: Some(call("other-model", 10, 5, 42)),
            ..exchange_request(&created.id, "q", "a")
        },
    ] {
        let status = client
            .append_exchange(different)
            .await
            .expect_err("reused key with a different body");
        assert_eq!(status.code(), Code::AlreadyExists, "{status:?}");
        let (reason, _) = error_details(&status);
        assert!(reason.is_some(), "ErrorInfo missing: {status:?}");
    }
    assert_eq!(all_messages(&mut client, &created.id).await, messages);
    assert_eq!(revision(&mut client, &created.id).await, 2);

    // The watcher saw one exchange, not one per retry: the next write is revision 3.
    let next = exchange(&mut client, &created.id, "q2", "a2").await;
    assert_eq!(next.revision, 3);
    let mut revisions = Vec::new();
    while revisions.last() != Some(&3) {
        let event = tokio::time::timeout(Duration::from_secs(10), watch.message())
            .await
            .expect("event in time")
            .unwrap()
            .expect("stream open");
        use pb::session_event::Event;
        if !matches!(event.event, Some(Event::CaughtUp(_) | Event::Progress(_))) {
            revisions.push(event.revision);
        }
    }
    assert_eq!(revisions, [1, 2, 3]);
}

async fn idempotent_retry_with_stale_expected_sequence(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    let created = create(&mut client, "ses_conc_idem_stale").await;
    let first_request = pb::AppendExchangeRequest {
        request_id: "req-stale".into(),
        expected_next_sequence: Some(0),
        ..exchange_request(&created.id, "q", "a")
    };
    let first = client
        .append_exchange(first_request.clone())
        .await
        .unwrap()
        .into_inner();
    // Others write; the key's expected_next_sequence is now stale.
    exchange(&mut client, &created.id, "q1", "a1").await;
    exchange(&mut client, &created.id, "q2", "a2").await;
    let before = all_messages(&mut client, &created.id).await;
    assert_eq!(before.len(), 6);

    let retry = client
        .append_exchange(first_request.clone())
        .await
        .expect("a retry with a stale expected_next_sequence still gets the first result")
        .into_inner();
    assert_eq!(retry, first);
    assert_eq!(all_messages(&mut client, &created.id).await, before);
    assert_eq!(revision(&mut client, &created.id).await, 4);

    // Without the key the same body is rejected as stale.
    let status = client
        .append_exchange(pb::AppendExchangeRequest {
            request_id: String::new(),
            ..first_request
        })
        .await
        .expect_err("stale without a key");
    assert_eq!(status.code(), Code::Aborted);
}

/// Concurrent retries of one request: one write, every caller gets it.
async fn idempotent_concurrent_retries(backend: Backend) {
    const RETRIES: usize = 12;
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    let created = create(&mut client, "ses_conc_idem_race").await;
    let body = pb::AppendExchangeRequest {
        request_id: "req-race".into(),
        ..exchange_request(&created.id, "q", "a")
    };
    let mut tasks = Vec::new();
    for _ in 0..RETRIES {
        let mut client = server.client().await;
        let body = body.clone();
        tasks.push(tokio::spawn(async move {
            client.append_exchange(body).await.map(|r| r.into_inner())
        }));
    }
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(task.await.unwrap().expect("every retry succeeds"));
    }
    for answer in &answers {
        assert_eq!(answer, &answers[0]);
    }
    assert_eq!(answers[0].revision, 2);
    assert_eq!(all_messages(&mut client, &created.id).await.len(), 2);
    assert_eq!(revision(&mut client, &created.id).await, 2);
}

/// Appends, retries and other writes interleaved on a few sessions at
/// once, so the writer's batches mix appends it writes in bulk with ones it
/// defers (retries) and other writes: every acknowledged write is in the
/// log once, in a gap-free revision order, and every retry gets its first
/// answer.
async fn mixed_writes_interleave(backend: Backend) {
    const SESSIONS: usize = 4;
    const WRITERS: usize = 8;
    const ROUNDS: usize = 15;
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    for s in 0..SESSIONS {
        create(&mut client, &format!("ses_mixed_{s}")).await;
    }
    let mut tasks = Vec::new();
    for w in 0..WRITERS {
        let mut client = server.client().await;
        tasks.push(tokio::spawn(async move {
            let id = format!("ses_mixed_{}", w % SESSIONS);
            let (mut appends, mut updates) = (0_i64, 0_i64);
            let mut first_answers: Vec<(String, pb::AppendExchangeResponse)> = Vec::new();
            for i in 0..ROUNDS {
                match i % 5 {
                    // A retry of this writer's latest append.
                    2 => {
                        let (request_id, first) = first_answers.last().cloned().unwrap();
                        let again = client
                            .append_exchange(pb::AppendExchangeRequest {
                                request_id,
                                ..exchange_request(
                                    &id,
                                    &format!("w{w} q{}", i - 1),
                                    &format!("w{w} a{}", i - 1),
                                )
                            })
                            .await
                            .expect("retry")
                            .into_inner();
                        assert_eq!(again, first, "a retry answers with the first result");
                    }
                    4 => {
                        client
                            .update_session(pb::UpdateSessionRequest {
                                session: Some(pb::Session {
                                    id: id.clone(),
                                    title: format!("w{w} r{i}"),
                                    ..Default::default()
                                }),
                                update_mask: Some(prost_types::FieldMask {
                                    paths: vec!["title".into()],
                                }),
                            })
                            .await
                            .expect("update");
                        updates += 1;
                    }
                    _ => {
                        let request_id = format!("req-{w}-{i}");
                        let answer = client
                            .append_exchange(pb::AppendExchangeRequest {
                                request_id: request_id.clone(),
                                ..exchange_request(
                                    &id,
                                    &format!("w{w} q{i}"),
                                    &format!("w{w} a{i}"),
                                )
                            })
                            .await
                            .expect("append")
                            .into_inner();
                        first_answers.push((request_id, answer));
                        appends += 1;
                    }
                }
            }
            (appends, updates, first_answers)
        }));
    }
    let mut writes = [0_i64; SESSIONS];
    let mut acknowledged: Vec<Vec<pb::AppendExchangeResponse>> = vec![Vec::new(); SESSIONS];
    for (w, task) in tasks.into_iter().enumerate() {
        let (appends, updates, answers) = tokio::time::timeout(Duration::from_secs(120), task)
            .await
            .expect("writer in time")
            .unwrap();
        writes[w % SESSIONS] += appends + updates;
        acknowledged[w % SESSIONS].extend(answers.into_iter().map(|(_, answer)| answer));
    }
    for s in 0..SESSIONS {
        let id = format!("ses_mixed_{s}");
        let head = revision(&mut client, &id).await;
        assert_eq!(head, 1 + writes[s], "{id}: one revision per write");
        // The log replays every revision once, in order, and each
        // acknowledged append at the revision it was answered with.
        let mut events = watch(&mut client, &id, 0).await;
        let mut replayed = Vec::new();
        while let Some(event) = events.message().await.expect("replay") {
            if event_kind(&event) == "caught_up" {
                break;
            }
            replayed.push(event);
        }
        let revisions: Vec<i64> = replayed.iter().map(|e| e.revision).collect();
        assert_eq!(revisions, (1..=head).collect::<Vec<_>>(), "{id}");
        for answer in &acknowledged[s] {
            let event = &replayed[usize::try_from(answer.revision - 1).unwrap()];
            assert_appended(event, answer);
        }
        let sequences: Vec<i64> = all_messages(&mut client, &id)
            .await
            .iter()
            .map(|m| m.sequence)
            .collect();
        let appended = i64::try_from(acknowledged[s].len()).unwrap();
        assert_eq!(sequences, (0..2 * appended).collect::<Vec<_>>(), "{id}");
    }
}

crate::backend_tests!(
    mixed_writes_interleave,
    concurrent_writers_one_session,
    expected_next_sequence_conflict,
    expected_next_sequence_race,
    idempotent_retry,
    idempotent_retry_with_stale_expected_sequence,
    idempotent_concurrent_retries,
);
