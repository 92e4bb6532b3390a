//! Hostile input. Arbitrary messages (any Unicode, U+0000, backslashes,
//! malformed JSON, every block kind) round-trip exactly on every backend;
//! arbitrary, mostly invalid requests get a status from the error table and
//! write nothing; garbage on the wire (random bytes, broken HTTP/2, lying
//! gRPC length prefixes, mistyped protobuf, cancelled streams) never takes
//! the server down.
//!
//! The property tests run a fixed number of cases (`PROPTEST_CASES`, 48 by
//! default) from a fixed seed (`PROPTEST_RNG_SEED` picks another), against
//! one server per backend started outside the property loop.

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use proptest::collection::{btree_map, vec};
use proptest::prelude::*;
use proptest::strategy::Union;
use proptest::test_runner::{Config, RngSeed, TestCaseError, TestRunner};
use prost::Message as _;
use prost::bytes::{Buf as _, BufMut as _, Bytes};
use sessionstore_client::SessionStoreClient;
use sessionstore_client::v1 as pb;
use sessionstore_client::v1::content_block::Block;
use sessionstore_client::v1::session_event::Event;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tonic::Code;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::http;
use tonic::transport::Channel;

use crate::support::*;

type Client = SessionStoreClient<Channel>;

/// The statuses the error table (README) allows for a bad request (no
/// credentials are configured here, so no UNAUTHENTICATED).
const SPEC_CODES: [Code; 7] = [
    Code::InvalidArgument,
    Code::NotFound,
    Code::Aborted,
    Code::OutOfRange,
    Code::FailedPrecondition,
    Code::AlreadyExists,
    Code::ResourceExhausted,
];

/// How long any single wait in this file may take before the test fails.
const PATIENCE: Duration = Duration::from_secs(30);

static NEXT_ID: AtomicUsize = AtomicUsize::new(0);

/// A session id no other case uses.
fn fresh_id(prefix: &str) -> String {
    format!("{prefix}-{}", NEXT_ID.fetch_add(1, Ordering::Relaxed))
}

// ---------------------------------------------------------------------------
// Property-test plumbing

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// `PROPTEST_CASES` cases (48 by default) from a fixed seed unless
/// `PROPTEST_RNG_SEED` names one; no regression files; bounded shrinking.
fn proptest_config() -> Config {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(48);
    let defaults = Config::default();
    let rng_seed = match defaults.rng_seed {
        RngSeed::Random => RngSeed::Fixed(0x5e55_1057),
        fixed @ RngSeed::Fixed(_) => fixed,
    };
    Config {
        cases,
        rng_seed,
        failure_persistence: None,
        max_shrink_iters: 2048,
        ..defaults
    }
}

/// Runs `test` on values of `strategy`, each case blocking on `runtime`;
/// panics with proptest's report (the shrunk input) on failure.
fn run_property<S, F, Fut>(runtime: &tokio::runtime::Runtime, name: &str, strategy: S, test: F)
where
    S: Strategy,
    F: Fn(S::Value) -> Fut,
    Fut: Future<Output = Result<(), TestCaseError>>,
{
    let mut runner = TestRunner::new(proptest_config());
    if let Err(error) = runner.run(&strategy, |value| runtime.block_on(test(value))) {
        panic!("{name}: {error}");
    }
}

/// Turns a failed call into a failed case.
fn rpc<T>(
    what: &str,
    result: Result<tonic::Response<T>, tonic::Status>,
) -> Result<T, TestCaseError> {
    result
        .map(tonic::Response::into_inner)
        .map_err(|status| failed_call(what, &status))
}

fn failed_call(what: &str, status: &tonic::Status) -> TestCaseError {
    TestCaseError::fail(format!(
        "{what} failed: {:?} {:?} {:?}",
        status.code(),
        status.message(),
        error_details(status)
    ))
}

// ---------------------------------------------------------------------------
// Generators

/// Pieces that break naive escaping, JSON handling, SQL and Unicode
/// assumptions.
const TRICKY: &[&str] = &[
    "\0",
    "\0\0",
    "\\",
    "\\0",
    "\\\\0",
    "\\u0000",
    "\\\\",
    "\"",
    "'",
    "''",
    "\u{1}",
    "\u{1}\u{1}",
    "\u{1}\u{2}",
    "\u{1f}",
    "\u{7f}",
    "\u{301}",
    "e\u{301}",
    "\u{200d}",
    "\u{200b}",
    "👩\u{200d}👩\u{200d}👧",
    "😀",
    "\u{1f3fd}",
    "\u{fffd}",
    "\u{feff}",
    "\u{2028}",
    "\u{2029}",
    "\u{10ffff}",
    "\u{e000}",
    "\r\n",
    "\r",
    "\n",
    "\t",
    " ",
    "%",
    "_",
    "$1",
    "?",
    "' OR '1'='1",
    "); DROP TABLE messages; --",
    "ses_",
    "msg_",
    "```",
    "# ",
];

/// JSON-ish text that must survive byte for byte (never parsed).
const JSONISH: &[&str] = &[
    "{}",
    "",
    "null",
    "{\"a\": 1e400}",
    "{\"a\":1,\"a\":2}",
    "{\"s\": \"\\u0000\\ud800\"}",
    "[1, 2,",
    "  { \"x\" : [ ] }  ",
    "\"unterminated",
    "{\"deep\": [[[[[[[[[[]]]]]]]]]]}",
    "-0.0",
    "{\"k\": 1.0000000000000000000001}",
    "{'single': 'quotes'}",
    "\u{feff}{}",
];

fn piece() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => proptest::sample::select(TRICKY).prop_map(str::to_owned),
        3 => any::<char>().prop_map(String::from),
        2 => "[a-zA-Z0-9 ]{1,6}",
    ]
}

/// Arbitrary text: mostly short, sometimes a few hundred pieces.
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        8 => vec(piece(), 0..8).prop_map(|p| p.concat()),
        1 => vec(piece(), 8..200).prop_map(|p| p.concat()),
    ]
}

fn json_text() -> impl Strategy<Value = String> {
    prop_oneof![
        2 => text(),
        2 => proptest::sample::select(JSONISH).prop_map(str::to_owned),
        1 => (proptest::sample::select(JSONISH), text()).prop_map(|(j, t)| format!("{j}{t}")),
    ]
}

fn metadata() -> impl Strategy<Value = BTreeMap<String, String>> {
    btree_map(text(), text(), 0..3)
}

