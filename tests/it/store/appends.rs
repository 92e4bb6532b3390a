//! Appends: numbering, a retry answered once, refusals that write nothing,
//! and a `full_history` append storing only its new tail.

use super::*;
use sqlx::Connection as _;

crate::postgres_tests!(
    postgres_writers_leave_no_transaction_open,
    one_trip_batches_leave_nothing_open_and_redo_a_changed_session,
    a_one_trip_batch_closing_a_run_notifies_before_it_answers,
);

crate::backend_tests!(
    appends_are_numbered_and_a_retry_is_answered_once,
    a_retry_is_recognised_whatever_its_request_id_holds,
    refusals_write_nothing,
    a_full_history_append_stores_only_its_new_tail,
);

async fn appends_are_numbered_and_a_retry_is_answered_once(backend: Backend) {
    let (_storage, store) = open(backend).await;
    create(&store, "s").await;
    let mut first = exchange("s", "q1");
    first.request_id = "r1".into();
    first.expected_next_sequence = Some(0);
    let (revision, appended) = store.append_exchange(TENANT, first.clone()).await.unwrap();
    assert_eq!((revision, appended.next_sequence), (2, 2));
    assert!(!appended.replayed);
    let call = appended.provider_call.clone().unwrap();
    assert_eq!(call.total_tokens, 12, "total filled in from its parts");
    let sequences: Vec<i64> = appended.messages.iter().map(|m| m.sequence).collect();
    assert_eq!(sequences, [0, 1]);
    assert_eq!(appended.messages[1].produced_by_call_id, call.id);

    // The retry, even with its now stale expected sequence, is the first
    // answer again and writes nothing.
    let (again, replayed) = store.append_exchange(TENANT, first).await.unwrap();
    assert!(replayed.replayed);
    assert_eq!(again, revision);
    assert_eq!(replayed.messages, appended.messages);
    assert_eq!(texts(&store, "s").await, ["q1", "an answer"]);
    assert_eq!(store.get_session(TENANT, "s").await.unwrap().revision, 2);

    let (revision, appended) = store
        .append_exchange(TENANT, exchange("s", "q2"))
        .await
        .unwrap();
    assert_eq!((revision, appended.messages[0].sequence), (3, 2));
    store.close().await;
}

/// Request ids are read back from where they are stored (on PostgreSQL,
/// as JSON in the statement that locks the sessions), so ids holding what
/// storage escapes or JSON quotes are recognised, in any tenant, and each
/// run of concurrent appends tells them apart.
async fn a_retry_is_recognised_whatever_its_request_id_holds(backend: Backend) {
    let (_storage, store) = open(backend).await;
    let ids = [
        "back\\slash \\0",
        "quote \" and [\"json\", 1]",
        "nul \u{0} inside",
        "ünïcödé ✓",
        "",
    ];
    for tenant in [TENANT, "ten\\ant \u{0}"] {
        create_in(&store, tenant, "s").await;
        let firsts = futures_util::future::join_all(ids.iter().map(|id| {
            let mut keyed = exchange("s", &format!("q {id}"));
            keyed.request_id = (*id).to_owned();
            store.append_exchange(tenant, keyed)
        }))
        .await;
        for (id, first) in ids.iter().zip(firsts) {
            let (revision, appended) = first.unwrap();
            assert!(!appended.replayed, "{id:?}");
            if id.is_empty() {
                continue;
            }
            let mut retry = exchange("s", &format!("q {id}"));
            retry.request_id = (*id).to_owned();
            let (again, replayed) = store.append_exchange(tenant, retry.clone()).await.unwrap();
            assert!(replayed.replayed, "{id:?} in {tenant:?}");
            assert_eq!((again, &replayed.messages), (revision, &appended.messages));
            retry.messages[0].content = "another question".into();
            let reused = store.append_exchange(tenant, retry).await.unwrap_err();
            assert!(
                matches!(reused, Error::IdempotencyConflict(_)),
                "{reused:?}"
            );
        }
        let session = store.get_session(tenant, "s").await.unwrap();
        assert_eq!(session.next_sequence, 2 * ids.len() as i64, "{tenant:?}");
    }
    // A keyed request naming no live session: no session row comes back to
    // carry the ids, and it is refused as unknown, writing nothing.
    let mut missing = exchange("nope", "x");
    missing.request_id = "never stored".into();
    let refused = store.append_exchange(TENANT, missing).await.unwrap_err();
    assert!(matches!(refused, Error::SessionNotFound(_)), "{refused:?}");
    store.close().await;
}

