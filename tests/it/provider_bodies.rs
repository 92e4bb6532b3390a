//! History for the next model, as each provider's request body, checked
//! from outside against the real `sessionstore` binary.
//!
//! Six sessions hold the same three conversations — one on Claude (signed
//! thinking, redacted thinking, `tool_use` blocks, `tool_result` blocks),
//! one on GPT (reasoning items with `encrypted_content`, parallel tool
//! calls, an image, a call never answered), one on Gemini (signed text and
//! function calls, a parallel call without a signature) — in each of the
//! six orders, every reply stored by the AppendExchange of the provider
//! call that produced it. Each is exported with ExportTranscript as the
//! Anthropic Messages, OpenAI Responses and Gemini bodies, without a
//! target and for each provider's model under every reasoning policy.
//!
//! Here, for every body: the reasoning kept is exactly what the target's
//! policy keeps (signatures only for the same provider and model, or
//! provider; none for another or under `NONE`), a Gemini function call
//! without a kept signature carries `skip_thought_signature_validator`,
//! tool input that is not a JSON object is wrapped as `_raw` (and the
//! Responses `arguments` keep it verbatim), U+0000 arrives intact, tool
//! errors are marked, the unanswered call is gone, system and developer
//! messages are user turns where the API has no such role, and results
//! open the next user turn.
//!
//! In Python (`tests/python/provider_bodies.py`, in a virtualenv of its own
//! with the providers' official SDKs at the versions pinned below): every
//! body validates against the SDK's request types with nothing unknown or
//! changed, and the SDK's own client sends it unchanged (over a mock
//! transport: nothing leaves the machine). Without python3 the test fails,
//! unless `SESSIONSTORE_TEST_SKIP` names `python`: that half is then skipped.

use std::path::PathBuf;

use serde_json::{Value, json};
use sessionstore_client::SessionStoreClient;
use sessionstore_client::v1 as pb;
use tonic::transport::Channel;

use crate::python::venv_with;
use crate::support::{Backend, ServerProcess, Storage, connect, sessionstore_binary};

/// The providers' official SDKs, and what the check itself imports.
const SDKS: [&str; 5] = [
    "anthropic==2.14.0",
    "openai==3.57.0",
    "google-genai==3.6.1",
    "pydantic==2.14.4",
    "httpx2==2.16.2",
];

crate::backend_tests!(every_provider_order_exports_bodies_each_sdk_accepts);

type Client = SessionStoreClient<Channel>;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Provider {
    Claude,
    Gpt,
    Gemini,
}

use Provider::{Claude, Gemini, Gpt};

impl Provider {
    const ALL: [Provider; 3] = [Claude, Gpt, Gemini];

    fn name(self) -> &'static str {
        match self {
            Claude => "anthropic",
            Gpt => "openai",
            Gemini => "google",
        }
    }

    fn model(self) -> &'static str {
        match self {
            Claude => "claude-sonnet-4-5",
            Gpt => "gpt-5",
            Gemini => "gemini-3-pro-preview",
        }
    }

    /// Another model of the same provider.
    fn other_model(self) -> &'static str {
        match self {
            Claude => "claude-opus-4-1",
            Gpt => "gpt-5-mini",
            Gemini => "gemini-2.5-flash",
        }
    }

    /// The body for this provider's API.
    fn format(self) -> pb::TranscriptFormat {
        match self {
            Claude => pb::TranscriptFormat::AnthropicMessages,
            Gpt => pb::TranscriptFormat::OpenaiResponses,
            Gemini => pb::TranscriptFormat::GeminiContents,
        }
    }

    /// The format's name for the Python check.
    fn format_name(self) -> &'static str {
        match self {
            Claude => "anthropic",
            Gpt => "openai-responses",
            Gemini => "gemini",
        }
    }
}

// ---------------------------------------------------------------------------
// Fixtures

fn block(block: pb::content_block::Block) -> pb::ContentBlock {
    pb::ContentBlock { block: Some(block) }
}

fn text_block(text: &str, signature: &str) -> pb::ContentBlock {
    block(pb::content_block::Block::Text(pb::TextBlock {
        text: text.into(),
        signature: signature.into(),
    }))
}

fn thinking(thinking: &str, signature: &str) -> pb::ContentBlock {
    block(pb::content_block::Block::Thinking(pb::ThinkingBlock {
        thinking: thinking.into(),
        signature: signature.into(),
    }))
}

fn redacted(data: &str) -> pb::ContentBlock {
    block(pb::content_block::Block::RedactedThinking(
        pb::RedactedThinkingBlock { data: data.into() },
    ))
}