/// A content block of any kind.
fn block() -> impl Strategy<Value = pb::ContentBlock> {
    prop_oneof![
        text().prop_map(|text| Block::Text(pb::TextBlock { text })),
        (text(), text()).prop_map(|(thinking, signature)| Block::Thinking(pb::ThinkingBlock {
            thinking,
            signature,
        })),
        text().prop_map(|data| Block::RedactedThinking(pb::RedactedThinkingBlock { data })),
        (text(), text(), vec(any::<u8>(), 0..48)).prop_map(|(media_type, url, data)| {
            Block::Image(pb::ImageBlock {
                media_type,
                url,
                data,
            })
        }),
        (text(), text(), json_text())
            .prop_map(|(id, name, input)| Block::ToolUse(pb::ToolUseBlock { id, name, input })),
        (text(), text(), any::<bool>()).prop_map(|(tool_use_id, content, is_error)| {
            Block::ToolResult(pb::ToolResultBlock {
                tool_use_id,
                content,
                is_error,
            })
        }),
        (text(), json_text())
            .prop_map(|(r#type, json)| Block::Json(pb::JsonBlock { r#type, json })),
    ]
    .prop_map(|block| pb::ContentBlock { block: Some(block) })
}

fn tool_call() -> impl Strategy<Value = pb::ToolCall> {
    (text(), text(), json_text()).prop_map(|(id, name, arguments)| pb::ToolCall {
        id,
        name,
        arguments,
    })
}

/// A message with a valid role and arbitrary everything else.
fn message() -> impl Strategy<Value = pb::Message> {
    (
        1..=5i32,
        text(),
        vec(block(), 0..4),
        vec(tool_call(), 0..3),
        text(),
        any::<bool>(),
        text(),
        metadata(),
    )
        .prop_map(
            |(
                role,
                content,
                content_blocks,
                tool_calls,
                tool_call_id,
                tool_error,
                name,
                metadata,
            )| {
                pb::Message {
                    role,
                    content,
                    content_blocks,
                    tool_calls,
                    tool_call_id,
                    tool_error,
                    name,
                    metadata,
                }
            },
        )
}

/// A non-negative count or cost, including the extremes.
fn amount() -> impl Strategy<Value = i64> {
    prop_oneof![
        4 => 0..10_000i64,
        1 => Just(i64::MAX),
        1 => 0..=i64::MAX,
    ]
}

fn provider_call() -> impl Strategy<Value = pb::ProviderCall> {
    (
        (text(), text(), text(), text(), text()),
        (amount(), amount(), amount(), amount()),
    )
        .prop_map(
            |(
                (request_id, provider, model, requested_provider, requested_model),
                (prompt_tokens, completion_tokens, total_tokens, cost_micros_usd),
            )| pb::ProviderCall {
                request_id,
                provider,
                model,
                requested_provider,
                requested_model,
                prompt_tokens,
                completion_tokens,
                total_tokens,
                cost_micros_usd,
                ..Default::default()
            },
        )
}

// ---------------------------------------------------------------------------
// 1. The stored-message round trip

/// One session's life: created with arbitrary fields and history, one
/// exchange appended (as `messages` or as `full_history`), then forked and
/// edited.
#[derive(Clone, Debug)]
struct RoundTrip {
    title: String,
    system_prompt: String,
    user: String,
    metadata: BTreeMap<String, String>,
    initial_history: Vec<pb::Message>,
    messages: Vec<pb::Message>,
    call: Option<pb::ProviderCall>,
    responses: Vec<pb::Message>,
    /// Send the exchange as `full_history` (the stored history plus `messages`).
    full_history: bool,
    /// With `full_history`: lead with a copy of the system prompt.
    prompt_first: bool,
    /// EditMessage's new content for the first message.
    replacement: pb::Message,
    reason: String,
}

fn round_trips() -> impl Strategy<Value = RoundTrip> {
    (
        (text(), text(), text(), metadata()),
        (
            vec(message(), 0..3),
            vec(message(), 0..3),
            vec(message(), 0..3),
        ),
        (provider_call(), any::<bool>(), any::<bool>(), any::<bool>()),
        (message(), text()),
    )
        .prop_map(
            |(
                (title, system_prompt, user, metadata),
                (initial_history, messages, responses),
                (call, with_call, full_history, prompt_first),
                (replacement, reason),
            )| {
                // Valid shapes only: responses need a call, and an exchange
                // needs something to write.
                let with_call = with_call || !responses.is_empty() || messages.is_empty();
                RoundTrip {
                    title,
                    system_prompt,
                    user,
                    metadata,
                    initial_history,
                    messages,
                    call: with_call.then_some(call),
                    responses,
                    full_history,
                    prompt_first,
                    replacement,
                    reason,
                }
            },
        )
}

/// The system message an export with `include_system_prompt` leads with.
fn prompt_copy(prompt: &str) -> pb::Message {
    pb::Message {
        role: pb::Role::System.into(),
        content: prompt.to_owned(),
        ..Default::default()
    }
}

/// Whether `message` restates the system prompt (and so is not history).
fn is_prompt_copy(message: &pb::Message, prompt: &str) -> bool {
    !prompt.is_empty() && *message == prompt_copy(prompt)
}

impl RoundTrip {
    /// The history CreateSession stores: without a leading prompt copy.
    fn stored_initial(&self) -> Vec<pb::Message> {
        match self.initial_history.split_first() {
            Some((first, rest)) if is_prompt_copy(first, &self.system_prompt) => rest.to_vec(),
            _ => self.initial_history.clone(),
        }
    }

    fn append_request(
        &self,
        id: &str,
        stored_initial: &[pb::Message],
    ) -> pb::AppendExchangeRequest {
        let mut request = pb::AppendExchangeRequest {
            session_id: id.to_owned(),
            provider_call: self.call.clone(),
            response_messages: self.responses.clone(),
            request_id: format!("{id}-append"),
            ..Default::default()
        };
        if self.full_history {
            let body: Vec<pb::Message> = stored_initial
                .iter()
                .chain(&self.messages)
                .cloned()
                .collect();
            // A leading prompt copy is skipped by the server, so one that is
            // really history needs a copy in front of it.
            let lead = (self.prompt_first && !self.system_prompt.is_empty())
                || body
                    .first()
                    .is_some_and(|m| is_prompt_copy(m, &self.system_prompt));
            if lead {
                request.full_history.push(prompt_copy(&self.system_prompt));
            }
            request.full_history.extend(body);
        } else {
            request.messages = self.messages.clone();
        }
        request
    }
}

async fn try_export(
    client: &mut Client,
    request: pb::ExportHistoryRequest,
) -> Result<Vec<pb::Message>, tonic::Status> {
    let mut stream = client.export_history(request).await?.into_inner();
    let mut out = Vec::new();
    while let Some(chunk) = stream.message().await? {
        out.extend(chunk.messages);
    }
    Ok(out)
}

async fn try_list(
    client: &mut Client,
    id: &str,
    page_size: i32,
) -> Result<Vec<pb::StoredMessage>, tonic::Status> {
    let mut out = Vec::new();
    let mut page_token = String::new();
    loop {
        let page = client
            .list_messages(pb::ListMessagesRequest {
                session_id: id.to_owned(),
                page_size,
                page_token,
                ..Default::default()
            })
            .await?
            .into_inner();
        out.extend(page.messages);
        if page.next_page_token.is_empty() {
            return Ok(out);
        }
        page_token = page.next_page_token;
    }
}

async fn try_transcript(
    client: &mut Client,
    id: &str,
    format: i32,
) -> Result<Vec<u8>, tonic::Status> {
    let mut stream = client
        .export_transcript(pb::ExportTranscriptRequest {
            session_id: id.to_owned(),
            format,
        })
        .await?
        .into_inner();
    let mut out = Vec::new();
    while let Some(chunk) = stream.message().await? {
        out.extend(chunk.data);
    }
    Ok(out)
}

/// The next event of a watch, within [`PATIENCE`].
async fn next_event(events: &mut Events) -> Result<pb::SessionEvent, TestCaseError> {
    match tokio::time::timeout(PATIENCE, events.message()).await {
        Ok(Ok(Some(event))) => Ok(event),
        Ok(Ok(None)) => Err(TestCaseError::fail("watch stream ended")),
        Ok(Err(status)) => Err(failed_call("WatchSession", &status)),
        Err(_) => Err(TestCaseError::fail("no watch event within the patience")),
    }
}

fn plain(stored: &[pb::StoredMessage]) -> Vec<pb::Message> {
    stored
        .iter()
        .map(|m| m.message.clone().unwrap_or_default())
        .collect()
}

/// Every string under an `"arguments"` key, anywhere in `value`.
fn arguments_in(value: &serde_json::Value, out: &mut Vec<String>) {
    match value {
        serde_json::Value::Object(map) => {
            for (key, inner) in map {
                match (key.as_str(), inner) {
                    ("arguments", serde_json::Value::String(s)) => out.push(s.clone()),
                    _ => arguments_in(inner, out),
                }
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|v| arguments_in(v, out)),
        _ => {}
    }
}

async fn round_trip_case(mut client: Client, case: RoundTrip) -> Result<(), TestCaseError> {
    let id = fresh_id("rt");
    let created = rpc(
        "CreateSession",
        client
            .create_session(pb::CreateSessionRequest {
                session_id: id.clone(),
                title: case.title.clone(),
                system_prompt: case.system_prompt.clone(),
                user: case.user.clone(),
                metadata: case.metadata.clone(),
                initial_history: case.initial_history.clone(),
            })
            .await,
    )?;
    prop_assert_eq!(&created.title, &case.title);
    prop_assert_eq!(&created.system_prompt, &case.system_prompt);
    prop_assert_eq!(&created.user, &case.user);
    prop_assert_eq!(&created.metadata, &case.metadata);
    prop_assert_eq!(created.revision, 1);
    let got = rpc(
        "GetSession",
        client
            .get_session(pb::GetSessionRequest {
                session_id: id.clone(),
            })
            .await,
    )?;
    prop_assert_eq!(&got, &created);

    // The exchange, and its idempotent retry.
    let stored_initial = case.stored_initial();
    let request = case.append_request(&id, &stored_initial);
    let appended = rpc(
        "AppendExchange",
        client.append_exchange(request.clone()).await,
    )?;
    let new: Vec<pb::Message> = case
        .messages
        .iter()
        .chain(&case.responses)
        .cloned()
        .collect();
    let first_new = stored_initial.len();
    prop_assert_eq!(
        plain(&appended.messages),
        new.clone(),
        "AppendExchange answer"
    );
    prop_assert_eq!(appended.revision, 2);
    prop_assert_eq!(appended.next_sequence, (first_new + new.len()) as i64);
    let call_id = appended
        .provider_call
        .as_ref()
        .map(|c| c.id.clone())
        .unwrap_or_default();
    for (i, stored) in appended.messages.iter().enumerate() {
        prop_assert_eq!(stored.sequence, (first_new + i) as i64);
        prop_assert_eq!(&stored.session_id, &id);
        prop_assert!(stored.id.starts_with("msg_"), "message id {:?}", stored.id);
        let linked = if i >= case.messages.len() {
            call_id.as_str()
        } else {
            ""
        };
        prop_assert_eq!(stored.produced_by_call_id.as_str(), linked, "message {}", i);
    }
    match (&case.call, &appended.provider_call) {
        (None, None) => {}
        (Some(sent), Some(stored)) => {
            let total = if sent.total_tokens == 0 {
                sent.prompt_tokens.saturating_add(sent.completion_tokens)
            } else {
                sent.total_tokens
            };
            let expected = pb::ProviderCall {
                id: stored.id.clone(),
                session_id: id.clone(),
                total_tokens: total,
                create_time: stored.create_time,
                ..sent.clone()
            };
            prop_assert_eq!(stored, &expected);
            prop_assert!(stored.id.starts_with("call_"), "call id {:?}", stored.id);
        }
        (sent, stored) => prop_assert!(false, "sent call {:?}, stored {:?}", sent, stored),
    }
    let retried = rpc(
        "AppendExchange retry",
        client.append_exchange(request).await,
    )?;
    prop_assert_eq!(
        &retried,
        &appended,
        "an idempotent retry answers the first result"
    );

    // Every read returns exactly what was written.
    let expected: Vec<pb::Message> = stored_initial.iter().chain(&new).cloned().collect();
    let export_request = pb::ExportHistoryRequest {
        session_id: id.clone(),
        ..Default::default()
    };
    let exported = try_export(&mut client, export_request.clone())
        .await
        .map_err(|s| failed_call("ExportHistory", &s))?;
    prop_assert_eq!(&exported, &expected, "ExportHistory");
    let with_prompt = try_export(
        &mut client,
        pb::ExportHistoryRequest {
            include_system_prompt: true,
            ..export_request.clone()
        },
    )
    .await
    .map_err(|s| failed_call("ExportHistory with prompt", &s))?;
    let prompt: Vec<pb::Message> = (!case.system_prompt.is_empty())
        .then(|| prompt_copy(&case.system_prompt))
        .into_iter()
        .collect();
    prop_assert_eq!(
        &with_prompt[..prompt.len().min(with_prompt.len())],
        &prompt[..]
    );
    prop_assert_eq!(
        &with_prompt[prompt.len().min(with_prompt.len())..],
        &expected[..]
    );

    let listed = try_list(&mut client, &id, 2)
        .await
        .map_err(|s| failed_call("ListMessages", &s))?;
    prop_assert_eq!(plain(&listed), expected.clone(), "ListMessages");
    for (i, stored) in listed.iter().enumerate() {
        prop_assert_eq!(stored.sequence, i as i64);
    }
    prop_assert_eq!(&listed[first_new..], &appended.messages[..]);

    let calls = rpc(
        "ListProviderCalls",
        client
            .list_provider_calls(pb::ListProviderCallsRequest {
                session_id: id.clone(),
                ..Default::default()
            })
            .await,
    )?;
    let expected_calls: Vec<pb::ProviderCall> = appended.provider_call.iter().cloned().collect();
    prop_assert_eq!(&calls.provider_calls, &expected_calls);

    // The event log holds the same bodies.
    let mut events = client
        .watch_session(pb::WatchSessionRequest {
            session_id: id.clone(),
            after_revision: 0,
            include_active_deltas: false,
        })
        .await
        .map_err(|s| failed_call("WatchSession", &s))?
        .into_inner();
    let event = next_event(&mut events).await?;
    let Some(Event::SessionCreated(made)) = event.event else {
        return Err(TestCaseError::fail(format!("first event {event:?}")));
    };
    prop_assert_eq!(
        plain(&made.messages),
        stored_initial.clone(),
        "session_created"
    );
    prop_assert_eq!(&listed[..first_new], &made.messages[..]);
    let event = next_event(&mut events).await?;
    let Some(Event::ExchangeAppended(exchange)) = event.event else {
        return Err(TestCaseError::fail(format!("second event {event:?}")));
    };
    prop_assert_eq!(&exchange.messages, &appended.messages, "exchange_appended");
    prop_assert_eq!(&exchange.provider_call, &appended.provider_call);
    let event = next_event(&mut events).await?;
    prop_assert!(
        matches!(event.event, Some(Event::CaughtUp(_))),
        "expected caught_up, got {:?}",
        event
    );
    drop(events);

    // Transcripts render anything; the OpenAI form keeps every argument.
    let markdown = try_transcript(&mut client, &id, pb::TranscriptFormat::Markdown.into())
        .await
        .map_err(|s| failed_call("ExportTranscript markdown", &s))?;
    prop_assert!(String::from_utf8(markdown).is_ok(), "Markdown is not UTF-8");
    let openai = try_transcript(&mut client, &id, pb::TranscriptFormat::OpenaiJson.into())
        .await
        .map_err(|s| failed_call("ExportTranscript openai", &s))?;
    let openai: serde_json::Value = serde_json::from_slice(&openai)
        .map_err(|e| TestCaseError::fail(format!("OpenAI transcript is not JSON: {e}")))?;
    prop_assert!(openai.is_array(), "OpenAI transcript is not an array");
    if !case.system_prompt.is_empty() {
        prop_assert_eq!(&openai[0]["role"], "system");
        prop_assert_eq!(
            openai[0]["content"].as_str(),
            Some(case.system_prompt.as_str())
        );
    }
    let mut found = Vec::new();
    arguments_in(&openai, &mut found);
    for message in &expected {
        let sent = message.tool_calls.iter().map(|c| &c.arguments).chain(
            message
                .content_blocks
                .iter()
                .filter_map(|b| match &b.block {
                    Some(Block::ToolUse(u)) => Some(&u.input),
                    _ => None,
                }),
        );
        for arguments in sent {
            let at = found.iter().position(|f| f == arguments);
            prop_assert!(
                at.is_some(),
                "arguments {:?} missing from {}",
                arguments,
                openai
            );
            if let Some(at) = at {
                found.swap_remove(at);
            }
        }
    }

    // A fork copies the history exactly.
    let fork_id = format!("{id}-fork");
    let fork = rpc(
        "ForkSession",
        client
            .fork_session(pb::ForkSessionRequest {
                session_id: id.clone(),
                at_sequence: expected.len() as i64 - 1,
                new_session_id: fork_id.clone(),
            })
            .await,
    )?;
    prop_assert_eq!(&fork.metadata, &case.metadata);
    prop_assert_eq!(&fork.system_prompt, &case.system_prompt);
    let forked = try_export(
        &mut client,
        pb::ExportHistoryRequest {
            session_id: fork_id,
            ..Default::default()
        },
    )
    .await
    .map_err(|s| failed_call("ExportHistory of the fork", &s))?;
    prop_assert_eq!(&forked, &expected, "fork");

    // An edit replaces the first message; the event keeps the previous one.
    if let Some(first) = listed.first() {
        let edited = rpc(
            "EditMessage",
            client
                .edit_message(pb::EditMessageRequest {
                    session_id: id.clone(),
                    message_id: first.id.clone(),
                    message: Some(case.replacement.clone()),
                    reason: case.reason.clone(),
                    run_id: String::new(),
                })
                .await,
        )?;
        prop_assert_eq!(
            edited.message.as_ref().and_then(|m| m.message.as_ref()),
            Some(&case.replacement)
        );
        let mut after_edit = expected.clone();
        after_edit[0] = case.replacement.clone();
        let exported = try_export(&mut client, export_request)
            .await
            .map_err(|s| failed_call("ExportHistory after edit", &s))?;
        prop_assert_eq!(&exported, &after_edit, "after EditMessage");
        let mut events = client
            .watch_session(pb::WatchSessionRequest {
                session_id: id.clone(),
                after_revision: appended.revision,
                include_active_deltas: false,
            })
            .await
            .map_err(|s| failed_call("WatchSession after edit", &s))?
            .into_inner();
        let event = next_event(&mut events).await?;
        let Some(Event::MessageEdited(change)) = event.event else {
            return Err(TestCaseError::fail(format!("edit event {event:?}")));
        };
        prop_assert_eq!(change.previous.as_ref(), Some(&expected[0]));
        prop_assert_eq!(
            change.message.as_ref().and_then(|m| m.message.as_ref()),
            Some(&case.replacement)
        );
        prop_assert_eq!(&change.reason, &case.reason);
    }
    Ok(())
}

fn round_trip(backend: Backend) {
    let runtime = runtime();
    if matches!(backend, Backend::Postgres)
        && !runtime.block_on(postgres_available("hostile::round_trip_postgres"))
    {
        return;
    }
    let server = runtime.block_on(TestServer::start(backend));
    let client = runtime.block_on(server.client());
    run_property(
        &runtime,
        &format!("message round trip on {backend:?}"),
        round_trips(),
        |case| round_trip_case(client.clone(), case),
    );
    drop(client);
    runtime
        .block_on(server.stop())
        .expect("the server stops cleanly");
}

#[test]
fn round_trip_memory() {
    round_trip(Backend::Memory);
}

#[test]
fn round_trip_file() {
    round_trip(Backend::File);
}

#[test]
fn round_trip_postgres() {
    round_trip(Backend::Postgres);
}

// ---------------------------------------------------------------------------
// 2. Request validation

/// Which session a request names.
#[derive(Clone, Debug)]
enum Sid {
    /// The case's session (created with three messages).
    Live,
    /// A well-formed id no session has.
    Missing,
    Raw(String),
}

/// Which message a request names.
#[derive(Clone, Debug)]
enum Mid {
    /// The live session's message at this index (modulo its length).
    Live(usize),
    Raw(String),
}

/// A page token: raw text, or a forged one in the server's own encoding
/// (`{live}` in a part stands for the live session id).
#[derive(Clone, Debug)]
enum Token {
    Raw(String),
    Forged(String, Vec<String>),
}

#[derive(Clone, Debug)]
enum Req {
    Create {
        id: String,
        history: Vec<pb::Message>,
        metadata: BTreeMap<String, String>,
    },
    Get(Sid),
    ListSessions {
        page_size: i32,
        token: Token,
        user: String,
    },
    Update {
        sid: Sid,
        title: String,
        summary: Option<Mid>,
        paths: Option<Vec<String>>,
        metadata: BTreeMap<String, String>,
    },
    Delete(Sid),
    Append {
        sid: Sid,
        messages: Vec<pb::Message>,
        full_history: Vec<pb::Message>,
        call: Option<pb::ProviderCall>,
        responses: Vec<pb::Message>,
        expected: Option<i64>,
        request_id: String,
        run_id: String,
    },
    Export {
        sid: Sid,
        include_system_prompt: bool,
        from_summary: bool,
        after: Option<i64>,
        max: i64,
    },
    ListMessages {
        sid: Sid,
        after: Option<i64>,
        page_size: i32,
        token: Token,
    },
    ListCalls {
        sid: Sid,
        page_size: i32,
        token: Token,
    },
    Watch {
        sid: Sid,
        after_revision: i64,
    },
    Delta {
        sid: Sid,
        run_id: String,
        index: i64,
        delta: Option<pb::publish_delta_request::Delta>,
    },
    Discard {
        sid: Sid,
        run_id: String,
    },
    Begin {
        sid: Sid,
        run_id: String,
        lease: Option<prost_types::Duration>,
    },
    End {
        sid: Sid,
        run_id: String,
    },
    Rollback {
        sid: Sid,
        after: i64,
        run_id: String,
    },
    Edit {
        sid: Sid,
        mid: Mid,
        message: Option<pb::Message>,
        reason: String,
        run_id: String,
    },
    Redact {
        sid: Sid,
        mid: Mid,
        reason: String,
        run_id: String,
    },
    Fork {
        sid: Sid,
        at: i64,
        new_id: String,
    },
    Transcript {
        sid: Sid,
        format: i32,
    },
    SetState {
        sid: Sid,
        key: String,
        value: String,
        expected: Option<i64>,
    },
    GetState {
        sid: Sid,
        key: String,
    },
    ListState {
        sid: Sid,
        page_size: i32,
        token: Token,
    },
    DeleteState {
        sid: Sid,
        key: String,
        expected: Option<i64>,
    },
    Search {
        query: String,
        user: String,
        page_size: i32,
        token: Token,
    },
}

/// Session ids a caller might send: empty, over-long, control characters,
/// injection attempts, or merely unusual.
fn raw_id() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        Just("x".repeat(128)),
        Just("y".repeat(129)),
        Just("z".repeat(5000)),
        Just("ses_\0".to_owned()),
        Just("../../etc/passwd".to_owned()),
        Just("ses x".to_owned()),
        text(),
        "[a-zA-Z0-9_.:-]{1,20}",
    ]
}

fn sid() -> impl Strategy<Value = Sid> {
    prop_oneof![
        6 => Just(Sid::Live),
        1 => Just(Sid::Missing),
        3 => raw_id().prop_map(Sid::Raw),
    ]
}

fn mid() -> impl Strategy<Value = Mid> {
    prop_oneof![
        3 => (0..8usize).prop_map(Mid::Live),
        1 => Just(Mid::Raw(String::new())),
        1 => Just(Mid::Raw("m".repeat(300))),
        1 => text().prop_map(Mid::Raw),
    ]
}

/// Mostly small, sometimes extreme.
fn int64() -> impl Strategy<Value = i64> {
    prop_oneof![
        4 => -3..8i64,
        1 => Just(i64::MIN),
        1 => Just(i64::MAX),
        1 => any::<i64>(),
    ]
}

fn page_size() -> impl Strategy<Value = i32> {
    prop_oneof![
        6 => Just(0),
        3 => -3..5i32,
        1 => Just(i32::MIN),
        1 => Just(i32::MAX),
        1 => 990..1010i32,
        1 => any::<i32>(),
    ]
}

/// A role as a raw enum value: valid, unspecified, or unknown.
fn any_role() -> impl Strategy<Value = i32> {
    prop_oneof![
        6 => 1..=5i32,
        1 => Just(0),
        1 => Just(6),
        1 => Just(99),
        1 => Just(-1),
        1 => any::<i32>(),
    ]
}

/// A message that may have a bad role or an empty content block.
fn loose_message() -> impl Strategy<Value = pb::Message> {
    (
        any_role(),
        message(),
        prop_oneof![5 => Just(false), 1 => Just(true)],
    )
        .prop_map(|(role, mut message, empty_block)| {
            message.role = role;
            if empty_block {
                message
                    .content_blocks
                    .push(pb::ContentBlock { block: None });
            }
            message
        })
}

fn loose_messages() -> impl Strategy<Value = Vec<pb::Message>> {
    prop_oneof![
        2 => Just(Vec::new()),
        3 => vec(loose_message(), 1..3),
    ]
}

/// Any counts at all, negative ones included; and ignored fields set.
fn loose_call() -> impl Strategy<Value = pb::ProviderCall> {
    (
        provider_call(),
        [int64(), int64(), int64(), int64()],
        text(),
    )
        .prop_map(|(mut call, [prompt, completion, total, cost], id)| {
            call.prompt_tokens = prompt;
            call.completion_tokens = completion;
            call.total_tokens = total;
            call.cost_micros_usd = cost;
            call.id = id;
            call.create_time = Some(prost_types::Timestamp {
                seconds: i64::MIN,
                nanos: -1,
            });
            call
        })
}

fn run_id() -> impl Strategy<Value = String> {
    prop_oneof![
        2 => Just(String::new()),
        2 => "[a-z]{1,4}",
        1 => text(),
        1 => Just("r".repeat(257)),
    ]
}

fn state_key() -> impl Strategy<Value = String> {
    prop_oneof![
        1 => Just(String::new()),
        3 => "[a-z]{1,3}",
        2 => text(),
        1 => Just("\0".to_owned()),
        1 => Just("k".repeat(257)),
    ]
}

fn expected_version() -> impl Strategy<Value = Option<i64>> {
    prop_oneof![2 => Just(None), 1 => int64().prop_map(Some)]
}

/// Minimal base64url without padding, the page tokens' alphabet.
fn base64url(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | (u32::from(*b) << (16 - 8 * i)));
        for i in 0..=chunk.len() {
            out.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
        }
    }
    out
}

