//! `sessions export` and `sessions import`: the JSON export file, and the
//! transcripts (Markdown, OpenAI Chat Completions, and the providers'
//! request bodies), for a target model with `--for`.
//!
//! The JSON file, `sessionstore.export.v2`, holds everything a session holds
//! that the API can restore, ids and times included for reference:
//!
//! ```text
//! {"format": "sessionstore.export.v2",
//!  "session": {"id", "title", "system_prompt", "user", "metadata",
//!              "create_time", "update_time", "forked_from"?},
//!  "messages": [{"sequence", "id", "produced_by_call_id"?, "redacted"?,
//!                "create_time", "message": {…}}, …],
//!  "summary_sequence": N,
//!  "provider_calls": [{"id", "request_id", "provider", "model",
//!                      "requested_provider", "requested_model", "prompt_tokens",
//!                      "completion_tokens", "total_tokens", "cost_micros_usd",
//!                      "create_time"}, …],
//!  "state": [{"key", "value", "update_time"}, …]}
//! ```
//!
//! `message` is a message as version 1 files hold them (the domain
//! `Message`'s JSON). `summary_sequence` (present when the session has a
//! summary marker) names the summary message by sequence, since ids change
//! on import; it follows the messages because the export, which streams
//! page by page in bounded memory, only learns it there. `forked_from`
//! says where a fork came from; it is not restored (a fork's provenance is
//! the server's to record).
//!
//! Import replays the history as exchanges: each provider call, in the order
//! recorded, with the messages sent since the previous call as its inputs and
//! the run of messages it produced as its responses, so every call keeps its
//! link to its messages. A call that produced no current message (its answer
//! was rolled back) goes in alone, after the inputs recorded before it.
//! Redacted messages are appended as the redaction left them and redacted
//! again; then the state entries are set and the summary marker placed.
//! Every append is pinned to the session's expected next sequence and keyed
//! by a request id derived from the session id and its place in the replay.

use std::collections::HashMap;
use std::io::{IsTerminal as _, Write};
use std::ops::Range;
use std::path::Path;

use anyhow::Context as _;
use prost::Message as _;
use serde::{Deserialize, Serialize};
use sessionstore_client::v1 as pb;
use sessionstore_client::{Client, Exchange, NewSession};

use super::ExportFormat;
use crate::domain::calendar::{days_from_civil, rfc3339};
use crate::domain::{Message, Timestamp, control};
use crate::wire;

const FORMAT_V1: &str = "sessionstore.export.v1";
const FORMAT_V2: &str = "sessionstore.export.v2";
/// Page size for the listings an export reads.
const PAGE_SIZE: i32 = 1000;
/// Most messages sent per call when importing.
const IMPORT_CHUNK: usize = 500;
/// Most encoded message bytes sent per call when importing (half the
/// server's default request limit).
const IMPORT_CHUNK_BYTES: usize = 8 * 1024 * 1024;

/// The header of an export file.
#[derive(Debug, Serialize, Deserialize)]
struct ExportedSession {
    id: String,
    #[serde(default)]
    title: String,
    #[serde(default)]
    system_prompt: String,
    #[serde(default)]
    user: String,
    #[serde(default)]
    metadata: std::collections::BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    create_time: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    update_time: Option<String>,
    /// For a fork: the session and last sequence it was copied from.
    /// Output only: import does not restore it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    forked_from: Option<ForkedFrom>,
}

#[derive(Debug, Serialize, Deserialize)]
struct ForkedFrom {
    session_id: String,
    sequence: i64,
}

/// One message as stored: its place, its producing call, whether it was
/// redacted, and the message itself.
#[derive(Debug, Serialize, Deserialize)]
struct ExportedMessage {
    sequence: i64,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    id: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    produced_by_call_id: String,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    redacted: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    create_time: Option<String>,
    message: Message,
}

