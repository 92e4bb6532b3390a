//! `sessionstore sessions approvals`, `approve` and `deny` against a real
//! server: the listing (table and JSON, every filter), both decisions and
//! what they print, refusals as one line on stderr with exit code 1 (a
//! usage error 2), and `sessions watch` showing requests and decisions.

use std::time::{Duration, SystemTime};

use sessionstore_client::v1::{self as pb, ApprovalState, Message, ProviderCall};
use sessionstore_client::{Client, Exchange, NewApproval, NewSession};

use crate::support::{Backend, CliWatch, TestServer, sessions_cli, table_rows};

/// `sessionstore sessions --server … ARGS`: exit code, stdout, stderr.
async fn sessions(server: &TestServer, args: &[&str]) -> (Option<i32>, String, String) {
    sessions_cli(&server.endpoint(), args).await
}

/// An assistant message calling each of `ids` (OpenAI style).
fn calling(ids: &[&str]) -> Message {
    Message {
        tool_calls: ids
            .iter()
            .map(|id| pb::ToolCall {
                id: (*id).to_owned(),
                name: "delete_files".to_owned(),
                arguments: "{}".to_owned(),
                signature: String::new(),
            })
            .collect(),
        ..Message::assistant("")
    }
}

/// `session_id`, owned by `user`, whose answer calls each of `calls`
/// (revision 2).
async fn session_calling(client: &Client, session_id: &str, user: &str, calls: &[&str]) {
    client
        .create_session(NewSession::new().id(session_id).user(user))
        .await
        .unwrap();
    client
        .append_exchange(
            &Exchange::new(session_id)
                .message(Message::user("clean up, please"))
                .provider_call(ProviderCall::new("openai", "gpt-tools").with_tokens(10, 5))
                .response(calling(calls)),
        )
        .await
        .unwrap();
}

