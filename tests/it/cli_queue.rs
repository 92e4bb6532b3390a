//! `sessionstore sessions submit`, `queue` and `withdraw` against a real
//! server: input appended at once or queued (each mode, what it prints),
//! the waiting inputs (table and JSON), withdrawals, refusals as one line
//! on stderr with exit code 1 (a usage error 2), and `sessions watch`
//! showing inputs queued, taken and withdrawn.

use std::time::Duration;

use futures_util::TryStreamExt as _;
use sessionstore_client::v1::{self as pb, Message};
use sessionstore_client::{Client, NewInput, NewSession};

use crate::support::{Backend, CliWatch, TestServer, sessions_cli, table_rows};

/// A lease no test outlives.
const LEASE: Duration = Duration::from_secs(600);

/// `sessionstore sessions --server … ARGS`: exit code, stdout, stderr.
async fn sessions(server: &TestServer, args: &[&str]) -> (Option<i32>, String, String) {
    sessions_cli(&server.endpoint(), args).await
}

/// `sessions submit` that must succeed: its one line.
async fn submit(server: &TestServer, args: &[&str]) -> String {
    let mut all = vec!["submit"];
    all.extend_from_slice(args);
    let (code, out, err) = sessions(server, &all).await;
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(out.lines().count(), 1, "{out}");
    out.trim().to_owned()
}

/// The input id of a `queued inp_… at position …` line.
fn queued_id(line: &str) -> String {
    let id = line
        .strip_prefix("queued ")
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("not a queued line: {line}"));
    assert!(id.starts_with("inp_"), "{line}");
    id.to_owned()
}

