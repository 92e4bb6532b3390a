//! What an export for a target needs of a stored message, read from its
//! encoding (a `sessionstore.v1.Message`) without decoding it: the ids and
//! flags its rules judge by ([`outline`]), and the message without its
//! reasoning and signatures ([`without_reasoning`]), written by copying
//! the encoding's other fields. A message then goes out as stored, or as
//! that copy, and is decoded only when pairing changes it.

use prost::encoding::{WireType, encode_key, encode_varint};

use super::fields::{Field, Fields};
use crate::domain::{Error, Result};

// `Message`'s fields.
const ROLE: u32 = 1;
const TEXT: u32 = 2;
const BLOCKS: u32 = 3;
const TOOL_CALLS: u32 = 4;
const TOOL_CALL_ID: u32 = 5;
// `ContentBlock`'s kinds (its `oneof`).
const TEXT_BLOCK: u32 = 1;
const THINKING: u32 = 2;
const REDACTED_THINKING: u32 = 3;
const TOOL_USE: u32 = 5;
const TOOL_RESULT: u32 = 6;
const JSON: u32 = 7;
// Fields within a block or a call.
const TEXT_BLOCK_SIGNATURE: u32 = 2;
const TOOL_USE_ID: u32 = 1;
const TOOL_USE_SIGNATURE: u32 = 4;
const TOOL_RESULT_FOR: u32 = 1;
const JSON_TYPE: u32 = 1;
const CALL_ID: u32 = 1;
const CALL_SIGNATURE: u32 = 4;

/// What an export for a target judges a message by.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Outline {
    pub assistant: bool,
    /// Its `content` (text) is not empty.
    pub has_text: bool,
    /// The call it answers as a tool message; empty if none.
    pub tool_call_id: String,
    /// Ids of its tool calls (`tool_calls`).
    pub tool_calls: Vec<String>,
    /// Ids of its `tool_use` blocks.
    pub tool_uses: Vec<String>,
    /// Ids its `tool_result` blocks answer.
    pub result_blocks: Vec<String>,
    /// It holds a reasoning block (thinking, redacted thinking, or a JSON
    /// block of type `reasoning`).
    pub reasoning: bool,
    /// It holds a block that is neither reasoning, a call nor a result.
    pub other_blocks: bool,
    /// A text or `tool_use` block, or a tool call, has a signature.
    pub signed: bool,
}