/// One provider call, every field.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(default)]
struct ExportedCall {
    id: String,
    request_id: String,
    provider: String,
    model: String,
    requested_provider: String,
    requested_model: String,
    prompt_tokens: i64,
    completion_tokens: i64,
    total_tokens: i64,
    cost_micros_usd: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    create_time: Option<String>,
    // The billing buckets, the provider's usage object and the call's wall
    // time; absent from files written before they existed.
    #[serde(skip_serializing_if = "is_zero")]
    cached_input_tokens: i64,
    #[serde(skip_serializing_if = "is_zero")]
    cache_creation_input_tokens: i64,
    #[serde(skip_serializing_if = "is_zero")]
    reasoning_tokens: i64,
    #[serde(skip_serializing_if = "String::is_empty")]
    usage_json: String,
    #[serde(skip_serializing_if = "is_zero")]
    duration_micros: i64,
}

#[allow(
    clippy::trivially_copy_pass_by_ref,
    reason = "serde passes a reference"
)]
fn is_zero(value: &i64) -> bool {
    *value == 0
}

/// One per-session state entry.
#[derive(Debug, Serialize, Deserialize)]
struct ExportedState {
    key: String,
    #[serde(default)]
    value: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    update_time: Option<String>,
}

/// A version 2 file, as read.
#[derive(Debug, Deserialize)]
struct ImportFile {
    session: ExportedSession,
    messages: Vec<ExportedMessage>,
    #[serde(default)]
    summary_sequence: Option<i64>,
    #[serde(default)]
    provider_calls: Vec<ExportedCall>,
    #[serde(default)]
    state: Vec<ExportedState>,
}

/// A version 1 file: the header and plain messages.
#[derive(Debug, Deserialize)]
struct FileV1 {
    session: ExportedSession,
    messages: Vec<Message>,
}

impl From<FileV1> for ImportFile {
    fn from(v1: FileV1) -> Self {
        let messages = v1
            .messages
            .into_iter()
            .zip(0..)
            .map(|(message, sequence)| ExportedMessage {
                sequence,
                id: String::new(),
                produced_by_call_id: String::new(),
                redacted: false,
                create_time: None,
                message,
            })
            .collect();
        ImportFile {
            session: v1.session,
            messages,
            summary_sequence: None,
            provider_calls: Vec::new(),
            state: Vec::new(),
        }
    }
}

/// Shows `done` on stderr, over the same line, when stderr is a terminal.
struct Progress {
    on: bool,
    what: &'static str,
    total: Option<usize>,
}

impl Progress {
    fn new(what: &'static str, total: Option<usize>) -> Self {
        Progress {
            on: std::io::stderr().is_terminal(),
            what,
            total,
        }
    }

    fn show(&self, done: usize) {
        if self.on {
            let text = match self.total {
                Some(total) => format!("\r{} {done}/{total} messages", self.what),
                None => format!("\r{} {done} messages", self.what),
            };
            let _ = std::io::stderr().write_all(text.as_bytes());
        }
    }

    fn finish(&self, done: usize) {
        if self.on {
            self.show(done);
            let _ = std::io::stderr().write_all(b"\n");
        }
    }
}

pub(super) async fn export(
    client: &Client,
    id: &str,
    format: ExportFormat,
    target: Option<pb::ExportTarget>,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    let transcript = match format {
        ExportFormat::Json => return export_json(client, id, out).await,
        ExportFormat::Markdown => pb::TranscriptFormat::Markdown,
        ExportFormat::Openai => pb::TranscriptFormat::OpenaiJson,
        ExportFormat::Anthropic => pb::TranscriptFormat::AnthropicMessages,
        ExportFormat::OpenaiResponses => pb::TranscriptFormat::OpenaiResponses,
        ExportFormat::Gemini => pb::TranscriptFormat::GeminiContents,
    };
    let mut chunks = client
        .raw()
        .export_transcript(pb::ExportTranscriptRequest {
            session_id: id.to_owned(),
            format: transcript.into(),
            target,
        })
        .await
        .map_err(sessionstore_client::Error::from)?
        .into_inner();
    let progress = Progress::new("exported", None);
    let mut bytes = 0;
    while let Some(chunk) = chunks
        .message()
        .await
        .map_err(sessionstore_client::Error::from)?
    {
        out.write_all(&chunk.data)?;
        bytes += chunk.data.len();
        if progress.on {
            let _ = write!(std::io::stderr(), "\rexported {} KiB", bytes / 1024);
        }
    }
    if progress.on {
        let _ = writeln!(std::io::stderr());
    }
    Ok(())
}

