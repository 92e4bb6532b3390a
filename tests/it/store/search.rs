//! Search over the current messages of a tenant's live sessions: every
//! word must occur, edits, redactions, rollbacks and deletions are seen at
//! once (on SQLite files the index is built by a thread of its own, and a
//! search waits until it has caught up), pages by offset and limit.

use std::collections::BTreeSet;

use sessionstore_server::domain::search::search_words;
use sessionstore_server::domain::{Fork, SearchHit};
use sessionstore_server::store::SearchQuery;
use sqlx::Connection as _;

use super::*;

crate::postgres_tests!(
    an_edit_racing_a_search_build_keeps_its_own_words,
    postgres_words_are_the_same_in_binary_and_in_text,
);

crate::backend_tests!(
    search_finds_every_word_in_the_current_view,
    search_pages_by_offset_and_keeps_to_the_user_and_tenant,
);

fn query(words: &str, user: Option<&str>, offset: usize, limit: usize) -> SearchQuery {
    SearchQuery {
        words: search_words(words).unwrap(),
        user: user.map(str::to_owned),
        offset,
        limit,
    }
}

async fn hits(store: &SqlStore, tenant: &str, words: &str) -> Vec<SearchHit> {
    store
        .search(tenant, query(words, None, 0, 100))
        .await
        .unwrap()
}

/// Where a search of `TENANT`'s sessions found its words.
async fn found(store: &SqlStore, words: &str) -> BTreeSet<(String, i64)> {
    hits(store, TENANT, words)
        .await
        .into_iter()
        .map(|hit| (hit.session_id, hit.sequence))
        .collect()
}

fn at(session: &str, sequence: i64) -> (String, i64) {
    (session.to_owned(), sequence)
}

