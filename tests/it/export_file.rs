//! `sessions export --format json` and `sessions import`, run for real: the
//! file carries everything a session holds (messages with their producing
//! calls and redactions, provider calls, state, the summary marker), and
//! export → import → export gives the same file apart from ids and times.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use serde_json::{Value, json};
use sessionstore_client::SessionStoreClient;
use sessionstore_client::v1 as pb;
use sessionstore_client::v1::content_block::Block;
use tonic::Code;
use tonic::transport::Channel;

use crate::support::{Backend, TestServer, all_messages, get, sessionstore_binary};

/// Runs `sessionstore sessions --server … ARGS`: (success, stdout, stderr).
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

/// Exports `id` to `path` with the binary and returns the file, parsed.
async fn export_file(server: &TestServer, id: &str, path: &Path) -> Value {
    let (ok, _, err) = sessions(
        server,
        &[
            "export",
            id,
            "--format",
            "json",
            "-o",
            path.to_str().unwrap(),
        ],
    )
    .await;
    assert!(ok, "export {id}: {err}");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn block(block: Block) -> pb::ContentBlock {
    pb::ContentBlock { block: Some(block) }
}

fn message(role: pb::Role, content: &str) -> pb::Message {
    pb::Message {
        role: role.into(),
        content: content.to_owned(),
        ..Default::default()
    }
}

/// A provider call with every field set, `total_tokens` not the plain sum.
fn full_call(n: i64) -> pb::ProviderCall {
    pb::ProviderCall {
        request_id: format!("gw-req-{n}"),
        provider: "anthropic".into(),
        model: format!("claude-{n}"),
        requested_provider: "router".into(),
        requested_model: "best-available".into(),
        prompt_tokens: 100 * n,
        completion_tokens: 10 * n,
        total_tokens: 111 * n,
        cost_micros_usd: 850 * n,
        ..Default::default()
    }
}

async fn append(
    client: &mut SessionStoreClient<Channel>,
    id: &str,
    messages: Vec<pb::Message>,
    call: Option<pb::ProviderCall>,
    responses: Vec<pb::Message>,
) -> pb::AppendExchangeResponse {
    client
        .append_exchange(pb::AppendExchangeRequest {
            session_id: id.to_owned(),
            messages,
            provider_call: call,
            response_messages: responses,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
}

/// A session with every kind of content the store keeps.
async fn build_everything(client: &mut SessionStoreClient<Channel>, id: &str) {
    client
        .create_session(pb::CreateSessionRequest {
            session_id: id.to_owned(),
            title: "Everything, exported".into(),
            system_prompt: "You are exact.".into(),
            user: "alice".into(),
            metadata: BTreeMap::from([
                ("team".into(), "search".into()),
                ("ticket".into(), "T-1".into()),
            ]),
            ..Default::default()
        })
        .await
        .unwrap();

    // 0..=3: a restated system prompt (history, not the prompt), a developer
    // message, a user message with blocks, metadata and U+0000; the answer
    // thinks, calls tools both ways (one with malformed arguments).
    let mut question = message(pb::Role::User, "hello\u{0}world");
    question.metadata = BTreeMap::from([
        ("lang".into(), "en".into()),
        ("client".into(), "cli".into()),
    ]);
    question.content_blocks = vec![
        block(Block::Text(pb::TextBlock {
            text: "see the picture".into(),
            signature: String::new(),
        })),
        block(Block::Image(pb::ImageBlock {
            media_type: "image/png".into(),
            url: String::new(),
            data: vec![0, 1, 2, 255],
        })),
    ];
    let mut answer = message(pb::Role::Assistant, "");
    answer.name = "bot".into();
    answer.metadata = BTreeMap::from([("finish".into(), "tool_use".into())]);
    answer.content_blocks = vec![
        block(Block::Thinking(pb::ThinkingBlock {
            thinking: "The user wants the weather.".into(),
            signature: "c2lnbmF0dXJl==".into(),
        })),
        block(Block::RedactedThinking(pb::RedactedThinkingBlock {
            data: "ZW5jcnlwdGVk".into(),
        })),
        block(Block::Text(pb::TextBlock {
            text: "Looking it up.".into(),
            signature: String::new(),
        })),
        block(Block::ToolUse(pb::ToolUseBlock {
            id: "toolu_1".into(),
            name: "search".into(),
            input: "{\"q\": \"weather\"}".into(),
            signature: String::new(),
        })),
    ];
    answer.tool_calls = vec![pb::ToolCall {
        id: "call_a".into(),
        name: "lookup".into(),
        arguments: "{\"city\": \"Par".into(),
        signature: String::new(),
    }];
    append(
        client,
        id,
        vec![
            message(pb::Role::System, "You are exact."),
            message(pb::Role::Developer, "Answer in French."),
            question,
        ],
        Some(full_call(1)),
        vec![answer],
    )
    .await;

    // 4..=6: a tool message (the summary marker goes here), tool results as
    // blocks (one an error), and an answer with a JSON block.
    let mut tool = message(pb::Role::Tool, "sunny");
    tool.tool_call_id = "call_a".into();
    tool.tool_error = true;
    tool.name = "lookup".into();
    let mut results = message(pb::Role::User, "");
    results.content_blocks = vec![
        block(Block::ToolResult(pb::ToolResultBlock {
            tool_use_id: "toolu_1".into(),
            content: "22 °C".into(),
            is_error: false,
        })),
        block(Block::ToolResult(pb::ToolResultBlock {
            tool_use_id: "toolu_1".into(),
            content: "timeout".into(),
            is_error: true,
        })),
    ];
    let mut cited = message(pb::Role::Assistant, "Il fait beau.");
    cited.content_blocks = vec![block(Block::Json(pb::JsonBlock {
        r#type: "citations".into(),
        json: "{\"cites\": [1, 2], \"raw\": \"\\u0000\"}".into(),
    }))];
    let second = append(
        client,
        id,
        vec![tool, results],
        Some(full_call(2)),
        vec![cited],
    )
    .await;
    let summary_id = second.messages[0].id.clone();

    // 7: a question whose first answer (call 3) is rolled back, then
    // answered again (call 4, at 8).
    let retry = append(
        client,
        id,
        vec![message(pb::Role::User, "Try again")],
        Some(full_call(3)),
        vec![message(pb::Role::Assistant, "first draft")],
    )
    .await;
    client
        .rollback_session(pb::RollbackSessionRequest {
            session_id: id.to_owned(),
            after_sequence: retry.messages[0].sequence,
            ..Default::default()
        })
        .await
        .unwrap();
    append(
        client,
        id,
        vec![],
        Some(full_call(4)),
        vec![message(pb::Role::Assistant, "second draft")],
    )
    .await;
    // A call that produced nothing at all (call 5).
    append(client, id, vec![], Some(full_call(5)), vec![]).await;

    // 9, 10: messages without a call; 9 is redacted, 10 edited.
    let mut secret = message(pb::Role::Assistant, "the password is hunter2");
    secret.tool_calls = vec![pb::ToolCall {
        id: "call_s".into(),
        name: "login".into(),
        arguments: "{\"token\": \"s3cr3t\"}".into(),
        signature: String::new(),
    }];
    secret.metadata = BTreeMap::from([("private".into(), "yes".into())]);
    let last = append(
        client,
        id,
        vec![secret, message(pb::Role::User, "teh typo")],
        None,
        vec![],
    )
    .await;
    let mut fixed = message(pb::Role::User, "the typo");
    fixed.metadata = BTreeMap::from([("edited".into(), "yes".into())]);
    client
        .edit_message(pb::EditMessageRequest {
            session_id: id.to_owned(),
            message_id: last.messages[1].id.clone(),
            message: Some(fixed),
            reason: "typo".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    client
        .redact_message(pb::RedactMessageRequest {
            session_id: id.to_owned(),
            message_id: last.messages[0].id.clone(),
            reason: "a secret".into(),
            ..Default::default()
        })
        .await
        .unwrap();

    for (key, value) in [
        ("cwd", "/home/alice"),
        ("plan", "{\"step\": 2, \"note\": \"ünïcode\"}"),
        ("empty", ""),
    ] {
        client
            .set_state(pb::SetStateRequest {
                session_id: id.to_owned(),
                key: key.into(),
                value: value.into(),
                ..Default::default()
            })
            .await
            .unwrap();
    }
    client
        .update_session(pb::UpdateSessionRequest {
            session: Some(pb::Session {
                id: id.to_owned(),
                summary_message_id: summary_id,
                ..Default::default()
            }),
            update_mask: Some(prost_types::FieldMask {
                paths: vec!["summary_message_id".into()],
            }),
        })
        .await
        .unwrap();
}

/// The file with ids replaced by their place (`call#N` by position in
/// `provider_calls`, `msg#N` by position in `messages`, so links are
/// still compared) and times removed.
fn normalise(file: &Value) -> Value {
    let mut file = file.clone();
    file["session"]["id"] = json!("<session>");
    let session = file["session"].as_object_mut().unwrap();
    for time in ["create_time", "update_time"] {
        assert!(session.remove(time).is_some(), "session.{time} is written");
    }
    let mut call_ids = HashMap::new();
    for (index, call) in file["provider_calls"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .enumerate()
    {
        let call = call.as_object_mut().unwrap();
        let id = call["id"].as_str().unwrap().to_owned();
        call_ids.insert(id, format!("call#{index}"));
        call.insert("id".into(), json!(format!("call#{index}")));
        assert!(call.remove("create_time").is_some());
    }
    for (index, message) in file["messages"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .enumerate()
    {
        let message = message.as_object_mut().unwrap();
        message.insert("id".into(), json!(format!("msg#{index}")));
        assert!(message.remove("create_time").is_some());
        if let Some(link) = message.get_mut("produced_by_call_id") {
            let id = link.as_str().unwrap();
            *link = json!(call_ids.get(id).cloned().unwrap_or(format!("unknown {id}")));
        }
    }
    for entry in file["state"].as_array_mut().unwrap() {
        assert!(
            entry
                .as_object_mut()
                .unwrap()
                .remove("update_time")
                .is_some()
        );
    }
    file
}

async fn summary_of(client: &mut SessionStoreClient<Channel>, id: &str) -> pb::SessionSummary {
    let page = client
        .list_sessions(pb::ListSessionsRequest {
            page_size: 1000,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    page.sessions
        .into_iter()
        .find(|s| s.session.as_ref().is_some_and(|s| s.id == id))
        .unwrap_or_else(|| panic!("{id} is not listed"))
}

async fn round_trip(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    build_everything(&mut client, "everything").await;
    let dir = tempfile::tempdir().unwrap();

    let original = export_file(&server, "everything", &dir.path().join("a.json")).await;
    // The file holds what was built (so the identity below is not vacuous).
    assert_eq!(original["format"], "sessionstore.export.v2");
    assert_eq!(original["session"]["system_prompt"], "You are exact.");
    assert_eq!(original["session"]["metadata"]["ticket"], "T-1");
    let messages = original["messages"].as_array().unwrap();
    let calls = original["provider_calls"].as_array().unwrap();
    assert_eq!(messages.len(), 11, "{original:#}");
    assert_eq!(calls.len(), 5, "{original:#}");
    assert_eq!(messages[0]["message"]["role"], "system");
    assert_eq!(messages[2]["message"]["content"], "hello\u{0}world");
    assert_eq!(
        messages[3]["message"]["tool_calls"][0]["arguments"],
        "{\"city\": \"Par"
    );
    let linked: Vec<(usize, &str)> = messages
        .iter()
        .enumerate()
        .filter_map(|(i, m)| Some((i, m["produced_by_call_id"].as_str()?)))
        .collect();
    let call_id = |n: usize| calls[n]["id"].as_str().unwrap();
    assert_eq!(
        linked,
        [(3, call_id(0)), (6, call_id(1)), (8, call_id(3))],
        "calls 3 and 5 produced no current message"
    );
    assert_eq!(calls[2]["total_tokens"], 333);
    assert_eq!(calls[4]["requested_model"], "best-available");
    assert_eq!(messages[9]["redacted"], true);
    assert_eq!(messages[10]["message"]["content"], "the typo");
    assert_eq!(original["summary_sequence"], 4);
    assert_eq!(original["state"].as_array().map(Vec::len), Some(3));
    let text = std::fs::read_to_string(dir.path().join("a.json")).unwrap();
    assert!(
        !text.contains("hunter2") && !text.contains("s3cr3t"),
        "a redacted message's content is not exported"
    );
    assert!(
        messages[0]["create_time"]
            .as_str()
            .is_some_and(|t| t.ends_with('Z')),
        "{}",
        messages[0]
    );

    let (ok, said, err) = sessions(
        &server,
        &[
            "import",
            dir.path().join("a.json").to_str().unwrap(),
            "--id",
            "copy",
        ],
    )
    .await;
    assert!(ok, "{err}");
    assert_eq!(
        said.trim(),
        "imported copy: 11 messages, 5 provider calls, 3 state entries"
    );
    let copy = export_file(&server, "copy", &dir.path().join("b.json")).await;
    assert_eq!(
        normalise(&copy),
        normalise(&original),
        "export → import → export is an identity apart from ids and times"
    );
    let (before, after) = (
        summary_of(&mut client, "everything").await,
        summary_of(&mut client, "copy").await,
    );
    assert_eq!(before.total_cost_micros_usd, 850 * 15);
    for (what, was, is) in [
        (
            "total_cost_micros_usd",
            before.total_cost_micros_usd,
            after.total_cost_micros_usd,
        ),
        (
            "provider_call_count",
            before.provider_call_count,
            after.provider_call_count,
        ),
        ("total_tokens", before.total_tokens, after.total_tokens),
        ("message_count", before.message_count, after.message_count),
        (
            "last_cost_micros_usd",
            before.last_cost_micros_usd,
            after.last_cost_micros_usd,
        ),
    ] {
        assert_eq!(is, was, "{what}");
    }
    assert_eq!(
        (after.last_model, after.last_request_id),
        (before.last_model, before.last_request_id)
    );
    // The redacted message is redacted again, not merely appended empty.
    let stored = all_messages(&mut client, "copy").await;
    assert!(stored[9].redacted);

    // Importing over an existing session: one line, and nothing written.
    let revision = get(&mut client, "everything").await.revision;
    let (ok, _, err) = sessions(
        &server,
        &["import", dir.path().join("a.json").to_str().unwrap()],
    )
    .await;
    assert!(!ok);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.starts_with("sessionstore: session \"everything\" already exists")
            && err.contains("--id"),
        "{err}"
    );
    let after = get(&mut client, "everything").await;
    assert_eq!(after.revision, revision, "nothing was written");
    assert_eq!(all_messages(&mut client, "everything").await.len(), 11);

    // A file that does not hold together is refused before anything is
    // written, naming what is wrong.
    let mut broken = original.clone();
    broken["messages"][6]["produced_by_call_id"] = json!("call_nope");
    let path = dir.path().join("broken.json");
    std::fs::write(&path, broken.to_string()).unwrap();
    let (ok, _, err) = sessions(
        &server,
        &["import", path.to_str().unwrap(), "--id", "broken"],
    )
    .await;
    assert!(!ok);
    assert!(
        err.contains("messages[6].produced_by_call_id \"call_nope\""),
        "{err}"
    );
    let missing = client
        .get_session(pb::GetSessionRequest {
            session_id: "broken".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(missing.code(), Code::NotFound);
    server.stop().await.unwrap();
}

/// A file written by the first version of the export still imports.
async fn version_1_files_import(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v1.json");
    let v1 = json!({
        "format": "sessionstore.export.v1",
        "session": {
            "id": "old",
            "title": "From v1",
            "system_prompt": "Be brief.",
            "user": "bob",
            "metadata": {"source": "v1"}
        },
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "2+2?", "metadata": {"lang": "en"}},
            {"role": "assistant", "content_blocks": [
                {"thinking": {"thinking": "adding", "signature": "c2ln"}},
                {"text": {"text": "4"}}
            ]}
        ]
    });
    std::fs::write(&path, v1.to_string()).unwrap();
    let (ok, said, err) = sessions(&server, &["import", path.to_str().unwrap()]).await;
    assert!(ok, "{err}");
    assert_eq!(
        said.trim(),
        "imported old: 3 messages, 0 provider calls, 0 state entries"
    );
    let session = get(&mut client, "old").await;
    assert_eq!(
        (
            session.title.as_str(),
            session.system_prompt.as_str(),
            session.user.as_str()
        ),
        ("From v1", "Be brief.", "bob")
    );
    assert_eq!(
        session.metadata.get("source").map(String::as_str),
        Some("v1")
    );
    let stored = all_messages(&mut client, "old").await;
    assert_eq!(stored.len(), 3);
    let answer = stored[2].message.as_ref().unwrap();
    assert_eq!(
        answer.content_blocks[0].block,
        Some(Block::Thinking(pb::ThinkingBlock {
            thinking: "adding".into(),
            signature: "c2ln".into(),
        }))
    );
    assert_eq!(
        stored[1]
            .message
            .as_ref()
            .unwrap()
            .metadata
            .get("lang")
            .map(String::as_str),
        Some("en")
    );
    // The file may come through a pipe.
    let piped = tokio::process::Command::new(sessionstore_binary())
        .args(["sessions", "--server", &server.endpoint()])
        .args(["import", "/dev/stdin", "--id", "old-piped"])
        .stdin(std::fs::File::open(&path).unwrap())
        .env("NO_COLOR", "1")
        .output()
        .await
        .unwrap();
    assert!(piped.status.success(), "{piped:?}");
    assert_eq!(all_messages(&mut client, "old-piped").await.len(), 3);

    // And it exports as version 2.
    let exported = export_file(&server, "old", &dir.path().join("v2.json")).await;
    assert_eq!(exported["format"], "sessionstore.export.v2");
    assert_eq!(exported["messages"][2]["message"], v1["messages"][2]);
    server.stop().await.unwrap();
}

/// More messages than one listing page or one import append: the export
/// pages, the import goes in chunks, and the copy still matches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_session_round_trips_in_pages_and_chunks() {
    let server = TestServer::start(Backend::File).await;
    let mut client = server.client().await;
    crate::support::create(&mut client, "long").await;
    let inputs = |from: usize, count: usize| {
        (from..from + count)
            .map(|i| message(pb::Role::User, &format!("input {i}")))
            .collect::<Vec<_>>()
    };
    append(&mut client, "long", inputs(0, 900), None, vec![]).await;
    append(
        &mut client,
        "long",
        inputs(900, 300),
        Some(full_call(1)),
        vec![
            message(pb::Role::Assistant, "answer a"),
            message(pb::Role::Assistant, "answer b"),
        ],
    )
    .await;
    for n in 2..7 {
        append(
            &mut client,
            "long",
            inputs(1200 + n as usize, 1),
            Some(full_call(n)),
            vec![message(pb::Role::Assistant, &format!("answer {n}"))],
        )
        .await;
    }
    let dir = tempfile::tempdir().unwrap();
    let original = export_file(&server, "long", &dir.path().join("a.json")).await;
    assert_eq!(original["messages"].as_array().map(Vec::len), Some(1212));
    let (ok, said, err) = sessions(
        &server,
        &[
            "import",
            dir.path().join("a.json").to_str().unwrap(),
            "--id",
            "long-copy",
        ],
    )
    .await;
    assert!(ok, "{err}");
    assert!(said.contains("1212 messages, 6 provider calls"), "{said}");
    let copy = export_file(&server, "long-copy", &dir.path().join("b.json")).await;
    assert_eq!(normalise(&copy), normalise(&original));
    let (before, after) = (
        summary_of(&mut client, "long").await,
        summary_of(&mut client, "long-copy").await,
    );
    assert_eq!(
        (
            after.total_cost_micros_usd,
            after.provider_call_count,
            after.total_tokens
        ),
        (
            before.total_cost_micros_usd,
            before.provider_call_count,
            before.total_tokens
        )
    );
    server.stop().await.unwrap();
}

/// An import that fails part-way says so, and what to do about the
/// session it leaves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_import_names_the_incomplete_session() {
    let server = TestServer::start(Backend::File).await;
    let mut client = server.client().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad-state.json");
    // The server refuses the state key only when it is set, after the
    // messages are in.
    let file = json!({
        "format": "sessionstore.export.v2",
        "session": {"id": "half"},
        "messages": [{"sequence": 0, "message": {"role": "user", "content": "hi"}}],
        "provider_calls": [],
        "state": [{"key": "k".repeat(300), "value": "v"}]
    });
    std::fs::write(&path, file.to_string()).unwrap();
    let (ok, _, err) = sessions(&server, &["import", path.to_str().unwrap()]).await;
    assert!(!ok);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains("key")
            && err.contains("session \"half\" is incomplete")
            && err.contains("sessionstore sessions delete half"),
        "{err}"
    );
    assert_eq!(all_messages(&mut client, "half").await.len(), 1);
    server.stop().await.unwrap();
}

mod file {
    use crate::support::Backend;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn round_trip() {
        super::round_trip(Backend::File).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn version_1_files_import() {
        super::version_1_files_import(Backend::File).await;
    }
}

mod postgres {
    use crate::support::{Backend, postgres_available};

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn round_trip() {
        if postgres_available("export_file::postgres::round_trip").await {
            super::round_trip(Backend::Postgres).await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn version_1_files_import() {
        if postgres_available("export_file::postgres::version_1_files_import").await {
            super::version_1_files_import(Backend::Postgres).await;
        }
    }
}