fn image(media_type: &str, url: &str, data: &[u8]) -> pb::ContentBlock {
    block(pb::content_block::Block::Image(pb::ImageBlock {
        media_type: media_type.into(),
        url: url.into(),
        data: data.to_vec(),
    }))
}

fn tool_use(id: &str, name: &str, input: &str) -> pb::ContentBlock {
    block(pb::content_block::Block::ToolUse(pb::ToolUseBlock {
        id: id.into(),
        name: name.into(),
        input: input.into(),
        signature: String::new(),
    }))
}

fn tool_result_block(id: &str, content: &str, is_error: bool) -> pb::ContentBlock {
    block(pb::content_block::Block::ToolResult(pb::ToolResultBlock {
        tool_use_id: id.into(),
        content: content.into(),
        is_error,
    }))
}

fn reasoning(json: &str) -> pb::ContentBlock {
    block(pb::content_block::Block::Json(pb::JsonBlock {
        r#type: "reasoning".into(),
        json: json.into(),
    }))
}

fn tool_call(id: &str, name: &str, arguments: &str, signature: &str) -> pb::ToolCall {
    pb::ToolCall {
        id: id.into(),
        name: name.into(),
        arguments: arguments.into(),
        signature: signature.into(),
    }
}

fn message(role: pb::Role, content: &str, blocks: Vec<pb::ContentBlock>) -> pb::Message {
    pb::Message {
        role: role.into(),
        content: content.into(),
        content_blocks: blocks,
        ..Default::default()
    }
}

fn tool_output(id: &str, output: &str, error: bool) -> pb::Message {
    pb::Message {
        role: pb::Role::Tool.into(),
        content: output.into(),
        tool_call_id: id.into(),
        tool_error: error,
        ..Default::default()
    }
}

/// An OpenAI reasoning item as the Responses API returns it.
fn reasoning_item(n: usize, which: char) -> String {
    format!(
        "{{\"type\": \"reasoning\", \"id\": \"rs_{n}{which}\", \"summary\": [{{\"type\": \
         \"summary_text\", \"text\": \"Look it up.\"}}], \"encrypted_content\": \
         \"gAAAAB-openai-{n}{which}\"}}"
    )
}

/// A Gemini thought signature (base64, as the API returns it).
fn gemini_signature(kind: &str, n: usize) -> String {
    let mut signature = format!("gem+{kind}/{n}");
    while signature.len() % 4 != 0 {
        signature.push('A');
    }
    signature
}

/// Stored tool inputs and arguments that are not JSON objects.
const CLAUDE_BAD_INPUT: &str = "{\"topic\": \"Oslo\"";
const GPT_BAD_ARGUMENTS: &str = "not json at all";
const GEMINI_ARRAY_ARGUMENTS: &str = "[\"OSL\"]";
const SYSTEM_PROMPT: &str = "You plan trips.\u{0} Be brief.";