/// A wire time as RFC 3339 in UTC, to the microsecond.
fn time_text(time: &prost_types::Timestamp) -> String {
    let micros = time
        .seconds
        .saturating_mul(1_000_000)
        .saturating_add(i64::from(time.nanos / 1000));
    let seconds = rfc3339(Timestamp(micros));
    let whole = seconds.strip_suffix('Z').unwrap_or(&seconds);
    format!("{whole}.{:06}Z", micros.rem_euclid(1_000_000))
}

/// Microseconds since the epoch from `YYYY-MM-DDTHH:MM:SS[.ffffff]Z`, as
/// [`time_text`] writes it.
fn parse_time(text: &str) -> Option<i64> {
    let text = text.strip_suffix('Z')?;
    let (date, clock) = text.split_once('T')?;
    let mut date = date.splitn(3, '-').map(|part| part.parse::<i64>().ok());
    let (year, month, day) = (date.next()??, date.next()??, date.next()??);
    let (clock, fraction) = clock.split_once('.').unwrap_or((clock, ""));
    let mut clock = clock.splitn(3, ':').map(|part| part.parse::<i64>().ok());
    let (hour, minute, second) = (clock.next()??, clock.next()??, clock.next()??);
    if !(1..=12).contains(&month)
        || !(1..=31).contains(&day)
        || hour > 23
        || minute > 59
        || second > 60
        || fraction.len() > 6
        || !fraction.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let micros = format!("{fraction:0<6}").parse::<i64>().ok()?;
    let seconds = days_from_civil(year, month, day) * 86_400 + hour * 3600 + minute * 60 + second;
    Some(seconds * 1_000_000 + micros)
}

/// Writes `,` before every item but the first, and each item on a line.
fn separator(out: &mut impl Write, index: usize) -> std::io::Result<()> {
    out.write_all(if index == 0 { b"\n" } else { b",\n" })
}

/// Closes a list of `count` items.
fn close_list(out: &mut impl Write, count: usize) -> std::io::Result<()> {
    out.write_all(if count == 0 { b"]" } else { b"\n]" })
}

/// Writes a paged listing as the elements of a JSON array whose `[` is
/// written already, then closes it: `page` reads the page after a token
/// (its items and the next token, empty at the end), `record` makes the
/// record of the item at an index. Returns how many were written.
async fn write_pages<T, R, F>(
    out: &mut impl Write,
    mut page: impl FnMut(String) -> F,
    mut record: impl FnMut(usize, T) -> anyhow::Result<R>,
) -> anyhow::Result<usize>
where
    F: std::future::Future<Output = anyhow::Result<(Vec<T>, String)>>,
    R: Serialize,
{
    let mut count = 0;
    let mut token = String::new();
    loop {
        let (items, next) = page(token).await?;
        for item in items {
            let record = record(count, item)?;
            separator(out, count)?;
            serde_json::to_writer(&mut *out, &record)?;
            count += 1;
        }
        if next.is_empty() {
            break;
        }
        token = next;
    }
    close_list(out, count)?;
    Ok(count)
}

