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
        (text(), text())
            .prop_map(|(text, signature)| Block::Text(pb::TextBlock { text, signature })),
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
        (text(), text(), json_text(), text()).prop_map(|(id, name, input, signature)| {
            Block::ToolUse(pb::ToolUseBlock {
                id,
                name,
                input,
                signature,
            })
        }),
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
    (text(), text(), json_text(), text()).prop_map(|(id, name, arguments, signature)| {
        pb::ToolCall {
            id,
            name,
            arguments,
            signature,
        }
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
        any::<bool>(),
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
                incomplete,
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
                    incomplete,
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

mod round_trip;
mod validation;
mod wire;

// Shared between the suites, and with `faults_edge.rs`.
use round_trip::{plain, try_export, try_list, try_transcript};
pub(crate) use validation::assert_serving;
pub(crate) use wire::{RawCodec, grpc_frame, raw_call, raw_unary, varint};
