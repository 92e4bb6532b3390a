//! An appended exchange's event refers to its messages for their content
//! instead of repeating it; every read of the event (replay, an
//! idempotent retry) puts the content back, and before a message changes
//! or goes (edit, redaction, rollback) the event that refers to it is
//! written out whole, so the replay still shows what was appended.

use super::*;

crate::backend_tests!(appended_events_refer_to_their_messages_and_read_back_whole);

/// Each stored event of session `id`: its revision, the range of messages
/// it refers to, and its stored encoding. `None` for an in-memory database.
async fn stored_events(url: &str, id: &str) -> Option<Vec<(i64, i64, i64, Vec<u8>)>> {
    const SQL: &str = "SELECT e.revision, e.refers_from, e.refers_until, e.wire \
         FROM events AS e JOIN sessions AS s ON s.key = e.session_key \
         WHERE s.id = $1 ORDER BY e.revision";
    if url.starts_with("postgres") {
        let pool = sqlx::PgPool::connect(url).await.unwrap();
        let rows = sqlx::query_as(SQL).bind(id).fetch_all(&pool).await.unwrap();
        pool.close().await;
        Some(rows)
    } else {
        let path = url
            .strip_prefix("sqlite://")
            .filter(|_| url != "sqlite::memory:")?;
        let pool = sqlx::SqlitePool::connect(&format!("sqlite://{path}?mode=ro"))
            .await
            .unwrap();
        let rows = sqlx::query_as(SQL).bind(id).fetch_all(&pool).await.unwrap();
        pool.close().await;
        Some(rows)
    }
}

fn holds(wire: &[u8], text: &str) -> bool {
    wire.windows(text.len()).any(|w| w == text.as_bytes())
}

/// Checks what the log stores: for each revision, the messages its event
/// refers to (`from..until`, empty for none) and a text it must hold, or
/// must not hold (`!text`).
async fn assert_stored(url: &str, id: &str, expected: &[(i64, (i64, i64), &str)]) {
    let Some(events) = stored_events(url, id).await else {
        return;
    };
    for (revision, refers, text) in expected {
        let (_, from, until, wire) = events
            .iter()
            .find(|(r, ..)| r == revision)
            .unwrap_or_else(|| panic!("no event at revision {revision}"));
        assert_eq!((*from, *until), *refers, "revision {revision} refers to");
        match text.strip_prefix('!') {
            Some(absent) => assert!(
                !holds(wire, absent),
                "revision {revision} repeats {absent:?}"
            ),
            None => assert!(holds(wire, text), "revision {revision} lacks {text:?}"),
        }
    }
}

async fn appended_events_refer_to_their_messages_and_read_back_whole(backend: Backend) {
    let storage = Storage::new(backend).await;
    let url = storage.url.clone();
    let server = TestServer::start_on(storage, |_| {}).await;
    let mut client = server.client().await;
    create(&mut client, "ref").await;
    let retry = pb::AppendExchangeRequest {
        request_id: "req-first".into(),
        ..exchange_request("ref", "alpha-question", "alpha-answer")
    };
    let first = client
        .append_exchange(retry.clone())
        .await
        .unwrap()
        .into_inner();
    let second = exchange(&mut client, "ref", "bravo-question", "bravo-answer").await;
    let third = exchange(&mut client, "ref", "charlie-question", "charlie-answer").await;
    assert_eq!((first.revision, second.revision, third.revision), (2, 3, 4));
    // Each append's event carries its messages' ids, not their content.
    assert_stored(
        &url,
        "ref",
        &[
            (2, (0, 2), "!alpha-answer"),
            (3, (2, 4), "!bravo-question"),
            (4, (4, 6), "!charlie-answer"),
        ],
    )
    .await;
    let events = replay(&mut client, "ref").await;
    for (event, appended) in events[1..].iter().zip([&first, &second, &third]) {
        assert_appended(event, appended);
    }
    // A retry reads the first result back whole.
    let again = client
        .append_exchange(retry.clone())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again.messages, first.messages);
    assert_eq!(again.revision, 2);

    // An edit writes out the event of the edited message first.
    let edited = edit(
        &mut client,
        "ref",
        &first.messages[1].id,
        Some(assistant("alpha-edited")),
        "",
    )
    .await
    .unwrap();
    assert_eq!(edited.revision, 5);
    assert_stored(
        &url,
        "ref",
        &[(2, (0, 0), "alpha-answer"), (3, (2, 4), "!bravo-answer")],
    )
    .await;

    // A rollback, the events of every message it removes.
    let rolled = rollback(&mut client, "ref", 1).await.unwrap();
    assert_eq!(rolled.revision, 6);
    assert_stored(
        &url,
        "ref",
        &[(3, (0, 0), "bravo-question"), (4, (0, 0), "charlie-answer")],
    )
    .await;
    // New messages take the removed ones' sequences.
    let fourth = exchange(&mut client, "ref", "delta-question", "delta-answer").await;
    assert_eq!(fourth.messages[0].sequence, 2);
    assert_stored(&url, "ref", &[(7, (2, 4), "!delta-answer")]).await;

    // The replay shows every exchange as it was appended.
    let events = replay(&mut client, "ref").await;
    assert_eq!(events.len(), 7);
    assert_appended(&events[1], &first);
    assert_appended(&events[2], &second);
    assert_appended(&events[3], &third);
    assert_appended(&events[6], &fourth);
    let again = client.append_exchange(retry).await.unwrap().into_inner();
    assert_eq!(again.messages, first.messages, "the first result, unedited");

    // A redaction leaves no trace of the text in any event.
    redact(&mut client, "ref", &fourth.messages[1].id, "")
        .await
        .unwrap();
    assert_stored(&url, "ref", &[(7, (0, 0), "!delta-answer")]).await;
    let events = replay(&mut client, "ref").await;
    assert!(!format!("{events:?}").contains("delta-answer"));
    assert!(format!("{events:?}").contains("delta-question"));
}