/// What one provider's conversation appends, at position `n` (1–3) of
/// its session: two exchanges, each with the provider call that produced
/// its replies.
fn segment(provider: Provider, n: usize) -> Vec<(Vec<pb::Message>, Vec<pb::Message>)> {
    use pb::Role::{Assistant, User};
    match provider {
        Claude => vec![
            (
                vec![message(User, "Claude: weather and news for Oslo?", vec![])],
                vec![message(
                    Assistant,
                    "",
                    vec![
                        thinking("Two lookups at once.", &format!("claude-sig-{n}a")),
                        redacted(&format!("claude-redacted-{n}")),
                        text_block("Checking both.", ""),
                        tool_use(
                            &format!("toolu_w{n}"),
                            "get_weather",
                            "{\"city\": \"Oslo\"}",
                        ),
                        tool_use(&format!("toolu_n{n}"), "get_news", CLAUDE_BAD_INPUT),
                    ],
                )],
            ),
            (
                vec![message(
                    User,
                    "",
                    vec![
                        tool_result_block(&format!("toolu_w{n}"), "rain\u{0}, 12 C", false),
                        tool_result_block(&format!("toolu_n{n}"), "invalid input", true),
                    ],
                )],
                vec![message(
                    Assistant,
                    "",
                    vec![
                        thinking("It rains.", &format!("claude-sig-{n}b")),
                        text_block("Rain in Oslo; the news tool failed.", ""),
                    ],
                )],
            ),
        ],
        Gpt => vec![
            (
                vec![message(
                    User,
                    "GPT: what is in this photo?",
                    vec![
                        image("image/png", "", b"\x89PNG fake"),
                        image("image/jpeg", &format!("https://example.com/{n}.jpg"), &[]),
                    ],
                )],
                vec![pb::Message {
                    tool_calls: vec![
                        tool_call(&format!("call_x{n}"), "lookup", "{\"q\": \"harbour\"}", ""),
                        tool_call(&format!("call_y{n}"), "lookup", GPT_BAD_ARGUMENTS, ""),
                        // Never answered, and a reply follows: not pending.
                        tool_call(&format!("call_z{n}"), "cancelled", "{}", ""),
                    ],
                    ..message(Assistant, "", vec![reasoning(&reasoning_item(n, 'a'))])
                }],
            ),
            (
                vec![
                    tool_output(&format!("call_x{n}"), "a harbour", false),
                    tool_output(&format!("call_y{n}"), "bad arguments\u{0}", true),
                ],
                vec![
                    // Reasoning that preceded nothing: never sent.
                    message(Assistant, "", vec![reasoning(&reasoning_item(n, 'c'))]),
                    message(
                        Assistant,
                        "A harbour in Oslo.",
                        vec![reasoning(&reasoning_item(n, 'b'))],
                    ),
                ],
            ),
        ],
        Gemini => vec![
            (
                vec![message(User, "Gemini: flights and hotels?", vec![])],
                vec![pb::Message {
                    tool_calls: vec![
                        tool_call(
                            &format!("g_f{n}"),
                            "search_flights",
                            "{\"to\": \"OSL\"}",
                            &gemini_signature("call", n),
                        ),
                        tool_call(
                            &format!("g_h{n}"),
                            "search_hotels",
                            GEMINI_ARRAY_ARGUMENTS,
                            "",
                        ),
                    ],
                    ..message(
                        Assistant,
                        "",
                        vec![text_block("Searching.", &gemini_signature("text", n))],
                    )
                }],
            ),
            (
                vec![
                    tool_output(&format!("g_f{n}"), "3 flights", false),
                    tool_output(&format!("g_h{n}"), "quota exceeded", true),
                ],
                vec![message(
                    Assistant,
                    "",
                    vec![
                        text_block("Two options.", ""),
                        text_block("", &gemini_signature("last", n)),
                    ],
                )],
            ),
        ],
    }
}

/// Stores a session whose conversation passes through `order`.
async fn store_session(client: &mut Client, id: &str, order: [Provider; 3]) {
    client
        .create_session(pb::CreateSessionRequest {
            session_id: id.into(),
            system_prompt: SYSTEM_PROMPT.into(),
            initial_history: vec![
                message(pb::Role::System, "Use metric units.", vec![]),
                message(pb::Role::Developer, "Answer in English.", vec![]),
            ],
            ..Default::default()
        })
        .await
        .unwrap();
    for (index, provider) in order.into_iter().enumerate() {
        for (messages, response_messages) in segment(provider, index + 1) {
            client
                .append_exchange(pb::AppendExchangeRequest {
                    session_id: id.into(),
                    messages,
                    provider_call: Some(pb::ProviderCall {
                        provider: provider.name().into(),
                        model: provider.model().into(),
                        prompt_tokens: 10,
                        completion_tokens: 5,
                        ..Default::default()
                    }),
                    response_messages,
                    ..Default::default()
                })
                .await
                .unwrap();
        }
    }
    client
        .append_exchange(pb::AppendExchangeRequest {
            session_id: id.into(),
            messages: vec![message(pb::Role::User, "Thanks.\u{0} What next?", vec![])],
            ..Default::default()
        })
        .await
        .unwrap();
}

// ---------------------------------------------------------------------------
// Exports

/// One export: a body, for a target (provider, model, policy) or none.
#[derive(Clone, Copy, Debug)]
struct Export {
    format: Provider,
    target: Option<(Provider, &'static str, pb::ReasoningPolicy)>,
}

impl Export {
    /// Whether reasoning that `origin`'s model produced is kept.
    fn keeps(self, origin: Provider) -> bool {
        match self.target {
            None => origin == self.format,
            Some((_, _, pb::ReasoningPolicy::None)) => false,
            Some((provider, _, pb::ReasoningPolicy::SameProvider)) => origin == provider,
            Some((provider, model, _)) => origin == provider && model == origin.model(),
        }
    }

