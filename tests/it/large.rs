//! Large sessions: a ~10 MB history exports through a client with tonic's
//! default 4 MiB decoding limit, in chunks of about 1 MiB.

use prost::Message as _;
use sessionstore_client::SessionStoreClient;
use sessionstore_client::v1 as pb;
use tonic::transport::Channel;

use std::time::Duration;

use crate::support::{
    Backend, Storage, TestServer, assistant, call, create, error_details, open_files_under,
    poll_until, user, watch,
};

/// The export chunk bound, plus room for one message's framing.
const CHUNK_LIMIT: usize = 1024 * 1024 + 16 * 1024;

/// ~`len` bytes of text, distinct per `tag`, with some multi-byte characters.
fn body(tag: &str, len: usize) -> String {
    let unit = format!("[{tag}] ünïcødé ✓ lorem ipsum dolor sit amet; ");
    let mut text = unit.repeat(len / unit.len() + 1);
    let mut cut = len;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    text.truncate(cut);
    text
}

/// Exports with a plain, default-configured client, checking chunk sizes.
async fn export_checked(
    client: &mut SessionStoreClient<Channel>,
    request: pb::ExportHistoryRequest,
) -> (Vec<pb::Message>, usize) {
    let mut stream = client
        .export_history(request)
        .await
        .expect("export")
        .into_inner();
    let mut out = Vec::new();
    let mut chunks = 0;
    while let Some(chunk) = stream.message().await.expect("export chunk") {
        let size = chunk.encoded_len();
        assert!(
            size <= CHUNK_LIMIT,
            "chunk {chunks} is {size} bytes, more than about 1 MiB"
        );
        assert!(!chunk.messages.is_empty(), "empty export chunk");
        chunks += 1;
        out.extend(chunk.messages);
    }
    (out, chunks)
}

