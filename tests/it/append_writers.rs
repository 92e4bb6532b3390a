//! PostgreSQL's append writers, as many as `--append-writers` asks: each
//! session's appends still apply in arrival order, once each, and a
//! refused append in a batch leaves the others written. Their batches are
//! counted in `/metrics`.

use std::collections::HashMap;
use std::time::Duration;

use sessionstore_client::v1 as pb;
use tonic::Code;

use crate::ops::{http_get, sample};
use crate::support::{
    Backend, Storage, TestServer, all_messages, content, create, exchange_request,
};

const SESSIONS: usize = 24;
const EACH: usize = 12;

/// Many clients on many sessions (and four on one shared session) through
/// eight writers: every session's history is gap-free and in each
/// client's order, each retry answers its first result, and a stale
/// `expected_next_sequence` is refused without failing the appends batched
/// with it.
async fn eight_writers_keep_each_sessions_order_once() {
    let server = TestServer::start_on(Storage::new(Backend::Postgres).await, |config| {
        config.database.max_connections = 16;
        config.append_writers = Some(8);
        config.telemetry.metrics_listen = Some("127.0.0.1:0".into());
    })
    .await;
    let metrics = server.metrics_addr.expect("metrics are served");
    let mut client = server.client().await;
    for s in 0..SESSIONS {
        create(&mut client, &format!("w-{s}")).await;
    }
    create(&mut client, "shared").await;

    let mut tasks = Vec::new();
    for s in 0..SESSIONS {
        let mut client = server.client().await;
        tasks.push(tokio::spawn(async move {
            let id = format!("w-{s}");
            let mut next = 0;
            for i in 0..EACH {
                let request = pb::AppendExchangeRequest {
                    request_id: format!("{id}-{i}"),
                    expected_next_sequence: Some(next),
                    ..exchange_request(&id, &format!("{id} q{i}"), &format!("{id} a{i}"))
                };
                let first = client
                    .append_exchange(request.clone())
                    .await
                    .expect("append")
                    .into_inner();
                assert_eq!(first.messages[0].sequence, next, "{id} #{i}");
                // A retry answers the first result, even with its
                // expected sequence now stale.
                let again = client
                    .append_exchange(request)
                    .await
                    .expect("retry")
                    .into_inner();
                assert_eq!(again, first, "{id} #{i}: a retry answers the first");
                // A stale expectation is refused; nothing is written.
                let stale = client
                    .append_exchange(pb::AppendExchangeRequest {
                        expected_next_sequence: Some(next),
                        ..exchange_request(&id, "stale", "stale")
                    })
                    .await
                    .expect_err("a stale expected sequence");
                assert_eq!(stale.code(), Code::Aborted, "{stale:?}");
                next = first.next_sequence;
            }
        }));
    }
    for w in 0..4 {
        let mut client = server.client().await;
        tasks.push(tokio::spawn(async move {
            let mut last = -1;
            for i in 0..EACH {
                let appended = client
                    .append_exchange(exchange_request(
                        "shared",
                        &format!("s{w} q{i}"),
                        &format!("s{w} a{i}"),
                    ))
                    .await
                    .expect("append to the shared session")
                    .into_inner();
                assert!(
                    appended.revision > last,
                    "one client's appends in its order"
                );
                last = appended.revision;
            }
        }));
    }
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(120), task)
            .await
            .expect("clients in time")
            .expect("client");
    }

    for s in 0..SESSIONS {
        let id = format!("w-{s}");
        let stored = all_messages(&mut client, &id).await;
        let texts: Vec<&str> = stored.iter().map(content).collect();
        let wanted: Vec<String> = (0..EACH)
            .flat_map(|i| [format!("{id} q{i}"), format!("{id} a{i}")])
            .collect();
        assert_eq!(texts, wanted, "{id}: each once, in order");
        let sequences: Vec<i64> = stored.iter().map(|m| m.sequence).collect();
        assert_eq!(sequences, (0..2 * EACH as i64).collect::<Vec<_>>(), "{id}");
    }
    let shared = all_messages(&mut client, "shared").await;
    assert_eq!(shared.len(), 4 * 2 * EACH);
    let mut seen: HashMap<usize, usize> = HashMap::new();
    for pair in shared.chunks(2) {
        let question = content(&pair[0]);
        let (writer, rest) = question
            .trim_start_matches('s')
            .split_once(" q")
            .expect("a shared question");
        let (writer, i): (usize, usize) = (writer.parse().unwrap(), rest.parse().unwrap());
        assert_eq!(
            content(&pair[1]),
            format!("s{writer} a{i}"),
            "an exchange kept whole"
        );
        let expected = seen.entry(writer).or_default();
        assert_eq!(i, *expected, "writer {writer}'s appends in its order");
        *expected += 1;
    }

    let (_, text) = http_get(metrics, "/metrics").await;
    assert_eq!(sample(&text, "sessionstore_append_writers "), Some(8.0));
    let batches = sample(&text, "sessionstore_append_batches_total ").expect("batches counted");
    let appends =
        sample(&text, "sessionstore_append_batched_appends_total ").expect("appends counted");
    let round_trips =
        sample(&text, "sessionstore_append_batch_round_trips_total ").expect("round trips counted");
    assert!(batches >= 1.0, "{text}");
    assert!(appends >= batches, "every batch holds an append");
    assert!(
        round_trips >= batches,
        "a batch takes one round trip at least"
    );
    assert_eq!(
        sample(&text, "sessionstore_append_batches_in_flight "),
        Some(0.0)
    );
}

crate::postgres_tests!(eight_writers_keep_each_sessions_order_once);
