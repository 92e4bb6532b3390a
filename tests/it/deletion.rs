//! DeleteSession of a long session: gone from every read at once, its
//! history then deleted a batch of rows per transaction (as EraseUser
//! deletes a user's), so that it never holds SQLite's one writer, or one
//! PostgreSQL transaction, for all of it; the call answers once all of it
//! is gone.

use std::time::Duration;

use sessionstore_client::SessionStoreClient;
use sessionstore_client::v1 as pb;
use tonic::transport::Channel;

use crate::support::{
    Backend, ServerProcess, Storage, TestServer, assert_gone, assistant, call, create_owned,
    exchange, get, next_change, poll_until, search_hits, sessionstore_binary, user, watch,
};

crate::backend_tests!(a_long_session_is_deleted_whole);

crate::postgres_tests!(
    a_long_session_is_deleted_batch_by_batch,
    a_deletion_cut_short_is_finished_batch_by_batch,
);

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
    assert_eq!(search_hits(&mut client, "longword").await, 100);
    let long = get(&mut client, "long").await;
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
    assert_gone(&mut client, "long").await;
    assert_eq!(search_hits(&mut client, "longword").await, 0);
    assert_eq!(search_hits(&mut client, "keptword").await, 2);
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
    let key = live_key(&pool, "long").await;
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
    until_one_waits_for_a_lock(&pool, "the deletion waiting for the held provider call").await;
    let left = messages_left().await;
    assert!(
        0 < left && left < total,
        "{left} of {total} messages left while the deletion waits: the batches before \
         the held call committed on their own"
    );
    assert_gone(&mut client, "long").await;
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

/// The key of the live session `id`.
async fn live_key(pool: &sqlx::PgPool, id: &str) -> i64 {
    sqlx::query_scalar("SELECT key FROM sessions WHERE id = $1 AND deleted = 0")
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Waits until a backend of the database at `pool` waits for a lock.
async fn until_one_waits_for_a_lock(pool: &sqlx::PgPool, what: &str) {
    poll_until(what, Duration::from_secs(30), || {
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
    })
    .await;
}

/// A server killed (SIGKILL) part way through deleting a long session
/// leaves a tombstone with rows; once the tombstone is due to be purged,
/// the sweeper of the next server deletes what is left a batch at a time
/// too (some of the messages are gone, committed, while a later batch
/// waits for a held provider call), then purges it.
async fn a_deletion_cut_short_is_finished_batch_by_batch() {
    let storage = Storage::new(Backend::Postgres).await;
    let url = storage.url.clone();
    let binary = tokio::task::spawn_blocking(sessionstore_binary)
        .await
        .unwrap();
    let logs = tempfile::tempdir().unwrap();
    let start = |log: &str| {
        let log = logs.path().join(log);
        let (binary, url) = (binary.clone(), url.clone());
        async move {
            let args = ["--sweep-interval-ms", "50"];
            ServerProcess::start(&binary, &url, "127.0.0.1:0", log, &args).await
        }
    };
    let mut server = start("first.log").await;
    let mut client = SessionStoreClient::connect(server.endpoint())
        .await
        .unwrap();
    let total = fill_long(&mut client, "long", "longword").await as i64;
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    let key = live_key(&pool, "long").await;
    let count = |table: &'static str| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>(&format!(
                "SELECT count(*) FROM {table} WHERE session_key = $1"
            ))
            .bind(key)
            .fetch_one(&pool)
            .await
            .unwrap()
        }
    };
    // Holds one of the session's rows (`which`, a condition) in a
    // transaction of its own: a batch that would delete it waits.
    let hold = |which: &'static str| {
        let pool = pool.clone();
        async move {
            let mut holder = pool.begin().await.unwrap();
            sqlx::query(&format!("SELECT 1 FROM {which} LIMIT 1 FOR UPDATE"))
                .bind(key)
                .execute(&mut *holder)
                .await
                .unwrap();
            holder
        }
    };

    // The first server is killed while its deletion waits for a message
    // of its second batch.
    let holder = hold("messages WHERE session_key = $1 AND sequence = 1500").await;
    let mut deleter = client.clone();
    let deleting = tokio::spawn(async move { delete(&mut deleter, "long").await });
    until_one_waits_for_a_lock(&pool, "the deletion waiting for the held message").await;
    server.kill().await;
    assert!(deleting.await.unwrap().is_err());
    holder.rollback().await.unwrap();
    // Its backend's batch is rolled back once the lock is free.
    poll_until(
        "the killed server's batch gone",
        Duration::from_secs(30),
        || {
            let pool = pool.clone();
            async move {
                let open: i64 = sqlx::query_scalar(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
                 AND state <> 'idle' AND pid <> pg_backend_pid()",
                )
                .fetch_one(&pool)
                .await
                .unwrap();
                (open == 0).then_some(())
            }
        },
    )
    .await;
    let left = count("messages").await;
    assert!(
        1000 < left && left < total,
        "{left} of {total} messages left"
    );
    assert!(count("provider_calls").await > 0);

    // An hour later (its tombstone's time moved back), the next server's
    // sweeper finishes it.
    sqlx::query("UPDATE sessions SET update_time = update_time - 7200000000 WHERE key = $1")
        .bind(key)
        .execute(&pool)
        .await
        .unwrap();
    let holder = hold("provider_calls WHERE session_key = $1").await;
    let server = start("second.log").await;
    until_one_waits_for_a_lock(&pool, "the sweeper waiting for the held call").await;
    let waiting = count("messages").await;
    assert!(
        waiting < left,
        "{waiting} of the {left} messages left while the sweeper waits: its batches before \
         the held call committed on their own"
    );
    holder.rollback().await.unwrap();
    poll_until("the tombstone purged", Duration::from_secs(30), || {
        let pool = pool.clone();
        async move {
            let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM sessions WHERE key = $1")
                .bind(key)
                .fetch_one(&pool)
                .await
                .unwrap();
            (rows == 0).then_some(())
        }
    })
    .await;
    for table in ["messages", "provider_calls", "events"] {
        assert_eq!(count(table).await, 0, "{table}");
    }
    pool.close().await;
    drop(server);
}