async fn waiting(client: &Client, session_id: &str) -> Vec<pb::QueuedInput> {
    client
        .list_queued_inputs(session_id)
        .try_collect()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn input_is_submitted_listed_and_withdrawn_from_the_terminal() {
    let server = TestServer::start(Backend::File).await;
    let client = Client::connect(server.endpoint()).await.unwrap();
    client
        .create_session(NewSession::new().id("ses_cli"))
        .await
        .unwrap();

    // Not busy: appended at once.
    assert_eq!(
        submit(&server, &["ses_cli", "--text", "hello"]).await,
        "appended to ses_cli at once (not busy): sequences 0..0 (revision 2)"
    );
    assert_eq!(
        submit(
            &server,
            &["ses_cli", "--text", "a", "--text", "b", "--mode", "reject"]
        )
        .await,
        "appended to ses_cli at once (not busy): sequences 1..2 (revision 3)"
    );

    // A run holds the lease: queued, with its id and position.
    let mut run = client.begin_run("ses_cli", "run_a", LEASE).await.unwrap();
    let said = submit(&server, &["ses_cli", "--text", "one"]).await;
    let one = queued_id(&said);
    assert_eq!(
        said,
        format!("queued {one} at position 1 of ses_cli (revision 5)")
    );
    let said = submit(
        &server,
        &[
            "ses_cli", "--text", "two a", "--text", "two b", "--mode", "queue",
        ],
    )
    .await;
    let two = queued_id(&said);
    assert_eq!(
        said,
        format!("queued {two} at position 2 of ses_cli (revision 6)")
    );
    // An interrupt also asks the run to stop, and says which.
    let said = submit(
        &server,
        &["ses_cli", "--text", "stop that", "--mode", "interrupt"],
    )
    .await;
    let three = queued_id(&said);
    assert_eq!(
        said,
        format!("queued {three} at position 3 of ses_cli (revision 8); asked run run_a to stop")
    );
    assert!(
        run.publish_text("x").await.unwrap(),
        "the run was asked to stop"
    );
    let queued = waiting(&client, "ses_cli").await;
    let texts: Vec<Vec<&str>> = queued
        .iter()
        .map(|input| input.messages.iter().map(|m| m.content.as_str()).collect())
        .collect();
    assert_eq!(
        texts,
        [vec!["one"], vec!["two a", "two b"], vec!["stop that"]]
    );
    assert_eq!(queued[2].mode(), pb::InputMode::Interrupt);
    assert_eq!(client.export_history("ses_cli").await.unwrap().len(), 3);

    // Reject while busy: refused, saying why; nothing written.
    let (code, out, err) = sessions(
        &server,
        &["submit", "ses_cli", "--text", "no", "--mode", "reject"],
    )
    .await;
    assert_eq!(code, Some(1));
    assert!(out.is_empty(), "{out}");
    assert_eq!(
        err.trim(),
        "sessionstore: ses_cli is busy (run run_a holds it): nothing submitted (--mode reject)"
    );
    assert_eq!(client.get_session("ses_cli").await.unwrap().revision, 8);

    // The waiting inputs, by position, under a header.
    let (code, table, err) = sessions(&server, &["queue", "ses_cli"]).await;
    assert_eq!(code, Some(0), "{err}");
    let header = table.lines().next().unwrap();
    for column in ["POSITION", "ID", "MODE", "MESSAGES", "TEXT", "QUEUED"] {
        assert!(header.contains(column), "{column} missing from\n{table}");
    }
    let firsts: Vec<Vec<String>> = table_rows(&table)
        .into_iter()
        .map(|row| row.into_iter().take(5).collect())
        .collect();
    let expected: Vec<Vec<String>> = [
        ["1", one.as_str(), "queue", "1", "one"],
        ["2", two.as_str(), "queue", "2", "two"],
        ["3", three.as_str(), "interrupt", "1", "stop"],
    ]
    .iter()
    .map(|row| row.iter().map(|cell| (*cell).to_owned()).collect())
    .collect();
    assert_eq!(firsts, expected, "{table}");
    assert!(
        table.lines().nth(3).unwrap().contains("stop that"),
        "{table}"
    );

    // JSON: one array, every field, messages as an export holds them.
    let (code, json, err) = sessions(&server, &["queue", "ses_cli", "--format", "json"]).await;
    assert_eq!(code, Some(0), "{err}");
    let json: serde_json::Value = serde_json::from_str(&json).unwrap();
    let items = json.as_array().unwrap();
    assert_eq!(items.len(), 3, "{json}");
    assert_eq!(items[1]["input_id"], two.as_str());
    assert_eq!(items[1]["session_id"], "ses_cli");
    assert_eq!(items[1]["position"], 2);
    assert_eq!(items[1]["mode"], "queue");
    assert_eq!(
        items[1]["messages"],
        serde_json::json!([
            {"role": "user", "content": "two a"},
            {"role": "user", "content": "two b"},
        ])
    );
    assert!(items[1]["create_time"].is_string(), "{json}");
    assert_eq!(items[2]["mode"], "interrupt");

    // Withdrawn: one line, the revision; gone from the queue.
    let (code, said, err) = sessions(&server, &["withdraw", "ses_cli", &two]).await;
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(
        said.trim(),
        format!("withdrew {two} from ses_cli (revision 9)")
    );
    let ids: Vec<String> = waiting(&client, "ses_cli")
        .await
        .into_iter()
        .map(|input| input.input_id)
        .collect();
    assert_eq!(ids, [one.clone(), three.clone()]);

    // Refusals: one line on stderr, exit code 1.
    client.take_queued_input("ses_cli", "run_a").await.unwrap();
    let (code, out, err) = sessions(&server, &["withdraw", "ses_cli", &one]).await;
    assert_eq!(code, Some(1));
    assert!(out.is_empty(), "{out}");
    assert_eq!(
        err.trim(),
        format!(
            "sessionstore: input {one} of ses_cli was already taken into the history: too late to withdraw"
        )
    );
    let (code, _, err) = sessions(&server, &["withdraw", "ses_cli", "inp_nope"]).await;
    assert_eq!(code, Some(1));
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.starts_with("sessionstore: ") && err.contains("inp_nope"),
        "{err}"
    );
    for args in [
        &["queue", "ses_nope"][..],
        &["submit", "ses_nope", "--text", "hi"],
        &["withdraw", "ses_nope", &three],
    ] {
        let (code, _, err) = sessions(&server, args).await;
        assert_eq!(code, Some(1), "{args:?}");
        assert_eq!(
            err.trim(),
            "sessionstore: session \"ses_nope\" not found",
            "{args:?}"
        );
    }

    // Usage errors: exit code 2, naming what is wrong.
    let (code, _, err) = sessions(&server, &["submit", "ses_cli"]).await;
    assert_eq!(code, Some(2));
    assert!(err.contains("--text"), "{err}");
    let (code, _, err) = sessions(
        &server,
        &["submit", "ses_cli", "--text", "x", "--mode", "maybe"],
    )
    .await;
    assert_eq!(code, Some(2));
    assert!(
        err.contains("queue") && err.contains("interrupt") && err.contains("reject"),
        "{err}"
    );
    let (code, _, err) = sessions(&server, &["withdraw", "ses_cli"]).await;
    assert_eq!(code, Some(2));
    assert!(err.contains("INPUT"), "{err}");

    // The run ends without taking the rest: still busy with waiting input.
    run.discard().await.unwrap();
    let (code, _, err) = sessions(
        &server,
        &["submit", "ses_cli", "--text", "no", "--mode", "reject"],
    )
    .await;
    assert_eq!(code, Some(1));
    assert_eq!(
        err.trim(),
        "sessionstore: ses_cli is busy (inputs wait in its queue): nothing submitted (--mode reject)"
    );
    // Interrupting with no run holding the lease names none.
    let said = submit(
        &server,
        &["ses_cli", "--text", "again", "--mode", "interrupt"],
    )
    .await;
    let four = queued_id(&said);
    assert!(said.starts_with(&format!(
        "queued {four} at position 4 of ses_cli (revision "
    )));
    assert!(!said.contains("asked run"), "{said}");

    // Emptied: the header, and a line saying so; JSON, an empty array.
    for input in [&three, &four] {
        client
            .withdraw_queued_input("ses_cli", input.as_str())
            .await
            .unwrap();
    }
    let (code, table, err) = sessions(&server, &["queue", "ses_cli"]).await;
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(table.lines().count(), 2, "{table}");
    assert_eq!(table.lines().nth(1), Some("(no inputs waiting)"));
    let (code, json, _) = sessions(&server, &["queue", "ses_cli", "--format", "json"]).await;
    assert_eq!(code, Some(0));
    assert_eq!(json.trim(), "[]");
    server.stop().await.unwrap();
}

