//! Reads: ExportHistory against a plain ordered SELECT of the same rows,
//! WatchSession's replay of a long event log against ExportHistory of the
//! same messages, and ListSessions pages at the front and deep into a large
//! tenant.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use futures_util::StreamExt as _;
use sessionstore_client::SessionStoreClient;
use sessionstore_client::v1 as pb;
use sqlx::Connection as _;
use tonic::transport::Channel;

use crate::server::{Database, Server};
use crate::{stats, workload};

/// The session an export benchmark reads.
pub fn export_session(messages: usize) -> String {
    format!("bench-export-{messages}")
}

/// Creates a session holding `messages` messages of ~1 KB.
pub async fn prepare_export(server: &Server, messages: usize) -> anyhow::Result<()> {
    prepare_session(server, &export_session(messages), messages, 200).await
}

/// Creates session `id` holding `messages` messages of ~1 KB, appended
/// `per_call` at a time.
async fn prepare_session(
    server: &Server,
    id: &str,
    messages: usize,
    per_call: usize,
) -> anyhow::Result<()> {
    let mut client = server.connect().await?;
    workload::create_session(&mut client, id, "bench", 0, 0).await?;
    workload::fill(&mut client, id, messages, per_call).await
}

/// Reads the whole session through ExportHistory: how long until the last
/// message arrived.
pub async fn export_once(server: &Server, messages: usize) -> anyhow::Result<Duration> {
    export_id(server, &export_session(messages), messages).await
}

/// Reads an ExportHistory stream to its end: how many messages arrived.
async fn export_all(
    client: &mut SessionStoreClient<Channel>,
    request: pb::ExportHistoryRequest,
) -> anyhow::Result<usize> {
    let mut stream = client
        .export_history(request)
        .await
        .context("ExportHistory")?
        .into_inner();
    let mut received = 0;
    while let Some(chunk) = stream.next().await {
        received += chunk.context("ExportHistory stream")?.messages.len();
    }
    Ok(received)
}

async fn export_id(server: &Server, id: &str, messages: usize) -> anyhow::Result<Duration> {
    let mut client = server.connect().await?;
    let started = Instant::now();
    let received = export_all(
        &mut client,
        pb::ExportHistoryRequest {
            session_id: id.to_owned(),
            ..Default::default()
        },
    )
    .await?;
    let took = started.elapsed();
    anyhow::ensure!(
        received == messages,
        "exported {received} messages, expected {messages}"
    );
    Ok(took)
}

/// The session a replay benchmark reads: `exchanges` appends of a user
/// and an assistant message each.
pub fn replay_session(exchanges: usize) -> String {
    format!("bench-replay-{exchanges}")
}

/// Creates a session of `exchanges` appends, one event each.
pub async fn prepare_replay(server: &Server, exchanges: usize) -> anyhow::Result<()> {
    prepare_session(server, &replay_session(exchanges), 2 * exchanges, 2).await
}

/// Replays the session's whole event log through WatchSession: how long
/// until `caught_up` arrived.
pub async fn replay_once(server: &Server, exchanges: usize) -> anyhow::Result<Duration> {
    let mut client = server.connect().await?;
    let started = Instant::now();
    let mut stream = client
        .watch_session(pb::WatchSessionRequest {
            session_id: replay_session(exchanges),
            ..Default::default()
        })
        .await
        .context("WatchSession")?
        .into_inner();
    let mut messages = 0;
    loop {
        let event = stream
            .next()
            .await
            .context("the watch ended before catching up")?
            .context("WatchSession stream")?;
        match event.event {
            Some(pb::session_event::Event::ExchangeAppended(appended)) => {
                messages += appended.messages.len();
            }
            Some(pb::session_event::Event::CaughtUp(_)) => break,
            _ => {}
        }
    }
    let took = started.elapsed();
    anyhow::ensure!(
        messages == 2 * exchanges,
        "replayed {messages} messages, expected {}",
        2 * exchanges
    );
    Ok(took)
}

/// ExportHistory of the replay session: the same messages in one stream.
pub async fn export_replay_session(server: &Server, exchanges: usize) -> anyhow::Result<Duration> {
    export_id(server, &replay_session(exchanges), 2 * exchanges).await
}

/// Every column of the messages a read returns: a message's content is
/// its protobuf encoding (`wire`) or, as an older server wrote it, its
/// JSON (`body`).
const SELECT_MESSAGES: &str = "SELECT sequence, id, produced_by_call_id, body, wire, create_time, \
     redacted FROM messages WHERE session_key = (SELECT key FROM sessions \
     WHERE tenant = 'default' AND id = $1 AND deleted = 0) ORDER BY sequence";