/// The file described at the top of this module, written page by page so
/// any size exports in bounded memory.
async fn export_json(client: &Client, id: &str, out: &mut impl Write) -> anyhow::Result<()> {
    let session = client.get_session(id.to_owned()).await?;
    let header = ExportedSession {
        id: session.id.clone(),
        title: session.title.clone(),
        system_prompt: session.system_prompt.clone(),
        user: session.user.clone(),
        metadata: session.metadata.clone().into_iter().collect(),
        create_time: session.create_time.as_ref().map(time_text),
        update_time: session.update_time.as_ref().map(time_text),
        forked_from: (!session.parent_session_id.is_empty()).then(|| ForkedFrom {
            session_id: session.parent_session_id.clone(),
            sequence: session.parent_sequence,
        }),
    };
    write!(
        out,
        "{{\"format\":{},\n\"session\":{},\n\"messages\":[",
        serde_json::to_string(FORMAT_V2)?,
        serde_json::to_string(&header)?
    )?;
    let failed = sessionstore_client::Error::from;

    let progress = Progress::new("exported", None);
    let mut summary_sequence = None;
    let count = write_pages(
        out,
        |page_token| {
            let (mut raw, id) = (client.raw(), id.to_owned());
            async move {
                let page = raw
                    .list_messages(pb::ListMessagesRequest {
                        session_id: id,
                        page_size: PAGE_SIZE,
                        page_token,
                        ..Default::default()
                    })
                    .await
                    .map_err(failed)?
                    .into_inner();
                Ok((page.messages, page.next_page_token))
            }
        },
        |index, stored: pb::StoredMessage| {
            if !session.summary_message_id.is_empty() && stored.id == session.summary_message_id {
                summary_sequence = Some(stored.sequence);
            }
            let message = wire::message_from_pb(
                stored.message.unwrap_or_default(),
                &format!("messages[{index}].message"),
            )?;
            if (index + 1) % 1000 == 0 {
                progress.show(index + 1);
            }
            Ok(ExportedMessage {
                sequence: stored.sequence,
                id: stored.id,
                produced_by_call_id: stored.produced_by_call_id,
                redacted: stored.redacted,
                create_time: stored.create_time.as_ref().map(time_text),
                message,
            })
        },
    )
    .await?;
    if let Some(sequence) = summary_sequence {
        write!(out, ",\n\"summary_sequence\":{sequence}")?;
    }

    out.write_all(b",\n\"provider_calls\":[")?;
    write_pages(
        out,
        |page_token| {
            let (mut raw, id) = (client.raw(), id.to_owned());
            async move {
                let page = raw
                    .list_provider_calls(pb::ListProviderCallsRequest {
                        session_id: id,
                        page_size: PAGE_SIZE,
                        page_token,
                    })
                    .await
                    .map_err(failed)?
                    .into_inner();
                Ok((page.provider_calls, page.next_page_token))
            }
        },
        |_, call: pb::ProviderCall| {
            Ok(ExportedCall {
                create_time: call.create_time.as_ref().map(time_text),
                id: call.id,
                request_id: call.request_id,
                provider: call.provider,
                model: call.model,
                requested_provider: call.requested_provider,
                requested_model: call.requested_model,
                prompt_tokens: call.prompt_tokens,
                completion_tokens: call.completion_tokens,
                total_tokens: call.total_tokens,
                cost_micros_usd: call.cost_micros_usd,
                cached_input_tokens: call.cached_input_tokens,
                cache_creation_input_tokens: call.cache_creation_input_tokens,
                reasoning_tokens: call.reasoning_tokens,
                usage_json: call.usage_json,
                duration_micros: call.duration.as_ref().map_or(0, wire::duration_micros),
            })
        },
    )
    .await?;

    out.write_all(b",\n\"state\":[")?;
    write_pages(
        out,
        |page_token| {
            let (mut raw, id) = (client.raw(), id.to_owned());
            async move {
                let page = raw
                    .list_state(pb::ListStateRequest {
                        session_id: id,
                        page_size: PAGE_SIZE,
                        page_token,
                        scope: String::new(),
                    })
                    .await
                    .map_err(failed)?
                    .into_inner();
                Ok((page.entries, page.next_page_token))
            }
        },
        |_, entry: pb::StateEntry| {
            Ok(ExportedState {
                update_time: entry.update_time.as_ref().map(time_text),
                key: entry.key,
                value: entry.value,
            })
        },
    )
    .await?;

    // The listings are separate reads: a change between them could pair
    // messages with calls from another moment.
    let after = client.get_session(id.to_owned()).await?;
    anyhow::ensure!(
        after.revision == session.revision,
        "session {id:?} changed while it was being exported (revision {} became {}); export it again",
        session.revision,
        after.revision
    );
    out.write_all(b"\n}\n")?;
    progress.finish(count);
    Ok(())
}

/// Reads an export file of either version.
fn read_file(path: &Path) -> anyhow::Result<ImportFile> {
    #[derive(Deserialize)]
    struct Probe {
        format: String,
    }
    // Read once (the path may be a pipe), parsed twice: for the format,
    // then as that format.
    let text = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let not_export = || format!("{} is not a sessionstore JSON export", path.display());
    let probe: Probe = serde_json::from_slice(&text).with_context(not_export)?;
    match probe.format.as_str() {
        FORMAT_V2 => serde_json::from_slice(&text).with_context(not_export),
        FORMAT_V1 => {
            let v1: FileV1 = serde_json::from_slice(&text).with_context(not_export)?;
            Ok(v1.into())
        }
        other => anyhow::bail!(
            "{} has format {other:?}; expected {FORMAT_V2:?} (or {FORMAT_V1:?})",
            path.display()
        ),
    }
}