/// Asks for an approval; answers its id.
async fn ask(client: &Client, approval: NewApproval) -> String {
    client
        .request_approval(approval)
        .await
        .unwrap()
        .approval
        .unwrap()
        .approval_id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approvals_are_listed_approved_and_denied_from_the_terminal() {
    let server = TestServer::start(Backend::File).await;
    let client = Client::connect(server.endpoint()).await.unwrap();
    session_calling(&client, "ses_cli", "alice", &["call_a", "call_b"]).await;
    session_calling(&client, "ses_other", "bob", &["call_z"]).await;
    let detail = "{ \"path\" : \"/tmp/a\" }";
    let a = ask(
        &client,
        NewApproval::new("ses_cli", "call_a")
            .title("Delete /tmp/a?")
            .detail_json(detail)
            .expire_time(SystemTime::now() + Duration::from_secs(3600)),
    )
    .await;
    let b = ask(
        &client,
        NewApproval::new("ses_cli", "call_b").title("Force?"),
    )
    .await;
    let z = ask(&client, NewApproval::new("ses_other", "call_z")).await;

    // Every approval of the tenant, oldest first, under a header.
    let (code, table, err) = sessions(&server, &["approvals"]).await;
    assert_eq!(code, Some(0), "{err}");
    let header = table.lines().next().unwrap();
    for column in [
        "ID",
        "SESSION",
        "TOOL CALL",
        "STATE",
        "TITLE",
        "DECIDED BY",
        "CREATED",
        "EXPIRES",
    ] {
        assert!(header.contains(column), "{column} missing from\n{table}");
    }
    let listed = table_rows(&table);
    let firsts: Vec<[&str; 4]> = listed
        .iter()
        .map(|r| [r[0].as_str(), r[1].as_str(), r[2].as_str(), r[3].as_str()])
        .collect();
    assert_eq!(
        firsts,
        [
            [a.as_str(), "ses_cli", "call_a", "pending"],
            [b.as_str(), "ses_cli", "call_b", "pending"],
            [z.as_str(), "ses_other", "call_z", "pending"],
        ],
        "{table}"
    );
    assert!(table.lines().nth(1).unwrap().contains("Delete /tmp/a?"));

    // One session's.
    let (code, table, err) = sessions(&server, &["approvals", "ses_cli"]).await;
    assert_eq!(code, Some(0), "{err}");
    let ids: Vec<&str> = table.lines().skip(1).map(first_word).collect();
    assert_eq!(ids, [a.as_str(), b.as_str()], "{table}");

    // Approve: one line, the decision's revision.
    let (code, said, err) = sessions(
        &server,
        &[
            "approve",
            "ses_cli",
            &a,
            "--reason",
            "looks fine",
            "--by",
            "alice",
        ],
    )
    .await;
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(said.trim(), format!("approved {a} of ses_cli (revision 5)"));
    // Deny: the tool result is stored with the decision.
    let (code, said, err) = sessions(
        &server,
        &[
            "deny",
            "ses_cli",
            &b,
            "--reason",
            "not today",
            "--by",
            "bob",
        ],
    )
    .await;
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(
        said.trim(),
        format!("denied {b} of ses_cli (revision 6; tool result stored at sequence 2)")
    );
    let approved = client.get_approval("ses_cli", &a).await.unwrap();
    assert_eq!(approved.state(), ApprovalState::Approved);
    assert_eq!(
        (approved.decided_by.as_str(), approved.reason.as_str()),
        ("alice", "looks fine")
    );
    let denied = client.get_approval("ses_cli", &b).await.unwrap();
    assert_eq!(denied.state(), ApprovalState::Denied);
    assert_eq!(denied.decided_by, "bob");
    let history = client.export_history("ses_cli").await.unwrap();
    let last = history.last().unwrap();
    assert_eq!(
        (
            last.role(),
            last.tool_call_id.as_str(),
            last.content.as_str(),
            last.tool_error
        ),
        (pb::Role::Tool, "call_b", "not today", true)
    );

    // The state filter, the user filter, and nothing found.
    let (code, table, err) = sessions(&server, &["approvals", "--state", "pending"]).await;
    assert_eq!(code, Some(0), "{err}");
    let ids: Vec<&str> = table.lines().skip(1).map(first_word).collect();
    assert_eq!(ids, [z.as_str()], "{table}");
    let (_, table, _) = sessions(&server, &["approvals", "--state", "approved"]).await;
    let listed = table_rows(&table);
    assert_eq!(listed.len(), 1, "{table}");
    assert_eq!(listed[0][0], a);
    assert!(listed[0].contains(&"alice".to_owned()), "{table}");
    let (_, table, _) = sessions(&server, &["approvals", "--user", "bob"]).await;
    let ids: Vec<&str> = table.lines().skip(1).map(first_word).collect();
    assert_eq!(ids, [z.as_str()], "{table}");
    let (code, table, err) =
        sessions(&server, &["approvals", "ses_cli", "--state", "expired"]).await;
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(table.lines().count(), 2, "{table}");
    assert_eq!(table.lines().nth(1), Some("(no approvals)"));

    // JSON: one array, every field, the details verbatim, unset times null.
    let (code, json, err) = sessions(&server, &["approvals", "ses_cli", "--format", "json"]).await;
    assert_eq!(code, Some(0), "{err}");
    let json: serde_json::Value = serde_json::from_str(&json).unwrap();
    let items = json.as_array().unwrap();
    assert_eq!(items.len(), 2, "{json}");
    assert_eq!(items[0]["approval_id"], a.as_str());
    assert_eq!(items[0]["session_id"], "ses_cli");
    assert_eq!(items[0]["tool_call_id"], "call_a");
    assert_eq!(items[0]["title"], "Delete /tmp/a?");
    assert_eq!(items[0]["detail_json"], detail);
    assert_eq!(items[0]["state"], "approved");
    assert_eq!(items[0]["decided_by"], "alice");
    assert_eq!(items[0]["reason"], "looks fine");
    for time in ["create_time", "decide_time", "expire_time"] {
        assert!(items[0][time].is_string(), "{time}: {json}");
    }
    assert_eq!(items[1]["state"], "denied");
    assert_eq!(items[1]["reason"], "not today");
    assert!(items[1]["expire_time"].is_null(), "{json}");
    let (code, json, _) = sessions(
        &server,
        &["approvals", "--user", "nobody", "--format", "json"],
    )
    .await;
    assert_eq!(code, Some(0));
    assert_eq!(json.trim(), "[]");

    // Refusals: one line on stderr, exit code 1, nothing written.
    let (code, out, err) = sessions(&server, &["deny", "ses_cli", &a, "--by", "carol"]).await;
    assert_eq!(code, Some(1));
    assert!(out.is_empty(), "{out}");
    assert_eq!(
        err.trim(),
        format!("sessionstore: approval {a} of ses_cli was already approved by alice")
    );
    let (code, _, err) = sessions(&server, &["approve", "ses_cli", "apr_nope"]).await;
    assert_eq!(code, Some(1));
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.starts_with("sessionstore: ") && err.contains("apr_nope"),
        "{err}"
    );
    let (code, _, err) = sessions(&server, &["approve", "ses_nope", &a]).await;
    assert_eq!(code, Some(1));
    assert_eq!(err.trim(), "sessionstore: session \"ses_nope\" not found");
    assert_eq!(client.get_session("ses_cli").await.unwrap().revision, 6);

    // Usage errors: exit code 2, naming what is wrong.
    let (code, _, err) = sessions(&server, &["approvals", "--state", "maybe"]).await;
    assert_eq!(code, Some(2));
    assert!(err.contains("pending") && err.contains("expired"), "{err}");
    let (code, _, err) = sessions(&server, &["approve", "ses_cli"]).await;
    assert_eq!(code, Some(2));
    assert!(err.contains("APPROVAL"), "{err}");

    // An approval that expired says so.
    session_calling(&client, "ses_late", "alice", &["call_l"]).await;
    let expire = SystemTime::now() + Duration::from_secs(1);
    let late = ask(
        &client,
        NewApproval::new("ses_late", "call_l").expire_time(expire),
    )
    .await;
    if let Ok(left) = expire.duration_since(SystemTime::now()) {
        tokio::time::sleep(left + Duration::from_millis(200)).await;
    }
    let (code, _, err) = sessions(&server, &["approve", "ses_late", &late]).await;
    assert_eq!(code, Some(1));
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains(&late) && err.contains("expired"), "{err}");
    let (_, table, _) = sessions(&server, &["approvals", "ses_late"]).await;
    assert_eq!(table_rows(&table)[0][3], "expired", "{table}");
    server.stop().await.unwrap();
}

