//! `sessions export`: the JSON export file (`file_format.rs`), and the
//! transcripts (Markdown, OpenAI Chat Completions, and the providers'
//! request bodies), for a target model with `--for`.

use std::io::Write;

use serde::Serialize;
use sessionstore_client::Client;
use sessionstore_client::v1 as pb;

use super::ExportFormat;
use super::file_format::*;
use super::progress::Progress;
use crate::wire;

/// Page size for the listings an export reads.
const PAGE_SIZE: i32 = 1000;

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
        |_, call: pb::ProviderCall| Ok(ExportedCall::from(call)),
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
