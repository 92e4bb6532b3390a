//! AppendExchange through the service, and the same transaction issued
//! straight to the database (the ceiling the service is measured against).
//!
//! The raw transaction writes exactly the rows an append writes, one
//! statement per table, as a hand-rolled store would: read and (on
//! PostgreSQL) lock the session row, insert the provider call, the two
//! messages, their full-text rows, update the session's counters, insert
//! the event and the idempotency key, commit (and, on PostgreSQL, send the
//! commit hint every replica listens for in the COMMIT's round trip, after
//! it, as the server does). One transaction per exchange.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use sessionstore_client::SessionStoreClient;
use sessionstore_client::v1 as pb;
use sqlx::postgres::PgPoolOptions;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{PgPool, SqlitePool};
use tonic::transport::Channel;

use crate::server::{Database, Server};
use crate::stats::{Run, Timing, Worker, run_blocking, run_load};
use crate::workload;

/// Where the writers write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Spread {
    /// Each writer appends to a session of its own.
    Many,
    /// Every writer appends to one session.
    One,
}

impl Spread {
    pub fn label(self) -> &'static str {
        match self {
            Spread::Many => "many sessions",
            Spread::One => "one session",
        }
    }

    /// The session writer `worker` appends to.
    pub fn session(self, worker: usize) -> String {
        match self {
            Spread::Many => format!("bench-writer-{worker}"),
            Spread::One => "bench-shared".to_owned(),
        }
    }
}

/// Creates the sessions the append benchmarks write to and pre-fills each
/// with `prefill` messages, written as the measured exchanges are (a
/// provider call and an idempotency key each), so every table the runs
/// write already holds rows when the caller `ANALYZE`s: statistics taken
/// on an empty table plan its lookups, and the foreign-key checks against
/// it, as scans that grow slower with every row the run adds.
pub async fn prepare(
    server: &Server,
    db: &Database,
    writers: usize,
    prefill: usize,
) -> anyhow::Result<()> {
    let client = server.connect().await?;
    let mut ids: Vec<String> = (0..writers).map(|w| Spread::Many.session(w)).collect();
    ids.push(Spread::One.session(0));
    let mut fills = tokio::task::JoinSet::new();
    for (n, id) in ids.into_iter().enumerate() {
        let mut client = client.clone();
        fills.spawn(async move {
            workload::create_session(&mut client, &id, "bench", 0, 0).await?;
            for i in 0..prefill.div_ceil(2) {
                let seed = seed_base(n) ^ i as u64;
                client
                    .append_exchange(workload::exchange(&id, seed))
                    .await
                    .with_context(|| format!("pre-fill {id}"))?;
            }
            anyhow::Ok(())
        });
    }
    while let Some(filled) = fills.join_next().await {
        filled??;
    }
    if !db.is_postgres() {
        ceiling_search(db).await?;
    }
    Ok(())
}

