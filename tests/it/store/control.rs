//! Conversation control: the lease, versioned state, and a rollback with
//! the event log it leaves.

use super::*;

crate::backend_tests!(
    a_lease_keeps_other_writers_off,
    state_entries_are_versioned_by_revision,
    a_rollback_is_one_revision_and_the_log_holds_every_change,
);

async fn a_lease_keeps_other_writers_off(backend: Backend) {
    let (_storage, store) = open(backend).await;
    create(&store, "s").await;
    let begun = store
        .control(
            TENANT,
            "s",
            controls::BeginRun {
                run_id: "run-1".into(),
                lease_micros: 60_000_000,
            },
        )
        .await
        .unwrap();
    assert_eq!(begun.revision, 2, "{begun:?}");
    let busy = store
        .append_exchange(TENANT, exchange("s", "intruder"))
        .await
        .unwrap_err();
    assert!(
        matches!(&busy, Error::SessionBusy { active_run_id, .. } if active_run_id == "run-1"),
        "{busy:?}"
    );
    let mut holder = exchange("s", "mine");
    holder.run_id = "run-1".into();
    let (revision, appended) = store.append_exchange(TENANT, holder).await.unwrap();
    assert_eq!((revision, appended.run_id.as_str()), (3, "run-1"));
    assert_eq!(texts(&store, "s").await, ["mine", "an answer"]);
    store.close().await;
}

async fn state_entries_are_versioned_by_revision(backend: Backend) {
    let (_storage, store) = open(backend).await;
    create(&store, "s").await;
    let set = |key: &str, value: &str, expected_version: Option<i64>| controls::SetState {
        key: key.to_owned(),
        value: value.to_owned(),
        expected_version,
    };
    let cwd = store
        .control(TENANT, "s", set("cwd", "/home", Some(0)))
        .await
        .unwrap();
    assert_eq!((cwd.version, cwd.value.as_str()), (2, "/home"));
    let exists = store
        .control(TENANT, "s", set("cwd", "/tmp", Some(0)))
        .await
        .unwrap_err();
    assert!(
        matches!(
            exists,
            Error::StateVersionMismatch {
                expected: 0,
                actual: 2,
                ..
            }
        ),
        "{exists:?}"
    );
    store
        .control(TENANT, "s", set("a-first", "1", None))
        .await
        .unwrap();
    let handle = store.resolve(TENANT, "s").await.unwrap();
    assert_eq!(handle.revision, 3, "a refused write makes no revision");
    let listed: Vec<(String, i64)> = store
        .list_state(&handle, None, 10)
        .await
        .unwrap()
        .into_iter()
        .map(|e| (e.key, e.version))
        .collect();
    assert_eq!(listed, [("a-first".to_owned(), 3), ("cwd".to_owned(), 2)]);
    store
        .control(
            TENANT,
            "s",
            controls::DeleteState {
                key: "cwd".into(),
                expected_version: Some(2),
            },
        )
        .await
        .unwrap();
    let handle = store.resolve(TENANT, "s").await.unwrap();
    let gone = store.get_state(&handle, "cwd").await.unwrap_err();
    assert!(matches!(gone, Error::StateNotFound(_)), "{gone:?}");
    store.close().await;
}

async fn a_rollback_is_one_revision_and_the_log_holds_every_change(backend: Backend) {
    let (_storage, store) = open(backend).await;
    create(&store, "s").await;
    for question in ["q1", "q2"] {
        store
            .append_exchange(TENANT, exchange("s", question))
            .await
            .unwrap();
    }
    let rolled = store
        .control(
            TENANT,
            "s",
            controls::Rollback {
                after_sequence: 1,
                run_id: String::new(),
                expected_next_sequence: None,
                return_removed: false,
                remove_last: 0,
                request_id: String::new(),
            },
        )
        .await
        .unwrap();
    assert_eq!(
        (rolled.revision, rolled.next_sequence),
        (4, 2),
        "{rolled:?}"
    );
    assert_eq!(texts(&store, "s").await, ["q1", "an answer"]);
    let (revision, appended) = store
        .append_exchange(TENANT, exchange("s", "q3"))
        .await
        .unwrap();
    assert_eq!((revision, appended.messages[0].sequence), (5, 2));

    let handle = store.resolve(TENANT, "s").await.unwrap();
    let events = store.read_events(handle.key, 0, 100).await.unwrap();
    let revisions: Vec<i64> = events.iter().map(|e| e.revision).collect();
    assert_eq!(revisions, [1, 2, 3, 4, 5], "one event per revision, no gap");
    assert!(matches!(events[0].change, Change::SessionCreated { .. }));
    assert!(matches!(events[3].change, Change::RolledBack { .. }));
    let calls = store.read_provider_calls(&handle, 0, 10).await.unwrap();
    assert_eq!(calls.len(), 3, "a rollback keeps the provider calls");
    store.close().await;
}
