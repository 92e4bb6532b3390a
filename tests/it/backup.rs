//! `sessionstore backup` and `restore` (SQLite): a backup taken while
//! eight writers append holds every exchange acknowledged before it
//! started, restores into a fresh directory, and serves them again
//! (gap-free, searchable, their request ids still known); `restore`
//! refuses a database a running server has open and changes nothing;
//! PostgreSQL URLs are pointed to `pg_dump`.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use sessionstore_client::v1 as pb;
use sqlx::Connection as _;

use crate::support::{
    ServerProcess, all_messages, connect, content, create, exchange, exchange_request,
    sessionstore_binary,
};

const WRITERS: usize = 8;

fn session_of(writer: usize) -> String {
    format!("ses_backup_{writer}")
}

fn question(writer: usize, n: u64) -> String {
    format!("question {writer} {n} zebra{writer}x{n}")
}

fn request(writer: usize, n: u64) -> pb::AppendExchangeRequest {
    let mut request = exchange_request(
        &session_of(writer),
        &question(writer, n),
        &format!("answer {writer} {n}"),
    );
    request.request_id = format!("req-{writer}-{n}");
    request
}

/// Runs `sessionstore ARGS`: exit status, stdout, stderr.
async fn run(binary: &Path, args: &[&str]) -> (std::process::ExitStatus, String, String) {
    let output = tokio::process::Command::new(binary)
        .args(args)
        .env_remove("SESSIONSTORE_DATABASE_URL")
        .output()
        .await
        .expect("run sessionstore");
    (
        output.status,
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

fn sqlite_url(path: &Path) -> String {
    format!("sqlite://{}", path.display())
}

/// The file names in `dir`, sorted.
fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("read dir")
        .map(|entry| {
            entry
                .expect("dir entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    names.sort();
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_under_writes_restores_every_exchange_acknowledged_before_it() {
    let binary = sessionstore_binary();
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::create_dir_all(dir.path().join("live")).expect("mkdir");
    let live = sqlite_url(&dir.path().join("live/sessions.db"));
    let mut server = ServerProcess::start(
        &binary,
        &live,
        "127.0.0.1:0",
        dir.path().join("live.log"),
        &[],
    )
    .await;
    let mut client = connect(&server.endpoint()).await;
    for writer in 0..WRITERS {
        create(&mut client, &session_of(writer)).await;
    }

    // Each writer appends one exchange after another; `acked[w]` is how
    // many of writer w's exchanges were acknowledged.
    let stop = Arc::new(AtomicBool::new(false));
    let acked: Arc<Vec<AtomicU64>> = Arc::new((0..WRITERS).map(|_| AtomicU64::new(0)).collect());
    let mut writers = Vec::new();
    for writer in 0..WRITERS {
        let mut client = connect(&server.endpoint()).await;
        let (stop, acked) = (Arc::clone(&stop), Arc::clone(&acked));
        writers.push(tokio::spawn(async move {
            let mut n = 0;
            while !stop.load(Ordering::SeqCst) {
                client
                    .append_exchange(request(writer, n))
                    .await
                    .expect("append exchange");
                n += 1;
                acked[writer].store(n, Ordering::SeqCst);
            }
        }));
    }
    crate::support::poll_until(
        "every writer acknowledged 10 exchanges",
        Duration::from_secs(60),
        || {
            let acked = Arc::clone(&acked);
            async move {
                acked
                    .iter()
                    .all(|a| a.load(Ordering::SeqCst) >= 10)
                    .then_some(())
            }
        },
    )
    .await;

    // What was acknowledged before the backup starts must be in it.
    let before: Vec<u64> = acked.iter().map(|a| a.load(Ordering::SeqCst)).collect();
    let backup_file = dir.path().join("backup.db");
    let backup_path = backup_file.to_string_lossy().into_owned();
    let (status, stdout, stderr) = run(
        &binary,
        &["backup", "--to", &backup_path, "--database-url", &live],
    )
    .await;
    let after: Vec<u64> = acked.iter().map(|a| a.load(Ordering::SeqCst)).collect();
    assert!(status.success(), "backup failed: {stderr}");
    assert!(
        stdout.starts_with("backed up ") && stdout.contains(&backup_path),
        "{stdout}"
    );
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    stop.store(true, Ordering::SeqCst);
    for writer in writers {
        writer.await.expect("writer");
    }
    println!(
        "acknowledged before the backup: {}, by its end: {}",
        before.iter().sum::<u64>(),
        after.iter().sum::<u64>()
    );
    server.terminate().await;

    // Restored into a fresh directory (created by restore).
    let restored_file = dir.path().join("fresh/restored/sessions.db");
    let restored = sqlite_url(&restored_file);
    let (status, stdout, stderr) = run(
        &binary,
        &[
            "restore",
            "--from",
            &backup_path,
            "--database-url",
            &restored,
        ],
    )
    .await;
    assert!(status.success(), "restore failed: {stderr}");
    assert!(stdout.starts_with("restored "), "{stdout}");
    {
        let mut conn = sqlx::SqliteConnection::connect(&format!("{restored}?mode=ro"))
            .await
            .expect("open the restored database");
        let check: String = sqlx::query_scalar("PRAGMA integrity_check")
            .fetch_one(&mut conn)
            .await
            .expect("integrity_check");
        assert_eq!(check, "ok");
        conn.close().await.expect("close");
    }
    assert_eq!(
        names_in(&dir.path().join("fresh/restored")),
        ["sessions.db"],
        "one file, no search index"
    );

    let server = ServerProcess::start(
        &binary,
        &restored,
        "127.0.0.1:0",
        dir.path().join("restored.log"),
        &[],
    )
    .await;
    let mut client = connect(&server.endpoint()).await;
    for (writer, &acknowledged) in before.iter().enumerate() {
        let messages = all_messages(&mut client, &session_of(writer)).await;
        let sequences: Vec<i64> = messages.iter().map(|m| m.sequence).collect();
        let first = sequences.first().copied().unwrap_or_default();
        assert_eq!(
            sequences,
            (first..first + sequences.len() as i64).collect::<Vec<_>>(),
            "writer {writer}: sequences gap-free"
        );
        // A consistent copy: a prefix of the writer's exchanges, at least
        // every one acknowledged before the backup started.
        let questions: Vec<&str> = messages
            .iter()
            .map(content)
            .filter(|text| text.starts_with("question "))
            .collect();
        let expected: Vec<String> = (0..questions.len() as u64)
            .map(|n| question(writer, n))
            .collect();
        assert_eq!(
            questions, expected,
            "writer {writer}: its exchanges in order"
        );
        assert!(
            questions.len() as u64 >= acknowledged,
            "writer {writer}: {} exchanges restored, {acknowledged} acknowledged before the backup",
            questions.len(),
        );
    }

    // The request ids came back too: a retry is answered, not stored twice.
    let count = all_messages(&mut client, &session_of(0)).await.len();
    client
        .append_exchange(request(0, 0))
        .await
        .expect("retry of an acknowledged request");
    assert_eq!(all_messages(&mut client, &session_of(0)).await.len(), count);

    // The search index is rebuilt from the restored messages.
    let word = format!("zebra5x{}", before[5] - 1);
    let hits = crate::support::poll_until(
        "a search finds a restored message",
        Duration::from_secs(60),
        || {
            let mut client = client.clone();
            let word = word.clone();
            async move {
                let response = client
                    .search_messages(pb::SearchMessagesRequest {
                        query: word,
                        page_size: 10,
                        ..Default::default()
                    })
                    .await
                    .ok()?
                    .into_inner();
                (!response.hits.is_empty()).then_some(response.hits)
            }
        },
    )
    .await;
    assert_eq!(hits.len(), 1, "{hits:?}");
    assert_eq!(hits[0].session_id, session_of(5));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restore_refuses_a_database_a_server_is_using() {
    let binary = sessionstore_binary();
    let dir = tempfile::tempdir().expect("temp dir");
    let live_dir = dir.path().join("live");
    std::fs::create_dir_all(&live_dir).expect("mkdir");
    let live = sqlite_url(&live_dir.join("sessions.db"));
    let mut server = ServerProcess::start(
        &binary,
        &live,
        "127.0.0.1:0",
        dir.path().join("live.log"),
        &[],
    )
    .await;
    let mut client = connect(&server.endpoint()).await;
    create(&mut client, "ses_backup_kept").await;
    exchange(&mut client, "ses_backup_kept", "before the backup", "one").await;

    let backup_file = dir.path().join("backup.db");
    let backup_path = backup_file.to_string_lossy().into_owned();
    let args = ["backup", "--to", &backup_path, "--database-url", &live];
    let (status, _, stderr) = run(&binary, &args).await;
    assert!(status.success(), "{stderr}");
    // An existing --to is refused without --force.
    let (status, _, stderr) = run(&binary, &args).await;
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("--force"), "{stderr}");
    let (status, _, stderr) = run(&binary, &[&args[..], &["--force"]].concat()).await;
    assert!(status.success(), "{stderr}");

    exchange(&mut client, "ses_backup_kept", "after the backup", "two").await;
    let files = names_in(&live_dir);
    let (status, stdout, stderr) = run(
        &binary,
        &["restore", "--from", &backup_path, "--database-url", &live],
    )
    .await;
    assert_eq!(status.code(), Some(1), "{stdout}{stderr}");
    assert!(stdout.is_empty(), "{stdout}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("in use"), "{stderr}");
    assert_eq!(names_in(&live_dir), files, "no file added or removed");
    // The server goes on serving all of it.
    exchange(&mut client, "ses_backup_kept", "after the refusal", "three").await;
    let questions: Vec<String> = all_messages(&mut client, "ses_backup_kept")
        .await
        .iter()
        .map(|m| content(m).to_owned())
        .collect();
    for text in ["before the backup", "after the backup", "after the refusal"] {
        assert!(questions.iter().any(|q| q == text), "{questions:?}");
    }

    // Stopped, the same database is replaced: back to the backup.
    server.terminate().await;
    let (status, stdout, stderr) = run(
        &binary,
        &["restore", "--from", &backup_path, "--database-url", &live],
    )
    .await;
    assert!(status.success(), "{stderr}");
    assert!(
        stdout.contains("-search"),
        "the old search file removed: {stdout}"
    );
    assert_eq!(names_in(&live_dir), ["sessions.db"]);
    let server = ServerProcess::start(
        &binary,
        &live,
        "127.0.0.1:0",
        dir.path().join("again.log"),
        &[],
    )
    .await;
    let mut client = connect(&server.endpoint()).await;
    let questions: Vec<String> = all_messages(&mut client, "ses_backup_kept")
        .await
        .iter()
        .map(|m| content(m).to_owned())
        .collect();
    assert!(questions.iter().any(|q| q == "before the backup"));
    assert!(!questions.iter().any(|q| q == "after the backup"));

    // Not a database: refused, saying so.
    let (status, _, stderr) = run(
        &binary,
        &[
            "restore",
            "--from",
            &dir.path().join("live.log").to_string_lossy(),
            "--database-url",
            &sqlite_url(&dir.path().join("other/sessions.db")),
        ],
    )
    .await;
    assert_eq!(status.code(), Some(1));
    assert!(
        stderr.contains("not a sessionstore SQLite database"),
        "{stderr}"
    );
    assert!(!dir.path().join("other/sessions.db").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_urls_are_pointed_to_pg_dump() {
    let binary = sessionstore_binary();
    let dir = tempfile::tempdir().expect("temp dir");
    let to = dir.path().join("backup.db").to_string_lossy().into_owned();
    let url = "postgres://sessionstore@127.0.0.1:5432/sessionstore";
    for args in [
        ["backup", "--to", &to, "--database-url", url],
        ["restore", "--from", &to, "--database-url", url],
    ] {
        let (status, stdout, stderr) = run(&binary, &args).await;
        assert_eq!(status.code(), Some(1), "{args:?}");
        assert!(stdout.is_empty(), "{stdout}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(
            stderr.contains("pg_dump") && stderr.contains("README"),
            "{stderr}"
        );
    }
    assert!(!dir.path().join("backup.db").exists());
}