/// A message row as the SELECTs fetch it (the content left undecoded).
type MessageRow = (
    i64,
    String,
    Option<String>,
    String,
    Option<Vec<u8>>,
    i64,
    i64,
);

/// The same rows through sqlx, fetched into memory (no decoding).
pub async fn select_sqlx(db: &Database, messages: usize) -> anyhow::Result<Duration> {
    let id = export_session(messages);
    let (took, rows) = if db.is_postgres() {
        let mut conn = sqlx::PgConnection::connect(&db.url()).await?;
        timed_select::<sqlx::Postgres>(&mut conn, &id).await?
    } else {
        let mut conn = sqlx::SqliteConnection::connect(&db.url()).await?;
        timed_select::<sqlx::Sqlite>(&mut conn, &id).await?
    };
    anyhow::ensure!(
        rows == messages,
        "selected {rows} rows, expected {messages}"
    );
    Ok(took)
}

/// Runs the SELECT of session `id`'s messages once to prepare it, as a
/// pool would have, then times it: (time, rows).
async fn timed_select<DB: sqlx::Database>(
    conn: &mut DB::Connection,
    id: &str,
) -> anyhow::Result<(Duration, usize)>
where
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
    for<'q> &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    MessageRow: for<'r> sqlx::FromRow<'r, DB::Row>,
{
    sqlx::query(SELECT_MESSAGES)
        .bind(id)
        .fetch_all(&mut *conn)
        .await?;
    let started = Instant::now();
    let rows = sqlx::query_as::<_, MessageRow>(SELECT_MESSAGES)
        .bind(id)
        .fetch_all(&mut *conn)
        .await?;
    Ok((started.elapsed(), rows.len()))
}

/// The same rows through the SQLite engine (rusqlite), on a connection
/// that maps the file as the server's read connections do (1 GiB).
pub fn select_engine(db: &Database, messages: usize) -> anyhow::Result<Duration> {
    let id = export_session(messages);
    let conn = rusqlite::Connection::open(db.url().trim_start_matches("sqlite://"))?;
    conn.pragma_update(None, "mmap_size", 1_i64 << 30)?;
    let sql = SELECT_MESSAGES.replace("$1", "?1");
    let mut statement = conn.prepare(&sql)?;
    let started = Instant::now();
    let rows = statement
        .query_map([&id], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, Option<String>>(2)?,
                r.get::<_, String>(3)?,
                r.get::<_, Option<Vec<u8>>>(4)?,
                r.get::<_, i64>(5)?,
                r.get::<_, i64>(6)?,
            ))
        })?
        .collect::<Result<Vec<_>, _>>()?;
    let took = started.elapsed();
    anyhow::ensure!(
        rows.len() == messages,
        "selected {} rows, expected {messages}",
        rows.len()
    );
    Ok(took)
}

/// How many sessions the list benchmark writes with `messages_each`.
pub struct ListShape {
    pub sessions: usize,
    pub messages_each: usize,
}

/// Fills a tenant with `shape.sessions` sessions of small messages, from
/// `writers` concurrent clients (not measured).
pub async fn prepare_list(
    server: &Server,
    shape: &ListShape,
    writers: usize,
) -> anyhow::Result<()> {
    let mut tasks = tokio::task::JoinSet::new();
    for writer in 0..writers {
        let mut client = server.connect().await?;
        let (sessions, messages) = (shape.sessions, shape.messages_each);
        let apps = apps(sessions);
        tasks.spawn(async move {
            for n in (writer..sessions).step_by(writers) {
                let id = format!("bench-list-{n:07}");
                let user = format!("user-{}", n % 100);
                let tier = if n % 10 == 0 { "pro" } else { "free" };
                let metadata = [
                    ("app".to_owned(), format!("app-{}", n % apps)),
                    ("tier".to_owned(), tier.to_owned()),
                ]
                .into();
                workload::create_tagged_session(&mut client, &id, &user, messages, 100, metadata)
                    .await?;
            }
            Ok::<_, anyhow::Error>(())
        });
    }
    while let Some(done) = tasks.join_next().await {
        done??;
    }
    Ok(())
}

pub const PAGE_SIZE: i32 = 50;

/// Sessions of the list benchmark sharing one `app` metadata value: a
/// filter on one matches this many (1 in 1,000 of 100,000 sessions).
pub const PER_APP: usize = 100;

/// Distinct `app` values among `sessions` sessions.
pub fn apps(sessions: usize) -> usize {
    (sessions / PER_APP).max(1)
}

/// The filter the selective filtered list case pages through.
pub fn selective_filter() -> String {
    "metadata.app = \"app-0\"".to_owned()
}

/// A filter nine in ten sessions match (`tier` is `pro` for the rest).
pub fn common_filter() -> String {
    "metadata.tier = \"free\"".to_owned()
}