const TOKEN_KINDS: &[&str] = &[
    "messages", "calls", "sessions", "state", "search", "nope", "",
];

const MASK_PATHS: &[&str] = &[
    "title",
    "system_prompt",
    "metadata",
    "summary_message_id",
    "*",
    "",
    "nope",
    "title.x",
];

fn token() -> impl Strategy<Value = Token> {
    prop_oneof![
        8 => Just(Token::Raw(String::new())),
        2 => text().prop_map(Token::Raw),
        2 => vec(any::<u8>(), 0..40).prop_map(|b| Token::Raw(base64url(&b))),
        3 => (
            proptest::sample::select(TOKEN_KINDS),
            vec(
                prop_oneof![
                    Just("{live}".to_owned()),
                    Just(String::new()),
                    text(),
                    int64().prop_map(|n| n.to_string()),
                ],
                0..4,
            ),
        )
            .prop_map(|(kind, parts)| Token::Forged(kind.to_owned(), parts)),
    ]
}

/// A lease: missing, negative, zero, over a day, or long enough that it
/// never runs out during a case (an expiry would be a revision of its own).
fn lease() -> impl Strategy<Value = Option<prost_types::Duration>> {
    let seconds = prop_oneof![Just(i64::MIN), Just(i64::MAX), -100..=0i64, 60..200_000i64,];
    let nanos = prop_oneof![
        Just(0),
        Just(-1),
        Just(i32::MIN),
        Just(i32::MAX),
        Just(999_999_999),
        Just(1_000_000_000),
    ];
    prop_oneof![
        1 => Just(None),
        3 => (60..3600i64).prop_map(|seconds| Some(prost_types::Duration { seconds, nanos: 0 })),
        4 => (seconds, nanos).prop_map(|(seconds, nanos)| {
            let micros = seconds
                .saturating_mul(1_000_000)
                .saturating_add(i64::from(nanos / 1000));
            let seconds = if (1..30_000_000).contains(&micros) { 60 } else { seconds };
            Some(prost_types::Duration { seconds, nanos })
        }),
    ]
}

