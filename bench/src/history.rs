//! Sessions with their whole history written straight into the database
//! with multi-row INSERTs, as the server would have left them after a
//! CreateSession and a number of AppendExchange calls: the session row with
//! its counters, one event per revision, and per exchange a user message,
//! a provider call, the assistant's answer it produced and an idempotency
//! key (and, on PostgreSQL, the messages' search rows; on SQLite the
//! server builds its search file from the messages when it first starts).
//!
//! The rows are in the form the server writes (`sessions create` and
//! `sessions append` against a real server, read back from its tables):
//! each message's content protobuf-encoded in `wire`, each event's
//! `SessionEvent` encoding, an exchange's referring to its messages for
//! their content.
//! Through the API a fill of this size would take many minutes.

use std::time::Duration;

use anyhow::Context as _;
use futures_util::StreamExt as _;
use prost::Message as _;
use sessionstore_client::v1 as pb;
use sqlx::Connection as _;

use crate::server::{Database, Server};
use crate::usage::{Conn, TENANT};
use crate::workload;

/// Rows per INSERT statement.
const ROWS_PER_INSERT: usize = 1000;

/// The provider call every filled exchange records (as
/// [`workload::provider_call`] sends it).
const PROVIDER: &str = "anthropic";
const MODEL: &str = "claude-sonnet-4-5";
const PROMPT_TOKENS: i64 = 350;
const COMPLETION_TOKENS: i64 = 260;
const COST_MICROS_USD: i64 = 4_950;

/// One session: created at `create_time`, then `exchanges` appends, one
/// every `step` microseconds, each of a user message and an assistant
/// message of [`workload::MESSAGE_BYTES`] and the call that produced it.
#[derive(Clone, Debug)]
pub struct Chat {
    pub key: i64,
    pub id: String,
    pub user: String,
    pub title: String,
    pub exchanges: usize,
    pub create_time: i64,
    pub step: i64,
    /// Seeds the messages' texts.
    pub seed: u64,
}

impl Chat {
    pub fn messages(&self) -> i64 {
        2 * self.exchanges as i64
    }

    /// The revision the session is at: 1 for its creation, one per append.
    pub fn revision(&self) -> i64 {
        1 + self.exchanges as i64
    }

    fn time_of(&self, exchange: usize) -> i64 {
        self.create_time + (exchange as i64 + 1) * self.step
    }

    pub fn update_time(&self) -> i64 {
        if self.exchanges == 0 {
            self.create_time
        } else {
            self.time_of(self.exchanges - 1)
        }
    }

    fn request_id(&self, exchange: usize) -> String {
        format!("gw-{}-{exchange}", self.key)
    }

    /// The text of message `sequence`.
    pub fn text(&self, sequence: i64) -> String {
        let seed = self.seed.wrapping_mul(0x1_0000_0001) ^ sequence as u64;
        workload::text(seed, workload::MESSAGE_BYTES)
    }
}