/// A full queue is refused, saying how full and what to do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_says_so() {
    let server = TestServer::start(Backend::Memory).await;
    let client = Client::connect(server.endpoint()).await.unwrap();
    client
        .create_session(NewSession::new().id("ses_full"))
        .await
        .unwrap();
    let _run = client.begin_run("ses_full", "run_a", LEASE).await.unwrap();
    for i in 0..100 {
        let input = NewInput::new("ses_full").message(Message::user(format!("wait {i}")));
        assert!(client.submit_input(&input).await.unwrap().queued);
    }
    let (code, out, err) = sessions(&server, &["submit", "ses_full", "--text", "more"]).await;
    assert_eq!(code, Some(1));
    assert!(out.is_empty(), "{out}");
    assert_eq!(
        err.trim(),
        "sessionstore: the queue of ses_full is full (100 inputs wait): nothing submitted; \
         withdraw one, or wait until the run takes some"
    );
    let (code, table, err) = sessions(&server, &["queue", "ses_full"]).await;
    assert_eq!(code, Some(0), "{err}");
    let positions: Vec<String> = table_rows(&table)
        .into_iter()
        .map(|r| r[0].clone())
        .collect();
    let expected: Vec<String> = (1..=100).map(|p| p.to_string()).collect();
    assert_eq!(positions, expected, "every page, by position");
    server.stop().await.unwrap();
}

/// `sessions watch` prints inputs queued, taken and withdrawn on a line each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_shows_inputs_queued_taken_and_withdrawn() {
    let server = TestServer::start(Backend::Memory).await;
    let client = Client::connect(server.endpoint()).await.unwrap();
    client
        .create_session(NewSession::new().id("ses_tail"))
        .await
        .unwrap();
    let mut watch = CliWatch::start(&server.endpoint(), "ses_tail");
    assert!(watch.next_line().await.contains("session_created"));
    assert!(watch.next_line().await.contains("caught_up"));
    let _run = client.begin_run("ses_tail", "run_a", LEASE).await.unwrap();
    assert!(watch.next_line().await.contains("run_begun"));

    let said = submit(&server, &["ses_tail", "--text", "hi there"]).await;
    let first = queued_id(&said);
    let line = watch.next_line().await;
    assert!(
        line.ends_with(&format!("input_queued  {first} position 1: user: hi there")),
        "{line}"
    );
    let said = submit(
        &server,
        &[
            "ses_tail",
            "--text",
            "stop",
            "--text",
            "now",
            "--mode",
            "interrupt",
        ],
    )
    .await;
    let second = queued_id(&said);
    let line = watch.next_line().await;
    assert!(
        line.ends_with(&format!(
            "input_queued  {second} position 2 (interrupt): user: stop | user: now"
        )),
        "{line}"
    );
    assert!(
        watch
            .next_line()
            .await
            .contains("run_cancel_requested  run_a")
    );

    let (code, _, err) = sessions(&server, &["withdraw", "ses_tail", &second]).await;
    assert_eq!(code, Some(0), "{err}");
    let line = watch.next_line().await;
    assert!(
        line.ends_with(&format!("input_withdrawn  {second} position 2")),
        "{line}"
    );
    client.take_queued_input("ses_tail", "run_a").await.unwrap();
    let line = watch.next_line().await;
    assert!(
        line.ends_with(&format!(
            "input_taken  {first} position 1 by run_a: user: hi there"
        )),
        "{line}"
    );

    client.delete_session("ses_tail").await.unwrap();
    assert!(watch.next_line().await.contains("session_deleted"));
    assert!(watch.exited_cleanly().await);
    server.stop().await.unwrap();
}