fn delta() -> impl Strategy<Value = Option<pb::publish_delta_request::Delta>> {
    use pb::publish_delta_request::Delta;
    prop_oneof![
        1 => Just(None),
        2 => text().prop_map(|t| Some(Delta::Text(t))),
        2 => block().prop_map(|b| Some(Delta::Block(b))),
        1 => Just(Some(Delta::Block(pb::ContentBlock { block: None }))),
    ]
}

fn request() -> impl Strategy<Value = Req> {
    Union::new(vec![
        (
            prop_oneof![Just(String::new()), raw_id()],
            vec(loose_message(), 0..3),
            metadata(),
        )
            .prop_map(|(id, history, metadata)| Req::Create {
                id,
                history,
                metadata,
            })
            .boxed(),
        sid().prop_map(Req::Get).boxed(),
        (
            page_size(),
            token(),
            prop_oneof![Just(String::new()), text()],
        )
            .prop_map(|(page_size, token, user)| Req::ListSessions {
                page_size,
                token,
                user,
            })
            .boxed(),
        (
            sid(),
            text(),
            proptest::option::of(mid()),
            proptest::option::of(vec(
                proptest::sample::select(MASK_PATHS).prop_map(str::to_owned),
                0..3,
            )),
            metadata(),
        )
            .prop_map(|(sid, title, summary, paths, metadata)| Req::Update {
                sid,
                title,
                summary,
                paths,
                metadata,
            })
            .boxed(),
        sid().prop_map(Req::Delete).boxed(),
        (
            sid(),
            loose_messages(),
            prop_oneof![3 => Just(Vec::new()), 1 => vec(loose_message(), 0..5)],
            proptest::option::of(loose_call()),
            loose_messages(),
            prop_oneof![Just(None), Just(Some(3)), int64().prop_map(Some)],
            prop_oneof![
                Just(String::new()),
                "[a-z]{1,2}",
                text(),
                Just("i".repeat(257))
            ],
            run_id(),
        )
            .prop_map(
                |(sid, messages, full_history, call, responses, expected, request_id, run_id)| {
                    Req::Append {
                        sid,
                        messages,
                        full_history,
                        call,
                        responses,
                        expected,
                        request_id,
                        run_id,
                    }
                },
            )
            .boxed(),
        // Near-valid appends to the live session: they succeed, or meet a
        // busy session, a stale expected_next_sequence or a reused key.
        (
            vec(message(), 0..3),
            proptest::option::of(provider_call()),
            vec(message(), 0..2),
            prop_oneof![2 => Just(None), 1 => (3..7i64).prop_map(Some)],
            prop_oneof![
                Just(String::new()),
                "[ab]".prop_map(|key| format!("{key}-{{live}}"))
            ],
            prop_oneof![2 => Just(String::new()), 1 => "[ab]"],
        )
            .prop_map(
                |(messages, call, responses, expected, request_id, run_id)| {
                    let call = call.or_else(|| {
                        (messages.is_empty() || !responses.is_empty())
                            .then(pb::ProviderCall::default)
                    });
                    Req::Append {
                        sid: Sid::Live,
                        messages,
                        full_history: Vec::new(),
                        call,
                        responses,
                        expected,
                        request_id,
                        run_id,
                    }
                },
            )
            .boxed(),
        (
            sid(),
            any::<bool>(),
            any::<bool>(),
            proptest::option::of(int64()),
            int64(),
        )
            .prop_map(
                |(sid, include_system_prompt, from_summary, after, max)| Req::Export {
                    sid,
                    include_system_prompt,
                    from_summary,
                    after,
                    max,
                },
            )
            .boxed(),
        (sid(), proptest::option::of(int64()), page_size(), token())
            .prop_map(|(sid, after, page_size, token)| Req::ListMessages {
                sid,
                after,
                page_size,
                token,
            })
            .boxed(),
        (sid(), page_size(), token())
            .prop_map(|(sid, page_size, token)| Req::ListCalls {
                sid,
                page_size,
                token,
            })
            .boxed(),
        (sid(), prop_oneof![int64(), Just(1000), 1..4i64])
            .prop_map(|(sid, after_revision)| Req::Watch {
                sid,
                after_revision,
            })
            .boxed(),
        (sid(), run_id(), int64(), delta())
            .prop_map(|(sid, run_id, index, delta)| Req::Delta {
                sid,
                run_id,
                index,
                delta,
            })
            .boxed(),
        (sid(), run_id())
            .prop_map(|(sid, run_id)| Req::Discard { sid, run_id })
            .boxed(),
        (sid(), run_id(), lease())
            .prop_map(|(sid, run_id, lease)| Req::Begin { sid, run_id, lease })
            .boxed(),
        // A near-valid BeginRun: the live session gets busy.
        ("[ab]", 60..3600i64)
            .prop_map(|(run_id, seconds)| Req::Begin {
                sid: Sid::Live,
                run_id,
                lease: Some(prost_types::Duration { seconds, nanos: 0 }),
            })
            .boxed(),
        (sid(), run_id())
            .prop_map(|(sid, run_id)| Req::End { sid, run_id })
            .boxed(),
        (sid(), int64(), run_id())
            .prop_map(|(sid, after, run_id)| Req::Rollback { sid, after, run_id })
            .boxed(),
        (
            sid(),
            mid(),
            proptest::option::of(loose_message()),
            prop_oneof![text(), Just("w".repeat(1025))],
            run_id(),
        )
            .prop_map(|(sid, mid, message, reason, run_id)| Req::Edit {
                sid,
                mid,
                message,
                reason,
                run_id,
            })
            .boxed(),
        (
            sid(),
            mid(),
            prop_oneof![text(), Just("w".repeat(1025))],
            run_id(),
        )
            .prop_map(|(sid, mid, reason, run_id)| Req::Redact {
                sid,
                mid,
                reason,
                run_id,
            })
            .boxed(),
        (sid(), int64(), prop_oneof![Just(String::new()), raw_id()])
            .prop_map(|(sid, at, new_id)| Req::Fork { sid, at, new_id })
            .boxed(),
        (
            sid(),
            prop_oneof![
                0..4i32,
                Just(-1),
                Just(i32::MIN),
                Just(i32::MAX),
                any::<i32>()
            ],
        )
            .prop_map(|(sid, format)| Req::Transcript { sid, format })
            .boxed(),
        (
            sid(),
            state_key(),
            prop_oneof![4 => text(), 1 => Just("v".repeat(64 * 1024 + 1))],
            expected_version(),
        )
            .prop_map(|(sid, key, value, expected)| Req::SetState {
                sid,
                key,
                value,
                expected,
            })
            .boxed(),
        (sid(), state_key())
            .prop_map(|(sid, key)| Req::GetState { sid, key })
            .boxed(),
        (sid(), page_size(), token())
            .prop_map(|(sid, page_size, token)| Req::ListState {
                sid,
                page_size,
                token,
            })
            .boxed(),
        (sid(), state_key(), expected_version())
            .prop_map(|(sid, key, expected)| Req::DeleteState { sid, key, expected })
            .boxed(),
        (
            prop_oneof![
                Just(String::new()),
                "[a-z]{1,5}( [a-zA-Z]{1,5}){0,3}",
                Just("\0 \0".to_owned()),
                text(),
                Just("w ".repeat(40)),
                Just("q".repeat(1025)),
            ],
            prop_oneof![Just(String::new()), text()],
            page_size(),
            token(),
        )
            .prop_map(|(query, user, page_size, token)| Req::Search {
                query,
                user,
                page_size,
                token,
            })
            .boxed(),
    ])
}

/// What a case's requests resolve against.
struct Live {
    id: String,
    message_ids: Vec<String>,
}

const MISSING_ID: &str = "ses_hostile_missing";

impl Live {
    fn sid(&self, sid: &Sid) -> String {
        match sid {
            Sid::Live => self.id.clone(),
            Sid::Missing => MISSING_ID.to_owned(),
            Sid::Raw(raw) => raw.clone(),
        }
    }

    fn mid(&self, mid: &Mid) -> String {
        match mid {
            Mid::Live(i) if !self.message_ids.is_empty() => {
                self.message_ids[i % self.message_ids.len()].clone()
            }
            Mid::Live(_) => "msg_none".to_owned(),
            Mid::Raw(raw) => raw.clone(),
        }
    }

    fn token(&self, token: &Token) -> String {
        match token {
            Token::Raw(raw) => raw.clone(),
            Token::Forged(kind, parts) => {
                let mut plain = kind.clone();
                for part in parts {
                    plain.push('\u{1f}');
                    plain.push_str(&part.replace("{live}", &self.id));
                }
                base64url(plain.as_bytes())
            }
        }
    }