/// One AppendExchange of an import: indices into the file's messages and
/// provider calls.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Part {
    inputs: Range<usize>,
    call: Option<usize>,
    responses: Range<usize>,
}

/// A time field of the file, if given; malformed is an error naming it.
fn time_field(text: Option<&str>, field: impl FnOnce() -> String) -> anyhow::Result<Option<i64>> {
    text.map(|text| {
        parse_time(text).with_context(|| {
            format!(
                "{} is {text:?}, not a time like 2025-01-31T12:00:00.000000Z",
                field()
            )
        })
    })
    .transpose()
}

/// Checks the file's history and orders it into exchanges (see the module
/// documentation); `size` gives a message's encoded size, for chunking.
fn plan(
    messages: &[ExportedMessage],
    calls: &[ExportedCall],
    size: impl Fn(usize) -> usize,
) -> anyhow::Result<Vec<Part>> {
    for (index, message) in messages.iter().enumerate() {
        anyhow::ensure!(
            usize::try_from(message.sequence).ok() == Some(index),
            "messages[{index}].sequence is {}; expected {index} (messages go in order from 0, without gaps)",
            message.sequence
        );
    }
    let mut by_id = HashMap::new();
    for (index, call) in calls.iter().enumerate() {
        if !call.id.is_empty() && by_id.insert(call.id.as_str(), index).is_some() {
            anyhow::bail!(
                "provider_calls[{index}].id {:?} is given twice; call ids must be unique",
                call.id
            );
        }
    }
    // Each call's run of messages; the runs follow the calls' order.
    let mut runs: Vec<Option<Range<usize>>> = vec![None; calls.len()];
    let mut previous: Option<usize> = None;
    let mut index = 0;
    while index < messages.len() {
        let link = &messages[index].produced_by_call_id;
        if link.is_empty() {
            index += 1;
            continue;
        }
        let call = *by_id.get(link.as_str()).with_context(|| {
            format!(
                "messages[{index}].produced_by_call_id {link:?} names no entry of provider_calls"
            )
        })?;
        let start = index;
        while index < messages.len() && messages[index].produced_by_call_id == *link {
            index += 1;
        }
        anyhow::ensure!(
            runs[call].is_none(),
            "messages[{start}].produced_by_call_id {link:?}: that call's other messages are not next to it (a call's messages are one run)"
        );
        anyhow::ensure!(
            previous.is_none_or(|p| p < call),
            "messages[{start}].produced_by_call_id {link:?}: provider_calls lists that call before the call of earlier messages (calls go in the order recorded)"
        );
        runs[call] = Some(start..index);
        previous = Some(call);
    }

    let mut exchanges = Vec::new();
    let mut next = 0;
    for (index, call) in calls.iter().enumerate() {
        let (inputs, responses) = match &runs[index] {
            Some(run) => (next..run.start, run.clone()),
            None => {
                // Its answer is gone: it goes after the inputs recorded
                // before it (all of them, if times are not given).
                let limit = runs[index..]
                    .iter()
                    .flatten()
                    .next()
                    .map_or(messages.len(), |run| run.start);
                let when = time_field(call.create_time.as_deref(), || {
                    format!("provider_calls[{index}].create_time")
                })?;
                let mut end = next;
                while end < limit {
                    let created = time_field(messages[end].create_time.as_deref(), || {
                        format!("messages[{end}].create_time")
                    })?;
                    match (when, created) {
                        (Some(when), Some(created)) if created > when => break,
                        _ => end += 1,
                    }
                }
                (next..end, end..end)
            }
        };
        next = responses.end;
        exchanges.push((inputs, Some(index), responses));
    }
    if next < messages.len() {
        exchanges.push((next..messages.len(), None, messages.len()..messages.len()));
    }

    // Large runs of inputs go in chunks; the call joins the last one when
    // they fit together.
    let mut parts = Vec::new();
    for (inputs, call, responses) in exchanges {
        let mut chunks: Vec<(Range<usize>, usize)> = Vec::new();
        let mut start = inputs.start;
        while start < inputs.end {
            let (mut end, mut bytes) = (start, 0);
            while end < inputs.end && end - start < IMPORT_CHUNK {
                let more = size(end);
                if end > start && bytes + more > IMPORT_CHUNK_BYTES {
                    break;
                }
                bytes += more;
                end += 1;
            }
            chunks.push((start..end, bytes));
            start = end;
        }
        let response_bytes: usize = responses.clone().map(&size).sum();
        let joined = call.is_some()
            && chunks.last().is_some_and(|(last, bytes)| {
                last.len() + responses.len() <= IMPORT_CHUNK
                    && bytes + response_bytes <= IMPORT_CHUNK_BYTES
            });
        let count = chunks.len();
        for (number, (range, _)) in chunks.into_iter().enumerate() {
            let with_call = joined && number + 1 == count;
            parts.push(Part {
                inputs: range.clone(),
                call: if with_call { call } else { None },
                responses: if with_call {
                    responses.clone()
                } else {
                    range.end..range.end
                },
            });
        }
        if call.is_some() && !joined {
            parts.push(Part {
                inputs: inputs.end..inputs.end,
                call,
                responses,
            });
        }
    }
    Ok(parts)
}