/// On SQLite the service indexes messages into a search file of its own,
/// on a thread of its own. The raw ceilings index them as a hand-rolled
/// table would, inside the transaction, into this FTS5 table (the
/// service's own definition), pre-filled with what the service indexed.
async fn ceiling_search(db: &Database) -> anyhow::Result<()> {
    use sqlx::Connection as _;
    let mut conn = sqlx::SqliteConnection::connect(&db.url()).await?;
    sqlx::query(
        "CREATE VIRTUAL TABLE IF NOT EXISTS ceiling_search \
         USING fts5 (text, tokenize = 'unicode61 remove_diacritics 2')",
    )
    .execute(&mut conn)
    .await?;
    // A message's content is its protobuf encoding (`wire`) or, as an
    // older server wrote it, its JSON (`body`).
    let rows: Vec<(i64, String, Option<Vec<u8>>)> =
        sqlx::query_as("SELECT (session_key << 32) + sequence, body, wire FROM messages")
            .fetch_all(&mut conn)
            .await?;
    let mut tx = conn.begin().await?;
    for (rowid, body, wire) in rows {
        let text = match wire {
            Some(wire) => <pb::Message as prost::Message>::decode(wire.as_slice())?.content,
            None => serde_json::from_str::<serde_json::Value>(&body)?["content"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
        };
        sqlx::query("INSERT OR REPLACE INTO ceiling_search (rowid, text) VALUES (?1, ?2)")
            .bind(rowid)
            .bind(text)
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await?;
    conn.close().await?;
    Ok(())
}

/// A gRPC client appending exchanges to one session; or, `rejected`,
/// sending each spoiled at its very end (a state change in a malformed
/// scope), so the server decodes, converts and checks all of it and then
/// answers INVALID_ARGUMENT without touching the database.
struct ServiceWriter {
    client: SessionStoreClient<Channel>,
    /// The other replicas' clients, when each append goes to the next
    /// replica in turn ([`Routing::Alternating`]).
    others: Vec<SessionStoreClient<Channel>>,
    session: String,
    seed: u64,
    shape: workload::Shape,
    rejected: bool,
}

impl Worker for ServiceWriter {
    async fn op(&mut self) -> anyhow::Result<()> {
        self.seed += 1;
        let mut request = workload::shaped_exchange(&self.session, self.seed, self.shape);
        if !self.others.is_empty() {
            self.others.push(self.client.clone());
            self.client = self.others.remove(0);
        }
        if !self.rejected {
            self.client
                .append_exchange(request)
                .await
                .context("AppendExchange")?;
            return Ok(());
        }
        request.state_changes.push(pb::StateChange {
            scope: "not a scope".to_owned(),
            key: "k".to_owned(),
            value: "v".to_owned(),
            ..Default::default()
        });
        match self.client.append_exchange(request).await {
            Err(status) if status.code() == tonic::Code::InvalidArgument => Ok(()),
            Err(status) => Err(anyhow::anyhow!("AppendExchange: {status}")),
            Ok(_) => anyhow::bail!("AppendExchange of a malformed scope was accepted"),
        }
    }
}

/// `clients` gRPC clients, each on its own connection, appending for the
/// length of `timing`.
pub async fn service(
    server: &Server,
    clients: usize,
    spread: Spread,
    timing: Timing,
) -> anyhow::Result<Run> {
    service_shaped(server, clients, spread, workload::Shape::Kb1, timing).await
}

/// [`service`], appending exchanges of `shape`.
pub async fn service_shaped(
    server: &Server,
    clients: usize,
    spread: Spread,
    shape: workload::Shape,
    timing: Timing,
) -> anyhow::Result<Run> {
    let servers = [server];
    let load = Load {
        clients,
        spread,
        routing: Routing::Sticky,
        shape,
    };
    service_with(&servers, load, timing).await
}

/// Which replica a client's appends go to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Routing {
    /// Client `i` always to `servers[i % servers.len()]` (a load balancer
    /// that keeps a session on one replica).
    Sticky,
    /// Each append to the next replica in turn (one that spreads requests).
    Alternating,
}

/// The same through several replicas of one database, routed by
/// `routing`; the servers' CPU is summed.
pub async fn service_across(
    servers: &[&Server],
    clients: usize,
    spread: Spread,
    routing: Routing,
    timing: Timing,
) -> anyhow::Result<Run> {
    let load = Load {
        clients,
        spread,
        routing,
        shape: workload::Shape::Kb1,
    };
    service_with(servers, load, timing).await
}

/// Who appends what, where.
struct Load {
    clients: usize,
    spread: Spread,
    routing: Routing,
    shape: workload::Shape,
}

async fn service_with(servers: &[&Server], load: Load, timing: Timing) -> anyhow::Result<Run> {
    let Load {
        clients,
        spread,
        routing,
        shape,
    } = load;
    let first = *servers.first().context("no server to append through")?;
    let mut workers = Vec::with_capacity(clients);
    for worker in 0..clients {
        let mut others = Vec::new();
        if routing == Routing::Alternating {
            for other in 1..servers.len() {
                others.push(servers[(worker + other) % servers.len()].connect().await?);
            }
        }
        workers.push(ServiceWriter {
            others,
            client: servers[worker % servers.len()].connect().await?,
            session: spread.session(worker),
            seed: seed_base(worker),
            shape,
            rejected: false,
        });
    }
    let mut searcher = first.connect().await?;
    let cpu_time =
        || -> anyhow::Result<Duration> { servers.iter().map(|server| server.cpu_time()).sum() };
    // The servers' CPU is read when the measured window opens and again
    // once the search below has waited for the index.
    let cpu_at_window = async {
        tokio::time::sleep(timing.warmup).await;
        cpu_time()
    };
    let (run, cpu_before) = tokio::join!(run_load(workers, timing), cpu_at_window);
    let mut run = run?;
    // On SQLite the service indexes messages for search beside the
    // appends, not in them. A search waits until every acknowledged
    // append is indexed; the time that takes after the run counts as part
    // of it, so a backlog left behind is not counted as done.
    // With `--search off` there is no index to wait for (the search
    // answers SEARCH_DISABLED at once).
    let began = std::time::Instant::now();
    let searched = searcher
        .search_messages(pb::SearchMessagesRequest {
            query: "catchup".to_owned(),
            page_size: 1,
            ..Default::default()
        })
        .await;
    match searched {
        Err(status) if first.search_off && status.code() == tonic::Code::FailedPrecondition => {}
        other => {
            other.context("SearchMessages after the run")?;
        }
    }
    run.window += began.elapsed();
    run.server_cpu = Some(cpu_time()?.saturating_sub(cpu_before?));
    Ok(run)
}

/// The server's floor for an append: `clients` clients (many sessions),
/// each on its own connection, sending exchanges of the same size that
/// the server decodes and checks in full, then rejects. What it costs per
/// call is gRPC, HTTP/2, decoding and the checks: everything an append
/// does but the store.
pub async fn rejected(server: &Server, clients: usize, timing: Timing) -> anyhow::Result<Run> {
    let mut workers = Vec::with_capacity(clients);
    for worker in 0..clients {
        workers.push(ServiceWriter {
            others: Vec::new(),
            client: server.connect().await?,
            session: Spread::Many.session(worker),
            seed: seed_base(worker),
            shape: workload::Shape::Kb1,
            rejected: true,
        });
    }
    let cpu_before = async {
        tokio::time::sleep(timing.warmup).await;
        server.cpu_time()
    };
    let (run, cpu_before) = tokio::join!(run_load(workers, timing), cpu_before);
    let mut run = run?;
    run.server_cpu = Some(server.cpu_time()?.saturating_sub(cpu_before?));
    Ok(run)
}

/// Distinct text per worker and run.
fn seed_base(worker: usize) -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    (worker as u64) << 40 ^ nanos
}

