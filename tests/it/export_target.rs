//! ExportHistory with a target: history the next model accepts, by the
//! origin of each message (the provider call that produced it), on every
//! backend; storage untouched; without a target, nothing changes.

use sessionstore_client::SessionStoreClient;
use sessionstore_client::v1 as pb;
use sessionstore_client::v1::content_block::Block;
use tonic::Code;
use tonic::transport::Channel;

use crate::support::{Backend, TestServer, create_owned, error_details, export, user};

crate::backend_tests!(
    an_export_for_a_target_keeps_what_that_model_accepts,
    without_a_target_nothing_changes,
    a_target_needs_a_provider,
);

type Client = SessionStoreClient<Channel>;

fn block(block: Block) -> pb::ContentBlock {
    pb::ContentBlock { block: Some(block) }
}

fn thinking(text: &str) -> pb::ContentBlock {
    block(Block::Thinking(pb::ThinkingBlock {
        thinking: text.into(),
        signature: format!("sig-{text}"),
    }))
}

fn reasoning_item(id: &str) -> pb::ContentBlock {
    block(Block::Json(pb::JsonBlock {
        r#type: "reasoning".into(),
        json: format!(r#"{{"type":"reasoning","id":"{id}","encrypted_content":"enc-{id}"}}"#),
    }))
}

fn call(provider: &str, model: &str) -> pb::ProviderCall {
    pb::ProviderCall {
        provider: provider.into(),
        model: model.into(),
        prompt_tokens: 1,
        completion_tokens: 1,
        ..Default::default()
    }
}

fn tool_call(id: &str, signature: &str) -> pb::ToolCall {
    pb::ToolCall {
        id: id.into(),
        name: "lookup".into(),
        arguments: r#"{"q":1}"#.into(),
        signature: signature.into(),
    }
}

fn tool_result(id: &str) -> pb::Message {
    pb::Message {
        role: pb::Role::Tool.into(),
        tool_call_id: id.into(),
        content: format!("result of {id}"),
        ..Default::default()
    }
}

async fn append(
    client: &mut Client,
    id: &str,
    inputs: Vec<pb::Message>,
    by: Option<pb::ProviderCall>,
    responses: Vec<pb::Message>,
) {
    client
        .append_exchange(pb::AppendExchangeRequest {
            session_id: id.into(),
            messages: inputs,
            provider_call: by,
            response_messages: responses,
            ..Default::default()
        })
        .await
        .unwrap_or_else(|status| panic!("append to {id}: {status:?}"));
}

/// A conversation on Claude (thinking, a tool call with its result), then
/// GPT (a reasoning item, parallel calls with one answered, then a pending
/// call at the end).
async fn conversation(client: &mut Client, id: &str) {
    create_owned(client, id, "ana").await;
    let claude = || Some(call("anthropic", "claude-sonnet-4-5"));
    let gpt = || Some(call("openai", "gpt-5"));
    append(
        client,
        id,
        vec![user("weather?")],
        claude(),
        vec![pb::Message {
            role: pb::Role::Assistant.into(),
            content_blocks: vec![thinking("plan")],
            tool_calls: vec![tool_call("c1", "")],
            ..Default::default()
        }],
    )
    .await;
    append(
        client,
        id,
        vec![tool_result("c1")],
        claude(),
        vec![pb::Message {
            role: pb::Role::Assistant.into(),
            content_blocks: vec![
                thinking("answer"),
                block(Block::Text(pb::TextBlock {
                    text: "It is sunny.".into(),
                    signature: "sig-text".into(),
                })),
            ],
            ..Default::default()
        }],
    )
    .await;
    // A reasoning-only message (left out for every target).
    append(
        client,
        id,
        vec![user("and tomorrow?")],
        gpt(),
        vec![
            pb::Message {
                role: pb::Role::Assistant.into(),
                content_blocks: vec![reasoning_item("r1")],
                ..Default::default()
            },
            pb::Message {
                role: pb::Role::Assistant.into(),
                content_blocks: vec![reasoning_item("r2")],
                tool_calls: vec![tool_call("p1", "gsig-p1"), tool_call("p2", "gsig-p2")],
                ..Default::default()
            },
        ],
    )
    .await;
    // p2 is never answered; after this, an assistant answer and a pending call.
    append(
        client,
        id,
        vec![tool_result("p1")],
        gpt(),
        vec![pb::Message {
            role: pb::Role::Assistant.into(),
            content: "Rain.".into(),
            ..Default::default()
        }],
    )
    .await;
    append(
        client,
        id,
        vec![user("book a taxi")],
        gpt(),
        vec![pb::Message {
            role: pb::Role::Assistant.into(),
            tool_calls: vec![tool_call("t1", "")],
            ..Default::default()
        }],
    )
    .await;
}

fn target(provider: &str, model: &str, reasoning: pb::ReasoningPolicy) -> Option<pb::ExportTarget> {
    Some(pb::ExportTarget {
        provider: provider.into(),
        model: model.into(),
        reasoning: reasoning.into(),
    })
}

async fn export_for(
    client: &mut Client,
    id: &str,
    target: Option<pb::ExportTarget>,
) -> Vec<pb::Message> {
    export(
        client,
        pb::ExportHistoryRequest {
            session_id: id.into(),
            target,
            ..Default::default()
        },
    )
    .await
}

/// Each message in short: role, text, block kinds, call ids.
fn outline(messages: &[pb::Message]) -> Vec<String> {
    messages
        .iter()
        .map(|m| {
            let mut parts = vec![format!("{:?}", m.role())];
            if !m.content.is_empty() {
                parts.push(m.content.clone());
            }
            for b in &m.content_blocks {
                parts.push(match &b.block {
                    Some(Block::Thinking(t)) => format!("thinking {}", t.thinking),
                    Some(Block::Json(j)) => format!("json {}", j.r#type),
                    Some(Block::Text(t)) => format!("text {}", t.text),
                    other => format!("{other:?}"),
                });
            }
            for c in &m.tool_calls {
                parts.push(format!("call {}", c.id));
            }
            parts.join(" | ")
        })
        .collect()
}

async fn an_export_for_a_target_keeps_what_that_model_accepts(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    conversation(&mut client, "switch").await;
    let stored = export_for(&mut client, "switch", None).await;

    // For Claude: its own thinking kept (with the text's signature); GPT's
    // reasoning items dropped, the reasoning-only message left out; p2
    // never answered (an assistant followed), so dropped; t1 pending.
    let for_claude = export_for(
        &mut client,
        "switch",
        target(
            "Anthropic",
            "claude-sonnet-4-5",
            pb::ReasoningPolicy::SameModel,
        ),
    )
    .await;
    assert_eq!(
        outline(&for_claude),
        [
            "User | weather?",
            "Assistant | thinking plan | call c1",
            "Tool | result of c1",
            "Assistant | thinking answer | text It is sunny.",
            "User | and tomorrow?",
            "Assistant | call p1",
            "Tool | result of p1",
            "Assistant | Rain.",
            "User | book a taxi",
            "Assistant | call t1",
        ]
    );
    let Some(Block::Text(text)) = &for_claude[3].content_blocks[1].block else {
        panic!("{:?}", for_claude[3]);
    };
    assert_eq!(text.signature, "sig-text");
    assert_eq!(
        for_claude[5].tool_calls[0].signature, "",
        "GPT's signature cleared"
    );
    // Kept reasoning is byte for byte what was stored.
    assert_eq!(for_claude[1].content_blocks[0], stored[1].content_blocks[0]);

    // For GPT: its reasoning items kept (the one before the calls), Claude's
    // thinking gone; the reasoning-only message still left out.
    let for_gpt = export_for(
        &mut client,
        "switch",
        target("openai", "gpt-5", pb::ReasoningPolicy::SameModel),
    )
    .await;
    assert_eq!(
        outline(&for_gpt),
        [
            "User | weather?",
            "Assistant | call c1",
            "Tool | result of c1",
            "Assistant | text It is sunny.",
            "User | and tomorrow?",
            "Assistant | json reasoning | call p1",
            "Tool | result of p1",
            "Assistant | Rain.",
            "User | book a taxi",
            "Assistant | call t1",
        ]
    );
    assert_eq!(for_gpt[5].tool_calls[0].signature, "gsig-p1");
    assert_eq!(for_gpt[5].content_blocks[0], stored[6].content_blocks[0]);

    // Another model of the same provider: SAME_MODEL keeps none,
    // SAME_PROVIDER keeps GPT's; NONE keeps nothing.
    let other_model = export_for(
        &mut client,
        "switch",
        target("openai", "o3", pb::ReasoningPolicy::SameModel),
    )
    .await;
    assert!(other_model.iter().all(|m| {
        m.content_blocks
            .iter()
            .all(|b| !matches!(b.block, Some(Block::Json(_))))
    }));
    let same_provider = export_for(
        &mut client,
        "switch",
        target("openai", "o3", pb::ReasoningPolicy::SameProvider),
    )
    .await;
    assert_eq!(outline(&same_provider), outline(&for_gpt));
    let none = export_for(
        &mut client,
        "switch",
        target("anthropic", "claude-sonnet-4-5", pb::ReasoningPolicy::None),
    )
    .await;
    assert!(none.iter().all(|m| {
        m.content_blocks
            .iter()
            .all(|b| matches!(b.block, Some(Block::Text(_))))
    }));

    // max_messages windows the result and never starts on an orphan.
    let window = export(
        &mut client,
        pb::ExportHistoryRequest {
            session_id: "switch".into(),
            target: target("openai", "gpt-5", pb::ReasoningPolicy::SameModel),
            max_messages: 5,
            ..Default::default()
        },
    )
    .await;
    assert_eq!(outline(&window), outline(&for_gpt)[5..]);
    let window = export(
        &mut client,
        pb::ExportHistoryRequest {
            session_id: "switch".into(),
            target: target("openai", "gpt-5", pb::ReasoningPolicy::SameModel),
            max_messages: 4,
            ..Default::default()
        },
    )
    .await;
    assert_eq!(
        outline(&window),
        outline(&for_gpt)[5..],
        "widened back to the call"
    );

    // Storage is untouched: the plain export is what it was.
    assert_eq!(export_for(&mut client, "switch", None).await, stored);
    server.stop().await.unwrap();
}

async fn without_a_target_nothing_changes(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    conversation(&mut client, "plain").await;
    let stored = export_for(&mut client, "plain", None).await;
    assert_eq!(
        stored.len(),
        11,
        "every stored message, reasoning-only and unanswered included"
    );
    // Export → rehydrate is an identity, signatures and all.
    client
        .create_session(pb::CreateSessionRequest {
            session_id: "copy".into(),
            initial_history: stored.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(export_for(&mut client, "copy", None).await, stored);
    // The copy has no origins (no call produced its messages): a target
    // keeps none of its reasoning.
    let copy_for_claude = export_for(
        &mut client,
        "copy",
        target(
            "anthropic",
            "claude-sonnet-4-5",
            pb::ReasoningPolicy::SameModel,
        ),
    )
    .await;
    assert!(copy_for_claude.iter().all(|m| {
        m.content_blocks
            .iter()
            .all(|b| matches!(b.block, Some(Block::Text(_))))
    }));
    server.stop().await.unwrap();
}

async fn a_target_needs_a_provider(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut client = server.client().await;
    create_owned(&mut client, "any", "ana").await;
    let status = client
        .export_history(pb::ExportHistoryRequest {
            session_id: "any".into(),
            target: target("", "gpt-5", pb::ReasoningPolicy::SameModel),
            ..Default::default()
        })
        .await
        .map(|_| ())
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert_eq!(error_details(&status).1.as_deref(), Some("target.provider"));
    // An empty model is valid.
    let none = export_for(
        &mut client,
        "any",
        target("openai", "", pb::ReasoningPolicy::SameModel),
    )
    .await;
    assert!(none.is_empty());
    server.stop().await.unwrap();
}

/// The client crate's `export_for` and `ExportHistory::for_model`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_crate_exports_for_a_model() {
    let server = TestServer::start(Backend::Memory).await;
    let mut raw = server.client().await;
    conversation(&mut raw, "crate").await;
    let client = sessionstore_client::Client::builder(server.endpoint())
        .connect()
        .await
        .unwrap();
    let for_gpt = client
        .export_for("crate", "openai", "gpt-5", pb::ReasoningPolicy::SameModel)
        .await
        .unwrap();
    let expected = export_for(
        &mut raw,
        "crate",
        target("openai", "gpt-5", pb::ReasoningPolicy::SameModel),
    )
    .await;
    assert_eq!(for_gpt, expected);
    let windowed = client
        .export_history(
            sessionstore_client::ExportHistory::new("crate")
                .for_model("openai", "gpt-5")
                .max_messages(5),
        )
        .await
        .unwrap();
    assert_eq!(windowed, expected[5..]);
    server.stop().await.unwrap();
}

/// A call answered only after more than the export holds back (2 MiB),
/// and one never answered: the export judges the rest in two passes and
/// gives the same answer as for a short session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_wait_for_a_result_is_judged_the_same() {
    let server = TestServer::start(Backend::File).await;
    let mut client = server.client().await;
    create_owned(&mut client, "long", "ana").await;
    let gpt = || Some(call("openai", "gpt-5"));
    append(
        &mut client,
        "long",
        vec![user("start")],
        gpt(),
        vec![pb::Message {
            role: pb::Role::Assistant.into(),
            tool_calls: vec![tool_call("late", ""), tool_call("lost", "")],
            ..Default::default()
        }],
    )
    .await;
    let big = "x".repeat(100 * 1024);
    for i in 0..30 {
        append(
            &mut client,
            "long",
            vec![user(&format!("{i} {big}"))],
            gpt(),
            vec![pb::Message {
                role: pb::Role::Assistant.into(),
                content: format!("reply {i}"),
                ..Default::default()
            }],
        )
        .await;
    }
    append(&mut client, "long", vec![tool_result("late")], None, vec![]).await;
    let out = export_for(
        &mut client,
        "long",
        target("openai", "gpt-5", pb::ReasoningPolicy::SameModel),
    )
    .await;
    assert_eq!(out.len(), 2 + 60 + 1);
    let calls: Vec<&str> = out[1].tool_calls.iter().map(|c| c.id.as_str()).collect();
    assert_eq!(calls, ["late"], "the late call kept, the lost one dropped");
    assert_eq!(out[62].tool_call_id, "late");
    server.stop().await.unwrap();
}
