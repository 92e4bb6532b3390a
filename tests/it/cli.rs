//! The `sessionstore` binary's commands and configuration, run for real.

use std::process::Command;

use sqlx::Connection as _;

use crate::support::{PgDatabase, sessionstore_binary};

#[test]
fn migrate_creates_the_sqlite_schema_and_its_directory() {
    let binary = sessionstore_binary();
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("nested/dir/sessions.db");
    let output = Command::new(&binary)
        .args(["migrate", "--database-url"])
        .arg(format!("sqlite://{}", db.display()))
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    assert!(db.exists(), "migrate creates the file and its directory");

    // Idempotent, and configurable through the environment alone.
    let again = Command::new(&binary)
        .arg("migrate")
        .env(
            "SESSIONSTORE_DATABASE_URL",
            format!("sqlite://{}", db.display()),
        )
        .output()
        .unwrap();
    assert!(again.status.success(), "{again:?}");

    let runtime = tokio::runtime::Runtime::new().unwrap();
    let tables: Vec<String> = runtime.block_on(async {
        let mut conn = sqlx::SqliteConnection::connect(&format!("sqlite://{}", db.display()))
            .await
            .unwrap();
        sqlx::query_scalar("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
            .fetch_all(&mut conn)
            .await
            .unwrap()
    });
    assert_core_tables(&tables);
}

/// The README's form: plain `sessionstore` with serve's flags serves.
#[tokio::test]
async fn plain_sessionstore_with_serve_flags_serves() {
    let binary = sessionstore_binary();
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/plain.db", dir.path().display());
    let mut child = tokio::process::Command::new(&binary)
        .args(["--listen", "127.0.0.1:0", "--database-url", &url])
        .env_remove("SESSIONSTORE_AUTH_TOKENS")
        .env("NO_COLOR", "1")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut lines = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(stdout));
    let serving = tokio::time::timeout(std::time::Duration::from_secs(30), async {
        while let Ok(Some(line)) = lines.next_line().await {
            if line.contains("sessionstore serving") {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(
        serving,
        Ok(true),
        "plain `sessionstore --listen … --database-url …` serves"
    );
    child.kill().await.unwrap();
}

/// An unreachable PostgreSQL at start: a quick exit that says where and why.
#[tokio::test]
async fn an_unreachable_postgres_at_start_names_host_and_cause() {
    let binary = sessionstore_binary();
    // A port nothing listens on: bound, then released.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("postgres://postgres@127.0.0.1:{port}/nowhere");
    let started = std::time::Instant::now();
    let output = tokio::time::timeout(
        std::time::Duration::from_secs(20),
        tokio::process::Command::new(&binary)
            .args(["serve", "--listen", "127.0.0.1:0", "--database-url", &url])
            .env("NO_COLOR", "1")
            .output(),
    )
    .await
    .expect("the server gives up quickly")
    .unwrap();
    assert!(!output.status.success());
    assert!(
        started.elapsed() < std::time::Duration::from_secs(10),
        "took {:?}",
        started.elapsed()
    );
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        text.contains(&format!("127.0.0.1:{port}")) && text.to_lowercase().contains("refused"),
        "names the host and the cause: {text}"
    );
}

async fn migrate_creates_the_postgres_schema() {
    let binary = sessionstore_binary();
    let db = PgDatabase::create().await;
    let output = tokio::process::Command::new(&binary)
        .args(["migrate", "--database-url", &db.url])
        .output()
        .await
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let mut conn = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT table_name::text FROM information_schema.tables WHERE table_schema = 'public'",
    )
    .fetch_all(&mut conn)
    .await
    .unwrap();
    // Large bodies are compressed with lz4 where the server has it.
    let lz4: bool = sqlx::query_scalar(
        "SELECT 'lz4' = ANY (enumvals) FROM pg_settings WHERE name = 'default_toast_compression'",
    )
    .fetch_one(&mut conn)
    .await
    .unwrap();
    let compression: Vec<String> = sqlx::query_scalar(
        "SELECT attrelid::regclass::text || '.' || attname || '=' || attcompression::text
         FROM pg_attribute
         WHERE (attrelid::regclass::text, attname) IN
               (('events', 'body'), ('events', 'wire'), ('messages', 'body'),
                ('message_search', 'words'))
         ORDER BY 1",
    )
    .fetch_all(&mut conn)
    .await
    .unwrap();
    let method = if lz4 { "l" } else { "" };
    assert_eq!(
        compression,
        [
            format!("events.body={method}"),
            format!("events.wire={method}"),
            format!("message_search.words={method}"),
            format!("messages.body={method}"),
        ]
    );
    conn.close().await.unwrap();
    assert_core_tables(&tables);
}

#[test]
fn an_unsupported_database_url_fails_at_start_with_a_clear_message() {
    let output = Command::new(sessionstore_binary())
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--database-url",
            "mysql://x/y",
        ])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let log = String::from_utf8_lossy(&output.stdout) + String::from_utf8_lossy(&output.stderr);
    assert!(log.contains("unsupported database URL"), "{log}");
}