    /// The sessions a request could change: its own and any it creates.
    fn touched(&self, req: &Req) -> Vec<String> {
        let ids = match req {
            Req::Create { id, .. } => vec![id.clone()],
            Req::ListSessions { .. } | Req::Search { .. } => Vec::new(),
            Req::Fork { sid, new_id, .. } => vec![self.sid(sid), new_id.clone()],
            Req::Get(sid) | Req::Delete(sid) => vec![self.sid(sid)],
            Req::Update { sid, .. }
            | Req::Append { sid, .. }
            | Req::Export { sid, .. }
            | Req::ListMessages { sid, .. }
            | Req::ListCalls { sid, .. }
            | Req::Watch { sid, .. }
            | Req::Delta { sid, .. }
            | Req::Discard { sid, .. }
            | Req::Begin { sid, .. }
            | Req::End { sid, .. }
            | Req::Rollback { sid, .. }
            | Req::Edit { sid, .. }
            | Req::Redact { sid, .. }
            | Req::Transcript { sid, .. }
            | Req::SetState { sid, .. }
            | Req::GetState { sid, .. }
            | Req::ListState { sid, .. }
            | Req::DeleteState { sid, .. } => vec![self.sid(sid)],
        };
        // Ids no session can have are not worth a look-up.
        ids.into_iter()
            .filter(|id| !id.is_empty() && id.len() <= 128)
            .collect()
    }
}

/// Sends one request; a streaming answer is read to its end (a watch: to
/// `caught_up`).
async fn send(client: &mut Client, live: &Live, req: &Req) -> Result<(), tonic::Status> {
    match req {
        Req::Create {
            id,
            history,
            metadata,
        } => {
            client
                .create_session(pb::CreateSessionRequest {
                    session_id: id.clone(),
                    title: "hostile".into(),
                    system_prompt: "prompt".into(),
                    user: "mallory".into(),
                    metadata: metadata.clone(),
                    initial_history: history.clone(),
                })
                .await?;
        }
        Req::Get(sid) => {
            client
                .get_session(pb::GetSessionRequest {
                    session_id: live.sid(sid),
                })
                .await?;
        }
        Req::ListSessions {
            page_size,
            token,
            user,
        } => {
            client
                .list_sessions(pb::ListSessionsRequest {
                    page_size: *page_size,
                    page_token: live.token(token),
                    user: user.clone(),
                })
                .await?;
        }
        Req::Update {
            sid,
            title,
            summary,
            paths,
            metadata,
        } => {
            client
                .update_session(pb::UpdateSessionRequest {
                    session: Some(pb::Session {
                        id: live.sid(sid),
                        title: title.clone(),
                        metadata: metadata.clone(),
                        summary_message_id: summary
                            .as_ref()
                            .map(|m| live.mid(m))
                            .unwrap_or_default(),
                        revision: -7,
                        ..Default::default()
                    }),
                    update_mask: paths.clone().map(|paths| prost_types::FieldMask { paths }),
                })
                .await?;
        }
        Req::Delete(sid) => {
            client
                .delete_session(pb::DeleteSessionRequest {
                    session_id: live.sid(sid),
                })
                .await?;
        }
        Req::Append {
            sid,
            messages,
            full_history,
            call,
            responses,
            expected,
            request_id,
            run_id,
        } => {
            client
                .append_exchange(pb::AppendExchangeRequest {
                    session_id: live.sid(sid),
                    messages: messages.clone(),
                    full_history: full_history.clone(),
                    provider_call: call.clone(),
                    response_messages: responses.clone(),
                    expected_next_sequence: *expected,
                    request_id: request_id.replace("{live}", &live.id),
                    run_id: run_id.clone(),
                })
                .await?;
        }
        Req::Export {
            sid,
            include_system_prompt,
            from_summary,
            after,
            max,
        } => {
            try_export(
                client,
                pb::ExportHistoryRequest {
                    session_id: live.sid(sid),
                    include_system_prompt: *include_system_prompt,
                    from_summary: *from_summary,
                    after_sequence: *after,
                    max_messages: *max,
                },
            )
            .await?;
        }
        Req::ListMessages {
            sid,
            after,
            page_size,
            token,
        } => {
            client
                .list_messages(pb::ListMessagesRequest {
                    session_id: live.sid(sid),
                    after_sequence: *after,
                    page_size: *page_size,
                    page_token: live.token(token),
                })
                .await?;
        }
        Req::ListCalls {
            sid,
            page_size,
            token,
        } => {
            client
                .list_provider_calls(pb::ListProviderCallsRequest {
                    session_id: live.sid(sid),
                    page_size: *page_size,
                    page_token: live.token(token),
                })
                .await?;
        }
        Req::Watch {
            sid,
            after_revision,
        } => {
            let mut events = client
                .watch_session(pb::WatchSessionRequest {
                    session_id: live.sid(sid),
                    after_revision: *after_revision,
                    include_active_deltas: true,
                })
                .await?
                .into_inner();
            let caught_up = async {
                let mut last = 0;
                loop {
                    match events.message().await? {
                        None => {
                            return Err(tonic::Status::data_loss("watch ended before caught_up"));
                        }
                        Some(pb::SessionEvent {
                            event: Some(Event::CaughtUp(_)),
                            ..
                        }) => return Ok(()),
                        Some(event) if event.revision <= last => {
                            return Err(tonic::Status::data_loss(format!(
                                "watch replayed revision {} after {last}",
                                event.revision
                            )));
                        }
                        Some(event) => last = event.revision,
                    }
                }
            };
            tokio::time::timeout(PATIENCE, caught_up)
                .await
                .map_err(|_| tonic::Status::deadline_exceeded("watch never caught up"))??;
        }
        Req::Delta {
            sid,
            run_id,
            index,
            delta,
        } => {
            client
                .publish_delta(pb::PublishDeltaRequest {
                    session_id: live.sid(sid),
                    run_id: run_id.clone(),
                    index: *index,
                    delta: delta.clone(),
                })
                .await?;
        }
        Req::Discard { sid, run_id } => {
            client
                .discard_run(pb::DiscardRunRequest {
                    session_id: live.sid(sid),
                    run_id: run_id.clone(),
                })
                .await?;
        }
        Req::Begin { sid, run_id, lease } => {
            client
                .begin_run(pb::BeginRunRequest {
                    session_id: live.sid(sid),
                    run_id: run_id.clone(),
                    lease: *lease,
                })
                .await?;
        }
        Req::End { sid, run_id } => {
            client
                .end_run(pb::EndRunRequest {
                    session_id: live.sid(sid),
                    run_id: run_id.clone(),
                })
                .await?;
        }
        Req::Rollback { sid, after, run_id } => {
            client
                .rollback_session(pb::RollbackSessionRequest {
                    session_id: live.sid(sid),
                    after_sequence: *after,
                    run_id: run_id.clone(),
                })
                .await?;
        }
        Req::Edit {
            sid,
            mid,
            message,
            reason,
            run_id,
        } => {
            client
                .edit_message(pb::EditMessageRequest {
                    session_id: live.sid(sid),
                    message_id: live.mid(mid),
                    message: message.clone(),
                    reason: reason.clone(),
                    run_id: run_id.clone(),
                })
                .await?;
        }
        Req::Redact {
            sid,
            mid,
            reason,
            run_id,
        } => {
            client
                .redact_message(pb::RedactMessageRequest {
                    session_id: live.sid(sid),
                    message_id: live.mid(mid),
                    reason: reason.clone(),
                    run_id: run_id.clone(),
                })
                .await?;
        }
        Req::Fork { sid, at, new_id } => {
            client
                .fork_session(pb::ForkSessionRequest {
                    session_id: live.sid(sid),
                    at_sequence: *at,
                    new_session_id: new_id.clone(),
                })
                .await?;
        }
        Req::Transcript { sid, format } => {
            try_transcript(client, &live.sid(sid), *format).await?;
        }
        Req::SetState {
            sid,
            key,
            value,
            expected,
        } => {
            client
                .set_state(pb::SetStateRequest {
                    session_id: live.sid(sid),
                    key: key.clone(),
                    value: value.clone(),
                    expected_version: *expected,
                })
                .await?;
        }
        Req::GetState { sid, key } => {
            client
                .get_state(pb::GetStateRequest {
                    session_id: live.sid(sid),
                    key: key.clone(),
                })
                .await?;
        }
        Req::ListState {
            sid,
            page_size,
            token,
        } => {
            client
                .list_state(pb::ListStateRequest {
                    session_id: live.sid(sid),
                    page_size: *page_size,
                    page_token: live.token(token),
                })
                .await?;
        }
        Req::DeleteState { sid, key, expected } => {
            client
                .delete_state(pb::DeleteStateRequest {
                    session_id: live.sid(sid),
                    key: key.clone(),
                    expected_version: *expected,
                })
                .await?;
        }
        Req::Search {
            query,
            user,
            page_size,
            token,
        } => {
            client
                .search_messages(pb::SearchMessagesRequest {
                    query: query.clone(),
                    user: user.clone(),
                    page_size: *page_size,
                    page_token: live.token(token),
                })
                .await?;
        }
    }
    Ok(())
}

/// The session as GetSession shows it, or `None` if there is none.
async fn snapshot(client: &mut Client, id: &str) -> Result<Option<pb::Session>, TestCaseError> {
    match client
        .get_session(pb::GetSessionRequest {
            session_id: id.to_owned(),
        })
        .await
    {
        Ok(session) => Ok(Some(session.into_inner())),
        Err(status) if status.code() == Code::NotFound => Ok(None),
        Err(status) => Err(failed_call("GetSession (snapshot)", &status)),
    }
}

/// A refused request got an allowed status with its details.
fn check_refusal(req: &Req, status: &tonic::Status) -> Result<(), TestCaseError> {
    let (reason, field) = error_details(status);
    prop_assert!(
        SPEC_CODES.contains(&status.code()),
        "{:?} answered {:?} {:?} (details {:?})",
        req,
        status.code(),
        status.message(),
        (reason, field)
    );
    prop_assert!(
        reason.as_deref().is_some_and(|r| !r.is_empty()),
        "{:?}: status {:?} {:?} carries no ErrorInfo reason",
        req,
        status.code(),
        status.message()
    );
    if status.code() == Code::InvalidArgument {
        prop_assert!(
            field.as_deref().is_some_and(|f| !f.is_empty()),
            "{:?}: INVALID_ARGUMENT {:?} names no field in BadRequest",
            req,
            status.message()
        );
    }
    Ok(())
}