    /// Every export a session gets: each body without a target, for each
    /// provider's model, and for its own provider under each policy.
    fn all() -> Vec<Export> {
        use pb::ReasoningPolicy::{None as Nothing, SameModel, SameProvider, Unspecified};
        let mut all = Vec::new();
        for format in Provider::ALL {
            all.push(Export {
                format,
                target: None,
            });
            for target in Provider::ALL {
                all.push(Export {
                    format,
                    target: Some((target, target.model(), SameModel)),
                });
            }
            all.extend(
                [
                    (format.model(), Unspecified),
                    (format.other_model(), SameModel),
                    (format.other_model(), SameProvider),
                    (format.model(), Nothing),
                ]
                .map(|(model, policy)| Export {
                    format,
                    target: Some((format, model, policy)),
                }),
            );
        }
        all
    }
}

async fn export_body(client: &mut Client, id: &str, export: Export) -> String {
    let target = export
        .target
        .map(|(provider, model, policy)| pb::ExportTarget {
            provider: provider.name().to_uppercase(),
            model: model.into(),
            reasoning: policy.into(),
        });
    let mut stream = client
        .export_transcript(pb::ExportTranscriptRequest {
            session_id: id.into(),
            format: export.format.format().into(),
            target,
        })
        .await
        .unwrap_or_else(|status| panic!("{export:?}: {status:?}"))
        .into_inner();
    let mut data = Vec::new();
    while let Some(chunk) = stream.message().await.unwrap() {
        data.extend(chunk.data);
    }
    String::from_utf8(data).unwrap()
}

// ---------------------------------------------------------------------------
// What each body must hold

/// Every JSON object in `value`, depth first.
fn objects(value: &Value) -> Vec<&serde_json::Map<String, Value>> {
    let mut out = Vec::new();
    let mut stack = vec![value];
    while let Some(value) = stack.pop() {
        match value {
            Value::Object(map) => {
                out.push(map);
                stack.extend(map.values().rev());
            }
            Value::Array(items) => stack.extend(items.iter().rev()),
            _ => {}
        }
    }
    out
}

/// The strings at `key` in objects with `"type": kind` (any object when
/// `kind` is empty).
fn strings_at<'a>(body: &'a Value, kind: &str, key: &str) -> Vec<&'a str> {
    let mut out: Vec<&str> = objects(body)
        .into_iter()
        .filter(|o| kind.is_empty() || o.get("type").and_then(Value::as_str) == Some(kind))
        .filter_map(|o| o.get(key).and_then(Value::as_str))
        .collect();
    out.sort_unstable();
    out
}

/// The object in `body` with `key` equal to `id`.
fn by_key<'a>(body: &'a Value, key: &str, id: &str) -> &'a serde_json::Map<String, Value> {
    objects(body)
        .into_iter()
        .find(|o| o.get(key).and_then(Value::as_str) == Some(id))
        .unwrap_or_else(|| panic!("no object with {key} {id:?} in {body}"))
}

fn sorted(mut strings: Vec<String>) -> Vec<String> {
    strings.sort_unstable();
    strings
}