pub(super) async fn import(
    client: &Client,
    path: &Path,
    id: Option<String>,
    explain: &dyn Fn(anyhow::Error) -> anyhow::Error,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    let file = read_file(path)?;
    // Everything is checked before anything is written.
    let parts = plan(&file.messages, &file.provider_calls, |index| {
        wire::message_to_pb(file.messages[index].message.clone()).encoded_len()
    })?;
    if let Some(sequence) = file.summary_sequence {
        anyhow::ensure!(
            usize::try_from(sequence).is_ok_and(|s| s < file.messages.len()),
            "summary_sequence {sequence} names no message (the file holds {})",
            file.messages.len()
        );
    }
    let mut new = NewSession::new()
        .id(id.unwrap_or_else(|| file.session.id.clone()))
        .title(file.session.title.clone())
        .system_prompt(file.session.system_prompt.clone())
        .user(file.session.user.clone());
    for (key, value) in &file.session.metadata {
        new = new.metadata(key.clone(), value.clone());
    }
    let id = match client.create_session(new).await {
        Ok(session) => session.id,
        Err(sessionstore_client::Error::AlreadyExists { session_id, .. }) => anyhow::bail!(
            "session {session_id:?} already exists; nothing was imported (choose another id with --id, or delete it first)"
        ),
        Err(other) => return Err(other.into()),
    };
    replay(client, &id, &file, &parts).await.map_err(|error| {
        anyhow::anyhow!(
            "{:#}; the import stopped part-way, so session {id:?} is incomplete: delete it (sessionstore sessions delete {id}) and import again",
            explain(error)
        )
    })?;
    let count =
        |n: usize, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
    writeln!(
        out,
        "imported {id}: {}, {}, {}",
        count(file.messages.len(), "message", "messages"),
        count(file.provider_calls.len(), "provider call", "provider calls"),
        count(file.state.len(), "state entry", "state entries")
    )?;
    Ok(())
}