async fn validation_case(mut client: Client, requests: Vec<Req>) -> Result<(), TestCaseError> {
    let id = fresh_id("val");
    let mut tool_call_message = assistant("");
    tool_call_message.tool_calls.push(pb::ToolCall {
        id: "t1".into(),
        name: "f".into(),
        arguments: "{".into(),
    });
    rpc(
        "CreateSession",
        client
            .create_session(pb::CreateSessionRequest {
                session_id: id.clone(),
                system_prompt: "prompt".into(),
                user: "mallory".into(),
                initial_history: vec![
                    user("hello"),
                    tool_call_message,
                    pb::Message {
                        role: pb::Role::Tool.into(),
                        content: "result".into(),
                        tool_call_id: "t1".into(),
                        ..Default::default()
                    },
                ],
                ..Default::default()
            })
            .await,
    )?;
    let message_ids = try_list(&mut client, &id, 0)
        .await
        .map_err(|s| failed_call("ListMessages", &s))?
        .into_iter()
        .map(|m| m.id)
        .collect();
    let live = Live { id, message_ids };

    for req in &requests {
        let touched = live.touched(req);
        let mut before = Vec::with_capacity(touched.len());
        for id in &touched {
            before.push(snapshot(&mut client, id).await?);
        }
        let Err(status) = send(&mut client, &live, req).await else {
            continue;
        };
        check_refusal(req, &status)?;
        for (id, before) in touched.iter().zip(before) {
            let after = snapshot(&mut client, id).await?;
            prop_assert_eq!(
                &after,
                &before,
                "{:?} failed with {:?} {:?} but changed session {:?}",
                req,
                status.code(),
                status.message(),
                id
            );
        }
    }

    // Whatever happened, the live session is still one consistent history.
    if snapshot(&mut client, &live.id).await?.is_some() {
        let listed = try_list(&mut client, &live.id, 0)
            .await
            .map_err(|s| failed_call("ListMessages", &s))?;
        for (i, stored) in listed.iter().enumerate() {
            prop_assert_eq!(stored.sequence, i as i64);
        }
        let exported = try_export(
            &mut client,
            pb::ExportHistoryRequest {
                session_id: live.id.clone(),
                ..Default::default()
            },
        )
        .await
        .map_err(|s| failed_call("ExportHistory", &s))?;
        prop_assert_eq!(exported, plain(&listed));
    }
    Ok(())
}

/// The server answers health checks SERVING and serves a plain
/// create + append + export, within [`PATIENCE`].
pub(crate) async fn assert_serving(endpoint: &str, tag: &str) {
    let work = async {
        let channel = Channel::from_shared(endpoint.to_owned())
            .expect("endpoint")
            .connect()
            .await
            .expect("connect after hostile input");
        let mut health = tonic_health::pb::health_client::HealthClient::new(channel.clone());
        for service in ["", "sessionstore.v1.SessionStore"] {
            let answer = health
                .check(tonic_health::pb::HealthCheckRequest {
                    service: service.into(),
                })
                .await
                .expect("health check")
                .into_inner();
            assert_eq!(
                answer.status,
                i32::from(tonic_health::pb::health_check_response::ServingStatus::Serving),
                "health of {service:?} after {tag}"
            );
        }
        let mut client = SessionStoreClient::new(channel);
        let id = fresh_id("sane");
        create(&mut client, &id).await;
        exchange(&mut client, &id, "still there?", "yes").await;
        let exported = export(
            &mut client,
            pb::ExportHistoryRequest {
                session_id: id,
                ..Default::default()
            },
        )
        .await;
        assert_eq!(
            exported,
            vec![user("still there?"), assistant("yes")],
            "after {tag}"
        );
    };
    tokio::time::timeout(PATIENCE, work)
        .await
        .unwrap_or_else(|_| panic!("the server did not serve within {PATIENCE:?} after {tag}"));
}

/// Requests at the integer extremes, run before the random ones so a known
/// edge is always covered: cursors and positions at `i64::MAX`/`MIN`,
/// windows of `i64::MAX` messages, counters that would overflow a sum. Each
/// inner list runs against one fresh session.
fn edge_requests() -> Vec<Vec<Req>> {
    let live = Sid::Live;
    let forged = |kind: &str, position: i64| {
        Token::Forged(
            kind.to_owned(),
            vec!["{live}".to_owned(), position.to_string()],
        )
    };
    let mut huge_call = pb::ProviderCall {
        prompt_tokens: i64::MAX,
        completion_tokens: i64::MAX,
        total_tokens: 0,
        cost_micros_usd: i64::MAX,
        ..Default::default()
    };
    huge_call.model = "huge".into();
    let huge_append = Req::Append {
        sid: Sid::Live,
        messages: vec![user("big spender")],
        full_history: Vec::new(),
        call: Some(huge_call),
        responses: vec![assistant("ok")],
        expected: None,
        request_id: String::new(),
        run_id: String::new(),
    };
    let export = |after: Option<i64>, max: i64, from_summary: bool| Req::Export {
        sid: Sid::Live,
        include_system_prompt: true,
        from_summary,
        after,
        max,
    };
    let singles = vec![
        export(Some(i64::MAX - 1), 0, false),
        export(Some(i64::MAX), 0, false),
        export(Some(i64::MAX), 2, false),
        export(None, i64::MAX, false),
        export(Some(-1), i64::MAX, true),
        Req::ListMessages {
            sid: live.clone(),
            after: Some(i64::MAX),
            page_size: i32::MAX,
            token: Token::Raw(String::new()),
        },
        Req::ListMessages {
            sid: live.clone(),
            after: None,
            page_size: 1,
            token: forged("messages", i64::MIN),
        },
        Req::ListMessages {
            sid: live.clone(),
            after: None,
            page_size: 1,
            token: forged("messages", i64::MAX),
        },
        Req::ListCalls {
            sid: live.clone(),
            page_size: i32::MAX,
            token: forged("calls", i64::MIN),
        },
        Req::ListCalls {
            sid: live.clone(),
            page_size: 1,
            token: forged("calls", i64::MAX),
        },
        Req::ListState {
            sid: live.clone(),
            page_size: i32::MAX,
            token: Token::Forged("state".into(), vec!["{live}".into(), "\0".into()]),
        },
        Req::Search {
            query: "big".into(),
            user: String::new(),
            page_size: i32::MAX,
            token: Token::Forged(
                "search".into(),
                vec!["big".into(), String::new(), i64::MAX.to_string()],
            ),
        },
        Req::ListSessions {
            page_size: i32::MAX,
            token: Token::Forged(
                "sessions".into(),
                vec![String::new(), i64::MIN.to_string(), String::new()],
            ),
            user: String::new(),
        },
        Req::Watch {
            sid: live.clone(),
            after_revision: i64::MAX,
        },
        Req::Delta {
            sid: live.clone(),
            run_id: "r".into(),
            index: i64::MAX,
            delta: Some(pb::publish_delta_request::Delta::Text("x".into())),
        },
        Req::Fork {
            sid: live.clone(),
            at: i64::MAX,
            new_id: String::new(),
        },
        Req::SetState {
            sid: live.clone(),
            key: "k".into(),
            value: "v".into(),
            expected: Some(i64::MAX),
        },
        Req::Begin {
            sid: live.clone(),
            run_id: "r".into(),
            lease: Some(prost_types::Duration {
                seconds: i64::MAX,
                nanos: i32::MAX,
            }),
        },
        Req::Begin {
            sid: live.clone(),
            run_id: "r".into(),
            lease: Some(prost_types::Duration {
                seconds: 86_400,
                nanos: 999_999_999,
            }),
        },
        Req::Append {
            sid: live.clone(),
            messages: vec![user("late")],
            full_history: Vec::new(),
            call: None,
            responses: Vec::new(),
            expected: Some(i64::MAX),
            request_id: String::new(),
            run_id: String::new(),
        },
        Req::Rollback {
            sid: live,
            after: i64::MAX,
            run_id: String::new(),
        },
    ];
    let mut edges: Vec<Vec<Req>> = singles.into_iter().map(|req| vec![req]).collect();
    // Two calls whose counts each fill an int64: the session's totals must
    // not overflow into an error, neither on the second write nor in listings.
    edges.push(vec![
        huge_append.clone(),
        huge_append,
        Req::ListSessions {
            page_size: 0,
            token: Token::Raw(String::new()),
            user: "mallory".into(),
        },
        Req::Get(Sid::Live),
    ]);
    edges
}

fn validation(backend: Backend) {
    let runtime = runtime();
    if matches!(backend, Backend::Postgres)
        && !runtime.block_on(postgres_available("hostile::validation_postgres"))
    {
        return;
    }
    let server = runtime.block_on(TestServer::start(backend));
    let client = runtime.block_on(server.client());
    let failures: Vec<String> = edge_requests()
        .into_iter()
        .filter_map(|edge| {
            runtime
                .block_on(validation_case(client.clone(), edge.clone()))
                .err()
                .map(|error| format!("{error}\n  requests: {edge:?}"))
        })
        .collect();
    assert!(
        failures.is_empty(),
        "request validation on {backend:?}, edge requests:\n{}",
        failures.join("\n")
    );
    run_property(
        &runtime,
        &format!("request validation on {backend:?}"),
        vec(request(), 1..6),
        |requests| validation_case(client.clone(), requests),
    );
    drop(client);
    runtime.block_on(assert_serving(&server.endpoint(), "arbitrary requests"));
    runtime
        .block_on(server.stop())
        .expect("the server stops cleanly");
}

#[test]
fn validation_memory() {
    validation(Backend::Memory);
}

#[test]
fn validation_postgres() {
    validation(Backend::Postgres);
}

// ---------------------------------------------------------------------------
// 3. Garbage on the wire

/// SplitMix64: seeded, so a failing batch can be replayed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// Up to `max` random bytes.
    fn noise(&mut self, max: usize) -> Vec<u8> {
        let n = self.below(max);
        self.bytes(n)
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(n + 8);
        while out.len() < n {
            out.extend(self.next().to_le_bytes());
        }
        out.truncate(n);
        out
    }
}

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// An HTTP/2 frame; `declared` overrides the length field when it lies.
fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8], declared: Option<u32>) -> Vec<u8> {
    let len = declared.unwrap_or(payload.len() as u32);
    let mut out = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    out.extend(stream.to_be_bytes());
    out.extend(payload);
    out
}

/// The preface and an empty SETTINGS frame: a client saying hello.
fn hello() -> Vec<u8> {
    let mut out = PREFACE.to_vec();
    out.extend(frame(4, 0, 0, &[], None));
    out
}

/// A TLS 1.2/1.3 ClientHello record, with random bytes where randomness goes.
fn client_hello(rng: &mut Rng) -> Vec<u8> {
    let mut body = vec![0x03, 0x03];
    body.extend(rng.bytes(32));
    body.push(0); // session id
    body.extend([0x00, 0x04, 0x13, 0x01, 0x13, 0x02]); // cipher suites
    body.extend([0x01, 0x00]); // compression
    let sni = b"localhost";
    let mut ext = vec![0x00, 0x00];
    let list_len = sni.len() + 3;
    ext.extend(((list_len + 2) as u16).to_be_bytes());
    ext.extend((list_len as u16).to_be_bytes());
    ext.push(0);
    ext.extend((sni.len() as u16).to_be_bytes());
    ext.extend(sni);
    body.extend((ext.len() as u16).to_be_bytes());
    body.extend(ext);
    let mut handshake = vec![0x01];
    handshake.extend(&(body.len() as u32).to_be_bytes()[1..]);
    handshake.extend(body);
    let mut record = vec![0x16, 0x03, 0x01];
    record.extend((handshake.len() as u16).to_be_bytes());
    record.extend(handshake);
    record
}

