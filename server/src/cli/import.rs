//! `sessions import`: a session restored from an export file.
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
use std::io::Write;
use std::ops::Range;
use std::path::Path;

use anyhow::Context as _;
use prost::Message as _;
use sessionstore_client::v1 as pb;
use sessionstore_client::{Client, Exchange, NewSession};

use super::file_format::*;
use super::progress::Progress;
use crate::domain::control;
use crate::wire;

/// Most messages sent per call when importing.
const IMPORT_CHUNK: usize = 500;
/// Most encoded message bytes sent per call when importing (half the
/// server's default request limit).
const IMPORT_CHUNK_BYTES: usize = 8 * 1024 * 1024;

/// One AppendExchange of an import: indices into the file's messages and
/// provider calls.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Part {
    inputs: Range<usize>,
    call: Option<usize>,
    responses: Range<usize>,
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
                .provider_call(call.to_record())
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
    use crate::domain::Message;

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
