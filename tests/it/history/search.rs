//! Search over the current view.

use super::*;

crate::backend_tests!(
    search_sees_only_the_current_view,
    search_pages_and_filters_by_user,
    search_splits_words_as_snippets_do,
    a_message_of_more_words_than_an_index_entry_holds_is_stored,
);

async fn search_sees_only_the_current_view(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    create(&mut client, "s_alice").await;
    client
        .create_session(pb::CreateSessionRequest {
            session_id: "s_bob".into(),
            title: "Bob's".into(),
            user: "bob".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    create(&mut client, "s_gone").await;

    let first = exchange(
        &mut client,
        "s_alice",
        "Where is the AARDVARK habitat?",
        "Aardvarks live in Africa.",
    )
    .await;
    exchange(
        &mut client,
        "s_alice",
        "tell me about the pangolin",
        "scaly",
    )
    .await;
    exchange(&mut client, "s_bob", "aardvark again", "alpha\u{0}omega").await;
    exchange(&mut client, "s_gone", "aardvark doomed", "x").await;

    // Case-insensitive words, every one of them.
    let expected: BTreeSet<_> = [at("s_alice", 0), at("s_bob", 0), at("s_gone", 0)].into();
    assert_eq!(found(&mut client, "aardvark", "").await, expected);
    assert_eq!(found(&mut client, "aArDvArK", "").await, expected);
    assert_eq!(
        found(&mut client, "habitat AARDVARK", "").await,
        [at("s_alice", 0)].into()
    );
    assert!(found(&mut client, "aardvark elephant", "").await.is_empty());
    assert_eq!(
        found(&mut client, "aardvark", "alice").await,
        [at("s_alice", 0), at("s_gone", 0)].into()
    );
    assert_eq!(
        found(&mut client, "aardvark", "bob").await,
        [at("s_bob", 0)].into()
    );
    let hits = search_all(&mut client, "habitat", "").await;
    assert_eq!(hits.len(), 1);
    let hit = &hits[0];
    assert_eq!(hit.session_id, "s_alice");
    assert_eq!(hit.sequence, 0);
    assert_eq!(hit.message_id, first.messages[0].id);
    assert_eq!(hit.session_title, "title of s_alice");
    assert_eq!(hit.role, i32::from(pb::Role::User));
    assert!(
        hit.snippet.to_lowercase().contains("**habitat**"),
        "{:?}",
        hit.snippet
    );
    let bob = search_all(&mut client, "aardvark", "bob").await;
    assert_eq!(bob[0].session_title, "Bob's");
    // U+0000 separates words like a space.
    assert_eq!(
        found(&mut client, "omega", "").await,
        [at("s_bob", 1)].into()
    );

    // Rolled-back, edited-away, redacted and deleted text is not found;
    // the edit's new text is.
    assert_eq!(
        found(&mut client, "pangolin", "").await,
        [at("s_alice", 2)].into()
    );
    rollback(&mut client, "s_alice", 1).await.unwrap();
    assert!(found(&mut client, "pangolin", "").await.is_empty());
    assert!(found(&mut client, "scaly", "").await.is_empty());

    let zebra = exchange(&mut client, "s_alice", "any zebra?", "zebra stripes").await;
    assert_eq!(
        found(&mut client, "zebra", "").await,
        [at("s_alice", 2), at("s_alice", 3)].into()
    );
    edit(
        &mut client,
        "s_alice",
        &zebra.messages[1].id,
        Some(assistant("okapi stripes")),
        "",
    )
    .await
    .unwrap();
    assert_eq!(
        found(&mut client, "zebra", "").await,
        [at("s_alice", 2)].into()
    );
    let okapi = search_all(&mut client, "OKAPI", "").await;
    assert_eq!(okapi.len(), 1);
    assert_eq!(
        (okapi[0].sequence, okapi[0].role),
        (3, i32::from(pb::Role::Assistant))
    );
    assert_eq!(
        found(&mut client, "stripes", "").await,
        [at("s_alice", 3)].into()
    );

    let secret = exchange(&mut client, "s_alice", "my secret platypus", "noted").await;
    assert_eq!(found(&mut client, "platypus", "").await.len(), 1);
    redact(&mut client, "s_alice", &secret.messages[0].id, "")
        .await
        .unwrap();
    assert!(found(&mut client, "platypus", "").await.is_empty());

    client
        .delete_session(pb::DeleteSessionRequest {
            session_id: "s_gone".into(),
        })
        .await
        .unwrap();
    assert!(found(&mut client, "doomed", "").await.is_empty());
    // A new session of the same id does not bring the old text back.
    create(&mut client, "s_gone").await;
    assert!(found(&mut client, "doomed", "").await.is_empty());
    assert_eq!(
        found(&mut client, "aardvark", "").await,
        [at("s_alice", 0), at("s_bob", 0)].into()
    );

    // A fork's copies are found in the fork too.
    fork(&mut client, "s_alice", 0, "s_fork").await.unwrap();
    assert_eq!(
        found(&mut client, "habitat", "").await,
        [at("s_alice", 0), at("s_fork", 0)].into()
    );

    for query in ["", "   "] {
        let empty = search(&mut client, query, "", 0, "").await.unwrap_err();
        assert_field(&empty, Code::InvalidArgument, "query");
    }
    server.stop().await.unwrap();
}

/// A word is a run of letters and digits on both backends: the parts of
/// an e-mail address, a path or a hyphenated word are found on their own,
/// and a query is split the same way. (PostgreSQL's own parser, used
/// before 0018, kept such words whole as well, so their parts were missed.)
async fn search_splits_words_as_snippets_do(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    create(&mut client, "w_split").await;
    let appended = exchange(
        &mut client,
        "w_split",
        "Write to ANN@Example.com about /srv/data-2024/report.txt",
        "A self-hosted ÉCOLE, version 3.14",
    )
    .await;
    let user = at("w_split", appended.messages[0].sequence);
    let answer = at("w_split", appended.messages[1].sequence);
    // Sent as the full history: its new messages are known only once the
    // stored ones are read (PostgreSQL's writers split the words of other
    // appends before queueing them).
    let mut full = exchange_request("w_split", "", "The QUOKKA-land reply");
    full.full_history = vec![
        crate::support::user("Write to ANN@Example.com about /srv/data-2024/report.txt"),
        crate::support::assistant("A self-hosted ÉCOLE, version 3.14"),
        crate::support::user("zebra crossing?"),
    ];
    full.messages.clear();
    let tail = client
        .append_exchange(full)
        .await
        .expect("append with full_history")
        .into_inner();
    let zebra = at("w_split", tail.messages[0].sequence);
    let quokka = at("w_split", tail.messages[1].sequence);
    assert_eq!(found(&mut client, "ZEBRA", "").await, [zebra].into());
    assert_eq!(found(&mut client, "land quokka", "").await, [quokka].into());
    for (query, hit) in [
        ("example", &user),
        ("ann@example.com", &user),
        ("srv report txt", &user),
        ("data 2024", &user),
        ("DATA-2024", &user),
        ("hosted", &answer),
        ("école", &answer),
        ("14", &answer),
    ] {
        assert_eq!(
            found(&mut client, query, "").await,
            [hit.clone()].into(),
            "{query}"
        );
    }
    assert!(found(&mut client, "examplecom", "").await.is_empty());
    assert!(found(&mut client, "!!", "").await.is_empty());
    let hits = search_all(&mut client, "hosted", "").await;
    assert_eq!(hits.len(), 1);
    assert!(
        hits[0].snippet.contains("self-**hosted**"),
        "{}",
        hits[0].snippet
    );
    server.stop().await.unwrap();
}

/// A message whose distinct words would take more than PostgreSQL's
/// 1 MiB for one `tsvector` is stored, and found by its first words (in
/// PostgreSQL's order of words, the index keeps as many as fit; before
/// 0018 the whole append failed there).
async fn a_message_of_more_words_than_an_index_entry_holds_is_stored(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    create(&mut client, "w_many").await;
    let text: Vec<String> = (0..200_000).map(|i| format!("w{i:06}")).collect();
    let appended = exchange(&mut client, "w_many", &text.join(" "), "short answer").await;
    let first = at("w_many", appended.messages[0].sequence);
    assert_eq!(found(&mut client, "w000001", "").await, [first].into());
    server.stop().await.unwrap();
}

async fn search_pages_and_filters_by_user(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    create(&mut client, "p_alice").await;
    client
        .create_session(pb::CreateSessionRequest {
            session_id: "p_bob".into(),
            user: "bob".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let mut expected = BTreeSet::new();
    for i in 0..13 {
        let appended = exchange(&mut client, "p_alice", &format!("needle {i}"), "hay").await;
        expected.insert(at("p_alice", appended.messages[0].sequence));
    }
    let mut bob = BTreeSet::new();
    for i in 0..12 {
        let appended = exchange(&mut client, "p_bob", &format!("Needle {i}"), "hay").await;
        bob.insert(at("p_bob", appended.messages[0].sequence));
    }
    expected.extend(bob.iter().cloned());

    let mut seen = Vec::new();
    let mut pages = 0;
    let mut token = String::new();
    loop {
        let page = search(&mut client, "needle", "", 7, &token).await.unwrap();
        assert!(page.hits.len() <= 7);
        pages += 1;
        seen.extend(page.hits.into_iter().map(|h| (h.session_id, h.sequence)));
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
        assert!(pages < 10, "paging does not end");
    }
    assert_eq!(pages, 4);
    let unique: BTreeSet<_> = seen.iter().cloned().collect();
    assert_eq!(unique.len(), seen.len(), "no hit on two pages");
    assert_eq!(unique, expected);

    assert_eq!(found(&mut client, "needle", "bob").await, bob);
    assert!(found(&mut client, "needle", "nobody").await.is_empty());
    let negative = search(&mut client, "needle", "", -1, "").await.unwrap_err();
    assert_field(&negative, Code::InvalidArgument, "page_size");
    server.stop().await.unwrap();
}

/// SQLite keeps its search index in a file of its own beside the database
/// (`<database>-search`), derived from the messages: a missing one is
/// rebuilt, and so is one that holds more than the database (as after a
/// power loss that took the database's last commits but not the index's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sqlite_search_file_is_rebuilt_when_missing_or_ahead() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("sessions.db");
    let url = format!("sqlite://{}", db.display());
    let with_suffix = |suffix: &str| std::path::PathBuf::from(format!("{}{suffix}", db.display()));
    // The sequences a search finds (all in `ses_sea`).
    let found = |client: &Client, word: &'static str| {
        let mut client = client.clone();
        async move {
            search_all(&mut client, word, "")
                .await
                .iter()
                .inspect(|hit| assert_eq!(hit.session_id, "ses_sea"))
                .map(|hit| hit.sequence)
                .collect::<Vec<_>>()
        }
    };
    let server = TestServer::start_with(url.clone(), None, |_| {}).await;
    let mut client = server.client().await;
    create(&mut client, "ses_sea").await;
    exchange(&mut client, "ses_sea", "the walrus said", "it is time").await;
    assert_eq!(found(&client, "walrus").await, [0]);
    server.stop().await.unwrap();
    assert_eq!(open_files_under(dir.path()), [] as [std::path::PathBuf; 0]);
    assert!(
        with_suffix("-search").exists(),
        "the index has a file of its own"
    );
    assert_eq!(automerge(&with_suffix("-search")).await, 8);
    // The database as it was, closed cleanly (its WAL copied back).
    std::fs::copy(&db, with_suffix(".before")).unwrap();

    // Missing: rebuilt from the messages.
    for suffix in ["-search", "-search-wal", "-search-shm"] {
        let _ = std::fs::remove_file(with_suffix(suffix));
    }
    let server = TestServer::start_with(url.clone(), None, |_| {}).await;
    let mut client = server.client().await;
    assert_eq!(found(&client, "walrus").await, [0]);
    exchange(&mut client, "ses_sea", "shoes, ships", "sealing wax").await;
    assert_eq!(found(&client, "sealing").await, [3]);
    server.stop().await.unwrap();
    assert_eq!(open_files_under(dir.path()), [] as [std::path::PathBuf; 0]);
    assert_eq!(automerge(&with_suffix("-search")).await, 8);

    // Ahead: the database goes back to before the second exchange, the
    // index keeps it. The index must not find what the database lost.
    for suffix in ["-wal", "-shm"] {
        let _ = std::fs::remove_file(with_suffix(suffix));
    }
    std::fs::copy(with_suffix(".before"), &db).unwrap();
    let server = TestServer::start_with(url, None, |_| {}).await;
    let mut client = server.client().await;
    assert!(found(&client, "sealing").await.is_empty());
    assert_eq!(found(&client, "walrus").await, [0]);
    // And it goes on indexing.
    exchange(&mut client, "ses_sea", "and cabbages", "and kings").await;
    assert_eq!(found(&client, "cabbages").await, [2]);
    server.stop().await.unwrap();
}

/// The FTS5 `automerge` setting the search file at `path` holds: how many
/// segments of a level gather before they are merged.
async fn automerge(path: &std::path::Path) -> i64 {
    use sqlx::Connection as _;
    let url = format!("sqlite://{}", path.display());
    let mut conn = sqlx::SqliteConnection::connect(&url).await.unwrap();
    let value = sqlx::query_scalar("SELECT v FROM message_search_config WHERE k = 'automerge'")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    conn.close().await.unwrap();
    value
}