async fn refusals_write_nothing(backend: Backend) {
    let (_storage, store) = open(backend).await;
    create(&store, "s").await;
    let mut stale = exchange("s", "late");
    stale.expected_next_sequence = Some(5);
    let refused = store.append_exchange(TENANT, stale).await.unwrap_err();
    assert!(
        matches!(
            refused,
            Error::SequenceMismatch {
                expected: 5,
                actual: 0
            }
        ),
        "{refused:?}"
    );
    let missing = store
        .append_exchange(TENANT, exchange("nope", "x"))
        .await
        .unwrap_err();
    assert!(matches!(missing, Error::SessionNotFound(_)), "{missing:?}");
    let other_tenant = store
        .append_exchange("globex", exchange("s", "x"))
        .await
        .unwrap_err();
    assert!(
        matches!(other_tenant, Error::SessionNotFound(_)),
        "tenants never see each other's sessions: {other_tenant:?}"
    );

    let mut keyed = exchange("s", "q");
    keyed.request_id = "k".into();
    store.append_exchange(TENANT, keyed.clone()).await.unwrap();
    keyed.messages[0].content = "another question".into();
    let reused = store.append_exchange(TENANT, keyed).await.unwrap_err();
    assert!(
        matches!(reused, Error::IdempotencyConflict(_)),
        "{reused:?}"
    );
    assert_eq!(texts(&store, "s").await, ["q", "an answer"]);
    assert_eq!(store.get_session(TENANT, "s").await.unwrap().revision, 2);
    store.close().await;
}

async fn a_full_history_append_stores_only_its_new_tail(backend: Backend) {
    let (_storage, store) = open(backend).await;
    create(&store, "s").await;
    store
        .append_exchange(TENANT, exchange("s", "q1"))
        .await
        .unwrap();
    let mut resent = exchange("s", "");
    resent.messages.clear();
    resent.full_history = vec![
        // A leading copy of the system prompt is skipped.
        Message::text(Role::System, "Be brief."),
        Message::text(Role::User, "q1"),
        Message::text(Role::Assistant, "an answer"),
        Message::text(Role::User, "q2"),
    ];
    let (revision, appended) = store.append_exchange(TENANT, resent.clone()).await.unwrap();
    assert_eq!(revision, 3);
    let stored: Vec<(i64, &str)> = appended
        .messages
        .iter()
        .map(|m| (m.sequence, m.message.content.as_str()))
        .collect();
    assert_eq!(stored, [(2, "q2"), (3, "an answer")]);

    // A history that no longer matches is refused, naming where.
    resent.full_history[1].content = "edited".into();
    let refused = store.append_exchange(TENANT, resent).await.unwrap_err();
    assert!(
        matches!(refused, Error::HistoryMismatch { .. }),
        "{refused:?}"
    );
    assert_eq!(texts(&store, "s").await.len(), 4);
    store.close().await;
}

/// PostgreSQL's append writers begin each batch's transaction in the
/// round trip that commits the batch before it. A writer whose open
/// transaction's connection ends (killed here, as an administrator or
/// `idle_in_transaction_session_timeout` would) appends on a new one, and
/// once appends stop no transaction is left open.
/// Batches in transactions (`--append-one-trip off`): the transaction
/// begun for the next batch is ended when its connection is killed, or
/// when no append comes.
async fn postgres_writers_leave_no_transaction_open() {
    let options = StoreOptions {
        append_one_trip: false,
        ..StoreOptions::default()
    };
    let (storage, store) = open_with(Backend::Postgres, &options).await;
    let observer =
        tokio::sync::Mutex::new(sqlx::PgConnection::connect(&storage.url).await.unwrap());
    let open_transactions = || {
        let observer = &observer;
        async move {
            let pids: Vec<i32> = sqlx::query_scalar(
                "SELECT pid FROM pg_stat_activity \
                 WHERE datname = current_database() AND state = 'idle in transaction'",
            )
            .fetch_all(&mut *observer.lock().await)
            .await
            .unwrap();
            pids
        }
    };
    create(&store, "s").await;
    store
        .append_exchange(TENANT, exchange("s", "q1"))
        .await
        .unwrap();
    // The writer's connection waits in the transaction begun for the next
    // batch; it is ended under it.
    let writer = crate::support::poll_until(
        "the writer's transaction begun for the next batch",
        std::time::Duration::from_secs(10),
        || async { open_transactions().await.first().copied() },
    )
    .await;
    let ended: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(writer)
        .fetch_one(&mut *observer.lock().await)
        .await
        .unwrap();
    assert!(ended);
    store
        .append_exchange(TENANT, exchange("s", "q2"))
        .await
        .unwrap();
    assert_eq!(
        texts(&store, "s").await,
        ["q1", "an answer", "q2", "an answer"]
    );
    // With no append coming, the writer ends its open transaction itself.
    crate::support::poll_until(
        "no transaction left open",
        std::time::Duration::from_secs(10),
        || async { open_transactions().await.is_empty().then_some(()) },
    )
    .await;
    store.close().await;
}

