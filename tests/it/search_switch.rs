//! `--search on|off`: off, nothing is indexed (no index rows, no search
//! log), what was indexed is removed, and SearchMessages fails
//! FAILED_PRECONDITION `SEARCH_DISABLED` while everything else works; on
//! again, the index is built from the stored messages and every one is
//! found.

use std::time::Duration;

use sessionstore_client::v1 as pb;
use sessionstore_server::config::SearchMode;
use tonic::Code;

use crate::support::{
    Backend, Storage, TestServer, create, error_details, exchange, poll_until, postgres_available,
};

async fn start(storage: &Storage, search: SearchMode) -> TestServer {
    TestServer::start_with(storage.url.clone(), None, |config| config.search = search).await
}

/// Hits for `word`, or the refusal.
async fn search(server: &TestServer, word: &str) -> Result<usize, tonic::Status> {
    let mut client = server.client().await;
    client
        .search_messages(pb::SearchMessagesRequest {
            query: word.into(),
            ..Default::default()
        })
        .await
        .map(|response| response.into_inner().hits.len())
}

/// What the database holds of the search index: index rows and, on
/// SQLite, rows of the log the indexer reads.
async fn index_rows(storage: &Storage, backend: Backend) -> i64 {
    match backend {
        Backend::Postgres => {
            let pool = sqlx::PgPool::connect(&storage.url).await.unwrap();
            let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM message_search")
                .fetch_one(&pool)
                .await
                .unwrap();
            pool.close().await;
            rows
        }
        _ => {
            let path = storage.url.strip_prefix("sqlite://").unwrap();
            let pool = sqlx::SqlitePool::connect(&format!("sqlite://{path}?mode=ro"))
                .await
                .unwrap();
            let logged: i64 = sqlx::query_scalar("SELECT count(*) FROM search_log")
                .fetch_one(&pool)
                .await
                .unwrap();
            pool.close().await;
            let search = sqlx::SqlitePool::connect(&format!("sqlite://{path}-search?mode=ro"))
                .await
                .unwrap();
            let tables: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM sqlite_master WHERE name = 'message_search'",
            )
            .fetch_one(&search)
            .await
            .unwrap();
            let indexed: i64 = if tables == 0 {
                0
            } else {
                sqlx::query_scalar("SELECT count(*) FROM message_search")
                    .fetch_one(&search)
                    .await
                    .unwrap()
            };
            search.close().await;
            logged + indexed
        }
    }
}

fn assert_disabled(result: Result<usize, tonic::Status>) {
    let status = result.expect_err("search is off");
    let (reason, _) = error_details(&status);
    assert_eq!(
        (status.code(), reason.as_deref()),
        (Code::FailedPrecondition, Some("SEARCH_DISABLED")),
        "{status:?}"
    );
}

/// Found once the index is built again (searches wait for it, then
/// answer SEARCH_INDEX_BEHIND, which is worth retrying).
async fn found_once_built(server: &TestServer, word: &str) -> usize {
    poll_until(
        &format!("{word:?} found after search is back on"),
        Duration::from_secs(60),
        || async {
            match search(server, word).await {
                Ok(hits) if hits > 0 => Some(hits),
                Ok(_) => None,
                Err(status) => {
                    let (reason, _) = error_details(&status);
                    assert_eq!(reason.as_deref(), Some("SEARCH_INDEX_BEHIND"), "{status:?}");
                    None
                }
            }
        },
    )
    .await
}

async fn off_then_on_again(backend: Backend) {
    let storage = Storage::new(backend).await;
    let on = start(&storage, SearchMode::On).await;
    let mut client = on.client().await;
    create(&mut client, "switched").await;
    exchange(&mut client, "switched", "alpha question", "alpha answer").await;
    assert_eq!(search(&on, "alpha").await.unwrap(), 2);
    on.stop().await.unwrap();

    let off = start(&storage, SearchMode::Off).await;
    let mut client = off.client().await;
    exchange(&mut client, "switched", "bravo question", "bravo answer").await;
    assert_disabled(search(&off, "alpha").await);
    // Everything else is unchanged.
    let messages = crate::support::all_messages(&mut client, "switched").await;
    assert_eq!(messages.len(), 4);
    assert_eq!(index_rows(&storage, backend).await, 0, "no index kept");
    off.stop().await.unwrap();

    let on = start(&storage, SearchMode::On).await;
    assert_eq!(found_once_built(&on, "alpha").await, 2);
    assert_eq!(found_once_built(&on, "bravo").await, 2);
    // Writes index again.
    let mut client = on.client().await;
    exchange(
        &mut client,
        "switched",
        "charlie question",
        "charlie answer",
    )
    .await;
    assert_eq!(search(&on, "charlie").await.unwrap(), 2);
    on.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_search_off_then_on_again() {
    off_then_on_again(Backend::File).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_search_off_then_on_again() {
    if postgres_available("search_switch::postgres_search_off_then_on_again").await {
        off_then_on_again(Backend::Postgres).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_memory_search_off_refuses_searches() {
    let storage = Storage::new(Backend::Memory).await;
    let off = start(&storage, SearchMode::Off).await;
    let mut client = off.client().await;
    create(&mut client, "plain").await;
    exchange(&mut client, "plain", "delta question", "delta answer").await;
    assert_disabled(search(&off, "delta").await);
    off.stop().await.unwrap();
}