async fn search_finds_every_word_in_the_current_view(backend: Backend) {
    let (_storage, store) = open(backend).await;
    create(&store, "a").await;
    create(&store, "b").await;
    let (_, first) = store
        .append_exchange(TENANT, exchange("a", "Where is the AARDVARK habitat?"))
        .await
        .unwrap();
    store
        .append_exchange(TENANT, exchange("a", "tell me about the pangolin"))
        .await
        .unwrap();
    let (_, other) = store
        .append_exchange(TENANT, exchange("b", "aardvark again"))
        .await
        .unwrap();

    // Case-insensitive words, every one of them.
    let aardvarks: BTreeSet<_> = [at("a", 0), at("b", 0)].into();
    assert_eq!(found(&store, "aardvark").await, aardvarks);
    assert_eq!(found(&store, "aArDvArK").await, aardvarks);
    assert_eq!(found(&store, "habitat AARDVARK").await, [at("a", 0)].into());
    assert!(found(&store, "aardvark elephant").await.is_empty());
    let habitat = hits(&store, TENANT, "habitat").await;
    assert_eq!(habitat.len(), 1, "{habitat:?}");
    let hit = &habitat[0];
    assert_eq!(
        (
            hit.session_id.as_str(),
            hit.session_title.as_str(),
            hit.sequence,
            hit.message_id.as_str(),
            hit.role,
        ),
        ("a", "t", 0, first.messages[0].id.as_str(), Role::User)
    );
    assert!(
        hit.snippet.to_lowercase().contains("**habitat**"),
        "{:?}",
        hit.snippet
    );
    let answers = hits(&store, TENANT, "answer").await;
    assert!(answers.iter().all(|h| h.role == Role::Assistant));
    assert_eq!(
        found(&store, "answer").await,
        [at("a", 1), at("a", 3), at("b", 1)].into()
    );
    assert!(
        hits(&store, "globex", "aardvark").await.is_empty(),
        "another tenant finds nothing"
    );

    // Rolled back, edited away, redacted, deleted: gone; an edit's new
    // text and a fork's copies: found.
    store
        .control(
            TENANT,
            "a",
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
    assert!(found(&store, "pangolin").await.is_empty());
    store
        .control(
            TENANT,
            "a",
            controls::Edit {
                message_id: first.messages[0].id.clone(),
                message: Message::text(Role::User, "Where is the okapi habitat?"),
                reason: String::new(),
                run_id: String::new(),
            },
        )
        .await
        .unwrap();
    assert_eq!(found(&store, "aardvark").await, [at("b", 0)].into());
    assert_eq!(found(&store, "okapi habitat").await, [at("a", 0)].into());
    store
        .control(
            TENANT,
            "b",
            controls::Redact {
                message_id: other.messages[0].id.clone(),
                reason: String::new(),
                run_id: String::new(),
            },
        )
        .await
        .unwrap();
    assert!(found(&store, "aardvark").await.is_empty());
    assert_eq!(
        found(&store, "answer").await,
        [at("a", 1), at("b", 1)].into()
    );
    store.delete_session(TENANT, "b").await.unwrap();
    assert_eq!(found(&store, "answer").await, [at("a", 1)].into());
    store
        .fork_session(
            TENANT,
            Fork {
                source_id: "a".into(),
                at_sequence: 0,
                new_id: Some("c".into()),
            },
        )
        .await
        .unwrap();
    assert_eq!(
        found(&store, "okapi").await,
        [at("a", 0), at("c", 0)].into()
    );
    // A new session under a deleted one's id does not bring its text back.
    create(&store, "b").await;
    assert_eq!(found(&store, "answer").await, [at("a", 1)].into());
    store.close().await;
}

async fn search_pages_by_offset_and_keeps_to_the_user_and_tenant(backend: Backend) {
    let (_storage, store) = open(backend).await;
    create(&store, "alice").await;
    let bobs = NewSession {
        id: Some("bob".into()),
        title: "Bob's".into(),
        system_prompt: String::new(),
        user: "bob".into(),
        metadata: Metadata::default(),
        initial_history: Vec::new(),
        initial_state: Default::default(),
        ..Default::default()
    };
    store.create_session(TENANT, bobs).await.unwrap();
    for i in 0..5 {
        for id in ["alice", "bob"] {
            store
                .append_exchange(TENANT, exchange(id, &format!("needle {i}")))
                .await
                .unwrap();
        }
    }

    let all = store
        .search(TENANT, query("needle", None, 0, 100))
        .await
        .unwrap();
    let everywhere: BTreeSet<_> = ["alice", "bob"]
        .into_iter()
        .flat_map(|id| (0..5).map(move |i| at(id, 2 * i)))
        .collect();
    let where_all: BTreeSet<_> = all
        .iter()
        .map(|h| (h.session_id.clone(), h.sequence))
        .collect();
    assert_eq!(where_all, everywhere);
    assert_eq!(all.len(), 10, "no hit twice");

    // Pages of three, by offset, are the whole list in its order.
    let mut paged = Vec::new();
    for offset in [0, 3, 6, 9] {
        let page = store
            .search(TENANT, query("needle", None, offset, 3))
            .await
            .unwrap();
        assert_eq!(page.len(), if offset == 9 { 1 } else { 3 }, "at {offset}");
        paged.extend(page);
    }
    assert_eq!(paged, all);
    assert!(
        store
            .search(TENANT, query("needle", None, 10, 3))
            .await
            .unwrap()
            .is_empty()
    );

    let bob = store
        .search(TENANT, query("needle", Some("bob"), 0, 100))
        .await
        .unwrap();
    assert_eq!(bob.len(), 5);
    assert!(
        bob.iter()
            .all(|h| h.session_id == "bob" && h.session_title == "Bob's"),
        "{bob:?}"
    );
    for user in ["nobody", "u"] {
        let only = store
            .search(TENANT, query("needle", Some(user), 0, 100))
            .await
            .unwrap();
        let expected = if user == "u" { 5 } else { 0 };
        assert_eq!(only.len(), expected, "user {user}");
        assert!(only.iter().all(|h| h.session_id == "alice"));
    }
    assert!(
        store
            .search("globex", query("needle", None, 0, 100))
            .await
            .unwrap()
            .is_empty()
    );
    store.close().await;
}

/// PostgreSQL: an edit racing a search build. The build's page read the
/// message before the edit and inserted its old words after the edit's
/// delete looked; the edit waits for the page, then its own words replace
/// the page's (before, it hit a unique violation and was run again).
async fn an_edit_racing_a_search_build_keeps_its_own_words() {
    let (storage, store) = open(Backend::Postgres).await;
    create(&store, "s").await;
    let (_, appended) = store
        .append_exchange(TENANT, exchange("s", "zebra"))
        .await
        .unwrap();
    let target = appended.messages[0].clone();
    let key = store.resolve(TENANT, "s").await.unwrap().key;

    // The build's page, part way: the row is not there (the index was
    // emptied while search was off), and the page inserts it from the old
    // text without committing yet.
    let mut build = sqlx::PgConnection::connect(&storage.url).await.unwrap();
    sqlx::query("DELETE FROM message_search WHERE session_key = $1 AND sequence = $2")
        .bind(key)
        .bind(target.sequence)
        .execute(&mut build)
        .await
        .unwrap();
    sqlx::query("BEGIN").execute(&mut build).await.unwrap();
    sqlx::query(
        "INSERT INTO message_search (session_key, sequence, words) \
         VALUES ($1, $2, to_tsvector('simple', 'zebra')) ON CONFLICT DO NOTHING",
    )
    .bind(key)
    .bind(target.sequence)
    .execute(&mut build)
    .await
    .unwrap();

    let editing = tokio::spawn({
        let store = store.clone();
        let message_id = target.id.clone();
        async move {
            store
                .control(
                    TENANT,
                    "s",
                    controls::Edit {
                        message_id,
                        message: Message::text(Role::User, "giraffe"),
                        reason: String::new(),
                        run_id: String::new(),
                    },
                )
                .await
        }
    });
    // The edit's insert waits for the page's row.
    let observer =
        tokio::sync::Mutex::new(sqlx::PgConnection::connect(&storage.url).await.unwrap());
    crate::support::poll_until(
        "the edit waiting for the page",
        std::time::Duration::from_secs(10),
        || {
            let observer = &observer;
            async move {
                let waiting: i64 = sqlx::query_scalar(
                    "SELECT count(*) FROM pg_stat_activity \
                     WHERE datname = current_database() AND wait_event_type = 'Lock'",
                )
                .fetch_one(&mut *observer.lock().await)
                .await
                .unwrap();
                (waiting > 0).then_some(())
            }
        },
    )
    .await;
    sqlx::query("COMMIT").execute(&mut build).await.unwrap();

    let edited = editing.await.unwrap().unwrap();
    assert_eq!(edited.message.message.content, "giraffe");
    assert_eq!(found(&store, "giraffe").await, BTreeSet::from([at("s", 0)]));
    assert!(found(&store, "zebra").await.is_empty());
    store.close().await;
}

/// PostgreSQL: the append writers bind a message's words as a `tsvector`
/// in PostgreSQL's binary form; a session's initial history is indexed
/// through the text form, which the statement casts. Both store the same
/// words and positions, and both are found.
async fn postgres_words_are_the_same_in_binary_and_in_text() {
    let (storage, store) = open(Backend::Postgres).await;
    let text = "Tea for TWO: tea at 3.14, ÉCOLE café naïve x1y2 ann@example.com tea ß";
    create(&store, "appended").await;
    store
        .append_exchange(TENANT, exchange("appended", text))
        .await
        .unwrap();
    let created = NewSession {
        id: Some("created".to_owned()),
        title: "t".into(),
        system_prompt: "Be brief.".into(),
        user: "u".into(),
        initial_history: vec![Message::text(Role::User, text)],
        ..Default::default()
    };
    store.create_session(TENANT, created).await.unwrap();

    let mut conn = sqlx::PgConnection::connect(&storage.url).await.unwrap();
    // Each session's first message is the text.
    let words: Vec<(String, String)> = sqlx::query_as(
        "SELECT s.id, CAST(f.words AS TEXT) FROM message_search f \
         JOIN sessions s ON s.key = f.session_key WHERE f.sequence = 0 ORDER BY s.id",
    )
    .fetch_all(&mut conn)
    .await
    .unwrap();
    assert_eq!(words.len(), 2, "{words:?}");
    assert_eq!(words[0].0, "appended");
    assert_eq!(words[0].1, words[1].1, "{words:?}");
    assert!(words[0].1.starts_with("'14':7 '3':6 "), "{words:?}");
    assert!(words[0].1.contains(" 'tea':1,4,15 "), "{words:?}");
    assert_eq!(
        found(&store, "ÉCOLE tea").await,
        [at("appended", 0), at("created", 0)].into()
    );
    store.close().await;
}
