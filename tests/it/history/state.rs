//! Per-session state.

use super::*;

crate::backend_tests!(
    state_versions_and_conditions,
    state_lists_in_key_order_and_dies_with_the_session,
    state_keys_order_as_text_with_nul_and_backslashes,
);

async fn state_versions_and_conditions(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    create(&mut client, "st").await;
    let mut stream = watch_caught_up(&mut client, "st", 1).await;

    let first = set_state(&mut client, "st", "cwd", "/home/alice", None)
        .await
        .unwrap();
    assert_eq!(
        (first.key.as_str(), first.value.as_str(), first.version),
        ("cwd", "/home/alice", 2)
    );
    assert!(first.update_time.is_some());
    assert_eq!(get_state(&mut client, "st", "cwd").await.unwrap(), first);
    let second = set_state(&mut client, "st", "cwd", "/tmp", None)
        .await
        .unwrap();
    assert_eq!(second.version, 3, "every write changes the version");

    // Conditional writes: a mismatch writes nothing.
    for expected in [0, 2, 99] {
        let mismatch = set_state(&mut client, "st", "cwd", "/nope", Some(expected))
            .await
            .unwrap_err();
        assert_reason(&mismatch, Code::Aborted, "STATE_VERSION_MISMATCH");
    }
    assert_eq!(get_state(&mut client, "st", "cwd").await.unwrap(), second);
    assert_eq!(get(&mut client, "st").await.revision, 3);
    let third = set_state(&mut client, "st", "cwd", "/srv", Some(3))
        .await
        .unwrap();
    assert_eq!(third.version, 4);
    let tricky = "a.rs\u{0}b.rs\\c \\0 \\\\ é";
    let files = set_state(&mut client, "st", "files", tricky, Some(0))
        .await
        .unwrap();
    assert_eq!(files.version, 5);
    assert_eq!(
        get_state(&mut client, "st", "files").await.unwrap().value,
        tricky
    );

    // Deletes.
    let stale = delete_state(&mut client, "st", "cwd", Some(3))
        .await
        .unwrap_err();
    assert_reason(&stale, Code::Aborted, "STATE_VERSION_MISMATCH");
    let deleted = delete_state(&mut client, "st", "cwd", Some(4))
        .await
        .unwrap();
    assert_eq!(deleted.revision, 6);
    let gone = get_state(&mut client, "st", "cwd").await.unwrap_err();
    assert_reason(&gone, Code::NotFound, "STATE_NOT_FOUND");
    let again = delete_state(&mut client, "st", "cwd", None)
        .await
        .unwrap_err();
    assert_reason(&again, Code::NotFound, "STATE_NOT_FOUND");
    let recreated = set_state(&mut client, "st", "cwd", "/again", Some(0))
        .await
        .unwrap();
    assert_eq!(recreated.version, 7);

    // Each write was one revision and one state_changed event.
    let mut changes = Vec::new();
    for revision in 2..=7 {
        let event = next_change(&mut stream).await;
        assert_eq!(event.revision, revision);
        let Some(Event::StateChanged(changed)) = event.event else {
            panic!("expected state_changed at revision {revision}, got {event:?}");
        };
        changes.push(changed);
    }
    let change = |key: &str, value: &str, version: i64, deleted: bool| pb::StateChanged {
        key: key.into(),
        value: value.into(),
        version,
        deleted,
    };
    assert_eq!(
        changes,
        [
            change("cwd", "/home/alice", 2, false),
            change("cwd", "/tmp", 3, false),
            change("cwd", "/srv", 4, false),
            change("files", tricky, 5, false),
            change("cwd", "", 6, true),
            change("cwd", "/again", 7, false),
        ]
    );

    // Bad requests write nothing.
    let no_key = set_state(&mut client, "st", "", "v", None)
        .await
        .unwrap_err();
    assert_field(&no_key, Code::InvalidArgument, "key");
    let no_key = get_state(&mut client, "st", "").await.unwrap_err();
    assert_field(&no_key, Code::InvalidArgument, "key");
    let no_key = delete_state(&mut client, "st", "", None).await.unwrap_err();
    assert_field(&no_key, Code::InvalidArgument, "key");
    let negative = set_state(&mut client, "st", "k", "v", Some(-1))
        .await
        .unwrap_err();
    assert_field(&negative, Code::InvalidArgument, "expected_version");
    let huge = "v".repeat(64 * 1024 + 1);
    let too_big = set_state(&mut client, "st", "big", &huge, None)
        .await
        .unwrap_err();
    assert_eq!(too_big.code(), Code::ResourceExhausted, "{too_big:?}");
    for status in [
        set_state(&mut client, "ghost", "k", "v", None)
            .await
            .unwrap_err(),
        get_state(&mut client, "ghost", "k").await.unwrap_err(),
        delete_state(&mut client, "ghost", "k", None)
            .await
            .unwrap_err(),
        list_state(&mut client, "ghost", 0, "").await.unwrap_err(),
    ] {
        assert_reason(&status, Code::NotFound, "SESSION_NOT_FOUND");
    }
    assert_eq!(get(&mut client, "st").await.revision, 7);
    // 64 KiB exactly is allowed.
    let largest = set_state(&mut client, "st", "big", &huge[1..], None)
        .await
        .unwrap();
    assert_eq!(largest.value.len(), 64 * 1024);
    assert_eq!(largest.version, 8);
    server.stop().await.unwrap();
}