/// Checks one body against the rules.
fn check_body(text: &str, order: [Provider; 3], export: Export) {
    let what = format!("{order:?} {export:?}:\n{text}");
    assert!(!text.contains('\u{0}'), "a raw NUL in {what}");
    let body: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {what}"));
    let position = |provider: Provider| order.iter().position(|&p| p == provider).unwrap() + 1;
    let (claude, gpt, gemini) = (position(Claude), position(Gpt), position(Gemini));
    // Reasoning of others never appears; U+0000 arrives intact; the
    // unanswered call is gone.
    for n in 1..=3 {
        assert!(!text.contains(&format!("call_z{n}")), "{what}");
        assert!(!text.contains(&format!("rs_{n}c")), "{what}");
    }
    let expect_thinking = export.format == Claude && export.keeps(Claude);
    let expect_items = export.format == Gpt && export.keeps(Gpt);
    let expect_gemini_signatures = export.format == Gemini && export.keeps(Gemini);
    assert_eq!(text.contains("claude-sig-"), expect_thinking, "{what}");
    assert_eq!(text.contains("claude-redacted-"), expect_thinking, "{what}");
    assert_eq!(text.contains("gAAAAB-openai-"), expect_items, "{what}");
    assert_eq!(text.contains("gem+"), expect_gemini_signatures, "{what}");
    assert!(
        strings_at(&body, "", "text").contains(&"Thanks.\u{0} What next?"),
        "{what}"
    );
    match export.format {
        Claude => {
            assert_eq!(body["system"], SYSTEM_PROMPT, "{what}");
            let messages = body["messages"].as_array().unwrap();
            for message in messages {
                let role = message["role"].as_str().unwrap();
                assert!(role == "user" || role == "assistant", "{what}");
                assert!(!message["content"].as_array().unwrap().is_empty(), "{what}");
            }
            assert_eq!(messages[0]["content"][0]["text"], "Use metric units.");
            assert_eq!(messages[1]["content"][0]["text"], "Answer in English.");
            assert_eq!(messages[1]["role"], "user");
            let expected: Vec<String> = if expect_thinking {
                vec![
                    format!("claude-sig-{claude}a"),
                    format!("claude-sig-{claude}b"),
                ]
            } else {
                Vec::new()
            };
            let signatures: Vec<&str> = strings_at(&body, "thinking", "signature");
            assert_eq!(signatures, expected, "{what}");
            // Inputs: an object as stored, anything else as _raw.
            let input = |id: String| by_key(&body, "id", &id)["input"].clone();
            assert_eq!(input(format!("toolu_w{claude}")), json!({ "city": "Oslo" }));
            assert_eq!(
                input(format!("toolu_n{claude}")),
                json!({ "_raw": CLAUDE_BAD_INPUT })
            );
            assert_eq!(
                input(format!("call_y{gpt}")),
                json!({ "_raw": GPT_BAD_ARGUMENTS })
            );
            assert_eq!(
                input(format!("g_h{gemini}")),
                json!({ "_raw": GEMINI_ARRAY_ARGUMENTS })
            );
            // Results: errors marked, NUL intact, and they open the user
            // message after the calls.
            let result = |id: String| by_key(&body, "tool_use_id", &id).clone();
            assert_eq!(
                result(format!("toolu_w{claude}"))["content"],
                "rain\u{0}, 12 C"
            );
            for id in [
                format!("toolu_n{claude}"),
                format!("call_y{gpt}"),
                format!("g_h{gemini}"),
            ] {
                assert_eq!(result(id)["is_error"], true, "{what}");
            }
            let calls_at = messages
                .iter()
                .position(|m| m.to_string().contains(&format!("\"call_x{gpt}\"")))
                .unwrap();
            let answer = &messages[calls_at + 1];
            assert_eq!(answer["role"], "user");
            assert_eq!(answer["content"][0]["tool_use_id"], format!("call_x{gpt}"));
            assert_eq!(answer["content"][1]["tool_use_id"], format!("call_y{gpt}"));
        }
        Gpt => {
            assert_eq!(body["instructions"], SYSTEM_PROMPT, "{what}");
            let input = body["input"].as_array().unwrap();
            assert_eq!(input[0]["role"], "system", "{what}");
            assert_eq!(input[1]["role"], "developer", "{what}");
            // Kept reasoning items: the stored JSON, each before an item of
            // its message.
            let items: Vec<&Value> = input.iter().filter(|i| i["type"] == "reasoning").collect();
            if expect_items {
                let expected: Vec<Value> = ['a', 'b']
                    .map(|w| serde_json::from_str(&reasoning_item(gpt, w)).unwrap())
                    .into();
                assert_eq!(items, expected.iter().collect::<Vec<_>>(), "{what}");
                for (index, item) in input.iter().enumerate() {
                    if item["type"] == "reasoning" {
                        let next = &input[index + 1];
                        assert!(
                            next["type"] == "function_call"
                                || (next["type"] == "message" && next["role"] == "assistant"),
                            "{what}"
                        );
                    }
                }
                assert!(text.contains(&reasoning_item(gpt, 'a')), "verbatim: {what}");
            } else {
                assert!(items.is_empty(), "{what}");
            }
            let arguments = |id: String| by_key(&body, "call_id", &id)["arguments"].clone();
            assert_eq!(arguments(format!("toolu_n{claude}")), CLAUDE_BAD_INPUT);
            assert_eq!(arguments(format!("call_y{gpt}")), GPT_BAD_ARGUMENTS);
            assert_eq!(arguments(format!("g_h{gemini}")), GEMINI_ARRAY_ARGUMENTS);
            let outputs: Vec<&str> = strings_at(&body, "function_call_output", "output");
            assert!(outputs.contains(&"bad arguments\u{0}"), "{what}");
            assert!(outputs.contains(&"rain\u{0}, 12 C"), "{what}");
        }
        Gemini => {
            assert_eq!(
                body["systemInstruction"],
                json!({ "parts": [{ "text": SYSTEM_PROMPT }] })
            );
            let contents = body["contents"].as_array().unwrap();
            for content in contents {
                let role = content["role"].as_str().unwrap();
                assert!(role == "user" || role == "model", "{what}");
                assert!(!content["parts"].as_array().unwrap().is_empty(), "{what}");
            }
            assert_eq!(contents[0]["role"], "user");
            assert_eq!(contents[1]["parts"][0]["text"], "Answer in English.");
            // Signatures: Gemini's own when kept; every other function call
            // carries the bypass value, and no other part a signature.
            let mut expected_calls = Vec::new();
            let mut expected_texts = Vec::new();
            for n in 1..=3 {
                for id in ["toolu_w", "toolu_n", "call_x", "call_y", "g_h"] {
                    expected_calls.push((format!("{id}{n}"), SKIP.to_owned()));
                }
                let kept = n == gemini && expect_gemini_signatures;
                expected_calls.push((
                    format!("g_f{n}"),
                    if kept {
                        gemini_signature("call", n)
                    } else {
                        SKIP.to_owned()
                    },
                ));
                if kept {
                    expected_texts.push(gemini_signature("text", n));
                    expected_texts.push(gemini_signature("last", n));
                }
            }
            let mut calls: Vec<(String, String)> = Vec::new();
            let mut text_signatures = Vec::new();
            for part in contents.iter().flat_map(|c| c["parts"].as_array().unwrap()) {
                let signature = part.get("thoughtSignature").and_then(Value::as_str);
                if let Some(call) = part.get("functionCall") {
                    let id = call["id"].as_str().unwrap().to_owned();
                    calls.push((id, signature.unwrap().to_owned()));
                } else if let Some(signature) = signature {
                    assert!(part.get("text").is_some(), "{what}");
                    text_signatures.push(signature.to_owned());
                }
            }
            calls.sort();
            expected_calls.sort();
            // Calls of providers not in this session's order do not exist:
            // compare on the ones made.
            expected_calls.retain(|(id, _)| calls.iter().any(|(made, _)| made == id));
            assert_eq!(calls.len(), 6, "{what}");
            assert_eq!(calls, expected_calls, "{what}");
            assert_eq!(sorted(text_signatures), sorted(expected_texts), "{what}");
            let args = |id: String| by_key(&body, "id", &id)["args"].clone();
            assert_eq!(
                args(format!("g_h{gemini}")),
                json!({ "_raw": GEMINI_ARRAY_ARGUMENTS })
            );
            assert_eq!(
                args(format!("toolu_n{claude}")),
                json!({ "_raw": CLAUDE_BAD_INPUT })
            );
            assert_eq!(
                args(format!("call_y{gpt}")),
                json!({ "_raw": GPT_BAD_ARGUMENTS })
            );
            // Results: named by their calls, errors under "error".
            let response = |id: String| {
                objects(&body)
                    .into_iter()
                    .filter_map(|o| o.get("functionResponse"))
                    .find(|r| r["id"] == id.as_str())
                    .unwrap_or_else(|| panic!("no response for {id}: {what}"))
                    .clone()
            };
            assert_eq!(
                response(format!("toolu_w{claude}")),
                json!({ "id": format!("toolu_w{claude}"), "name": "get_weather",
                        "response": { "output": "rain\u{0}, 12 C" } })
            );
            assert_eq!(
                response(format!("call_y{gpt}"))["response"],
                json!({ "error": "bad arguments\u{0}" })
            );
            assert_eq!(response(format!("g_h{gemini}"))["name"], "search_hotels");
            // The results of parallel calls make one user turn.
            let turn = contents
                .iter()
                .find(|c| {
                    c.to_string().contains(&format!("\"g_f{gemini}\"")) && c["role"] == "user"
                })
                .unwrap();
            assert_eq!(turn["parts"].as_array().unwrap().len(), 2, "{what}");
        }
    }
}