/// The page token of the page after `pages` pages (0: the first page).
pub async fn token_after(server: &Server, pages: usize) -> anyhow::Result<String> {
    let mut client = server.connect().await?;
    let mut token = String::new();
    for _ in 0..pages {
        let page = client
            .list_sessions(pb::ListSessionsRequest {
                page_size: PAGE_SIZE,
                page_token: token,
                ..Default::default()
            })
            .await?
            .into_inner();
        anyhow::ensure!(
            !page.next_page_token.is_empty(),
            "ran out of sessions while paging"
        );
        token = page.next_page_token;
    }
    Ok(token)
}

/// `samples` sequential ListSessions calls for the page at `token` of
/// `filter` (empty: every session).
pub async fn list_pages(
    server: &Server,
    token: &str,
    filter: &str,
    samples: usize,
) -> anyhow::Result<Vec<Duration>> {
    let mut client = server.connect().await?;
    stats::sampled(
        samples,
        async || {
            Ok(client
                .list_sessions(pb::ListSessionsRequest {
                    page_size: PAGE_SIZE,
                    page_token: token.to_owned(),
                    filter: filter.to_owned(),
                    ..Default::default()
                })
                .await?
                .into_inner())
        },
        |page| {
            anyhow::ensure!(
                page.sessions.len() == PAGE_SIZE as usize,
                "a page held {} sessions",
                page.sessions.len()
            );
            Ok(())
        },
    )
    .await
}

/// The session an export-for-a-target benchmark reads.
pub fn reasoning_session(messages: usize) -> String {
    format!("bench-export-reasoning-{messages}")
}

/// Creates a session of about `messages` messages of ~1 KB in exchanges of
/// three: a tool result and a user message, then an assistant answer with
/// a signed thinking block and the next tool call (so a third hold
/// reasoning), produced alternately by Claude and GPT calls.
pub async fn prepare_reasoning_export(server: &Server, messages: usize) -> anyhow::Result<()> {
    use pb::content_block::Block;
    let id = reasoning_session(messages);
    let mut client = server.connect().await?;
    workload::create_session(&mut client, &id, "bench", 0, 0).await?;
    let filler = "lorem ipsum dolor sit amet ".repeat(36);
    let text = |role: pb::Role, content: String| pb::Message {
        role: role.into(),
        content,
        ..Default::default()
    };
    for exchange in 0..messages.div_ceil(3) {
        let mut inputs = Vec::new();
        if exchange > 0 {
            let mut result = text(pb::Role::Tool, format!("result {exchange} {filler}"));
            result.tool_call_id = format!("call-{}", exchange - 1);
            inputs.push(result);
        }
        inputs.push(text(
            pb::Role::User,
            format!("question {exchange} {filler}"),
        ));
        let (provider, model) = if exchange % 2 == 0 {
            ("anthropic", "claude-sonnet-4-5")
        } else {
            ("openai", "gpt-5")
        };
        let answer = pb::Message {
            role: pb::Role::Assistant.into(),
            content: format!("answer {exchange}"),
            content_blocks: vec![pb::ContentBlock {
                block: Some(Block::Thinking(pb::ThinkingBlock {
                    thinking: format!("thinking {exchange} {filler}"),
                    signature: "EqQBCkgIARABGAIiQL".repeat(8),
                })),
            }],
            tool_calls: vec![pb::ToolCall {
                id: format!("call-{exchange}"),
                name: "lookup".into(),
                arguments: format!(r#"{{"q":{exchange}}}"#),
                signature: String::new(),
            }],
            ..Default::default()
        };
        client
            .append_exchange(pb::AppendExchangeRequest {
                session_id: id.clone(),
                messages: inputs,
                provider_call: Some(pb::ProviderCall {
                    provider: provider.into(),
                    model: model.into(),
                    prompt_tokens: 100,
                    completion_tokens: 50,
                    ..Default::default()
                }),
                response_messages: vec![answer],
                ..Default::default()
            })
            .await
            .context("AppendExchange (reasoning export session)")?;
    }
    Ok(())
}

/// Exports the reasoning session, for `target` or plainly: how long until
/// the last message arrived, and how many arrived.
pub async fn export_reasoning_once(
    server: &Server,
    messages: usize,
    target: Option<pb::ExportTarget>,
) -> anyhow::Result<(Duration, usize)> {
    let mut client = server.connect().await?;
    let started = Instant::now();
    let received = export_all(
        &mut client,
        pb::ExportHistoryRequest {
            session_id: reasoning_session(messages),
            target,
            ..Default::default()
        },
    )
    .await?;
    Ok((started.elapsed(), received))
}