/// One hostile connection's bytes, and whether to hang up without reading.
fn garbage(rng: &mut Rng, kind: usize) -> (Vec<u8>, bool) {
    match kind {
        // Pure noise, mostly small, sometimes up to a megabyte.
        0 => {
            let size = [0, 1, 23, 24, 25, 1000, 16 * 1024, 64 * 1024][rng.below(8)];
            (rng.bytes(size), false)
        }
        1 => (rng.bytes(1024 * 1024), false),
        // A correct preface, then random frames (some lying about their length).
        2 => {
            let mut out = hello();
            for _ in 0..1 + rng.below(20) {
                let kind = if rng.below(4) == 0 {
                    rng.below(256) as u8
                } else {
                    rng.below(10) as u8
                };
                let flags = rng.below(256) as u8;
                let stream = [0, 1, 3, 2, 0x7fff_ffff, 0xffff_ffff][rng.below(6)];
                let payload = rng.noise(64);
                let declared = (rng.below(5) == 0).then(|| rng.next() as u32 & 0x00ff_ffff);
                out.extend(frame(kind, flags, stream, &payload, declared));
            }
            (out, false)
        }
        // A frame cut short, then an abrupt hang-up.
        3 => {
            let mut out = hello();
            let mut cut = frame(1, 0x4, 1, &rng.bytes(200), Some(1000));
            cut.truncate(9 + rng.below(50));
            out.extend(cut);
            (out, true)
        }
        // A preface cut short.
        4 => (
            PREFACE[..rng.below(PREFACE.len())].to_vec(),
            rng.below(2) == 0,
        ),
        // HTTP/1.1 of several kinds.
        5 => {
            let texts: [&[u8]; 4] = [
                b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n",
                b"POST /sessionstore.v1.SessionStore/GetSession HTTP/1.1\r\nHost: a\r\nContent-Type: application/grpc\r\nContent-Length: 5\r\n\r\n\0\0\0\0\0",
                b"GET / HTTP/1.1\r\nHost: a\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\n\r\n",
                b"GET /metrics HTTP/1.0\r\n\r\n",
            ];
            (texts[rng.below(texts.len())].to_vec(), false)
        }
        // A TLS ClientHello to a plaintext port.
        6 => (client_hello(rng), false),
        // A flood of PINGs and SETTINGS.
        7 => {
            let mut out = hello();
            for _ in 0..2000 {
                if rng.below(2) == 0 {
                    out.extend(frame(6, 0, 0, &rng.bytes(8), None));
                } else {
                    out.extend(frame(4, 0, 0, &[0, 4, 0, 0, 0xff, 0xff], None));
                }
            }
            (out, false)
        }
        // HEADERS with an undecodable header block; CONTINUATION without HEADERS.
        _ => {
            let mut out = hello();
            out.extend(frame(1, 0x4, 1, &rng.noise(100), None));
            out.extend(frame(9, 0x4, 3, &rng.noise(40), None));
            (out, false)
        }
    }
}

/// Sends `bytes` on a fresh connection; unless `hang_up`, half-closes and
/// waits for the server to close its side. Err if it does not within
/// [`PATIENCE`].
async fn send_garbage(addr: SocketAddr, bytes: Vec<u8>, hang_up: bool) -> Result<(), String> {
    let mut stream = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    // The server may close mid-write; that is its right.
    let _ = stream.write_all(&bytes).await;
    if hang_up {
        return Ok(());
    }
    let _ = stream.shutdown().await;
    let mut buf = vec![0u8; 16 * 1024];
    let drained = async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
    };
    tokio::time::timeout(PATIENCE, drained).await.map_err(|_| {
        format!(
            "the server kept a garbage connection ({} bytes) open",
            bytes.len()
        )
    })
}

/// Two hundred hostile connections in batches, some concurrent, with idle
/// half-open connections held throughout; after each batch the server still
/// serves.
async fn garbage_connections(backend: Backend) {
    let server = TestServer::start(backend).await;
    let addr = server.addr;
    let mut rng = Rng(0x6a7b_a9e0);
    // Connections that said almost nothing and wait: they must not block others.
    let mut idle = Vec::new();
    for i in 0..8 {
        let mut stream = TcpStream::connect(addr).await.expect("connect");
        stream.write_all(&PREFACE[..i * 3]).await.expect("write");
        idle.push(stream);
    }
    let mut sent = 0;
    for batch in 0..8 {
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..25 {
            // Megabyte noise is slow in debug builds; four suffice.
            let kind = match rng.below(9) {
                _ if sent % 50 == 1 => 1,
                1 => 0,
                kind => kind,
            };
            let (bytes, hang_up) = garbage(&mut rng, kind);
            sent += 1;
            if rng.below(3) == 0 {
                // Some one after another...
                send_garbage(addr, bytes, hang_up)
                    .await
                    .unwrap_or_else(|e| panic!("batch {batch}, kind {kind}: {e}"));
            } else {
                // ...most at once.
                tasks.spawn(async move {
                    send_garbage(addr, bytes, hang_up)
                        .await
                        .map_err(|e| format!("batch {batch}, kind {kind}: {e}"))
                });
            }
        }
        while let Some(result) = tasks.join_next().await {
            result
                .expect("garbage task")
                .unwrap_or_else(|e| panic!("{e}"));
        }
        assert_serving(&server.endpoint(), &format!("garbage batch {batch}")).await;
    }
    assert_eq!(sent, 200);
    drop(idle);
    server.stop().await.expect("the server stops cleanly");
}

/// A gRPC message frame whose 5-byte prefix says `flag` and `claimed` length.
pub(crate) fn grpc_frame(flag: u8, claimed: u32, body: &[u8]) -> Vec<u8> {
    let mut out = vec![flag];
    out.extend(claimed.to_be_bytes());
    out.extend(body);
    out
}

/// What a raw HTTP/2 request got back.
#[derive(Debug)]
pub(crate) struct RawAnswer {
    pub(crate) http_status: u16,
    pub(crate) grpc_status: Option<Code>,
}

/// One request on its own raw HTTP/2 connection; dropping it drops the
/// connection.
pub(crate) struct RawStream {
    response: Option<h2::client::ResponseFuture>,
    _stream: h2::SendStream<Bytes>,
    driver: tokio::task::JoinHandle<()>,
}

impl Drop for RawStream {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

/// Opens a connection and sends one request with `body` as its DATA,
/// ending the stream unless `keep_open`.
pub(crate) async fn raw_h2(
    addr: SocketAddr,
    path: &str,
    content_type: &str,
    body: Vec<u8>,
    keep_open: bool,
) -> Result<RawStream, String> {
    let tcp = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let (sender, connection) = h2::client::handshake(tcp)
        .await
        .map_err(|e| e.to_string())?;
    let driver = tokio::spawn(async move {
        let _ = connection.await;
    });
    let mut sender = sender.ready().await.map_err(|e| e.to_string())?;
    let request = http::Request::builder()
        .method("POST")
        .uri(format!("http://{addr}{path}"))
        .header("content-type", content_type)
        .header("te", "trailers")
        .body(())
        .map_err(|e| e.to_string())?;
    let (response, mut stream) = sender
        .send_request(request, false)
        .map_err(|e| e.to_string())?;
    stream
        .send_data(Bytes::from(body), !keep_open)
        .map_err(|e| e.to_string())?;
    Ok(RawStream {
        response: Some(response),
        _stream: stream,
        driver,
    })
}

/// The status line and grpc-status of a raw request's answer.
pub(crate) async fn raw_answer(raw: &mut RawStream) -> Result<RawAnswer, String> {
    let response = raw.response.take().ok_or("already answered")?;
    let work = async {
        let response = response.await.map_err(|e| e.to_string())?;
        let grpc_status = |headers: &http::HeaderMap| {
            headers
                .get("grpc-status")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<i32>().ok())
                .map(Code::from)
        };
        let mut answer = RawAnswer {
            http_status: response.status().as_u16(),
            grpc_status: grpc_status(response.headers()),
        };
        if answer.grpc_status.is_none() {
            let mut body = response.into_body();
            while let Some(chunk) = body.data().await {
                let chunk = chunk.map_err(|e| e.to_string())?;
                let _ = body.flow_control().release_capacity(chunk.len());
            }
            let trailers = body.trailers().await.map_err(|e| e.to_string())?;
            answer.grpc_status = trailers.as_ref().and_then(grpc_status);
        }
        Ok(answer)
    };
    tokio::time::timeout(PATIENCE, work)
        .await
        .map_err(|_| "no answer within the patience".to_owned())?
}

/// Sends one request on a fresh connection and reads its answer.
pub(crate) async fn raw_call(
    addr: SocketAddr,
    path: &str,
    content_type: &str,
    body: Vec<u8>,
) -> Result<RawAnswer, String> {
    let mut raw = raw_h2(addr, path, content_type, body, false).await?;
    raw_answer(&mut raw).await
}

/// Passes bytes through untouched, so a test can send any protobuf at all.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct RawCodec;

#[derive(Debug)]
pub(crate) struct RawEncoder;

#[derive(Debug)]
pub(crate) struct RawDecoder;

impl Encoder for RawEncoder {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), tonic::Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for RawDecoder {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, tonic::Status> {
        let mut out = vec![0; src.remaining()];
        src.copy_to_slice(&mut out);
        Ok(Some(out))
    }
}

impl Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawEncoder;
    type Decoder = RawDecoder;

    fn encoder(&mut self) -> RawEncoder {
        RawEncoder
    }

    fn decoder(&mut self) -> RawDecoder {
        RawDecoder
    }
}

/// Calls `method` of SessionStore with `body` as the encoded request.
pub(crate) async fn raw_unary(
    channel: Channel,
    method: &str,
    body: Vec<u8>,
) -> Result<Vec<u8>, tonic::Status> {
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready()
        .await
        .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    let path = http::uri::PathAndQuery::try_from(format!("/sessionstore.v1.SessionStore/{method}"))
        .expect("path");
    grpc.unary(tonic::Request::new(body), path, RawCodec)
        .await
        .map(tonic::Response::into_inner)
}