const SKIP: &str = "skip_thought_signature_validator";

/// Every order of the three providers.
fn orders() -> Vec<[Provider; 3]> {
    let mut orders = Vec::new();
    for a in Provider::ALL {
        for b in Provider::ALL {
            for c in Provider::ALL {
                if a != b && b != c && a != c {
                    orders.push([a, b, c]);
                }
            }
        }
    }
    orders
}

/// Runs the SDK check over the bodies in `dir` listed by `manifest`.
fn check_with_sdks(python: &std::path::Path, manifest: &std::path::Path, count: usize) {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("python/provider_bodies.py");
    let output = std::process::Command::new(python)
        .arg(&script)
        .arg(manifest)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .expect("run python");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "the SDK check failed:\n{said}");
    assert!(
        said.contains(&format!("provider bodies ok: {count}")),
        "{said}"
    );
    println!("{}", said.trim());
}

async fn every_provider_order_exports_bodies_each_sdk_accepts(backend: Backend) {
    let python = tokio::task::spawn_blocking(|| {
        venv_with(
            "python-provider-sdks",
            &SDKS,
            "provider_bodies: the bodies checked with the providers' SDKs",
        )
    })
    .await
    .unwrap();
    let binary = tokio::task::spawn_blocking(sessionstore_binary)
        .await
        .unwrap();
    let storage = Storage::new(backend).await;
    let logs = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(
        &binary,
        &storage.url,
        "127.0.0.1:0",
        logs.path().join("server.log"),
        &[],
    )
    .await;
    let mut client = connect(&server.endpoint()).await;

    let bodies = tempfile::tempdir().unwrap();
    let mut manifest = Vec::new();
    for order in orders() {
        let id = format!(
            "{}-{}-{}",
            order[0].name(),
            order[1].name(),
            order[2].name()
        );
        store_session(&mut client, &id, order).await;
        for (index, export) in Export::all().into_iter().enumerate() {
            let text = export_body(&mut client, &id, export).await;
            check_body(&text, order, export);
            let path = bodies.path().join(format!("{id}-{index}.json"));
            std::fs::write(&path, &text).unwrap();
            manifest.push(json!({
                "format": export.format.format_name(),
                "path": path,
                "prompt": true,
            }));
        }
    }
    // Without a system prompt, no system key.
    client
        .create_session(pb::CreateSessionRequest {
            session_id: "no-prompt".into(),
            initial_history: vec![message(pb::Role::User, "Hello.", vec![])],
            ..Default::default()
        })
        .await
        .unwrap();
    for format in Provider::ALL {
        let export = Export {
            format,
            target: None,
        };
        let text = export_body(&mut client, "no-prompt", export).await;
        let body: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(body.as_object().unwrap().len(), 1, "{text}");
        let path = bodies
            .path()
            .join(format!("no-prompt-{}.json", format.format_name()));
        std::fs::write(&path, &text).unwrap();
        manifest.push(json!({
            "format": format.format_name(),
            "path": path,
            "prompt": false,
        }));
    }
    let count = manifest.len();
    let manifest_path = bodies.path().join("manifest.json");
    std::fs::write(&manifest_path, Value::Array(manifest).to_string()).unwrap();
    if let Some(python) = python {
        tokio::task::spawn_blocking(move || check_with_sdks(&python, &manifest_path, count))
            .await
            .unwrap();
    }
    drop(server);
}