/// A content block, as far as the rules tell them apart.
enum Block<'a> {
    Reasoning,
    /// A text block: its fields, whether it has a signature.
    Text(&'a [u8], bool),
    /// A `tool_use` block: its fields, its id, whether it has a signature.
    ToolUse(&'a [u8], String, bool),
    ToolResult(String),
    Other,
}

/// The outline of `encoding`, a stored `sessionstore.v1.Message`.
pub fn outline(encoding: &[u8]) -> Result<Outline> {
    let mut outline = Outline::default();
    for field in Fields(encoding) {
        let field = field?;
        match field.tag {
            ROLE => outline.assistant = varint(&field)? == pb_assistant(),
            TEXT => outline.has_text = !field.payload.is_empty(),
            TOOL_CALL_ID => outline.tool_call_id = string(field.payload)?,
            TOOL_CALLS => {
                for call in Fields(field.payload) {
                    let call = call?;
                    match call.tag {
                        CALL_ID => outline.tool_calls.push(string(call.payload)?),
                        CALL_SIGNATURE => outline.signed |= !call.payload.is_empty(),
                        _ => {}
                    }
                }
            }
            BLOCKS => match block(field.payload)? {
                Block::Reasoning => outline.reasoning = true,
                Block::Text(_, signed) => {
                    outline.other_blocks = true;
                    outline.signed |= signed;
                }
                Block::ToolUse(_, id, signed) => {
                    outline.tool_uses.push(id);
                    outline.signed |= signed;
                }
                Block::ToolResult(id) => outline.result_blocks.push(id),
                Block::Other => outline.other_blocks = true,
            },
            _ => {}
        }
    }
    Ok(outline)
}

/// `encoding` without its reasoning blocks and with every signature of
/// its text and `tool_use` blocks and tool calls cleared: what
/// `domain::target::stripped` makes of the message for a target that does
/// not keep its reasoning, encoded as prost encodes it (a cleared string
/// is left out). Every other field is copied as it is.
pub fn without_reasoning(encoding: &[u8]) -> Result<Vec<u8>> {
    let mut out = Vec::with_capacity(encoding.len());
    for field in Fields(encoding) {
        let field = field?;
        match field.tag {
            BLOCKS => match block(field.payload)? {
                Block::Reasoning => {}
                Block::Text(fields, true) => {
                    let block = nested(TEXT_BLOCK, &without(fields, TEXT_BLOCK_SIGNATURE)?);
                    put(&mut out, BLOCKS, &block);
                }
                Block::ToolUse(fields, _, true) => {
                    let block = nested(TOOL_USE, &without(fields, TOOL_USE_SIGNATURE)?);
                    put(&mut out, BLOCKS, &block);
                }
                _ => out.extend_from_slice(field.whole),
            },
            TOOL_CALLS => put(
                &mut out,
                TOOL_CALLS,
                &without(field.payload, CALL_SIGNATURE)?,
            ),
            _ => out.extend_from_slice(field.whole),
        }
    }
    Ok(out)
}

/// A content block's kind, from its encoding (the last kind set, as a
/// decoder takes a `oneof`).
fn block(encoding: &[u8]) -> Result<Block<'_>> {
    let mut kind = Block::Other;
    for field in Fields(encoding) {
        let field = field?;
        kind = match field.tag {
            THINKING | REDACTED_THINKING => Block::Reasoning,
            TEXT_BLOCK => Block::Text(field.payload, has(field.payload, TEXT_BLOCK_SIGNATURE)?),
            TOOL_USE => {
                let mut id = String::new();
                let mut signed = false;
                for inner in Fields(field.payload) {
                    let inner = inner?;
                    match inner.tag {
                        TOOL_USE_ID => id = string(inner.payload)?,
                        TOOL_USE_SIGNATURE => signed = !inner.payload.is_empty(),
                        _ => {}
                    }
                }
                Block::ToolUse(field.payload, id, signed)
            }
            TOOL_RESULT => {
                let mut id = String::new();
                for inner in Fields(field.payload) {
                    let inner = inner?;
                    if inner.tag == TOOL_RESULT_FOR {
                        id = string(inner.payload)?;
                    }
                }
                Block::ToolResult(id)
            }
            JSON => {
                let mut reasoning = false;
                for inner in Fields(field.payload) {
                    let inner = inner?;
                    if inner.tag == JSON_TYPE {
                        reasoning = inner.payload == b"reasoning";
                    }
                }
                if reasoning {
                    Block::Reasoning
                } else {
                    Block::Other
                }
            }
            _ => Block::Other,
        };
    }
    Ok(kind)
}

/// Whether `encoding` has a non-empty field `tag`.
fn has(encoding: &[u8], tag: u32) -> Result<bool> {
    for field in Fields(encoding) {
        let field = field?;
        if field.tag == tag && !field.payload.is_empty() {
            return Ok(true);
        }
    }
    Ok(false)
}

/// `encoding`'s fields but those numbered `tag`.
fn without(encoding: &[u8], tag: u32) -> Result<Vec<u8>> {
    let mut out = Vec::with_capacity(encoding.len());
    for field in Fields(encoding) {
        let field = field?;
        if field.tag != tag {
            out.extend_from_slice(field.whole);
        }
    }
    Ok(out)
}

/// A message holding `payload` as its field `tag`.
fn nested(tag: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(payload.len() + 6);
    put(&mut out, tag, payload);
    out
}

/// Appends `payload` as the length-delimited field `tag`.
fn put(out: &mut Vec<u8>, tag: u32, payload: &[u8]) {
    encode_key(tag, WireType::LengthDelimited, out);
    encode_varint(payload.len() as u64, out);
    out.extend_from_slice(payload);
}

fn varint(field: &Field<'_>) -> Result<u64> {
    let mut payload = field.payload;
    prost::encoding::decode_varint(&mut payload).map_err(Error::storage)
}

fn string(payload: &[u8]) -> Result<String> {
    String::from_utf8(payload.to_vec()).map_err(Error::storage)
}

fn pb_assistant() -> u64 {
    sessionstore_client::v1::Role::Assistant as u64
}