/// Everything one raw exchange writes, made before its transaction.
struct RawExchange {
    call_id: String,
    request_id: String,
    ids: [String; 2],
    texts: [String; 2],
    /// Each message's content as the service stores it (migration 0017).
    contents: [Vec<u8>; 2],
    fingerprint: Vec<u8>,
    now: i64,
}

const TENANT: &str = "default";
const PROMPT_TOKENS: i64 = 350;
const COMPLETION_TOKENS: i64 = 260;
const COST: i64 = 4_950;

impl RawExchange {
    fn new(seed: u64) -> RawExchange {
        let texts = [
            workload::text(seed, workload::MESSAGE_BYTES),
            workload::text(seed ^ 0xA55A, workload::MESSAGE_BYTES),
        ];
        let content = |role: pb::Role, text: &str| {
            prost::Message::encode_to_vec(&pb::Message {
                role: role.into(),
                content: text.to_owned(),
                ..Default::default()
            })
        };
        let contents = [
            content(pb::Role::User, &texts[0]),
            content(pb::Role::Assistant, &texts[1]),
        ];
        RawExchange {
            call_id: format!("call_{}", uuid::Uuid::now_v7().simple()),
            request_id: uuid::Uuid::now_v7().to_string(),
            ids: [
                format!("msg_{}", uuid::Uuid::now_v7().simple()),
                format!("msg_{}", uuid::Uuid::now_v7().simple()),
            ],
            texts,
            contents,
            fingerprint: seed.to_le_bytes().repeat(4),
            now: workload::now_micros(),
        }
    }

