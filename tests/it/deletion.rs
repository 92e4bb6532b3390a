//! DeleteSession of a long session: gone from every read at once, its
//! history then deleted a batch of rows per transaction (as EraseUser
//! deletes a user's), so that it never holds SQLite's one writer, or one
//! PostgreSQL transaction, for all of it; the call answers once all of it
//! is gone.

use std::time::Duration;

use sessionstore_client::SessionStoreClient;
use sessionstore_client::v1 as pb;
use tonic::Code;
use tonic::transport::Channel;

use crate::support::{
    Backend, Storage, TestServer, assistant, call, create_owned, exchange, next_change, poll_until,
    user, watch,
};

crate::backend_tests!(a_long_session_is_deleted_whole);

crate::postgres_tests!(a_long_session_is_deleted_batch_by_batch);

type Client = SessionStoreClient<Channel>;

/// The long session's exchanges, each of [`PER_EXCHANGE`] messages: 2,600
/// messages, more than two batches of rows.
const EXCHANGES: usize = 13;
const PER_EXCHANGE: usize = 200;

/// Creates session `id` with [`EXCHANGES`] exchanges (each with a provider
/// call and an idempotency key `id-N`), every message holding `word`.
/// Answers how many messages it holds.
async fn fill_long(client: &mut Client, id: &str, word: &str) -> usize {
    create_owned(client, id, "dora").await;
    for n in 0..EXCHANGES {
        let messages = (1..PER_EXCHANGE)
            .map(|i| user(&format!("{word} part {n}.{i}")))
            .collect();
        client
            .append_exchange(pb::AppendExchangeRequest {
                session_id: id.into(),
                messages,
                provider_call: Some(call("gpt-test", 10, 5, 42)),
                response_messages: vec![assistant(&format!("{word} answer {n}"))],
                request_id: format!("{id}-{n}"),
                ..Default::default()
            })
            .await
            .unwrap_or_else(|status| panic!("append {n}: {status:?}"));
    }
    EXCHANGES * PER_EXCHANGE
}

async fn delete(client: &mut Client, id: &str) -> Result<(), tonic::Status> {
    client
        .delete_session(pb::DeleteSessionRequest {
            session_id: id.into(),
        })
        .await
        .map(drop)
}