async fn state_lists_in_key_order_and_dies_with_the_session(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    create(&mut client, "ls").await;
    for key in ["k05", "k01", "k07", "k03", "k02", "k06", "k04"] {
        set_state(&mut client, "ls", key, &key.to_uppercase(), None)
            .await
            .unwrap();
    }
    let all: Vec<String> = (1..=7).map(|i| format!("k{i:02}")).collect();

    let mut pages = Vec::new();
    let mut token = String::new();
    loop {
        let page = list_state(&mut client, "ls", 3, &token).await.unwrap();
        for entry in &page.entries {
            assert_eq!(entry.value, entry.key.to_uppercase());
            assert!(entry.version > 1);
        }
        pages.push(page.entries.into_iter().map(|e| e.key).collect::<Vec<_>>());
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    assert_eq!(pages, [&all[0..3], &all[3..6], &all[6..7]]);
    let default_page = list_state(&mut client, "ls", 0, "").await.unwrap();
    let keys: Vec<String> = default_page.entries.into_iter().map(|e| e.key).collect();
    assert_eq!(keys, all);
    assert!(default_page.next_page_token.is_empty());
    let negative = list_state(&mut client, "ls", -1, "").await.unwrap_err();
    assert_field(&negative, Code::InvalidArgument, "page_size");

    // State is deleted with its session: a new session of the same id has none.
    client
        .delete_session(pb::DeleteSessionRequest {
            session_id: "ls".into(),
        })
        .await
        .unwrap();
    create(&mut client, "ls").await;
    let gone = get_state(&mut client, "ls", "k01").await.unwrap_err();
    assert_reason(&gone, Code::NotFound, "STATE_NOT_FOUND");
    assert!(
        list_state(&mut client, "ls", 0, "")
            .await
            .unwrap()
            .entries
            .is_empty()
    );

    server.stop().await.unwrap();
}

async fn state_keys_order_as_text_with_nul_and_backslashes(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    create(&mut client, "keys").await;
    // Keys are text like any other, U+0000 and backslashes included; the
    // listing follows their order ("a\u{0}z" before "a!").
    let keys = ["a", "a\u{0}z", "a!", "a\\", "a\\\u{0}", "b"];
    for key in keys.iter().rev() {
        set_state(&mut client, "keys", key, key, None)
            .await
            .unwrap();
    }
    for key in keys {
        assert_eq!(
            get_state(&mut client, "keys", key).await.unwrap().value,
            key
        );
    }
    let mut sorted = keys.to_vec();
    sorted.sort_unstable();
    let mut listed = Vec::new();
    let mut token = String::new();
    loop {
        let page = list_state(&mut client, "keys", 2, &token).await.unwrap();
        listed.extend(page.entries.into_iter().map(|e| e.key));
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    assert_eq!(listed, sorted, "entries in key order");
    server.stop().await.unwrap();
}