async fn ten_megabyte_export_in_bounded_chunks(backend: Backend) {
    const APPENDS: usize = 40;
    const HALF: usize = 128 * 1024;
    let server = TestServer::start(backend).await;
    // Default client: 4 MiB max decoding message size.
    let mut client = server.client().await;
    let created = create(&mut client, "ses_large").await;

    let mut expected = Vec::new();
    for i in 0..APPENDS {
        let question = user(&body(&format!("q{i}"), HALF));
        let answer = assistant(&body(&format!("a{i}"), HALF));
        let request = pb::AppendExchangeRequest {
            session_id: created.id.clone(),
            messages: vec![question.clone()],
            provider_call: Some(call("gpt-large", 100_000, 100_000, 1)),
            response_messages: vec![answer.clone()],
            ..Default::default()
        };
        assert!(request.encoded_len() < 4 * 1024 * 1024);
        client.append_exchange(request).await.expect("append");
        expected.push(question);
        expected.push(answer);
    }
    let total_text: usize = expected.iter().map(|m| m.content.len()).sum();
    assert!(total_text >= 10 * 1000 * 1000, "{total_text} bytes");

    let (exported, chunks) = export_checked(
        &mut client,
        pb::ExportHistoryRequest {
            session_id: created.id.clone(),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(exported.len(), expected.len());
    assert!(chunks >= 10, "{chunks} chunks for {total_text} bytes");
    for (i, (got, want)) in exported.iter().zip(&expected).enumerate() {
        assert_eq!(got.role, want.role, "message {i}");
        assert!(got.content == want.content, "message {i} content differs");
    }
    let exported_text: usize = exported.iter().map(|m| m.content.len()).sum();
    assert_eq!(exported_text, total_text);

    // With the system prompt and from the middle, too.
    let (with_prompt, _) = export_checked(
        &mut client,
        pb::ExportHistoryRequest {
            session_id: created.id.clone(),
            include_system_prompt: true,
            ..Default::default()
        },
    )
    .await;
    assert_eq!(with_prompt.len(), expected.len() + 1);
    assert_eq!(with_prompt[0].role, i32::from(pb::Role::System));
    assert_eq!(with_prompt[0].content, created.system_prompt);
    let (tail, _) = export_checked(
        &mut client,
        pb::ExportHistoryRequest {
            session_id: created.id.clone(),
            after_sequence: Some(49),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(tail.len(), expected.len() - 50);
    assert!(tail[0].content == expected[50].content);

    // Replaying the whole event log through the same default client works too.
    let mut events = watch(&mut client, &created.id, 0).await;
    let mut replayed = 0;
    loop {
        let event = events.message().await.unwrap().expect("stream open");
        use pb::session_event::Event;
        match event.event {
            Some(Event::CaughtUp(_)) => break,
            Some(Event::ExchangeAppended(appended)) => replayed += appended.messages.len(),
            _ => {}
        }
    }
    assert_eq!(replayed, expected.len());
}

/// A single message bigger than the chunk bound still exports through a
/// default client, and does not inflate the chunks around it.
async fn oversized_single_message_exports(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    let created = create(&mut client, "ses_large_single").await;
    let small_before = user("small before");
    let big = assistant(&body("big", 3 * 1024 * 1024));
    let small_after = user("small after");
    client
        .append_exchange(pb::AppendExchangeRequest {
            session_id: created.id.clone(),
            messages: vec![small_before.clone()],
            provider_call: Some(call("gpt-large", 1, 1, 1)),
            response_messages: vec![big.clone()],
            ..Default::default()
        })
        .await
        .unwrap();
    client
        .append_exchange(pb::AppendExchangeRequest {
            session_id: created.id.clone(),
            messages: vec![small_after.clone()],
            ..Default::default()
        })
        .await
        .unwrap();
    let mut stream = client
        .export_history(pb::ExportHistoryRequest {
            session_id: created.id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut chunks = Vec::new();
    while let Some(chunk) = stream.message().await.expect("export chunk") {
        chunks.push(chunk);
    }
    let all: Vec<&pb::Message> = chunks.iter().flat_map(|c| &c.messages).collect();
    assert_eq!(all.len(), 3);
    assert_eq!(all[0], &small_before);
    assert!(all[1] == &big, "the big message differs");
    assert_eq!(all[2], &small_after);
    for chunk in &chunks {
        if !chunk.messages.iter().any(|m| m.content == big.content) {
            assert!(chunk.encoded_len() <= CHUNK_LIMIT);
        }
    }
}

crate::backend_tests!(
    ten_megabyte_export_in_bounded_chunks,
    oversized_single_message_exports,
);

/// Half an exchange of the WAL tests, in bytes.
const WAL_HALF: usize = 96 * 1024;

/// A server on a fresh SQLite file, and the path of that file's WAL.
async fn file_server() -> (TestServer, std::path::PathBuf) {
    let storage = Storage::new(Backend::File).await;
    let wal = std::path::PathBuf::from(format!(
        "{}-wal",
        storage.url.trim_start_matches("sqlite://")
    ));
    (TestServer::start_on(storage, |_| {}).await, wal)
}

/// An exchange of two [`WAL_HALF`]-byte messages and a call, marked `tag`.
fn large_exchange(session: &str, tag: &str) -> pb::AppendExchangeRequest {
    pb::AppendExchangeRequest {
        session_id: session.to_owned(),
        messages: vec![user(&body(&format!("q{tag}"), WAL_HALF))],
        provider_call: Some(call("gpt-large", 100_000, 100_000, 1)),
        response_messages: vec![assistant(&body(&format!("a{tag}"), WAL_HALF))],
        ..Default::default()
    }
}

/// Under steady writes from several clients the SQLite WAL starts over and
/// stays bounded: checkpoints from beside the writer alone never caught up
/// with the WAL's end, and the file grew with every write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sqlite_wal_stays_bounded_under_steady_writes() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    const CLIENTS: usize = 4;
    // Enough to outlast several checkpoints at full speed: since each body
    // is written once (migrations 0016 and 0017), 1,200 appends took under
    // 2 s on a fast machine, too few restarts to see the WAL cut back.
    const MOST_APPENDS: usize = 4_000;
    let (server, wal) = file_server().await;
    let mut client = server.client().await;
    let appended = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut writers = tokio::task::JoinSet::new();
    for writer in 0..CLIENTS {
        let session = create(&mut client, &format!("ses_wal_{writer}")).await.id;
        let (mut client, appended, stop) = (server.client().await, appended.clone(), stop.clone());
        writers.spawn(async move {
            let mut index = 0;
            while !stop.load(Ordering::Relaxed) && appended.load(Ordering::Relaxed) < MOST_APPENDS {
                let request = large_exchange(&session, &format!("{writer}.{index}"));
                client.append_exchange(request).await.expect("append");
                appended.fetch_add(1, Ordering::Relaxed);
                index += 1;
            }
        });
    }
    // Watch the WAL's size while the writers go on, until it shrinks (it
    // started over past its size limit and was cut back) or they are done.
    // Started over below the limit, it is written over in place: its size
    // then stays what it reached, well under what was written.
    let mut largest = 0;
    let mut shrank = false;
    let mut looks = tokio::time::interval(std::time::Duration::from_millis(10));
    let mut first_done = None;
    while first_done.is_none() {
        first_done = writers.try_join_next();
        looks.tick().await;
        let size = std::fs::metadata(&wal).map(|m| m.len()).unwrap_or(0);
        if size < largest {
            shrank = true;
            break;
        }
        largest = size;
    }
    stop.store(true, Ordering::Relaxed);
    if let Some(done) = first_done {
        done.expect("writer");
    }
    while let Some(done) = writers.join_next().await {
        done.expect("writer");
    }
    let written = appended.load(Ordering::Relaxed) * 2 * WAL_HALF;
    assert!(
        shrank || largest < written as u64 / 2,
        "{written} bytes of messages written, and the WAL grew to {largest} bytes without being cut back"
    );
}

/// Once writes pause, the SQLite WAL files (the database's and the search
/// file's) give their space back: each is cut to zero bytes, and
/// everything acknowledged before is still there and found.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sqlite_wal_is_cut_to_zero_once_writes_pause() {
    const APPENDS: usize = 80;
    let (server, wal) = file_server().await;
    let search_wal = wal.with_file_name(format!(
        "{}-search-wal",
        wal.file_name()
            .and_then(|name| name.to_str())
            .and_then(|name| name.strip_suffix("-wal"))
            .expect("a WAL file name")
    ));
    // The search file's WAL grows when the indexer gets to the appends,
    // which on a busy machine may be well after they are answered: each
    // file's size is followed from beside the test's own tasks.
    let peaks = Peaks::follow(vec![wal.clone(), search_wal.clone()]);
    let mut client = server.client().await;
    let session = create(&mut client, "ses_quiet_wal").await.id;
    for index in 0..APPENDS {
        client
            .append_exchange(large_exchange(&session, &index.to_string()))
            .await
            .expect("append");
    }
    let last = format!("a{}", APPENDS - 1);
    poll_until("the last answer indexed", Duration::from_secs(120), || {
        let server = &server;
        let last = &last;
        async move { (indexed(server, last).await == 1).then_some(()) }
    })
    .await;
    // Quiet now, the indexer included: within seconds both files are cut
    // to zero bytes.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let mut looks = tokio::time::interval(Duration::from_millis(50));
    loop {
        looks.tick().await;
        let (left, search_left) = (file_size(&wal), file_size(&search_wal));
        if left == 0 && search_left == 0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "20 s after the index caught up the WAL still holds {left} bytes, the search \
             file's {search_left} (largest seen: {:?})",
            peaks.so_far()
        );
    }
    for (file, reached) in [&wal, &search_wal].into_iter().zip(peaks.stop()) {
        assert!(
            reached > 5 << 20,
            "{} reached only {reached} bytes; the test needs it above 4 MiB",
            file.display()
        );
    }
    let (messages, _) = export_checked(
        &mut client,
        pb::ExportHistoryRequest {
            session_id: session.clone(),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(messages.len(), 2 * APPENDS);
    assert_eq!(found(&server, &last).await, 1);
    // Writes go on as before, on a WAL that starts again from nothing.
    client
        .append_exchange(pb::AppendExchangeRequest {
            session_id: session.clone(),
            messages: vec![user("after the pause")],
            ..Default::default()
        })
        .await
        .expect("append after the pause");
    assert!(file_size(&wal) > 0);
}

/// A file's size in bytes; 0 if it is not there.
fn file_size(path: &std::path::Path) -> u64 {
    std::fs::metadata(path).map_or(0, |meta| meta.len())
}

/// The largest size each of some files has had, sampled every few
/// milliseconds on a thread of its own, so that a busy runtime cannot make
/// it miss a size the server keeps for only a moment.
struct Peaks {
    largest: std::sync::Arc<Vec<std::sync::atomic::AtomicU64>>,
    /// Dropping it (or sending on it) ends the sampling at once.
    stop: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Peaks {
    /// Between two looks at the files the thread waits on its stop signal,
    /// for at most this long.
    const LOOK_EVERY: Duration = Duration::from_millis(2);

    fn follow(paths: Vec<std::path::PathBuf>) -> Peaks {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicU64, Ordering};
        use std::sync::mpsc::RecvTimeoutError;
        let largest: Arc<Vec<AtomicU64>> =
            Arc::new(paths.iter().map(|_| AtomicU64::new(0)).collect());
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::spawn({
            let largest = Arc::clone(&largest);
            move || loop {
                for (path, peak) in paths.iter().zip(largest.iter()) {
                    peak.fetch_max(file_size(path), Ordering::Relaxed);
                }
                if let Ok(()) | Err(RecvTimeoutError::Disconnected) =
                    stopped.recv_timeout(Self::LOOK_EVERY)
                {
                    return;
                }
            }
        });
        Peaks {
            largest,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    fn so_far(&self) -> Vec<u64> {
        self.largest
            .iter()
            .map(|peak| peak.load(std::sync::atomic::Ordering::Relaxed))
            .collect()
    }

    /// Stops following; the largest sizes seen, in the order given.
    fn stop(mut self) -> Vec<u64> {
        self.stop.take();
        if let Some(thread) = self.thread.take() {
            thread.join().expect("the sampling thread");
        }
        self.so_far()
    }
}

/// Writers for the search-log tests: on SQLite each append run logs a
/// range per session, so this many appends log about as many rows.
const LOG_CLIENTS: usize = 8;
const LOG_APPENDS_EACH: usize = 600;

/// Appends [`LOG_APPENDS_EACH`] exchanges from each of [`LOG_CLIENTS`]
/// clients, each on its session `ses_log_<n>` (created here), the user
/// message naming its writer and index (`w<n>x<i>`).
async fn append_logged(server: &TestServer) {
    let mut client = server.client().await;
    let mut writers = tokio::task::JoinSet::new();
    for writer in 0..LOG_CLIENTS {
        let session = create(&mut client, &format!("ses_log_{writer}")).await.id;
        let mut client = server.client().await;
        writers.spawn(async move {
            for index in 0..LOG_APPENDS_EACH {
                let request = pb::AppendExchangeRequest {
                    session_id: session.clone(),
                    messages: vec![user(&format!("question w{writer}x{index}"))],
                    provider_call: Some(call("gpt-small", 10, 10, 1)),
                    response_messages: vec![assistant("answer")],
                    ..Default::default()
                };
                client.append_exchange(request).await.expect("append");
            }
        });
    }
    while let Some(done) = writers.join_next().await {
        done.expect("writer");
    }
}

/// How many messages a search for `word` finds.
async fn found(server: &TestServer, word: &str) -> usize {
    search(server, word).await.expect("search")
}

/// Hits for `word` once the index has the messages written before the
/// call; 0 while SQLite's index is still behind them.
async fn indexed(server: &TestServer, word: &str) -> usize {
    search(server, word).await.unwrap_or_else(|status| {
        let (reason, _) = error_details(&status);
        assert_eq!(reason.as_deref(), Some("SEARCH_INDEX_BEHIND"), "{status:?}");
        0
    })
}

async fn search(server: &TestServer, word: &str) -> Result<usize, tonic::Status> {
    let found = server
        .client()
        .await
        .search_messages(pb::SearchMessagesRequest {
            query: word.to_owned(),
            ..Default::default()
        })
        .await?;
    Ok(found.into_inner().hits.len())
}

/// `search_log`'s row count and last id.
async fn search_log(url: &str) -> (i64, i64) {
    use sqlx::Connection as _;
    let mut db = sqlx::SqliteConnection::connect(url).await.expect("open");
    let counted = sqlx::query_as("SELECT count(*), coalesce(max(id), 0) FROM search_log")
        .fetch_one(&mut db)
        .await
        .expect("count");
    db.close().await.expect("close");
    counted
}

/// SQLite's search index is written beside the appends from a log of the
/// message ranges they changed; the append thread deletes the log rows the
/// indexer has applied (keeping the last), and searches stay right across.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sqlite_search_log_is_trimmed_once_indexed() {
    let storage = Storage::new(Backend::File).await;
    let url = storage.url.clone();
    let server = TestServer::start_on(storage, |_| {}).await;
    append_logged(&server).await;
    // Everything indexed (a search waits for it).
    assert_eq!(found(&server, "w0x0").await, 1);
    assert_eq!(
        found(&server, &format!("w7x{}", LOG_APPENDS_EACH - 1)).await,
        1
    );
    let (rows, last) = search_log(&url).await;
    assert!(
        last >= (LOG_CLIENTS * LOG_APPENDS_EACH) as i64 / 2,
        "a log row per session per run: {last}"
    );
    // Deleted once 4,096 are applied: every row before the last applied.
    assert!(
        last - rows >= 4095 && rows < 4096,
        "applied rows deleted: {rows} left of {last}"
    );
    for word in ["w3x17".to_owned(), format!("w5x{}", LOG_APPENDS_EACH - 2)] {
        assert_eq!(found(&server, &word).await, 1);
    }
    server.stop().await.expect("stop");
}

/// A search file older than the database (restored from a backup taken
/// before log rows it never applied were deleted) is rebuilt at start,
/// rather than missing those messages for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_sqlite_search_file_is_rebuilt() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("sessions.db");
    let url = format!("sqlite://{}", db.display());
    let search = std::path::PathBuf::from(format!("{}-search", db.display()));
    let old = dir.path().join("old-search");

    let server = TestServer::start_with(url.clone(), None, |_| {}).await;
    let mut client = server.client().await;
    create(&mut client, "ses_first").await;
    crate::support::exchange(&mut client, "ses_first", "the first word", "reply").await;
    assert_eq!(found(&server, "first").await, 1);
    server.stop().await.expect("stop");
    assert_eq!(open_files_under(dir.path()), [] as [std::path::PathBuf; 0]);
    // Closed cleanly: the search file holds everything, its WAL is gone.
    std::fs::copy(&search, &old).expect("copy");

    let server = TestServer::start_with(url.clone(), None, |_| {}).await;
    append_logged(&server).await;
    assert_eq!(found(&server, "w2x3").await, 1);
    server.stop().await.expect("stop");
    assert_eq!(open_files_under(dir.path()), [] as [std::path::PathBuf; 0]);
    let (rows, last) = search_log(&url).await;
    assert!(
        last - rows >= 4095,
        "applied rows deleted: {rows} left of {last}"
    );

    for suffix in ["-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", search.display()));
    }
    std::fs::copy(&old, &search).expect("restore");
    let server = TestServer::start_with(url, None, |_| {}).await;
    for word in ["first", "w2x3", "w6x100"] {
        assert_eq!(found(&server, word).await, 1, "{word}");
    }
    server.stop().await.expect("stop");
}