async fn search(client: &mut Client, word: &str) -> usize {
    client
        .search_messages(pb::SearchMessagesRequest {
            query: word.into(),
            page_size: 100,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .hits
        .len()
}

/// Rows of `table` in the database at `url` whose session is not live
/// (deleted sessions' rows), or `None` for an in-memory database.
async fn rows_of_deleted(url: &str, table: &str) -> Option<i64> {
    let sql = format!(
        "SELECT count(*) FROM {table} \
         WHERE session_key NOT IN (SELECT key FROM sessions WHERE deleted = 0)"
    );
    if let Some(path) = url.strip_prefix("sqlite://") {
        let pool = sqlx::SqlitePool::connect(&format!("sqlite://{path}?mode=ro"))
            .await
            .unwrap();
        let count = sqlx::query_scalar(&sql).fetch_one(&pool).await.unwrap();
        pool.close().await;
        Some(count)
    } else if url.starts_with("postgres") {
        let pool = sqlx::PgPool::connect(url).await.unwrap();
        let count = sqlx::query_scalar(&sql).fetch_one(&pool).await.unwrap();
        pool.close().await;
        Some(count)
    } else {
        None
    }
}

/// Everything of a 2,600-message session goes, while another session is
/// appended to: its watcher is told and its stream ends, it is found by
/// no read or search, its idempotency keys are free again, its calls are
/// out of the usage sums, its id starts afresh, and no row of it is left
/// but the tombstone's last event.
async fn a_long_session_is_deleted_whole(backend: Backend) {
    let storage = Storage::new(backend).await;
    let url = storage.url.clone();
    let server = TestServer::start_on(storage, |_| {}).await;
    let mut client = server.client().await;
    let total = fill_long(&mut client, "long", "longword").await;
    create_owned(&mut client, "kept", "carol").await;
    exchange(&mut client, "kept", "keptword question", "keptword answer").await;
    assert_eq!(search(&mut client, "longword").await, 100);
    let long = client
        .get_session(pb::GetSessionRequest {
            session_id: "long".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        crate::support::all_messages(&mut client, "long")
            .await
            .len(),
        total
    );
    let mut events = watch(&mut client, "long", long.revision).await;
    assert_eq!(next_change(&mut events).await.kind(), "caught_up");

    let mut other = server.client().await;
    let appending = tokio::spawn(async move {
        for i in 0..20 {
            exchange(&mut other, "kept", &format!("q{i}"), "a").await;
        }
    });
    delete(&mut client, "long").await.unwrap();
    appending.await.unwrap();

    let deleted = next_change(&mut events).await;
    assert_eq!(deleted.kind(), "session_deleted");
    assert_eq!(deleted.revision, long.revision + 1);
    assert!(events.message().await.unwrap().is_none());
    let missing = client
        .get_session(pb::GetSessionRequest {
            session_id: "long".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(missing.code(), Code::NotFound);
    assert_eq!(search(&mut client, "longword").await, 0);
    assert_eq!(search(&mut client, "keptword").await, 2);
    let usage = client
        .summarize_usage(pb::SummarizeUsageRequest::default())
        .await
        .unwrap()
        .into_inner();
    let calls: i64 = usage.rows.iter().map(|row| row.calls).sum();
    assert_eq!(calls, 21, "only the kept session's calls are summed");
    // Its idempotency keys went with it: the first exchange's and the
    // last one's request ids are new again.
    for n in [0, EXCHANGES - 1] {
        let mut request = crate::support::exchange_request("kept", "again", "again");
        request.request_id = format!("long-{n}");
        let appended = client.append_exchange(request).await.unwrap().into_inner();
        // A replay would answer the long exchange's 200 messages.
        assert_eq!(appended.messages.len(), 2, "long-{n} is a new exchange");
    }
    let reborn = create_owned(&mut client, "long", "dora").await;
    assert_eq!(reborn.revision, 1);
    assert!(
        crate::support::all_messages(&mut client, "long")
            .await
            .is_empty()
    );

    for (table, left) in [
        ("messages", 0),
        ("provider_calls", 0),
        ("idempotency_keys", 0),
        ("session_state", 0),
        // The tombstone's `session_deleted`, until the sweeper purges it.
        ("events", 1),
    ] {
        if let Some(rows) = rows_of_deleted(&url, table).await {
            assert_eq!(rows, left, "{table}");
        }
    }
    server.stop().await.unwrap();
}

/// The deletion commits batch by batch: with one of the session's
/// provider calls held by another transaction, the deletion waits at the
/// batch that reaches it, and by then the session is gone from every read
/// and the batches before it have committed (some of its messages are
/// gone, not all); once the call is let go, the rest goes.
async fn a_long_session_is_deleted_batch_by_batch() {
    let storage = Storage::new(Backend::Postgres).await;
    let url = storage.url.clone();
    let server = TestServer::start_on(storage, |_| {}).await;
    let mut client = server.client().await;
    let total = fill_long(&mut client, "long", "longword").await as i64;
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    let key: i64 = sqlx::query_scalar("SELECT key FROM sessions WHERE id = 'long' AND deleted = 0")
        .fetch_one(&pool)
        .await
        .unwrap();
    let messages_left = || {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>("SELECT count(*) FROM messages WHERE session_key = $1")
                .bind(key)
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    assert_eq!(messages_left().await, total);

    let mut holder = pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM provider_calls WHERE session_key = $1 LIMIT 1 FOR UPDATE")
        .bind(key)
        .execute(&mut *holder)
        .await
        .unwrap();
    let mut deleter = server.client().await;
    let deleting = tokio::spawn(async move { delete(&mut deleter, "long").await });
    poll_until(
        "the deletion waiting for the held provider call",
        Duration::from_secs(30),
        || {
            let pool = pool.clone();
            async move {
                let waiting: i64 = sqlx::query_scalar(
                    "SELECT count(*) FROM pg_stat_activity \
                     WHERE datname = current_database() AND wait_event_type = 'Lock'",
                )
                .fetch_one(&pool)
                .await
                .unwrap();
                (waiting > 0).then_some(())
            }
        },
    )
    .await;
    let left = messages_left().await;
    assert!(
        0 < left && left < total,
        "{left} of {total} messages left while the deletion waits: the batches before \
         the held call committed on their own"
    );
    let missing = client
        .get_session(pb::GetSessionRequest {
            session_id: "long".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(missing.code(), Code::NotFound);
    assert!(!deleting.is_finished());

    holder.rollback().await.unwrap();
    deleting.await.unwrap().unwrap();
    assert_eq!(messages_left().await, 0);
    let calls: i64 =
        sqlx::query_scalar("SELECT count(*) FROM provider_calls WHERE session_key = $1")
            .bind(key)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(calls, 0);
    pool.close().await;
    server.stop().await.unwrap();
}