    /// The event: the stored exchange, encoded as the service records it
    /// (a `SessionEvent` whose messages' content is in their rows,
    /// migration 0016).
    fn event(&self, session_id: &str, revision: i64, first_sequence: i64) -> Vec<u8> {
        use prost::Message as _;
        let time = workload::timestamp(self.now);
        let message = |i: usize| pb::StoredMessage {
            id: self.ids[i].clone(),
            session_id: session_id.to_owned(),
            sequence: first_sequence + i as i64,
            produced_by_call_id: if i == 1 {
                self.call_id.clone()
            } else {
                String::new()
            },
            message: None,
            create_time: Some(time),
            redacted: false,
        };
        pb::SessionEvent {
            revision,
            time: Some(time),
            event: Some(pb::session_event::Event::ExchangeAppended(
                pb::ExchangeAppended {
                    messages: vec![message(0), message(1)],
                    provider_call: Some(pb::ProviderCall {
                        id: self.call_id.clone(),
                        session_id: session_id.to_owned(),
                        request_id: "gw".into(),
                        provider: "anthropic".into(),
                        model: "claude-sonnet-4-5".into(),
                        prompt_tokens: PROMPT_TOKENS,
                        completion_tokens: COMPLETION_TOKENS,
                        total_tokens: PROMPT_TOKENS + COMPLETION_TOKENS,
                        cost_micros_usd: COST,
                        create_time: Some(time),
                        ..Default::default()
                    }),
                    next_sequence: first_sequence + 2,
                    ..Default::default()
                },
            )),
        }
        .encode_to_vec()
    }
}

const INSERT_CALL: &str = "INSERT INTO provider_calls (id, session_key, request_id, provider, \
     model, requested_provider, requested_model, prompt_tokens, completion_tokens, total_tokens, \
     cost_micros_usd, create_time) VALUES ($1, $2, 'gw', 'anthropic', 'claude-sonnet-4-5', '', '', \
     $3, $4, $5, $6, $7)";
const INSERT_MESSAGES: &str = "INSERT INTO messages (session_key, sequence, id, \
     produced_by_call_id, body, wire, create_time, redacted, referenced_by) VALUES \
     ($1, $2, $3, NULL, '', $4, $5, 0, $6), ($1, $7, $8, $9, '', $10, $5, 0, $6)";
const UPDATE_SESSION: &str = "UPDATE sessions SET revision = $1, next_sequence = $2, \
     message_count = message_count + 2, update_time = $3, \
     provider_call_count = provider_call_count + 1, last_model = 'claude-sonnet-4-5', \
     last_provider = 'anthropic', last_cost_micros_usd = $4, last_request_id = 'gw', \
     total_tokens = total_tokens + $5, total_cost_micros_usd = total_cost_micros_usd + $4 \
     WHERE key = $6";
const INSERT_EVENT: &str = "INSERT INTO events (session_key, revision, time, body, wire, \
     refers_from, refers_until, request_id) VALUES ($1, $2, $3, '', $4, $5, $6, $7)";
const INSERT_KEY: &str = "INSERT INTO idempotency_keys (tenant, request_id, session_key, \
     fingerprint, revision, found_through_event) VALUES ($1, $2, $3, $4, $5, 1)";

/// SQLite's full-text row id of a message (as the service numbers them).
fn search_rowid(session_key: i64, sequence: i64) -> i64 {
    (session_key << 32) + sequence
}