/// `sessionstore sessions ARGS` against `endpoint`: success, stdout, stderr.
async fn sessions(
    binary: &std::path::Path,
    endpoint: &str,
    args: &[&str],
) -> (bool, String, String) {
    let output = tokio::process::Command::new(binary)
        .arg("sessions")
        .args(["--server", endpoint])
        .args(args)
        .env("NO_COLOR", "1")
        .env_remove("SESSIONSTORE_TOKEN")
        .output()
        .await
        .unwrap();
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// A target as (provider, model, policy).
type Target<'a> = Option<(&'a str, &'a str, pb::ReasoningPolicy)>;

/// ExportTranscript in any format, for a target or none.
async fn export_raw(
    client: &mut Client,
    id: &str,
    format: pb::TranscriptFormat,
    target: Target<'_>,
) -> String {
    let target = target.map(|(provider, model, policy)| pb::ExportTarget {
        provider: provider.into(),
        model: model.into(),
        reasoning: policy.into(),
    });
    let mut stream = client
        .export_transcript(pb::ExportTranscriptRequest {
            session_id: id.into(),
            format: format.into(),
            target,
        })
        .await
        .unwrap()
        .into_inner();
    let mut data = Vec::new();
    while let Some(chunk) = stream.message().await.unwrap() {
        data.extend(chunk.data);
    }
    String::from_utf8(data).unwrap()
}

/// `sessions export --for PROVIDER/MODEL [--reasoning …] --format …`
/// writes what ExportTranscript gives for that target, to stdout or
/// `-o FILE`, in every format but `json`; the bodies without `--for`
/// follow their own provider.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_exports_for_a_model() {
    use pb::ReasoningPolicy::{None as Nothing, SameModel, SameProvider};
    use pb::TranscriptFormat as F;
    let binary = tokio::task::spawn_blocking(sessionstore_binary)
        .await
        .unwrap();
    let storage = Storage::new(Backend::Memory).await;
    let logs = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(
        &binary,
        &storage.url,
        "127.0.0.1:0",
        logs.path().join("server.log"),
        &[],
    )
    .await;
    let endpoint = server.endpoint();
    let mut client = connect(&endpoint).await;
    store_session(&mut client, "trip", [Claude, Gpt, Gemini]).await;

    let out = tempfile::tempdir().unwrap();
    let file = out.path().join("body.json");
    let file_arg = file.to_str().unwrap();
    let cases: [(&[&str], F, Target<'_>); 8] = [
        (
            &["--for", "google/gemini-3-pro-preview", "--format", "gemini"],
            F::GeminiContents,
            Some(("google", "gemini-3-pro-preview", SameModel)),
        ),
        (&["--format", "anthropic"], F::AnthropicMessages, None),
        (
            &[
                "--format",
                "openai-responses",
                "--for",
                "openai/gpt-5-mini",
                "--reasoning",
                "same-provider",
            ],
            F::OpenaiResponses,
            Some(("openai", "gpt-5-mini", SameProvider)),
        ),
        (
            &[
                "--for",
                "anthropic/claude-sonnet-4-5",
                "--reasoning",
                "none",
                "--format",
                "anthropic",
            ],
            F::AnthropicMessages,
            Some(("anthropic", "claude-sonnet-4-5", Nothing)),
        ),
        (
            &[
                "--for",
                "anthropic/claude-sonnet-4-5",
                "--format",
                "markdown",
            ],
            F::Markdown,
            Some(("anthropic", "claude-sonnet-4-5", SameModel)),
        ),
        (
            &["--for", "google", "--format", "openai"],
            F::OpenaiJson,
            Some(("google", "", SameModel)),
        ),
        (
            // The model may hold a slash of its own.
            &["--for", "openrouter/meta/llama-4", "--format", "gemini"],
            F::GeminiContents,
            Some(("openrouter", "meta/llama-4", SameModel)),
        ),
        (&["--format", "markdown"], F::Markdown, None),
    ];
    for (args, format, target) in cases {
        let expected = export_raw(&mut client, "trip", format, target).await;
        let mut command = vec!["export", "trip"];
        command.extend_from_slice(args);
        let (ok, stdout, stderr) = sessions(&binary, &endpoint, &command).await;
        assert!(ok, "{command:?}: {stderr}");
        assert_eq!(stdout, expected, "{command:?}");
        command.extend_from_slice(&["-o", file_arg]);
        let (ok, stdout, stderr) = sessions(&binary, &endpoint, &command).await;
        assert!(ok && stdout.is_empty(), "{command:?}: {stderr}");
        assert_eq!(
            std::fs::read_to_string(&file).unwrap(),
            expected,
            "{command:?}"
        );
    }
    // What the target changes shows: Claude's thinking for Claude only,
    // GPT's reasoning items gone from Markdown for Claude.
    let (_, claude, _) = sessions(
        &binary,
        &endpoint,
        &[
            "export",
            "trip",
            "--for",
            "anthropic/claude-sonnet-4-5",
            "--format",
            "anthropic",
        ],
    )
    .await;
    assert!(claude.contains("claude-sig-1a"), "{claude}");
    let (_, none, _) = sessions(
        &binary,
        &endpoint,
        &[
            "export",
            "trip",
            "--for",
            "anthropic/claude-sonnet-4-5",
            "--reasoning",
            "none",
            "--format",
            "anthropic",
        ],
    )
    .await;
    assert!(!none.contains("claude-sig-"), "{none}");
    let (_, markdown, _) = sessions(
        &binary,
        &endpoint,
        &["export", "trip", "--format", "markdown"],
    )
    .await;
    assert!(markdown.contains("rs_2a"), "{markdown}");
    let (_, for_claude, _) = sessions(
        &binary,
        &endpoint,
        &[
            "export",
            "trip",
            "--format",
            "markdown",
            "--for",
            "anthropic/claude-sonnet-4-5",
        ],
    )
    .await;
    assert!(
        !for_claude.contains("rs_2a") && !for_claude.contains("call_z2"),
        "{for_claude}"
    );
    let (_, gemini, _) = sessions(
        &binary,
        &endpoint,
        &[
            "export",
            "trip",
            "--format",
            "gemini",
            "--for",
            "google/gemini-2.5-flash",
        ],
    )
    .await;
    assert!(
        gemini.contains(SKIP) && !gemini.contains("gem+"),
        "{gemini}"
    );

    // Mistakes: one line that says what is wrong, and no file.
    let missing = out.path().join("missing.json");
    for (args, says) in [
        (
            vec!["--for", "/gpt-5", "--format", "openai-responses"],
            "names no provider",
        ),
        (
            vec!["--for", "openai/gpt-5"],
            "does not apply to --format json",
        ),
        (vec!["--format", "gemini", "--reasoning", "none"], "--for"),
        (
            vec![
                "--format",
                "gemini",
                "--for",
                "google",
                "--reasoning",
                "all",
            ],
            "all",
        ),
    ] {
        let mut command = vec!["export", "trip", "-o", missing.to_str().unwrap()];
        command.extend(args);
        let (ok, _, stderr) = sessions(&binary, &endpoint, &command).await;
        assert!(!ok, "{command:?}");
        assert!(stderr.contains(says), "{command:?}: {stderr}");
        assert!(!missing.exists(), "{command:?}");
    }
    drop(server);
}