/// A SQL string literal.
fn q(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// Rows gathered table by table, written as multi-row INSERTs.
pub struct Rows {
    postgres: bool,
    sessions: Vec<String>,
    calls: Vec<String>,
    messages: Vec<String>,
    search: Vec<String>,
    events: Vec<String>,
    keys: Vec<String>,
}

impl Rows {
    pub fn new(db: &Database) -> Rows {
        Rows {
            postgres: db.is_postgres(),
            sessions: Vec::new(),
            calls: Vec::new(),
            messages: Vec::new(),
            search: Vec::new(),
            events: Vec::new(),
            keys: Vec::new(),
        }
    }

    /// The session row, with the counters its appends leave, and its
    /// `session_created` event (revision 1).
    pub fn session(&mut self, chat: &Chat) {
        let n = chat.exchanges as i64;
        let (last_model, last_provider, last_cost, last_request) = if n > 0 {
            (
                MODEL,
                PROVIDER,
                COST_MICROS_USD,
                chat.request_id(chat.exchanges - 1),
            )
        } else {
            ("", "", 0, String::new())
        };
        self.sessions.push(format!(
            "({}, '{TENANT}', {}, {}, '', {}, '{{}}', {}, {}, {}, {n}, {}, {}, {last_cost}, {}, \
             {}, {}, {}, {}, 0)",
            chat.key,
            q(&chat.id),
            q(&chat.title),
            q(&chat.user),
            chat.revision(),
            chat.messages(),
            chat.messages(),
            q(last_model),
            q(last_provider),
            q(&last_request),
            n * (PROMPT_TOKENS + COMPLETION_TOKENS),
            n * COST_MICROS_USD,
            chat.create_time,
            chat.update_time(),
        ));
        let created = pb::session_event::Event::SessionCreated(pb::SessionCreated {
            session: Some(pb::Session {
                id: chat.id.clone(),
                title: chat.title.clone(),
                user: chat.user.clone(),
                revision: 1,
                create_time: Some(workload::timestamp(chat.create_time)),
                update_time: Some(workload::timestamp(chat.create_time)),
                ..Default::default()
            }),
            ..Default::default()
        });
        self.event(chat, 1, chat.create_time, created, 0..0, "NULL");
    }

    /// Exchanges `range` of `chat`: its messages, calls, events and
    /// idempotency keys.
    pub fn exchanges(&mut self, chat: &Chat, range: std::ops::Range<usize>) {
        for exchange in range {
            self.exchange(chat, exchange);
        }
    }

    fn exchange(&mut self, chat: &Chat, exchange: usize) {
        let time = chat.time_of(exchange);
        let sequence = 2 * exchange as i64;
        let revision = exchange as i64 + 2;
        let call_id = format!("call_{}", uuid::Uuid::now_v7().simple());
        let request_id = chat.request_id(exchange);
        self.calls.push(format!(
            "('{TENANT}', {}, {}, {}, {}, '{PROVIDER}', '{MODEL}', '', '', {PROMPT_TOKENS}, \
             {COMPLETION_TOKENS}, {}, {COST_MICROS_USD}, {time}, 0, 0, 0, '', 0)",
            q(&chat.user),
            q(&call_id),
            chat.key,
            q(&request_id),
            PROMPT_TOKENS + COMPLETION_TOKENS,
        ));
        let mut stored = Vec::with_capacity(2);
        let roles = [
            (0, pb::Role::User, ""),
            (1, pb::Role::Assistant, call_id.as_str()),
        ];
        for (offset, pb_role, produced_by) in roles {
            let sequence = sequence + offset;
            let id = format!("msg_{}", uuid::Uuid::now_v7().simple());
            let text = chat.text(sequence);
            let message = pb::Message {
                role: pb_role.into(),
                content: text.clone(),
                ..Default::default()
            };
            let produced = if produced_by.is_empty() {
                "NULL".to_owned()
            } else {
                q(produced_by)
            };
            // As the server writes it (migration 0017): the encoding in
            // `wire`, `body` empty, referred to by the exchange's event.
            self.messages.push(format!(
                "({}, {sequence}, {}, {produced}, '', {}, {time}, 0, {revision})",
                chat.key,
                q(&id),
                self.bytes(&message.encode_to_vec()),
            ));
            if self.postgres {
                self.search
                    .push(format!("({}, {sequence}, {})", chat.key, q(&text)));
            }
            stored.push(pb::StoredMessage {
                id,
                session_id: chat.id.clone(),
                sequence,
                produced_by_call_id: produced_by.to_owned(),
                // In the message's row (migration 0016).
                message: None,
                create_time: Some(workload::timestamp(time)),
                redacted: false,
            });
        }
        let appended = pb::session_event::Event::ExchangeAppended(pb::ExchangeAppended {
            messages: stored,
            provider_call: Some(pb::ProviderCall {
                id: call_id,
                session_id: chat.id.clone(),
                request_id: request_id.clone(),
                provider: PROVIDER.into(),
                model: MODEL.into(),
                prompt_tokens: PROMPT_TOKENS,
                completion_tokens: COMPLETION_TOKENS,
                total_tokens: PROMPT_TOKENS + COMPLETION_TOKENS,
                cost_micros_usd: COST_MICROS_USD,
                create_time: Some(workload::timestamp(time)),
                ..Default::default()
            }),
            next_sequence: sequence + 2,
            ..Default::default()
        });
        // The client's idempotency key (a UUIDv7), named by its event
        // (migration 0019), and a fingerprint of 32 bytes; no filled
        // exchange is ever retried.
        let key = uuid::Uuid::now_v7();
        self.event(
            chat,
            revision,
            time,
            appended,
            sequence..sequence + 2,
            &format!("'{key}'"),
        );
        let fingerprint = format!("{}{}", key.simple(), key.simple());
        let fingerprint = if self.postgres {
            format!("'\\x{fingerprint}'")
        } else {
            format!("X'{fingerprint}'")
        };
        self.keys.push(format!(
            "('{TENANT}', '{key}', {}, {fingerprint}, {revision}, 1)",
            chat.key
        ));
    }

    /// An event row as the server writes it (migrations 0013, 0016 and
    /// 0019): the `SessionEvent` encoded in `wire`, `body` empty, referring
    /// to the messages `refers` for their content, naming its request id
    /// (`request_id`, an SQL literal: `NULL` for none).
    fn event(
        &mut self,
        chat: &Chat,
        revision: i64,
        time: i64,
        event: pb::session_event::Event,
        refers: std::ops::Range<i64>,
        request_id: &str,
    ) {
        let encoded = pb::SessionEvent {
            revision,
            time: Some(workload::timestamp(time)),
            event: Some(event),
        }
        .encode_to_vec();
        let literal = self.bytes(&encoded);
        self.events.push(format!(
            "({}, {revision}, {time}, '', {literal}, {}, {}, {request_id})",
            chat.key, refers.start, refers.end
        ));
    }

    /// A bytes literal.
    fn bytes(&self, bytes: &[u8]) -> String {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut hex = String::with_capacity(2 * bytes.len());
        for byte in bytes {
            hex.push(char::from(DIGITS[usize::from(byte >> 4)]));
            hex.push(char::from(DIGITS[usize::from(byte & 15)]));
        }
        if self.postgres {
            format!("'\\x{hex}'")
        } else {
            format!("X'{hex}'")
        }
    }

    /// Whether nothing is gathered.
    pub fn is_empty(&self) -> bool {
        self.sessions.is_empty() && self.events.is_empty()
    }

    /// Everything gathered as INSERT statements, in an order the foreign
    /// keys accept; the rows are taken.
    pub fn statements(&mut self) -> Vec<String> {
        let mut out = Vec::new();
        let sessions_head = if self.postgres {
            "INSERT INTO sessions (key, tenant, id, title, system_prompt, user_name, metadata, \
             revision, next_sequence, message_count, provider_call_count, last_model, \
             last_provider, last_cost_micros_usd, last_request_id, total_tokens, \
             total_cost_micros_usd, create_time, update_time, deleted) OVERRIDING SYSTEM VALUE VALUES "
        } else {
            "INSERT INTO sessions (key, tenant, id, title, system_prompt, user_name, metadata, \
             revision, next_sequence, message_count, provider_call_count, last_model, \
             last_provider, last_cost_micros_usd, last_request_id, total_tokens, \
             total_cost_micros_usd, create_time, update_time, deleted) VALUES "
        };
        let tables: [(&str, &str, &mut Vec<String>); 6] = [
            (sessions_head, "", &mut self.sessions),
            (
                "INSERT INTO provider_calls (tenant, user_name, id, session_key, request_id, \
                 provider, model, requested_provider, requested_model, prompt_tokens, \
                 completion_tokens, total_tokens, cost_micros_usd, create_time, \
                 cached_input_tokens, cache_creation_input_tokens, reasoning_tokens, usage_json, \
                 duration_micros) VALUES ",
                "",
                &mut self.calls,
            ),
            (
                "INSERT INTO messages (session_key, sequence, id, produced_by_call_id, body, \
                 wire, create_time, redacted, referenced_by) VALUES ",
                "",
                &mut self.messages,
            ),
            (
                "INSERT INTO message_search (session_key, sequence, words) \
                 SELECT k, s, to_tsvector('simple', t) FROM (VALUES ",
                ") AS v (k, s, t)",
                &mut self.search,
            ),
            (
                "INSERT INTO events (session_key, revision, time, body, wire, refers_from, \
                 refers_until, request_id) VALUES ",
                "",
                &mut self.events,
            ),
            (
                "INSERT INTO idempotency_keys (tenant, request_id, session_key, fingerprint, \
                 revision, found_through_event) VALUES ",
                "",
                &mut self.keys,
            ),
        ];
        for (head, tail, rows) in tables {
            for chunk in rows.chunks(ROWS_PER_INSERT) {
                out.push(format!("{head}{}{tail}", chunk.join(",")));
            }
            rows.clear();
        }
        out
    }
}

/// Opens the fill's own connection: on PostgreSQL without waiting for
/// each commit's flush (a fill lost in a crash is run again), on SQLite
/// with `synchronous = OFF` (as the usage fill).
pub async fn open(db: &Database) -> anyhow::Result<Conn> {
    let mut conn = Conn::open(db).await?;
    if db.is_postgres() {
        conn.execute("SET synchronous_commit = off").await?;
    }
    Ok(conn)
}

/// Writes `statements` in one transaction.
pub async fn commit(conn: &mut Conn, statements: Vec<String>) -> anyhow::Result<()> {
    conn.execute("BEGIN").await?;
    for statement in statements {
        conn.execute(&statement).await?;
    }
    conn.execute("COMMIT").await
}

/// PostgreSQL: the sessions' key sequence moved past the keys written, so
/// the server's own CreateSession takes the next one.
pub async fn finish(conn: &mut Conn, db: &Database) -> anyhow::Result<()> {
    if db.is_postgres() {
        conn.execute(
            "SELECT setval(pg_get_serial_sequence('sessions', 'key'), \
             (SELECT max(key) FROM sessions))",
        )
        .await?;
    }
    Ok(())
}

/// Writes `chats` whole: sessions, then their exchanges, in transactions
/// of about `per_transaction` exchanges (and sessions), the statements of
/// the next built on a blocking thread while the last are written.
pub async fn write(
    db: &Database,
    chats: Vec<Chat>,
    per_transaction: usize,
    progress: &str,
) -> anyhow::Result<()> {
    let started = std::time::Instant::now();
    let total: usize = chats.iter().map(|c| 1 + c.exchanges).sum();
    let (send, mut receive) = tokio::sync::mpsc::channel::<(usize, Vec<String>)>(2);
    let postgres = Rows::new(db);
    let builder = tokio::task::spawn_blocking(move || {
        let mut rows = postgres;
        let mut gathered = 0;
        let mut done = 0;
        for chat in &chats {
            rows.session(chat);
            gathered += 1;
            let mut from = 0;
            while from < chat.exchanges {
                let until =
                    (from + per_transaction.saturating_sub(gathered).max(1)).min(chat.exchanges);
                rows.exchanges(chat, from..until);
                gathered += until - from;
                from = until;
                if gathered >= per_transaction {
                    done += gathered;
                    if send.blocking_send((done, rows.statements())).is_err() {
                        return;
                    }
                    gathered = 0;
                }
            }
            if gathered >= per_transaction {
                done += gathered;
                if send.blocking_send((done, rows.statements())).is_err() {
                    return;
                }
                gathered = 0;
            }
        }
        if !rows.is_empty() {
            let _ = send.blocking_send((done + gathered, rows.statements()));
        }
    });
    let mut conn = open(db).await?;
    let mut reported = 0;
    while let Some((done, statements)) = receive.recv().await {
        commit(&mut conn, statements).await?;
        if done * 10 / total.max(1) > reported {
            reported = done * 10 / total.max(1);
            eprintln!(
                "   {progress}: {}% written ({:.0} s)",
                reported * 10,
                started.elapsed().as_secs_f64()
            );
        }
    }
    builder.await?;
    finish(&mut conn, db).await
}

/// A connection of the bench's own that reads counts.
pub enum Reader {
    Sqlite(sqlx::SqliteConnection),
    Postgres(sqlx::PgConnection),
}

impl Reader {
    pub async fn open(db: &Database) -> anyhow::Result<Reader> {
        let url = db.url();
        Ok(if db.is_postgres() {
            Reader::Postgres(sqlx::PgConnection::connect(&url).await?)
        } else {
            Reader::Sqlite(sqlx::SqliteConnection::connect(&url).await?)
        })
    }

    /// The one integer `sql` answers.
    pub async fn scalar(&mut self, sql: &str) -> anyhow::Result<i64> {
        Ok(match self {
            Reader::Sqlite(conn) => sqlx::query_scalar::<_, i64>(sql).fetch_one(conn).await?,
            Reader::Postgres(conn) => sqlx::query_scalar::<_, i64>(sql).fetch_one(conn).await?,
        })
    }

    pub async fn close(self) {
        let _ = match self {
            Reader::Sqlite(conn) => conn.close().await,
            Reader::Postgres(conn) => conn.close().await,
        };
    }
}

/// Checks through the API that the server reads `chat` as it was written:
/// its summary's counters (`chat` must be its user's most recently updated
/// session), its newest page of messages with their texts, and its last
/// two events replayed by WatchSession.
pub async fn verify(server: &Server, chat: &Chat) -> anyhow::Result<()> {
    let mut client = server.connect().await?;
    let listed = client
        .list_sessions(pb::ListSessionsRequest {
            page_size: 1,
            user: chat.user.clone(),
            ..Default::default()
        })
        .await
        .context("ListSessions of the filled user")?
        .into_inner();
    let summary = listed
        .sessions
        .first()
        .with_context(|| format!("ListSessions found no session of {}", chat.user))?;
    let session = summary
        .session
        .as_ref()
        .context("a summary without its session")?;
    let n = chat.exchanges as i64;
    let got = (
        session.id.as_str(),
        session.revision,
        session.next_sequence,
        summary.message_count,
        summary.provider_call_count,
        summary.total_tokens,
        summary.total_cost_micros_usd,
    );
    let expected = (
        chat.id.as_str(),
        chat.revision(),
        chat.messages(),
        chat.messages(),
        n,
        n * (PROMPT_TOKENS + COMPLETION_TOKENS),
        n * COST_MICROS_USD,
    );
    anyhow::ensure!(
        got == expected,
        "ListSessions read (id, revision, next_sequence, messages, calls, tokens, cost) {got:?}, \
         the fill wrote {expected:?}"
    );

    let page = client
        .list_messages(pb::ListMessagesRequest {
            session_id: chat.id.clone(),
            page_size: 50,
            order_by: "sequence desc".to_owned(),
            ..Default::default()
        })
        .await
        .context("ListMessages of a filled session")?
        .into_inner();
    anyhow::ensure!(
        page.messages.len() as i64 == chat.messages().min(50),
        "ListMessages answered {} messages of {}",
        page.messages.len(),
        chat.id
    );
    for (n, stored) in page.messages.iter().enumerate() {
        let sequence = chat.messages() - 1 - n as i64;
        let text = stored.message.as_ref().map(|m| m.content.as_str());
        anyhow::ensure!(
            stored.sequence == sequence && text == Some(chat.text(sequence).as_str()),
            "message {} of {} is not the one written at sequence {sequence}",
            stored.sequence,
            chat.id
        );
        anyhow::ensure!(
            stored.produced_by_call_id.is_empty() == (sequence % 2 == 0),
            "message {sequence} of {} has produced_by_call_id {:?}",
            chat.id,
            stored.produced_by_call_id
        );
    }

    let after = (chat.revision() - 2).max(0);
    let mut events = client
        .watch_session(pb::WatchSessionRequest {
            session_id: chat.id.clone(),
            after_revision: after,
            ..Default::default()
        })
        .await
        .context("WatchSession of a filled session")?
        .into_inner();
    let mut revision = after;
    loop {
        let event = tokio::time::timeout(Duration::from_secs(30), events.next())
            .await
            .context("WatchSession did not catch up within 30 s")?
            .context("the watch ended before catching up")?
            .context("WatchSession stream")?;
        match event.event {
            Some(pb::session_event::Event::CaughtUp(_)) => break,
            Some(pb::session_event::Event::SessionCreated(_)) if event.revision == 1 => {}
            Some(pb::session_event::Event::ExchangeAppended(appended)) => {
                let first = 2 * (event.revision - 2);
                let sequences: Vec<i64> = appended.messages.iter().map(|m| m.sequence).collect();
                anyhow::ensure!(
                    sequences == [first, first + 1]
                        && appended.provider_call.is_some()
                        && appended.next_sequence == first + 2,
                    "event {} of {} replayed as {sequences:?}",
                    event.revision,
                    chat.id
                );
            }
            other => anyhow::bail!(
                "event {} of {} replayed as {other:?}",
                event.revision,
                chat.id
            ),
        }
        anyhow::ensure!(
            event.revision == revision + 1,
            "WatchSession replayed revision {} after {revision}",
            event.revision
        );
        revision = event.revision;
    }
    anyhow::ensure!(
        revision == chat.revision(),
        "WatchSession caught up at revision {revision}, the fill wrote {}",
        chat.revision()
    );
    Ok(())
}