/// Protobuf varint.
pub(crate) fn varint(mut n: u64) -> Vec<u8> {
    let mut out = Vec::new();
    while n >= 0x80 {
        out.push((n as u8) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
    out
}

/// Request bodies that are not what the method expects: wrong wire types,
/// invalid UTF-8, truncation, overlong varints, deep group nesting, a
/// role far out of range, and noise.
fn mistyped_bodies(rng: &mut Rng) -> Vec<(&'static str, Vec<u8>)> {
    let mut deep_groups = Vec::new();
    let start = varint((99 << 3) | 3);
    let end = varint((99 << 3) | 4);
    for _ in 0..50_000 {
        deep_groups.extend(&start);
    }
    for _ in 0..50_000 {
        deep_groups.extend(&end);
    }
    let mut huge_role = vec![0x0a, 0x03, b's', b'-', b'1', 0x12];
    let message = [&[0x08][..], &varint(u64::MAX)].concat();
    huge_role.extend(varint(message.len() as u64));
    huge_role.extend(message);
    let mut bodies = vec![
        ("session_id as a varint", vec![0x08, 0x96, 0x01]),
        ("messages as fixed32", vec![0x15, 1, 2, 3, 4]),
        ("session_id not UTF-8", vec![0x0a, 0x02, 0xff, 0xfe]),
        ("length past the end", vec![0x0a, 0xe8, 0x07, b'a', b'b']),
        ("overlong varint", [&[0x08][..], &[0xff; 11]].concat()),
        ("wire type 7", vec![0x0f, 0x00]),
        ("field number 0", vec![0x00, 0x00]),
        ("role as a string", vec![0x12, 0x03, 0x0a, 0x01, b'x']),
        ("unterminated group", varint((7 << 3) | 3)),
        ("deeply nested groups", deep_groups),
        ("role out of range", huge_role),
        ("empty", Vec::new()),
    ];
    for _ in 0..40 {
        let size = rng.below(200);
        bodies.push(("noise", rng.bytes(size)));
    }
    bodies
}

async fn malformed_grpc(backend: Backend) {
    let server = TestServer::start(backend).await;
    let addr = server.addr;
    let mut rng = Rng(0xbad_b0d1e5);
    let append = "/sessionstore.v1.SessionStore/AppendExchange";

    // Lying or broken 5-byte prefixes in an otherwise ordinary call. A claim
    // over --max-request-bytes is RESOURCE_EXHAUSTED (the error table: "request over the
    // configured size limits"); a body that is cut short, a bad flag or no
    // message at all is malformed: INVALID_ARGUMENT, never INTERNAL.
    let oversize = [Code::ResourceExhausted, Code::InvalidArgument];
    let broken = [Code::InvalidArgument];
    let cases: Vec<(&str, Vec<u8>, &[Code])> = vec![
        (
            "claims 4 GB",
            grpc_frame(0, u32::MAX, &rng.bytes(1000)),
            &oversize,
        ),
        (
            "claims 4 GB, sends nothing",
            grpc_frame(0, u32::MAX, &[]),
            &oversize,
        ),
        ("claims 65 MB", grpc_frame(0, 65 << 20, &[0; 10]), &oversize),
        (
            "claims 60 MB, sends 1 KB",
            grpc_frame(0, 60 << 20, &rng.bytes(1024)),
            &broken,
        ),
        ("claims 10, sends 3", grpc_frame(0, 10, &[1, 2, 3]), &broken),
        ("half a prefix", vec![0, 0], &broken),
        (
            "compressed without grpc-encoding",
            grpc_frame(1, 3, &[1, 2, 3]),
            &broken,
        ),
        ("flag 0x80", grpc_frame(0x80, 0, &[]), &broken),
        ("no message at all", Vec::new(), &broken),
    ];
    for (what, body, allowed) in cases {
        let answer = raw_call(addr, append, "application/grpc", body)
            .await
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(answer.http_status, 200, "{what}: {answer:?}");
        let code = answer
            .grpc_status
            .unwrap_or_else(|| panic!("{what}: no grpc-status: {answer:?}"));
        assert!(
            allowed.contains(&code),
            "{what}: {code:?}, expected one of {allowed:?}"
        );
    }
    // Two messages in a unary call, an unknown method, a foreign content type:
    // any answer will do, as long as there is one.
    let valid = pb::GetSessionRequest {
        session_id: "nope".into(),
    }
    .encode_to_vec();
    let one = grpc_frame(0, valid.len() as u32, &valid);
    let two = [one.clone(), one].concat();
    for (what, path, content_type, body) in [
        (
            "two messages",
            "/sessionstore.v1.SessionStore/GetSession",
            "application/grpc",
            two,
        ),
        (
            "unknown method",
            "/sessionstore.v1.SessionStore/Nope",
            "application/grpc",
            vec![0; 5],
        ),
        ("unknown service", "/x.Y/Z", "application/grpc", vec![0; 5]),
        ("JSON body", append, "application/json", b"{}".to_vec()),
    ] {
        raw_call(addr, path, content_type, body)
            .await
            .unwrap_or_else(|e| panic!("{what}: {e}"));
    }
    // Prefixes promising more than ever comes, on streams left open: the
    // 4 GB claim is refused at once; the others wait for a body that never
    // comes while the server goes on serving, then the connections drop.
    let mut open = Vec::new();
    for claimed in [u32::MAX, 60 << 20, 1 << 20] {
        for _ in 0..4 {
            let body = grpc_frame(0, claimed, &[0; 64]);
            let mut raw = raw_h2(addr, append, "application/grpc", body, true)
                .await
                .unwrap_or_else(|e| panic!("claiming {claimed}: {e}"));
            if claimed == u32::MAX {
                let answer = raw_answer(&mut raw)
                    .await
                    .unwrap_or_else(|e| panic!("claiming {claimed}: {e}"));
                assert!(
                    answer.grpc_status.is_some_and(|c| oversize.contains(&c)),
                    "an open stream claiming {claimed} bytes: {answer:?}"
                );
            }
            open.push(raw);
        }
    }
    assert_serving(&server.endpoint(), "streams with lying prefixes held open").await;
    drop(open);
    assert_serving(&server.endpoint(), "lying gRPC prefixes").await;

    // Well-framed bodies that are not the protobuf the method expects.
    let channel = Channel::from_shared(server.endpoint())
        .expect("endpoint")
        .connect()
        .await
        .expect("connect");
    let methods = [
        "AppendExchange",
        "CreateSession",
        "UpdateSession",
        "SetState",
        "BeginRun",
    ];
    for (what, body) in mistyped_bodies(&mut rng) {
        for method in methods {
            let result =
                tokio::time::timeout(PATIENCE, raw_unary(channel.clone(), method, body.clone()))
                    .await
                    .unwrap_or_else(|_| panic!("{method} with {what}: no answer"));
            let undecodable = [
                "session_id not UTF-8",
                "length past the end",
                "overlong varint",
                "wire type 7",
                "field number 0",
                "unterminated group",
                "deeply nested groups",
            ];
            let Err(status) = result else {
                assert!(!undecodable.contains(&what), "{method} accepted {what}");
                continue;
            };
            let (reason, _) = error_details(&status);
            if undecodable.contains(&what) {
                assert_eq!(
                    (status.code(), reason.as_deref()),
                    (Code::InvalidArgument, Some("MALFORMED_REQUEST")),
                    "{method} with {what}: {status:?}"
                );
            }
            // Undecodable protobuf is INVALID_ARGUMENT, never INTERNAL.
            let ok = SPEC_CODES.contains(&status.code())
                && (status.code() != Code::InvalidArgument
                    || reason.as_deref() == Some("MALFORMED_REQUEST")
                    || reason.as_deref() == Some("INVALID_ARGUMENT"));
            assert!(
                ok,
                "{method} with {what} ({body:02x?}): {:?} {:?} {reason:?}",
                status.code(),
                status.message()
            );
        }
    }
    let unknown = raw_unary(channel, "Nope", Vec::new()).await.unwrap_err();
    assert_eq!(unknown.code(), Code::Unimplemented);
    assert_serving(&server.endpoint(), "mistyped protobuf").await;
    server.stop().await.expect("the server stops cleanly");
}

/// Appends sent over raw HTTP/2 and reset at once or a moment later (a
/// rapid-reset storm): each exchange commits whole or not at all.
async fn cancelled_appends(backend: Backend) {
    let server = TestServer::start(backend).await;
    let addr = server.addr;
    let mut client = server.client().await;
    let id = "ses_cancelled";
    create(&mut client, id).await;

    let mut connections = tokio::task::JoinSet::new();
    for connection in 0..4u64 {
        let id = id.to_owned();
        connections.spawn(async move {
            let mut rng = Rng(connection);
            let mut sent = 0;
            // The server answers a reset storm with GOAWAY; come back on a
            // new connection until every append has been sent.
            while sent < 150 {
                let tcp = TcpStream::connect(addr).await.expect("connect");
                let Ok((sender, driver)) = h2::client::handshake(tcp).await else {
                    continue;
                };
                let driver = tokio::spawn(async move {
                    let _ = driver.await;
                });
                let mut sender = sender;
                while sent < 150 {
                    let Ok(ready) = sender.ready().await else {
                        break;
                    };
                    sender = ready;
                    let request = exchange_request(
                        &id,
                        &format!("q{connection}-{sent}"),
                        &format!("a{connection}-{sent}"),
                    );
                    let encoded = request.encode_to_vec();
                    let body = grpc_frame(0, encoded.len() as u32, &encoded);
                    let http_request = http::Request::builder()
                        .method("POST")
                        .uri(format!(
                            "http://{addr}/sessionstore.v1.SessionStore/AppendExchange"
                        ))
                        .header("content-type", "application/grpc")
                        .header("te", "trailers")
                        .body(())
                        .expect("request");
                    let Ok((response, mut stream)) = sender.send_request(http_request, false)
                    else {
                        break;
                    };
                    sent += 1;
                    let _ = stream.send_data(Bytes::from(body), true);
                    // Reset at once, a moment later, a while later (often
                    // mid-transaction), or not at all.
                    let yields =
                        [0, 1 + rng.below(3), 10 + rng.below(100), usize::MAX][rng.below(4)];
                    if yields == usize::MAX {
                        let _ = tokio::time::timeout(PATIENCE, response).await;
                        continue;
                    }
                    for _ in 0..yields {
                        tokio::task::yield_now().await;
                    }
                    stream.send_reset(h2::Reason::CANCEL);
                }
                driver.abort();
            }
        });
    }
    while let Some(result) = connections.join_next().await {
        result.expect("connection task");
    }

    // A read between two equal revisions is a consistent one; cancelled
    // calls still running on the server may move it, so look until it holds.
    let mut consistent = None;
    for _ in 0..200 {
        let before = get(&mut client, id).await.revision;
        let messages = all_messages(&mut client, id).await;
        let calls = client
            .list_provider_calls(pb::ListProviderCallsRequest {
                session_id: id.to_owned(),
                page_size: 1000,
                ..Default::default()
            })
            .await
            .expect("list calls")
            .into_inner();
        if get(&mut client, id).await.revision == before {
            consistent = Some((before, messages, calls));
            break;
        }
    }
    let (revision, messages, calls) = consistent.expect("the session settles");
    let exchanges = usize::try_from(revision - 1).expect("revision");
    assert_eq!(messages.len(), 2 * exchanges, "every exchange is whole");
    assert!(calls.provider_calls.len() == exchanges || !calls.next_page_token.is_empty());
    for (i, pair) in messages.chunks(2).enumerate() {
        assert_eq!(pair[0].sequence, 2 * i as i64);
        assert_eq!(pair[1].sequence, 2 * i as i64 + 1);
        let question = content(&pair[0]);
        let answer = content(&pair[1]);
        assert_eq!(
            question.strip_prefix('q'),
            answer.strip_prefix('a'),
            "exchange {i} is one request's"
        );
        assert!(pair[0].produced_by_call_id.is_empty());
        assert!(!pair[1].produced_by_call_id.is_empty());
    }
    let exported = export(
        &mut client,
        pb::ExportHistoryRequest {
            session_id: id.to_owned(),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(exported, plain(&messages));
    assert_serving(&server.endpoint(), "cancelled appends").await;
    drop(client);
    server.stop().await.expect("the server stops cleanly");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_connections_leave_the_server_serving() {
    garbage_connections(Backend::Memory).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_grpc_bodies_get_a_status() {
    malformed_grpc(Backend::Memory).await;
}

crate::backend_tests!(cancelled_appends);
