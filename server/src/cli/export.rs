//! `sessions export` and `sessions import`: the JSON export file, and the
//! Markdown and OpenAI transcripts.

use std::io::{IsTerminal as _, Write};
use std::path::Path;

use anyhow::Context as _;
use futures_util::StreamExt as _;
use serde::{Deserialize, Serialize};
use sessionstore_client::v1 as pb;
use sessionstore_client::{Client, NewSession};

use super::ExportFormat;
use crate::domain::Message;
use crate::grpc::convert;

/// The header of an export file; the messages follow it in `messages`.
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
}

#[derive(Debug, Deserialize)]
struct ExportFile {
    format: String,
    session: ExportedSession,
    messages: Vec<Message>,
}

const FILE_FORMAT: &str = "sessionstore.export.v1";
/// Messages sent per call when importing.
const IMPORT_CHUNK: usize = 500;

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
    out: &mut impl Write,
) -> anyhow::Result<()> {
    let transcript = match format {
        ExportFormat::Json => return export_json(client, id, out).await,
        ExportFormat::Markdown => pb::TranscriptFormat::Markdown,
        ExportFormat::Openai => pb::TranscriptFormat::OpenaiJson,
    };
    let mut chunks = client
        .raw()
        .export_transcript(pb::ExportTranscriptRequest {
            session_id: id.to_owned(),
            format: transcript.into(),
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

/// `{"format": …, "session": {…}, "messages": [...]}`, written message by
/// message so any size exports in bounded memory.
async fn export_json(client: &Client, id: &str, out: &mut impl Write) -> anyhow::Result<()> {
    let session = client.get_session(id.to_owned()).await?;
    let header = ExportedSession {
        id: session.id,
        title: session.title,
        system_prompt: session.system_prompt,
        user: session.user,
        metadata: session.metadata.into_iter().collect(),
    };
    write!(
        out,
        "{{\"format\":{},\"session\":{},\"messages\":[",
        serde_json::to_string(FILE_FORMAT)?,
        serde_json::to_string(&header)?
    )?;
    let mut messages = client.export_history_stream(id).await?;
    let progress = Progress::new("exported", None);
    let mut count = 0;
    while let Some(message) = messages.next().await {
        let message = convert::message_from_pb(message?, &format!("messages[{count}]"))?;
        if count > 0 {
            out.write_all(b",")?;
        }
        out.write_all(b"\n")?;
        serde_json::to_writer(&mut *out, &message)?;
        count += 1;
        if count % 1000 == 0 {
            progress.show(count);
        }
    }
    out.write_all(b"\n]}\n")?;
    progress.finish(count);
    Ok(())
}

pub(super) async fn import(
    client: &Client,
    path: &Path,
    id: Option<String>,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    let file =
        std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let parsed: ExportFile = serde_json::from_reader(std::io::BufReader::new(file))
        .with_context(|| format!("{} is not a sessionstore JSON export", path.display()))?;
    anyhow::ensure!(
        parsed.format == FILE_FORMAT,
        "{} has format {:?}; expected {FILE_FORMAT:?}",
        path.display(),
        parsed.format
    );
    let id = id.unwrap_or(parsed.session.id);
    let total = parsed.messages.len();
    let mut chunks = parsed
        .messages
        .chunks(IMPORT_CHUNK)
        .map(|chunk| {
            chunk
                .iter()
                .cloned()
                .map(convert::message_to_pb)
                .collect::<Vec<_>>()
        })
        .collect::<Vec<_>>()
        .into_iter();
    let mut new = NewSession::new()
        .id(id.clone())
        .title(parsed.session.title)
        .system_prompt(parsed.session.system_prompt)
        .user(parsed.session.user);
    for (key, value) in parsed.session.metadata {
        new = new.metadata(key, value);
    }
    let first = chunks.next().unwrap_or_default();
    let mut done = first.len();
    client.create_session(new.initial_history(first)).await?;
    let progress = Progress::new("imported", Some(total));
    progress.show(done);
    for (index, messages) in chunks.enumerate() {
        let count = messages.len();
        let request = pb::AppendExchangeRequest {
            session_id: id.clone(),
            messages,
            // The next sequence is known exactly: a concurrent writer makes
            // the import stop rather than interleave.
            expected_next_sequence: Some(i64::try_from(done)?),
            request_id: format!("import-{id}-{index}"),
            ..Default::default()
        };
        client
            .raw()
            .append_exchange(request)
            .await
            .map_err(sessionstore_client::Error::from)?;
        done += count;
        progress.show(done);
    }
    progress.finish(done);
    writeln!(out, "imported {id}: {done} messages")?;
    Ok(())
}