fn first_word(line: &str) -> &str {
    line.split_whitespace().next().unwrap_or_default()
}

/// `sessions watch` prints a request and its decision on a line each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_shows_requests_and_decisions() {
    let server = TestServer::start(Backend::Memory).await;
    let client = Client::connect(server.endpoint()).await.unwrap();
    session_calling(&client, "ses_tail", "alice", &["call_a"]).await;
    let mut watch = CliWatch::start(&server.endpoint(), "ses_tail");
    assert!(watch.next_line().await.contains("session_created"));
    assert!(watch.next_line().await.contains("exchange_appended"));
    assert!(watch.next_line().await.contains("caught_up"));
    let id = ask(
        &client,
        NewApproval::new("ses_tail", "call_a").title("Delete everything?"),
    )
    .await;
    let requested = watch.next_line().await;
    assert!(
        requested.ends_with(&format!(
            "approval_requested  {id} call_a Delete everything?"
        )),
        "{requested}"
    );
    let (code, _, err) = sessions(
        &server,
        &["deny", "ses_tail", &id, "--reason", "no", "--by", "alice"],
    )
    .await;
    assert_eq!(code, Some(0), "{err}");
    let decided = watch.next_line().await;
    assert!(
        decided.ends_with(&format!("approval_decided  {id} denied by alice: no")),
        "{decided}"
    );
    client.delete_session("ses_tail").await.unwrap();
    assert!(watch.next_line().await.contains("session_deleted"));
    assert!(watch.exited_cleanly().await);
    server.stop().await.unwrap();
}