/// Which database a raw transaction writes to.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Engine {
    Sqlite,
    Postgres,
}

/// Reads the session row; PostgreSQL also locks it, as the service does.
fn select_session(engine: Engine) -> &'static str {
    match engine {
        Engine::Sqlite => {
            "SELECT key, revision, next_sequence FROM sessions \
             WHERE tenant = $1 AND id = $2 AND deleted = 0"
        }
        Engine::Postgres => {
            "SELECT key, revision, next_sequence FROM sessions \
             WHERE tenant = $1 AND id = $2 AND deleted = 0 FOR UPDATE"
        }
    }
}

/// A value bound into a raw statement.
enum Arg {
    Int(i64),
    Text(String),
    Bytes(Vec<u8>),
}

impl rusqlite::ToSql for Arg {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        use rusqlite::types::ToSqlOutput;
        Ok(match self {
            Arg::Int(v) => ToSqlOutput::from(*v),
            Arg::Text(v) => ToSqlOutput::from(v.as_str()),
            Arg::Bytes(v) => ToSqlOutput::from(v.as_slice()),
        })
    }
}

/// Binds one [`Arg`] to a sqlx query, whichever the database.
fn bind<'q, DB>(
    query: sqlx::query::Query<'q, DB, <DB as sqlx::Database>::Arguments<'q>>,
    arg: Arg,
) -> sqlx::query::Query<'q, DB, <DB as sqlx::Database>::Arguments<'q>>
where
    DB: sqlx::Database,
    i64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    String: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    Vec<u8>: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
{
    match arg {
        Arg::Int(v) => query.bind(v),
        Arg::Text(v) => query.bind(v),
        Arg::Bytes(v) => query.bind(v),
    }
}

impl RawExchange {
    /// Every statement the transaction runs after reading the session row
    /// (`key`, `revision`, `next` sequence), with its arguments, in order.
    /// The one list all three raw clients execute.
    fn writes(
        &self,
        engine: Engine,
        session: &str,
        (key, revision, next): (i64, i64, i64),
    ) -> Vec<(&'static str, Vec<Arg>)> {
        use Arg::{Bytes, Int, Text};
        let search = match engine {
            Engine::Sqlite => (
                "INSERT INTO ceiling_search (rowid, text) VALUES ($1, $2), ($3, $4)",
                vec![
                    Int(search_rowid(key, next)),
                    Text(self.texts[0].clone()),
                    Int(search_rowid(key, next + 1)),
                    Text(self.texts[1].clone()),
                ],
            ),
            Engine::Postgres => (
                "INSERT INTO message_search (session_key, sequence, words) \
                 VALUES ($1, $2, to_tsvector('simple', $3)), ($1, $4, to_tsvector('simple', $5))",
                vec![
                    Int(key),
                    Int(next),
                    Text(self.texts[0].clone()),
                    Int(next + 1),
                    Text(self.texts[1].clone()),
                ],
            ),
        };
        vec![
            (
                INSERT_CALL,
                vec![
                    Text(self.call_id.clone()),
                    Int(key),
                    Int(PROMPT_TOKENS),
                    Int(COMPLETION_TOKENS),
                    Int(PROMPT_TOKENS + COMPLETION_TOKENS),
                    Int(COST),
                    Int(self.now),
                ],
            ),
            (
                INSERT_MESSAGES,
                vec![
                    Int(key),
                    Int(next),
                    Text(self.ids[0].clone()),
                    Bytes(self.contents[0].clone()),
                    Int(self.now),
                    // SQLite numbers `$N` in the order of first appearance.
                    Int(revision + 1),
                    Int(next + 1),
                    Text(self.ids[1].clone()),
                    Text(self.call_id.clone()),
                    Bytes(self.contents[1].clone()),
                ],
            ),
            search,
            (
                UPDATE_SESSION,
                vec![
                    Int(revision + 1),
                    Int(next + 2),
                    Int(self.now),
                    Int(COST),
                    Int(PROMPT_TOKENS + COMPLETION_TOKENS),
                    Int(key),
                ],
            ),
            (
                INSERT_EVENT,
                vec![
                    Int(key),
                    Int(revision + 1),
                    Int(self.now),
                    Bytes(self.event(session, revision + 1, next)),
                    Int(next),
                    Int(next + 2),
                    Text(self.request_id.clone()),
                ],
            ),
            (
                INSERT_KEY,
                vec![
                    Text(TENANT.to_owned()),
                    Text(self.request_id.clone()),
                    Int(key),
                    Bytes(self.fingerprint.clone()),
                    Int(revision + 1),
                ],
            ),
        ]
    }
}

