//! The sweeper's reads and writes: expired leases and their settling, idle
//! sessions and their deletion, and the purge of deleted sessions'
//! tombstones. Times are chosen from the store's own timestamps, so no
//! case waits for a clock.

use sessionstore_server::domain::Timestamp;
use sessionstore_server::store::SweepCandidate;

use super::*;

crate::backend_tests!(
    expired_leases_are_found_and_settled_once,
    idle_sessions_are_found_oldest_first_and_deleted_only_while_idle,
    tombstones_are_purged_oldest_first_with_their_last_event,
);

const MINUTE: i64 = 60_000_000;

/// `micros` from now.
fn from_now(micros: i64) -> Timestamp {
    Timestamp(Timestamp::now().0 + micros)
}

fn candidate(tenant: &str, id: &str) -> SweepCandidate {
    SweepCandidate {
        tenant: tenant.to_owned(),
        id: id.to_owned(),
    }
}

async fn begin_run(store: &SqlStore, tenant: &str, id: &str, lease_micros: i64) -> Timestamp {
    let begun = store
        .control(
            tenant,
            id,
            controls::BeginRun {
                run_id: format!("run-{id}"),
                lease_micros,
            },
        )
        .await
        .unwrap();
    begun.expire_time
}

async fn expired_leases_are_found_and_settled_once(backend: Backend) {
    let (_storage, store) = open(backend).await;
    for id in ["idle", "long", "short", "gone", "blink"] {
        create(&store, id).await;
    }
    store
        .create_session(
            "globex",
            NewSession {
                id: Some("g".into()),
                title: String::new(),
                system_prompt: String::new(),
                user: String::new(),
                metadata: Metadata::default(),
                initial_history: Vec::new(),
                initial_state: Default::default(),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    begin_run(&store, TENANT, "long", 10 * MINUTE).await;
    begin_run(&store, TENANT, "short", MINUTE).await;
    begin_run(&store, "globex", "g", 5 * MINUTE).await;
    // A deleted session's lease is gone with it.
    begin_run(&store, TENANT, "gone", MINUTE).await;
    store.delete_session(TENANT, "gone").await.unwrap();

    // By expiry, soonest first, across tenants; never a session without one.
    assert!(
        store
            .expired_leases(Timestamp::now(), 10)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        store
            .expired_leases(from_now(2 * MINUTE), 10)
            .await
            .unwrap(),
        [candidate(TENANT, "short")]
    );
    assert_eq!(
        store
            .expired_leases(from_now(20 * MINUTE), 10)
            .await
            .unwrap(),
        [
            candidate(TENANT, "short"),
            candidate("globex", "g"),
            candidate(TENANT, "long")
        ]
    );
    assert_eq!(
        store
            .expired_leases(from_now(20 * MINUTE), 1)
            .await
            .unwrap(),
        [candidate(TENANT, "short")]
    );

    // A lease of one microsecond has run out by the next write: listed from
    // its expiry on, and settled as `run_ended` (expired) once.
    let expire_time = begin_run(&store, TENANT, "blink", 1).await;
    assert!(
        store
            .expired_leases(Timestamp(expire_time.0 - 1), 10)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        store.expired_leases(expire_time, 10).await.unwrap(),
        [candidate(TENANT, "blink")]
    );
    let settled = store
        .control(TENANT, "blink", controls::SettleLease)
        .await
        .unwrap();
    assert_eq!(settled, 3);
    let events = log(&store, "blink").await;
    assert_eq!(revisions(&events), [1, 2, 3]);
    assert_eq!(
        events[2].change,
        Change::RunEnded {
            run_id: "run-blink".into(),
            expired: true,
        }
    );
    let session = store.get_session(TENANT, "blink").await.unwrap();
    assert_eq!(
        (session.active_run_id.as_str(), session.run_expire_time),
        ("", Timestamp(0))
    );
    let again = store
        .control(TENANT, "blink", controls::SettleLease)
        .await
        .unwrap();
    assert_eq!(again, 3, "settled once");
    assert_eq!(revisions(&log(&store, "blink").await), [1, 2, 3]);
    assert!(
        !store
            .expired_leases(from_now(20 * MINUTE), 10)
            .await
            .unwrap()
            .contains(&candidate(TENANT, "blink"))
    );

    // A lease still running is not settled.
    let kept = store
        .control(TENANT, "short", controls::SettleLease)
        .await
        .unwrap();
    assert_eq!(kept, 2);
    let short = store.get_session(TENANT, "short").await.unwrap();
    assert_eq!(short.active_run_id, "run-short");
    assert_eq!(revisions(&log(&store, "short").await), [1, 2]);
    store.close().await;
}

async fn idle_sessions_are_found_oldest_first_and_deleted_only_while_idle(backend: Backend) {
    let (_storage, store) = open(backend).await;
    create(&store, "old").await;
    store
        .append_exchange(TENANT, exchange("old", "q1"))
        .await
        .unwrap();
    let old = store.get_session(TENANT, "old").await.unwrap();
    // Just after the old session's last revision.
    let cutoff = Timestamp(old.update_time.0 + 1);
    create(&store, "new").await;
    let new = store.get_session(TENANT, "new").await.unwrap();
    assert!(new.update_time >= cutoff, "{new:?} vs {old:?}");

    assert!(
        store
            .idle_sessions(Timestamp(0), 10)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        store.idle_sessions(cutoff, 10).await.unwrap(),
        [candidate(TENANT, "old")]
    );
    assert_eq!(
        store.idle_sessions(from_now(MINUTE), 10).await.unwrap(),
        [candidate(TENANT, "old"), candidate(TENANT, "new")]
    );
    assert_eq!(
        store.idle_sessions(from_now(MINUTE), 1).await.unwrap(),
        [candidate(TENANT, "old")]
    );

    // Not idle since the cutoff, unknown, another tenant's: nothing deleted.
    assert!(!store.delete_idle(TENANT, "new", cutoff).await.unwrap());
    assert!(
        !store
            .delete_idle(TENANT, "nope", from_now(MINUTE))
            .await
            .unwrap()
    );
    assert!(
        !store
            .delete_idle("globex", "old", from_now(MINUTE))
            .await
            .unwrap()
    );
    assert_eq!(store.get_session(TENANT, "new").await.unwrap(), new);
    assert_eq!(store.get_session(TENANT, "old").await.unwrap(), old);
    assert_eq!(revisions(&log(&store, "new").await), [1]);
    assert_eq!(revisions(&log(&store, "old").await), [1, 2]);

    // Idle: deleted, as one more revision, its log left holding only that.
    let key = store.resolve(TENANT, "old").await.unwrap().key;
    assert!(store.delete_idle(TENANT, "old", cutoff).await.unwrap());
    let gone = store.get_session(TENANT, "old").await.unwrap_err();
    assert!(matches!(gone, Error::SessionNotFound(_)), "{gone:?}");
    let events = store.read_events(key, 0, 100).await.unwrap();
    assert_eq!(revisions(&events), [3]);
    assert_eq!(events[0].change, Change::SessionDeleted);
    assert!(!store.delete_idle(TENANT, "old", cutoff).await.unwrap());
    assert_eq!(
        store.idle_sessions(from_now(MINUTE), 10).await.unwrap(),
        [candidate(TENANT, "new")],
        "a deleted session is not idle"
    );

    // Its id is free again, for a new session with nothing of the old.
    create(&store, "old").await;
    assert!(stored(&store, "old").await.is_empty());
    assert_ne!(store.resolve(TENANT, "old").await.unwrap().key, key);

    // Several tenants: each one's idle sessions, oldest first, tenant by
    // tenant in order, until the limit. (No index orders all tenants'
    // sessions by time: appends would write it.)
    for (tenant, id) in [
        ("zeta", "z1"),
        ("alpha", "a1"),
        ("zeta", "z2"),
        ("alpha", "a2"),
    ] {
        let new = NewSession {
            id: Some(id.to_owned()),
            user: "u".into(),
            ..Default::default()
        };
        store.create_session(tenant, new).await.unwrap();
    }
    let everyone = store.idle_sessions(from_now(MINUTE), 10).await.unwrap();
    let mut tenants: Vec<&str> = [TENANT, "alpha", "zeta"].into();
    tenants.sort_unstable();
    let expected: Vec<SweepCandidate> = tenants
        .iter()
        .flat_map(|tenant| match *tenant {
            "alpha" => vec![candidate("alpha", "a1"), candidate("alpha", "a2")],
            "zeta" => vec![candidate("zeta", "z1"), candidate("zeta", "z2")],
            _ => vec![candidate(TENANT, "new"), candidate(TENANT, "old")],
        })
        .collect();
    assert_eq!(everyone, expected);
    assert_eq!(
        store.idle_sessions(from_now(MINUTE), 3).await.unwrap(),
        expected[..3]
    );
    // A cutoff before the other tenants' sessions were made: only the
    // older ones.
    assert_eq!(
        store.idle_sessions(cutoff, 10).await.unwrap(),
        Vec::<SweepCandidate>::new(),
        "nothing but the deleted session was idle at the first cutoff"
    );
    store.close().await;
}

async fn tombstones_are_purged_oldest_first_with_their_last_event(backend: Backend) {
    let (_storage, store) = open(backend).await;
    let mut keys = Vec::new();
    for id in ["a", "b", "c"] {
        create(&store, id).await;
        store
            .append_exchange(TENANT, exchange(id, "q"))
            .await
            .unwrap();
        keys.push(store.resolve(TENANT, id).await.unwrap().key);
        store.delete_session(TENANT, id).await.unwrap();
    }
    create(&store, "live").await;
    // When each was deleted: the time of its last event.
    let mut deleted_at = Vec::new();
    for &key in &keys {
        let events = store.read_events(key, 0, 100).await.unwrap();
        assert_eq!(revisions(&events), [3]);
        assert_eq!(events[0].change, Change::SessionDeleted);
        deleted_at.push(events[0].time);
    }
    assert!(
        deleted_at.windows(2).all(|w| w[0] < w[1]),
        "deleted one after another: {deleted_at:?}"
    );

    assert_eq!(store.purge_tombstones(Timestamp(0), 10).await.unwrap(), 0);
    // Only those deleted before the cutoff.
    assert_eq!(store.purge_tombstones(deleted_at[1], 10).await.unwrap(), 1);
    assert!(store.read_events(keys[0], 0, 100).await.unwrap().is_empty());
    assert_eq!(
        revisions(&store.read_events(keys[1], 0, 100).await.unwrap()),
        [3]
    );
    // At most `limit`, oldest first.
    assert_eq!(
        store.purge_tombstones(from_now(MINUTE), 1).await.unwrap(),
        1
    );
    assert!(store.read_events(keys[1], 0, 100).await.unwrap().is_empty());
    assert_eq!(
        revisions(&store.read_events(keys[2], 0, 100).await.unwrap()),
        [3]
    );
    // Every tenant's.
    store
        .create_session(
            "globex",
            NewSession {
                id: Some("x".into()),
                title: String::new(),
                system_prompt: String::new(),
                user: String::new(),
                metadata: Metadata::default(),
                initial_history: Vec::new(),
                initial_state: Default::default(),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let globex_key = store.resolve("globex", "x").await.unwrap().key;
    store.delete_session("globex", "x").await.unwrap();
    assert_eq!(
        store.purge_tombstones(from_now(MINUTE), 10).await.unwrap(),
        2
    );
    assert!(store.read_events(keys[2], 0, 100).await.unwrap().is_empty());
    assert!(
        store
            .read_events(globex_key, 0, 100)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        store.purge_tombstones(from_now(MINUTE), 10).await.unwrap(),
        0
    );

    // Live sessions are never purged.
    let live = store.get_session(TENANT, "live").await.unwrap();
    assert_eq!(live.revision, 1);
    assert_eq!(revisions(&log(&store, "live").await), [1]);
    store.close().await;
}

/// Every path that deletes sessions deletes the rows that name them: on
/// PostgreSQL the tables an append writes have no foreign keys (migration
/// 0012), so no cascade would catch a row left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_row_outlives_its_session_on_sqlite() {
    no_row_outlives_its_session(Backend::File).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_row_outlives_its_session_on_postgres() {
    if crate::support::postgres_available("store::sweeps::no_row_outlives_its_session_on_postgres")
        .await
    {
        no_row_outlives_its_session(Backend::Postgres).await;
    }
}

async fn no_row_outlives_its_session(backend: Backend) {
    let (storage, store) = open(backend).await;
    let owned_by = |id: &str, user: &str| NewSession {
        id: Some(id.to_owned()),
        user: user.to_owned(),
        ..Default::default()
    };
    for (id, user) in [
        ("purged", "u"),
        ("deleted", "u"),
        ("kept", "u"),
        ("erased-1", "gone"),
        ("erased-2", "gone"),
    ] {
        store
            .create_session(TENANT, owned_by(id, user))
            .await
            .unwrap();
        for round in 0..3 {
            let mut exchange = exchange(id, &format!("question {round}"));
            exchange.request_id = format!("{id}-{round}");
            exchange.state_changes = vec![sessionstore_server::domain::StateChange {
                key: format!("k{round}"),
                value: "v".into(),
                scope: String::new(),
                delete: false,
            }];
            store.append_exchange(TENANT, exchange).await.unwrap();
        }
    }
    store.delete_session(TENANT, "purged").await.unwrap();
    assert_eq!(
        store.purge_tombstones(from_now(MINUTE), 10).await.unwrap(),
        1
    );
    store.delete_session(TENANT, "deleted").await.unwrap();
    store
        .erase_user(
            TENANT,
            sessionstore_server::domain::erase::Erasure::new("gone".into(), Vec::new()).unwrap(),
        )
        .await
        .unwrap();

    sqlx::any::install_default_drivers();
    let pool = sqlx::AnyPool::connect(&storage.url).await.unwrap();
    let count = |sql: String| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>(&sql)
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    let mut tables = vec![
        "messages",
        "provider_calls",
        "events",
        "idempotency_keys",
        "session_state",
        "session_metadata",
        "run_cancels",
    ];
    if matches!(backend, Backend::Postgres) {
        tables.push("message_search");
    }
    for table in tables {
        let orphans = count(format!(
            "SELECT count(*) FROM {table} t \
             WHERE NOT EXISTS (SELECT 1 FROM sessions s WHERE s.key = t.session_key)"
        ))
        .await;
        assert_eq!(orphans, 0, "rows of {table} whose session is gone");
        // Of a tombstone, only its last event is left.
        let of_tombstones = count(format!(
            "SELECT count(*) FROM {table} t JOIN sessions s ON s.key = t.session_key \
             WHERE s.deleted = 1"
        ))
        .await;
        let expected = i64::from(table == "events");
        assert_eq!(of_tombstones, expected, "rows of {table} of the tombstone");
    }
    // The session kept has all of its rows.
    for (table, rows) in [
        ("messages", 6),
        ("provider_calls", 3),
        ("events", 4),
        ("idempotency_keys", 3),
        ("session_state", 3),
    ] {
        let held = count(format!(
            "SELECT count(*) FROM {table} t JOIN sessions s ON s.key = t.session_key \
             WHERE s.id = 'kept'"
        ))
        .await;
        assert_eq!(held, rows, "rows of {table} of the session kept");
    }
    pool.close().await;
    store.close().await;
}