/// Appends the planned exchanges to the new session `id`, then redacts,
/// sets the state and places the summary marker.
async fn replay(
    client: &Client,
    id: &str,
    file: &ImportFile,
    parts: &[Part],
) -> anyhow::Result<()> {
    let failed = sessionstore_client::Error::from;
    let progress = Progress::new("imported", Some(file.messages.len()));
    let body = |index: usize| {
        let exported = &file.messages[index];
        // A redacted message goes in as the redaction left it: its content
        // is never sent again.
        let message = if exported.redacted {
            control::redacted(&exported.message)
        } else {
            exported.message.clone()
        };
        wire::message_to_pb(message)
    };
    let mut next = 0;
    let mut summary_id = None;
    for (number, part) in parts.iter().enumerate() {
        let mut exchange = Exchange::new(id)
            .messages(part.inputs.clone().map(&body))
            // The next sequence is known exactly: a concurrent writer makes
            // the import stop rather than interleave.
            .expected_next_sequence(i64::try_from(next)?)
            // A retry of this very request is recognised, not stored twice.
            .with_request_id(format!("import-{id}-{number}"));
        if let Some(call) = part.call {
            let call = &file.provider_calls[call];
            exchange = exchange
                .provider_call(pb::ProviderCall {
                    request_id: call.request_id.clone(),
                    provider: call.provider.clone(),
                    model: call.model.clone(),
                    requested_provider: call.requested_provider.clone(),
                    requested_model: call.requested_model.clone(),
                    prompt_tokens: call.prompt_tokens,
                    completion_tokens: call.completion_tokens,
                    total_tokens: call.total_tokens,
                    cost_micros_usd: call.cost_micros_usd,
                    cached_input_tokens: call.cached_input_tokens,
                    cache_creation_input_tokens: call.cache_creation_input_tokens,
                    reasoning_tokens: call.reasoning_tokens,
                    usage_json: call.usage_json.clone(),
                    duration: wire::duration_from_micros(call.duration_micros),
                    ..Default::default()
                })
                .responses(part.responses.clone().map(&body));
        }
        let stored = client.append_exchange(&exchange).await?;
        let added = part.inputs.len() + part.responses.len();
        anyhow::ensure!(
            stored.messages.len() == added
                && usize::try_from(stored.next_sequence)? == next + added,
            "the server stored {} messages up to sequence {} for an append of {added} at sequence {next}",
            stored.messages.len(),
            stored.next_sequence
        );
        for (offset, message) in stored.messages.into_iter().enumerate() {
            let index = next + offset;
            if file.summary_sequence == Some(i64::try_from(index)?) {
                summary_id = Some(message.id.clone());
            }
            if file.messages[index].redacted {
                client
                    .raw()
                    .redact_message(pb::RedactMessageRequest {
                        session_id: id.to_owned(),
                        message_id: message.id,
                        reason: "redacted in the exported session".into(),
                        run_id: String::new(),
                    })
                    .await
                    .map_err(failed)?;
            }
        }
        next += added;
        progress.show(next);
    }
    for entry in &file.state {
        client
            .raw()
            .set_state(pb::SetStateRequest {
                session_id: id.to_owned(),
                key: entry.key.clone(),
                value: entry.value.clone(),
                // A fresh session has no entries: a repeated key is an error,
                // not an overwrite.
                expected_version: Some(0),
                scope: String::new(),
            })
            .await
            .map_err(failed)?;
    }
    if let Some(summary_id) = summary_id {
        client
            .raw()
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
            .map_err(failed)?;
    }
    progress.finish(next);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(link: &str, time: Option<&str>) -> ExportedMessage {
        ExportedMessage {
            sequence: 0,
            id: String::new(),
            produced_by_call_id: link.to_owned(),
            redacted: false,
            create_time: time.map(str::to_owned),
            message: Message::text(crate::domain::Role::User, "x"),
        }
    }

    fn history(links: &[(&str, Option<&str>)]) -> Vec<ExportedMessage> {
        links
            .iter()
            .zip(0..)
            .map(|((link, time), sequence)| ExportedMessage {
                sequence,
                ..message(link, *time)
            })
            .collect()
    }

    fn call(id: &str, time: Option<&str>) -> ExportedCall {
        ExportedCall {
            id: id.to_owned(),
            create_time: time.map(str::to_owned),
            ..Default::default()
        }
    }

    fn part(inputs: Range<usize>, call: Option<usize>, responses: Range<usize>) -> Part {
        Part {
            inputs,
            call,
            responses,
        }
    }

    #[test]
    fn times_round_trip_to_the_microsecond() {
        for micros in [0, 1, 1_738_324_800_123_456, 951_782_400_000_001] {
            let stamp = wire::timestamp(Timestamp(micros));
            let text = time_text(&stamp);
            assert_eq!(parse_time(&text), Some(micros), "{text}");
        }
        assert_eq!(
            time_text(&wire::timestamp(Timestamp(1_738_324_800_123_456))),
            "2025-01-31T12:00:00.123456Z"
        );
        assert_eq!(
            parse_time("2025-01-31T12:00:00Z"),
            Some(1_738_324_800_000_000)
        );
        assert_eq!(
            parse_time("2025-01-31T12:00:00.5Z"),
            Some(1_738_324_800_500_000)
        );
        for bad in [
            "",
            "2025-01-31",
            "2025-13-01T00:00:00Z",
            "2025-01-31T12:00:00.x1Z",
        ] {
            assert_eq!(parse_time(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn calls_take_the_inputs_before_them_and_their_run() -> anyhow::Result<()> {
        let t = |s: u32| format!("2025-01-01T00:00:{s:02}.000000Z");
        let (t1, t2, t3, t4) = (t(1), t(2), t(3), t(4));
        // u0 a1(A) [R: answer rolled back] u2 a3(B) u4
        let messages = history(&[
            ("", Some(&t1)),
            ("A", Some(&t1)),
            ("", Some(&t3)),
            ("B", Some(&t3)),
            ("", Some(&t4)),
        ]);
        let calls = [
            call("A", Some(&t1)),
            call("R", Some(&t2)),
            call("B", Some(&t3)),
        ];
        let parts = plan(&messages, &calls, |_| 1)?;
        assert_eq!(
            parts,
            [
                part(0..1, Some(0), 1..2),
                part(2..2, Some(1), 2..2),
                part(2..3, Some(2), 3..4),
                part(4..5, None, 5..5),
            ]
        );
        // Regenerated: u0 sent with R, whose answer was replaced by B's.
        let messages = history(&[("", Some(&t1)), ("B", Some(&t3))]);
        let calls = [call("R", Some(&t2)), call("B", Some(&t3))];
        assert_eq!(
            plan(&messages, &calls, |_| 1)?,
            [part(0..1, Some(0), 1..1), part(1..1, Some(1), 1..2)]
        );
        Ok(())
    }

    #[test]
    fn long_inputs_go_in_chunks_and_the_call_joins_the_last_that_fits() -> anyhow::Result<()> {
        let mut links = vec![("", None); IMPORT_CHUNK + 10];
        links.push(("A", None));
        let messages = history(&links);
        let parts = plan(&messages, &[call("A", None)], |_| 1)?;
        let n = IMPORT_CHUNK;
        assert_eq!(
            parts,
            [
                part(0..n, None, n..n),
                part(n..n + 10, Some(0), n + 10..n + 11)
            ]
        );
        // Too big to join: the call goes in alone.
        let messages = history(&[("", None), ("A", None)]);
        let parts = plan(&messages, &[call("A", None)], |_| IMPORT_CHUNK_BYTES)?;
        assert_eq!(parts, [part(0..1, None, 1..1), part(1..1, Some(0), 1..2)]);
        // Bytes bound a chunk too: each of these fills more than half of one.
        let messages = history(&[("", None), ("", None), ("", None)]);
        let parts = plan(&messages, &[], |_| IMPORT_CHUNK_BYTES / 2 + 1)?;
        assert_eq!(
            parts,
            [
                part(0..1, None, 1..1),
                part(1..2, None, 2..2),
                part(2..3, None, 3..3)
            ]
        );
        Ok(())
    }

    #[test]
    fn inconsistent_links_are_refused_naming_the_field() -> anyhow::Result<()> {
        let error = |messages: &[(&str, Option<&str>)], calls: &[ExportedCall]| {
            plan(&history(messages), calls, |_| 1)
                .map_or_else(|e| format!("{e:#}"), |_| "accepted".into())
        };
        let missing = error(&[("", None), ("X", None)], &[]);
        assert!(
            missing.contains("messages[1].produced_by_call_id"),
            "{missing}"
        );
        let split = error(&[("A", None), ("", None), ("A", None)], &[call("A", None)]);
        assert!(split.contains("messages[2]"), "{split}");
        let order = error(
            &[("B", None), ("A", None)],
            &[call("A", None), call("B", None)],
        );
        assert!(order.contains("messages[1]"), "{order}");
        let twice = error(&[], &[call("A", None), call("A", None)]);
        assert!(twice.contains("provider_calls[1].id"), "{twice}");
        let mut gap = history(&[("", None), ("", None)]);
        gap[1].sequence = 5;
        let gap = plan(&gap, &[], |_| 1).map_or_else(|e| format!("{e:#}"), |_| "accepted".into());
        assert!(gap.contains("messages[1].sequence"), "{gap}");
        Ok(())
    }
}