/// The raw transaction through sqlx on SQLite. (`BEGIN IMMEDIATE` by hand:
/// sqlx's `begin()` is a deferred `BEGIN`, which would let two callers read
/// the same session row before either writes.)
async fn sqlx_sqlite_append(pool: &SqlitePool, session: &str, seed: u64) -> anyhow::Result<()> {
    let mut conn = pool.acquire().await?;
    sqlx::query("BEGIN IMMEDIATE").execute(&mut *conn).await?;
    sqlx_statements::<sqlx::Sqlite>(&mut conn, Engine::Sqlite, session, seed).await?;
    sqlx::query("COMMIT").execute(&mut *conn).await?;
    Ok(())
}

/// The raw transaction through sqlx on PostgreSQL. Its commit hint, which
/// every replica listens for, goes in the COMMIT's round trip, after it, as
/// the server sends it.
async fn sqlx_postgres_append(pool: &PgPool, session: &str, seed: u64) -> anyhow::Result<()> {
    use sqlx::Executor as _;
    let mut conn = pool.acquire().await?;
    conn.execute("BEGIN").await?;
    let written =
        sqlx_statements::<sqlx::Postgres>(&mut conn, Engine::Postgres, session, seed).await;
    let (key, revision) = match written {
        Ok(written) => written,
        Err(error) => {
            conn.execute("ROLLBACK").await?;
            return Err(error);
        }
    };
    conn.execute(
        format!("COMMIT; SELECT pg_notify('sessionstore_commits', '{key}:{revision}')").as_str(),
    )
    .await?;
    Ok(())
}

/// The raw transaction's statements, inside the caller's transaction: the
/// session read, then [`RawExchange::writes`]. Returns the session's key
/// and its new revision.
async fn sqlx_statements<DB: sqlx::Database>(
    conn: &mut DB::Connection,
    engine: Engine,
    session: &str,
    seed: u64,
) -> anyhow::Result<(i64, i64)>
where
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
    for<'q> &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'q> i64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'q> String: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'q> Vec<u8>: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    (i64, i64, i64): for<'r> sqlx::FromRow<'r, DB::Row>,
{
    let x = RawExchange::new(seed);
    let row: (i64, i64, i64) = sqlx::query_as(select_session(engine))
        .bind(TENANT)
        .bind(session)
        .fetch_one(&mut *conn)
        .await?;
    for (sql, args) in x.writes(engine, session, row) {
        let query = args.into_iter().fold(sqlx::query(sql), bind);
        query.execute(&mut *conn).await?;
    }
    Ok((row.0, row.1 + 1))
}