/// An append that closes a run, written in one round trip (its session
/// kept), has sent the run's closing hint before it answers: a listener's
/// next query finds it delivered. (Other replicas drop the run's buffered
/// deltas on that hint, before its caller can publish the next turn's.)
async fn a_one_trip_batch_closing_a_run_notifies_before_it_answers() {
    let (storage, store) = open(Backend::Postgres).await;
    let mut listener = sqlx::postgres::PgListener::connect(&storage.url)
        .await
        .unwrap();
    listener.listen("sessionstore_commits").await.unwrap();
    create(&store, "s").await;
    // The first append reads the session; the writer keeps it after.
    store
        .append_exchange(TENANT, exchange("s", "q1"))
        .await
        .unwrap();
    for turn in 2..6 {
        let closing = NewExchange {
            run_id: format!("run-{turn}"),
            ..exchange("s", "q")
        };
        let (revision, _) = store.append_exchange(TENANT, closing).await.unwrap();
        // Notifications committed before this query began reach the
        // listener before its answer.
        sqlx::query("SELECT 1")
            .execute(&mut listener)
            .await
            .unwrap();
        let mut delivered = Vec::new();
        while let Some(notification) = listener.next_buffered() {
            delivered.push(notification.payload().to_owned());
        }
        assert!(
            delivered
                .iter()
                .any(|hint| hint.ends_with(&format!(":{revision}:run-{turn}"))),
            "turn {turn}: the closing hint of revision {revision} before the answer: {delivered:?}"
        );
    }
}

/// One-trip batches (the default): a batch on kept sessions commits as
/// its one statement, so no transaction stays open between batches; a
/// killed writer connection is replaced; and a kept session changed
/// behind the writer's back fails that statement whole (nothing of it is
/// stored) and the batch is redone from the row as it is.
async fn one_trip_batches_leave_nothing_open_and_redo_a_changed_session() {
    let (storage, store) = open(Backend::Postgres).await;
    let mut observer = sqlx::PgConnection::connect(&storage.url).await.unwrap();
    create(&store, "s").await;
    for question in ["q1", "q2", "q3"] {
        store
            .append_exchange(TENANT, exchange("s", question))
            .await
            .unwrap();
    }
    let open: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity \
         WHERE datname = current_database() AND state = 'idle in transaction'",
    )
    .fetch_one(&mut observer)
    .await
    .unwrap();
    assert_eq!(open, 0, "no transaction is left open between batches");

    // The session changes behind the writer's back (as another replica's
    // write would): the writer's kept copy is stale.
    sqlx::query("UPDATE sessions SET title = 'changed elsewhere' WHERE id = 's'")
        .execute(&mut observer)
        .await
        .unwrap();
    store
        .append_exchange(TENANT, exchange("s", "q4"))
        .await
        .unwrap();
    assert_eq!(
        texts(&store, "s").await,
        [
            "q1",
            "an answer",
            "q2",
            "an answer",
            "q3",
            "an answer",
            "q4",
            "an answer"
        ],
        "the stale batch wrote nothing; its redo wrote q4 once"
    );
    let title: String = sqlx::query_scalar("SELECT title FROM sessions WHERE id = 's'")
        .fetch_one(&mut observer)
        .await
        .unwrap();
    assert_eq!(title, "changed elsewhere", "the redo kept the other change");

    // Every other connection of the database killed, the writer's among
    // them: the next append is written on a fresh one.
    sqlx::query(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE datname = current_database() AND pid <> pg_backend_pid()",
    )
    .execute(&mut observer)
    .await
    .unwrap();
    crate::support::poll_until(
        "an append after the connections were killed",
        std::time::Duration::from_secs(20),
        || async {
            store
                .append_exchange(TENANT, exchange("s", "q5"))
                .await
                .ok()
        },
    )
    .await;
    let stored = texts(&store, "s").await;
    assert_eq!(
        stored.iter().filter(|text| *text == "q5").count(),
        1,
        "q5 once: {stored:?}"
    );
    store.close().await;
}
