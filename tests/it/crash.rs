//! Durability: the real `sessionstore` binary, killed with SIGKILL while
//! appends are in flight, keeps every acknowledged exchange.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sessionstore_client::SessionStoreClient;
use sessionstore_client::v1 as pb;
use tokio::process::{Child, Command};
use tonic::transport::{Channel, Endpoint};

use crate::support::{all_messages, assistant, call, sessionstore_binary, user, watch};

/// Copies the server's log (stdout) lines to `path`, and sends the port from the
/// `sessionstore serving` line once it appears.
async fn copy_log(
    output: tokio::process::ChildStdout,
    path: PathBuf,
    ready: tokio::sync::oneshot::Sender<u16>,
) {
    use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _};
    let mut file = tokio::fs::File::create(&path).await.expect("log file");
    let mut lines = tokio::io::BufReader::new(output).lines();
    let mut ready = Some(ready);
    while let Ok(Some(line)) = lines.next_line().await {
        let _ = file.write_all(format!("{line}\n").as_bytes()).await;
        let _ = file.flush().await;
        if line.contains("sessionstore serving")
            && let Some(port) = bound_port(&line)
            && let Some(ready) = ready.take()
        {
            let _ = ready.send(port);
        }
    }
}

/// The port in a log line's `127.0.0.1:PORT`.
fn bound_port(line: &str) -> Option<u16> {
    let (_, rest) = line.split_once("127.0.0.1:")?;
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// A running `sessionstore serve` child process.
struct Instance {
    child: Child,
    endpoint: String,
}

impl Instance {
    /// Starts the binary on an ephemeral port and waits for its ready signal:
    /// the `sessionstore serving` log line, which names the bound address.
    /// Its listener is bound by then, so connections are accepted.
    async fn start(binary: &Path, database_url: &str, log_dir: &Path, n: usize) -> Instance {
        let log = log_dir.join(format!("server-{n}.log"));
        let mut child = Command::new(binary)
            .args([
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--database-url",
                database_url,
            ])
            .env_remove("SESSIONSTORE_AUTH_TOKENS")
            .env("SESSIONSTORE_LOG", "info")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn sessionstore");
        let output = child.stdout.take().expect("piped stdout");
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        tokio::spawn(copy_log(output, log.clone(), ready_tx));
        let port = match tokio::time::timeout(Duration::from_secs(30), ready_rx).await {
            Ok(Ok(port)) => port,
            _ => {
                let log = std::fs::read_to_string(&log).unwrap_or_default();
                panic!("sessionstore never became ready\n--- server log ---\n{log}");
            }
        };
        Instance {
            child,
            endpoint: format!("http://127.0.0.1:{port}"),
        }
    }

    async fn try_client(&self) -> Result<SessionStoreClient<Channel>, tonic::transport::Error> {
        let channel = Endpoint::from_shared(self.endpoint.clone())?
            .connect_timeout(Duration::from_secs(2))
            .timeout(Duration::from_secs(10))
            .connect()
            .await?;
        Ok(SessionStoreClient::new(channel))
    }

    async fn client(&self) -> SessionStoreClient<Channel> {
        self.try_client().await.expect("connect to sessionstore")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_keeps_every_acknowledged_exchange() {
    const WRITERS: usize = 4;
    const KILL_AFTER: usize = 200;
    let binary = tokio::task::spawn_blocking(sessionstore_binary)
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let database_url = format!("sqlite://{}/db.sqlite", dir.path().display());

    let mut server = Instance::start(&binary, &database_url, dir.path(), 1).await;
    let mut client = server.client().await;
    let session_id = client
        .create_session(pb::CreateSessionRequest {
            session_id: "ses_crash".into(),
            title: "crash".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .id;

    let acked: Arc<Mutex<Vec<pb::AppendExchangeResponse>>> = Arc::default();
    let (enough_tx, mut enough_rx) = tokio::sync::watch::channel(0_usize);
    let enough_tx = Arc::new(enough_tx);
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let mut client = server.client().await;
        let id = session_id.clone();
        let acked = Arc::clone(&acked);
        let enough_tx = Arc::clone(&enough_tx);
        writers.push(tokio::spawn(async move {
            let mut i = 0_usize;
            loop {
                let answer = client
                    .append_exchange(pb::AppendExchangeRequest {
                        session_id: id.clone(),
                        messages: vec![user(&format!("w{w} q{i}"))],
                        provider_call: Some(call("gpt-crash", 3, 4, 5)),
                        response_messages: vec![assistant(&format!("w{w} a{i}"))],
                        ..Default::default()
                    })
                    .await;
                match answer {
                    Ok(response) => {
                        let count = {
                            let mut acked = acked.lock().unwrap();
                            acked.push(response.into_inner());
                            acked.len()
                        };
                        enough_tx.send_replace(count);
                    }
                    // The server is gone: stop.
                    Err(_) => return i,
                }
                i += 1;
                assert!(i < 100_000, "the server was never killed");
            }
        }));
    }

    tokio::time::timeout(
        Duration::from_secs(120),
        enough_rx.wait_for(|count| *count >= KILL_AFTER),
    )
    .await
    .expect("enough acknowledgements in time")
    .unwrap();
    server.child.kill().await.expect("SIGKILL sessionstore");
    for writer in writers {
        tokio::time::timeout(Duration::from_secs(60), writer)
            .await
            .expect("writers notice the dead server")
            .unwrap();
    }
    let acked = std::mem::take(&mut *acked.lock().unwrap());
    assert!(acked.len() >= KILL_AFTER);

    // Restart on the same database.
    let server = Instance::start(&binary, &database_url, dir.path(), 2).await;
    let mut client = server.client().await;
    let stored = all_messages(&mut client, &session_id).await;

    // Contiguous from 0, whole exchanges only.
    let sequences: Vec<i64> = stored.iter().map(|m| m.sequence).collect();
    let expected: Vec<i64> = (0..i64::try_from(stored.len()).unwrap()).collect();
    assert_eq!(sequences, expected, "sequences must be contiguous from 0");
    assert_eq!(stored.len() % 2, 0, "a torn exchange survived the crash");
    for pair in stored.chunks(2) {
        let role = |m: &pb::StoredMessage| m.message.as_ref().map(|m| m.role);
        assert_eq!(role(&pair[0]), Some(pb::Role::User.into()));
        assert_eq!(role(&pair[1]), Some(pb::Role::Assistant.into()));
        assert!(!pair[1].produced_by_call_id.is_empty());
    }

    // Every acknowledged message is there, unchanged.
    for response in &acked {
        for m in &response.messages {
            let index = usize::try_from(m.sequence).unwrap();
            let found = stored.get(index);
            assert_eq!(
                found,
                Some(m),
                "acknowledged message {} (sequence {}) lost or changed",
                m.id,
                m.sequence
            );
        }
    }

    println!(
        "crash: {} exchanges acknowledged before SIGKILL, {} survived",
        acked.len(),
        stored.len() / 2
    );

    // The revision and the event log agree with the messages.
    let session = client
        .get_session(pb::GetSessionRequest {
            session_id: session_id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    let exchanges = i64::try_from(stored.len() / 2).unwrap();
    assert_eq!(session.revision, 1 + exchanges);
    let max_acked_revision = acked.iter().map(|r| r.revision).max().unwrap();
    assert!(session.revision >= max_acked_revision);

    let mut events = watch(&mut client, &session_id, 0).await;
    let mut replayed = Vec::new();
    loop {
        let event = tokio::time::timeout(Duration::from_secs(10), events.message())
            .await
            .expect("event in time")
            .unwrap()
            .expect("stream open");
        use pb::session_event::Event;
        match event.event {
            Some(Event::CaughtUp(_)) => {
                assert_eq!(event.revision, session.revision);
                break;
            }
            Some(Event::ExchangeAppended(appended)) => replayed.extend(appended.messages),
            Some(Event::SessionCreated(_)) => assert_eq!(event.revision, 1),
            other => panic!("unexpected event {other:?}"),
        }
    }
    assert_eq!(
        replayed, stored,
        "the event log matches the stored messages"
    );

    // The restarted server takes writes where the log ends.
    let next = client
        .append_exchange(pb::AppendExchangeRequest {
            session_id: session_id.clone(),
            messages: vec![user("after the crash")],
            expected_next_sequence: Some(i64::try_from(stored.len()).unwrap()),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(next.revision, session.revision + 1);
    drop(server);
}