#[test]
fn help_names_every_setting_and_its_environment_variable() {
    let output = Command::new(sessionstore_binary())
        .args(["serve", "--help"])
        .output()
        .unwrap();
    assert!(output.status.success());
    let help = String::from_utf8_lossy(&output.stdout);
    for name in [
        "--listen",
        "SESSIONSTORE_LISTEN",
        "SESSIONSTORE_LOG",
        "--database-url",
        "SESSIONSTORE_DATABASE_URL",
        "127.0.0.1:50051",
        "sqlite://data/sessionstore.db",
    ] {
        assert!(help.contains(name), "{name} missing from help:\n{help}");
    }
}

/// The schema holds every table the core service needs.
fn assert_core_tables(tables: &[String]) {
    for table in [
        "events",
        "idempotency_keys",
        "messages",
        "provider_calls",
        "sessions",
    ] {
        assert!(
            tables.iter().any(|t| t == table),
            "{table} missing from {tables:?}"
        );
    }
}

mod sessions {
    //! `sessionstore sessions …` against a real server.

    use std::process::Stdio;

    use sessionstore_client::v1 as pb;
    use tokio::io::{AsyncBufReadExt as _, BufReader};
    use tonic::Code;

    use crate::support::{
        Backend, TestServer, all_messages, create, create_owned, exchange_request,
        sessionstore_binary,
    };

    async fn sessions(server: &TestServer, args: &[&str]) -> (bool, String, String) {
        let output = tokio::process::Command::new(sessionstore_binary())
            .arg("sessions")
            .args(["--server", &server.endpoint()])
            .args(args)
            .env("NO_COLOR", "1")
            .output()
            .await
            .unwrap();
        (
            output.status.success(),
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    }

    /// Common failures read as one line that says what to do.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn errors_are_one_readable_line() {
        let server = TestServer::start(Backend::File).await;
        let (ok, _, err) = sessions(&server, &["show", "ses_nope"]).await;
        assert!(!ok);
        assert_eq!(err.trim(), "sessionstore: session \"ses_nope\" not found");
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("nope.json");
        let (ok, _, _) = sessions(
            &server,
            &["export", "ses_nope", "-o", &file.display().to_string()],
        )
        .await;
        assert!(!ok && !file.exists(), "no empty file for a missing session");

        // HOST:PORT, as --listen takes it, is accepted.
        let output = tokio::process::Command::new(sessionstore_binary())
            .args(["sessions", "--server", &server.addr.to_string(), "list"])
            .env("NO_COLOR", "1")
            .output()
            .await
            .unwrap();
        assert!(output.status.success(), "{output:?}");

        // Nobody listening: where, why, and what to check.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let output = tokio::process::Command::new(sessionstore_binary())
            .args(["sessions", "--server", &format!("127.0.0.1:{port}"), "list"])
            .env("NO_COLOR", "1")
            .output()
            .await
            .unwrap();
        assert_eq!(output.status.code(), Some(1));
        let err = String::from_utf8_lossy(&output.stderr);
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(
            err.starts_with(&format!(
                "sessionstore: cannot reach the server at http://127.0.0.1:{port} (Connection refused"
            )) && err.contains("--server URL"),
            "{err}"
        );
        server.stop().await.unwrap();
    }