/// The raw transaction through the SQLite engine itself (rusqlite), with
/// cached prepared statements. (SQLite reads `$N` as numbered parameters.)
fn rusqlite_append(
    conn: &mut rusqlite::Connection,
    session: &str,
    seed: u64,
) -> anyhow::Result<()> {
    let x = RawExchange::new(seed);
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    let row = tx
        .prepare_cached(select_session(Engine::Sqlite))?
        .query_row((TENANT, session), |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
    for (sql, args) in x.writes(Engine::Sqlite, session, row) {
        tx.prepare_cached(sql)?
            .execute(rusqlite::params_from_iter(args))?;
    }
    tx.commit()?;
    Ok(())
}

/// sqlx's SQLite pool, configured as the service configures SQLite (WAL,
/// `synchronous = FULL`, foreign keys, a 32 MiB page cache), with one connection: SQLite has one
/// writer at a time, so the raw ceiling is a single writer that
/// concurrent callers queue for.
async fn sqlite_pool(db: &Database) -> anyhow::Result<SqlitePool> {
    let options = db
        .url()
        .parse::<SqliteConnectOptions>()?
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Full)
        .foreign_keys(true)
        .pragma("cache_size", "-32768")
        .busy_timeout(Duration::from_secs(10));
    Ok(SqlitePoolOptions::new()
        .max_connections(1)
        .connect_with(options)
        .await?)
}

fn rusqlite_connection(db: &Database) -> anyhow::Result<rusqlite::Connection> {
    let path = db.url().trim_start_matches("sqlite://").to_owned();
    let conn = rusqlite::Connection::open(path)?;
    conn.busy_timeout(Duration::from_secs(10))?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "FULL")?;
    conn.pragma_update(None, "foreign_keys", "ON")?;
    conn.pragma_update(None, "cache_size", -32768)?;
    conn.set_prepared_statement_cache_capacity(32);
    Ok(conn)
}

/// One caller of the raw transaction through sqlx, on either engine.
struct SqlxWriter<DB: sqlx::Database> {
    pool: sqlx::Pool<DB>,
    session: String,
    seed: u64,
}

impl Worker for SqlxWriter<sqlx::Sqlite> {
    async fn op(&mut self) -> anyhow::Result<()> {
        self.seed += 1;
        sqlx_sqlite_append(&self.pool, &self.session, self.seed).await
    }
}

impl Worker for SqlxWriter<sqlx::Postgres> {
    async fn op(&mut self) -> anyhow::Result<()> {
        self.seed += 1;
        sqlx_postgres_append(&self.pool, &self.session, self.seed).await
    }
}

/// The raw transaction through sqlx at `clients` concurrent callers.
pub async fn raw_sqlx(
    db: &Database,
    clients: usize,
    spread: Spread,
    timing: Timing,
) -> anyhow::Result<Run> {
    if db.is_postgres() {
        let pool = PgPoolOptions::new()
            .max_connections(u32::try_from(clients)?)
            .min_connections(u32::try_from(clients)?)
            .connect(&db.url())
            .await?;
        run_sqlx(pool, clients, spread, timing).await
    } else {
        run_sqlx(sqlite_pool(db).await?, clients, spread, timing).await
    }
}

/// Runs `clients` sqlx writers on `pool`, then closes it.
async fn run_sqlx<DB: sqlx::Database>(
    pool: sqlx::Pool<DB>,
    clients: usize,
    spread: Spread,
    timing: Timing,
) -> anyhow::Result<Run>
where
    SqlxWriter<DB>: Worker,
{
    let workers = (0..clients)
        .map(|worker| SqlxWriter {
            pool: pool.clone(),
            session: spread.session(worker),
            seed: seed_base(worker),
        })
        .collect();
    let run = run_load(workers, timing).await;
    pool.close().await;
    run
}

/// The raw transaction through the SQLite engine: one writer connection
/// that `clients` threads take turns on.
pub async fn raw_engine(
    db: &Database,
    clients: usize,
    spread: Spread,
    timing: Timing,
) -> anyhow::Result<Run> {
    let conn = Arc::new(Mutex::new(rusqlite_connection(db)?));
    let workers = (0..clients)
        .map(|worker| {
            let conn = Arc::clone(&conn);
            let session = spread.session(worker);
            let mut seed = seed_base(worker);
            move || {
                seed += 1;
                let mut conn = conn
                    .lock()
                    .map_err(|_| anyhow::anyhow!("a writer thread panicked"))?;
                rusqlite_append(&mut conn, &session, seed)
            }
        })
        .collect();
    run_blocking(workers, timing).await
}