    /// A first stored exchange from the terminal alone: create, append, show.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn create_and_append_without_writing_a_client() {
        let server = TestServer::start(Backend::File).await;
        let (ok, id, err) = sessions(
            &server,
            &["create", "--title", "First", "--system-prompt", "Be brief."],
        )
        .await;
        assert!(ok, "{err}");
        let id = id.trim().to_owned();
        assert!(id.starts_with("ses_"), "{id}");
        let (ok, out, err) = sessions(
            &server,
            &[
                "append",
                &id,
                "--user",
                "What is 2+2?",
                "--assistant",
                "4",
                "--model",
                "openai/gpt-4o",
                "--tokens",
                "12,1",
                "--cost-micros-usd",
                "85",
            ],
        )
        .await;
        assert!(ok, "{err}");
        assert_eq!(
            out.trim(),
            format!("appended to {id}: sequences 0..1 (revision 2)")
        );
        let (ok, out, err) = sessions(&server, &["append", &id, "--user", "Thanks"]).await;
        assert!(ok, "{err}");
        assert_eq!(
            out.trim(),
            format!("appended to {id}: sequences 2..2 (revision 3)")
        );

        let mut client = server.client().await;
        let messages = all_messages(&mut client, &id).await;
        let texts: Vec<&str> = messages
            .iter()
            .map(|m| m.message.as_ref().unwrap().content.as_str())
            .collect();
        assert_eq!(texts, ["What is 2+2?", "4", "Thanks"]);
        assert!(!messages[1].produced_by_call_id.is_empty());
        let calls = client
            .list_provider_calls(pb::ListProviderCallsRequest {
                session_id: id.clone(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
            .provider_calls;
        assert_eq!(calls.len(), 1);
        assert_eq!(
            (
                calls[0].provider.as_str(),
                calls[0].model.as_str(),
                calls[0].prompt_tokens,
                calls[0].completion_tokens,
                calls[0].cost_micros_usd
            ),
            ("openai", "gpt-4o", 12, 1, 85)
        );

        // An answer needs the call that produced it, and bad shapes are named.
        let (ok, _, err) =
            sessions(&server, &["append", &id, "--user", "x", "--assistant", "y"]).await;
        assert!(!ok && err.contains("--model"), "{err}");
        let (ok, _, err) = sessions(
            &server,
            &["append", &id, "--user", "x", "--model", "gpt-4o"],
        )
        .await;
        assert!(!ok && err.contains("PROVIDER/MODEL"), "{err}");
        server.stop().await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn list_show_export_import_delete() {
        let server = TestServer::start(Backend::File).await;
        let mut client = server.client().await;
        create(&mut client, "cli-1").await;
        let mut exchange = exchange_request("cli-1", "What is 2+2?", "4");
        exchange.response_messages[0].content_blocks = vec![pb::ContentBlock {
            block: Some(pb::content_block::Block::Thinking(pb::ThinkingBlock {
                thinking: "adding".into(),
                signature: "c2lnbmVk".into(),
            })),
        }];
        exchange.messages[0]
            .metadata
            .insert("lang".into(), "en".into());
        client.append_exchange(exchange).await.unwrap();

        let (ok, table, err) = sessions(&server, &["list"]).await;
        assert!(ok, "{err}");
        let mut lines = table.lines();
        let header = lines.next().unwrap();
        for column in ["ID", "TITLE", "USER", "MESSAGES", "COST", "UPDATED"] {
            assert!(header.contains(column), "{table}");
        }
        let row = lines.next().unwrap();
        for value in ["cli-1", "title of cli-1", "alice", "2", "$0.000042"] {
            assert!(row.contains(value), "{value} missing from {row:?}");
        }

        let (ok, shown, err) = sessions(&server, &["show", "cli-1"]).await;
        assert!(ok, "{err}");
        for part in [
            "# title of cli-1",
            "revision  2",
            "What is 2+2?",
            "adding",
            "You are terse.",
        ] {
            assert!(shown.contains(part), "{part:?} missing from\n{shown}");
        }
        assert!(!shown.contains("\x1b["), "no colour with NO_COLOR");

        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("cli-1.json");
        let (ok, _, err) = sessions(
            &server,
            &[
                "export",
                "cli-1",
                "--format",
                "json",
                "--output",
                file.to_str().unwrap(),
            ],
        )
        .await;
        assert!(ok, "{err}");
        let (ok, imported, err) = sessions(
            &server,
            &["import", file.to_str().unwrap(), "--id", "cli-2"],
        )
        .await;
        assert!(ok, "{err}");
        assert!(
            imported.contains("imported cli-2: 2 messages"),
            "{imported}"
        );
        let original: Vec<_> = all_messages(&mut client, "cli-1")
            .await
            .into_iter()
            .map(|m| m.message)
            .collect();
        let copy: Vec<_> = all_messages(&mut client, "cli-2")
            .await
            .into_iter()
            .map(|m| m.message)
            .collect();
        assert_eq!(copy, original, "the JSON export re-imports losslessly");
        let copied = crate::support::get(&mut client, "cli-2").await;
        assert_eq!(copied.system_prompt, "You are terse.");
        assert_eq!(copied.title, "title of cli-1");

        let (ok, markdown, err) =
            sessions(&server, &["export", "cli-1", "--format", "markdown"]).await;
        assert!(ok, "{err}");
        assert!(markdown.starts_with("# title of cli-1"), "{markdown}");
        let (ok, openai, err) = sessions(&server, &["export", "cli-1", "--format", "openai"]).await;
        assert!(ok, "{err}");
        let openai: serde_json::Value = serde_json::from_str(&openai).unwrap();
        assert_eq!(openai.as_array().map(Vec::len), Some(3), "{openai}");

        let (ok, said, err) = sessions(&server, &["delete", "cli-2"]).await;
        assert!(ok, "{err}");
        assert!(said.contains("deleted cli-2"));
        let gone = client
            .get_session(pb::GetSessionRequest {
                session_id: "cli-2".into(),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(gone.code(), Code::NotFound);

        let (ok, _, err) = sessions(&server, &["show", "nope"]).await;
        assert!(!ok, "an unknown session is an error");
        assert!(err.contains("nope"), "{err}");
        server.stop().await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn usage_is_a_table_of_sums() {
        let server = TestServer::start(Backend::Memory).await;
        let mut client = server.client().await;
        for (id, owner, model, prompt, cached, cost) in [
            ("u1", "alice", "gpt-4o", 100, 40, 1_500),
            ("u2", "alice", "claude", 300, 0, 2_000),
            ("u3", "bob", "gpt-4o", 50, 10, 500),
        ] {
            create_owned(&mut client, id, owner).await;
            let mut request = exchange_request(id, "q", "a");
            request.provider_call = Some(pb::ProviderCall {
                provider: "p".into(),
                model: model.into(),
                prompt_tokens: prompt,
                cached_input_tokens: cached,
                completion_tokens: 10,
                cost_micros_usd: cost,
                ..Default::default()
            });
            client.append_exchange(request).await.unwrap();
        }
        let (ok, out, err) = sessions(&server, &["usage", "--by", "model", "--since", "1d"]).await;
        assert!(ok, "{err}");
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 3, "{out}");
        assert!(lines[0].starts_with("MODEL"), "{out}");
        let cells = |line: &str| {
            line.split_whitespace()
                .map(str::to_owned)
                .collect::<Vec<_>>()
        };
        assert_eq!(
            cells(lines[1]),
            ["p/claude", "1", "300", "0", "0", "10", "0", "$0.002000"]
        );
        assert_eq!(
            cells(lines[2]),
            ["p/gpt-4o", "2", "150", "50", "0", "20", "0", "$0.002000"]
        );
        let (ok, out, _) = sessions(&server, &["usage", "--user", "bob"]).await;
        assert!(ok);
        assert!(out.lines().nth(1).unwrap().starts_with("all "), "{out}");
        assert!(out.contains("$0.000500"), "{out}");
        let (ok, _, err) = sessions(&server, &["usage", "--since", "soon"]).await;
        assert!(!ok);
        assert!(
            err.contains("neither a date (YYYY-MM-DD) nor an age"),
            "{err}"
        );
        server.stop().await.unwrap();
    }

    /// `erase-user` asks for the name again; a wrong answer erases nothing.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn erase_user_asks_first() {
        use tokio::io::AsyncWriteExt as _;
        let server = TestServer::start(Backend::File).await;
        let mut client = server.client().await;
        create_owned(&mut client, "franks", "frank").await;
        client
            .append_exchange(exchange_request("franks", "hello", "hi"))
            .await
            .unwrap();
        create_owned(&mut client, "gails", "gail").await;

        // No answer (stdin empty): nothing erased.
        let (ok, _, err) = sessions(&server, &["erase-user", "frank"]).await;
        assert!(!ok);
        assert!(err.contains("Type the user's name to go on"), "{err}");
        assert!(err.contains("nothing erased"), "{err}");
        crate::support::get(&mut client, "franks").await;

        let mut child = tokio::process::Command::new(sessionstore_binary())
            .args([
                "sessions",
                "--server",
                &server.endpoint(),
                "erase-user",
                "frank",
            ])
            .env("NO_COLOR", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(b"frank\n").await.unwrap();
        drop(stdin);
        let output = child.wait_with_output().await.unwrap();
        assert!(output.status.success(), "{output:?}");
        assert_eq!(
            String::from_utf8_lossy(&output.stdout).trim(),
            "erased user frank: 1 sessions, 2 messages, 1 provider calls"
        );
        let status = client
            .get_session(pb::GetSessionRequest {
                session_id: "franks".into(),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::NotFound);

        // --yes does not ask; --scope erases a shared scope too.
        client
            .set_state(pb::SetStateRequest {
                scope: "user:app:gail".into(),
                key: "k".into(),
                value: "v".into(),
                ..Default::default()
            })
            .await
            .unwrap();
        let (ok, out, err) = sessions(
            &server,
            &["erase-user", "gail", "--scope", "user:app:gail", "--yes"],
        )
        .await;
        assert!(ok, "{err}");
        assert!(out.starts_with("erased user gail: 1 sessions"), "{out}");
        let status = client
            .get_state(pb::GetStateRequest {
                scope: "user:app:gail".into(),
                key: "k".into(),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::NotFound);
        server.stop().await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn watch_tails_a_session_until_it_is_deleted() {
        let server = TestServer::start(Backend::Memory).await;
        let mut client = server.client().await;
        create(&mut client, "tail").await;
        let mut child = tokio::process::Command::new(sessionstore_binary())
            .args(["sessions", "--server", &server.endpoint(), "watch", "tail"])
            .env("NO_COLOR", "1")
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut next = async || lines.next_line().await.unwrap().expect("watch ended early");
        assert!(next().await.contains("session_created"));
        assert!(next().await.contains("caught_up"));
        // A run's text streams onto one line; `sessions cancel` stops it.
        for (index, text) in [(0, "Hel"), (1, "lo")] {
            client
                .publish_delta(pb::PublishDeltaRequest {
                    session_id: "tail".into(),
                    run_id: "r1".into(),
                    index,
                    delta: Some(pb::publish_delta_request::Delta::Text(text.into())),
                })
                .await
                .unwrap();
        }
        let (ok, said, err) = sessions(
            &server,
            &["cancel", "tail", "r1", "--reason", "user pressed stop"],
        )
        .await;
        assert!(ok, "{err}");
        assert!(said.contains("asked run r1 of tail to stop"), "{said}");
        let streamed = next().await;
        assert!(streamed.ends_with("delta  r1: Hello"), "{streamed}");
        let cancelled = next().await;
        assert!(
            cancelled.contains("run_cancel_requested  r1 user pressed stop"),
            "{cancelled}"
        );
        // Not an active run: the error says so, in one line.
        let (ok, _, said) = sessions(&server, &["cancel", "tail", "r9"]).await;
        assert!(!ok);
        assert!(said.contains("not active"), "{said}");
        client
            .append_exchange(exchange_request("tail", "live question", "live answer"))
            .await
            .unwrap();
        let appended = next().await;
        assert!(appended.contains("exchange_appended"), "{appended}");
        assert!(appended.contains("user: live question"), "{appended}");
        assert!(appended.contains("assistant: live answer"), "{appended}");
        client
            .delete_session(pb::DeleteSessionRequest {
                session_id: "tail".into(),
            })
            .await
            .unwrap();
        assert!(next().await.contains("session_deleted"));
        let status = child.wait().await.unwrap();
        assert!(
            status.success(),
            "watch ends cleanly when the session is deleted"
        );
        server.stop().await.unwrap();
    }
}

crate::postgres_tests!(migrate_creates_the_postgres_schema,);
