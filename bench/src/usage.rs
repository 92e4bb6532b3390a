//! What a billing page asks: SummarizeUsage over a tenant holding a quarter
//! of provider calls, for one user's month (by day, by model) and for the
//! whole tenant's month (by model).
//!
//! The calls are written straight into the database with multi-row
//! INSERTs (through the API the fill would take hours), on a database the
//! real server has migrated, and read back through the client crate.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use sessionstore_client::v1 as pb;
use sessionstore_client::{Client, RetryPolicy};
use sqlx::Connection as _;

use crate::server::{Database, Server};

/// The tenant a server without tokens acts for.
pub const TENANT: &str = "default";

/// Microseconds in a day.
const DAY_MICROS: i64 = 86_400 * 1_000_000;

/// 2026-01-01T00:00:00Z, the day the calls start, counted from 1970-01-01.
const FIRST_DAY: i64 = 20_454;

/// The month measured: January 2026, `[FIRST_DAY, FIRST_DAY + 31)`.
pub const MONTH_DAYS: i64 = 31;

/// Rows per INSERT statement, and statements per transaction.
const ROWS_PER_INSERT: usize = 1000;
const INSERTS_PER_TRANSACTION: usize = 20;

/// The models calls are made to: provider, model, share of the calls in
/// percent, and price per million input and output tokens in micro-dollars.
const MODELS: [(&str, &str, u64, i64, i64); 4] = [
    ("anthropic", "claude-sonnet-4-5", 40, 3_000_000, 15_000_000),
    ("openai", "gpt-4o", 25, 2_500_000, 10_000_000),
    ("openai", "o4-mini", 20, 1_100_000, 4_400_000),
    ("anthropic", "claude-haiku-4-5", 15, 1_000_000, 5_000_000),
];

/// How much there is.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    pub users: usize,
    pub sessions: usize,
    pub calls_per_session: usize,
    /// Days the sessions' start times are spread over, from 2026-01-01.
    pub days: i64,
}

impl Shape {
    pub fn calls(&self) -> usize {
        self.sessions * self.calls_per_session
    }
}

/// The name of user `n`.
pub fn user_name(n: usize) -> String {
    format!("user-{n:05}")
}

/// What each measured request is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Query {
    /// One user's month by UTC day.
    UserByDay,
    /// One user's month by model.
    UserByModel,
    /// The whole tenant's month by model.
    TenantByModel,
}

impl Query {
    pub fn label(self) -> &'static str {
        match self {
            Query::UserByDay => "one user's month, USAGE_GROUP_BY_DAY",
            Query::UserByModel => "one user's month, USAGE_GROUP_BY_MODEL",
            Query::TenantByModel => "the whole tenant's month, USAGE_GROUP_BY_MODEL",
        }
    }
}

/// The sums of one group, as SummarizeUsage answers them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Sums {
    calls: i64,
    prompt_tokens: i64,
    completion_tokens: i64,
    cached_input_tokens: i64,
    cache_creation_input_tokens: i64,
    reasoning_tokens: i64,
    total_tokens: i64,
    cost_micros_usd: i64,
}

impl Sums {
    fn add(&mut self, call: &Call) {
        self.calls += 1;
        self.prompt_tokens += call.prompt;
        self.completion_tokens += call.completion;
        self.cached_input_tokens += call.cached;
        self.cache_creation_input_tokens += call.creation;
        self.reasoning_tokens += call.reasoning;
        self.total_tokens += call.prompt + call.completion;
        self.cost_micros_usd += call.cost();
    }

    fn merge(&mut self, other: &Sums) {
        self.calls += other.calls;
        self.prompt_tokens += other.prompt_tokens;
        self.completion_tokens += other.completion_tokens;
        self.cached_input_tokens += other.cached_input_tokens;
        self.cache_creation_input_tokens += other.cache_creation_input_tokens;
        self.reasoning_tokens += other.reasoning_tokens;
        self.total_tokens += other.total_tokens;
        self.cost_micros_usd += other.cost_micros_usd;
    }

    fn of(row: &pb::UsageRow) -> Sums {
        Sums {
            calls: row.calls,
            prompt_tokens: row.prompt_tokens,
            completion_tokens: row.completion_tokens,
            cached_input_tokens: row.cached_input_tokens,
            cache_creation_input_tokens: row.cache_creation_input_tokens,
            reasoning_tokens: row.reasoning_tokens,
            total_tokens: row.total_tokens,
            cost_micros_usd: row.cost_micros_usd,
        }
    }
}

/// What the fill wrote, summed by user, UTC day and model, to check every
/// answer against.
pub struct Written {
    sums: BTreeMap<(usize, i64, usize), Sums>,
    pub calls: usize,
    /// Calls in the measured month, of the whole tenant.
    pub month_calls: i64,
}

impl Written {
    /// The rows SummarizeUsage must answer for `query` (`user` for the
    /// user's queries), keyed and ordered as it orders them.
    fn expected(&self, query: Query, user: usize) -> Vec<(String, Sums)> {
        let mut rows: BTreeMap<String, Sums> = BTreeMap::new();
        let month = FIRST_DAY..FIRST_DAY + MONTH_DAYS;
        let users = match query {
            Query::TenantByModel => 0..usize::MAX,
            Query::UserByDay | Query::UserByModel => user..user + 1,
        };
        let range = (users.start, i64::MIN, 0)..(users.end, i64::MIN, 0);
        for (&(_, day, model), sums) in self.sums.range(range) {
            if !month.contains(&day) {
                continue;
            }
            let key = match query {
                Query::UserByDay => date_of_day(day),
                Query::UserByModel | Query::TenantByModel => {
                    format!("{}/{}", MODELS[model].0, MODELS[model].1)
                }
            };
            rows.entry(key).or_default().merge(sums);
        }
        rows.into_iter().collect()
    }
}

/// One provider call, before it is written.
struct Call {
    time: i64,
    session: usize,
    model: usize,
    /// All input tokens; `cached` and `creation` are parts of it.
    prompt: i64,
    cached: i64,
    creation: i64,
    /// All output tokens; `reasoning` is a part of it.
    completion: i64,
    reasoning: i64,
    duration_micros: i64,
}

impl Call {
    /// Cached input at a tenth of the input price, cache writes at 1.25×.
    fn cost(&self) -> i64 {
        let (_, _, _, input, output) = MODELS[self.model];
        let plain = self.prompt - self.cached - self.creation;
        (plain * input
            + self.cached * input / 10
            + self.creation * input * 5 / 4
            + self.completion * output)
            / 1_000_000
    }

    /// The provider's usage object, as the client's helpers keep it.
    fn usage_json(&self) -> String {
        if MODELS[self.model].0 == "anthropic" {
            format!(
                "{{\"input_tokens\":{},\"cache_read_input_tokens\":{},\
                 \"cache_creation_input_tokens\":{},\"output_tokens\":{}}}",
                self.prompt - self.cached - self.creation,
                self.cached,
                self.creation,
                self.completion
            )
        } else {
            format!(
                "{{\"prompt_tokens\":{},\"completion_tokens\":{},\"total_tokens\":{},\
                 \"prompt_tokens_details\":{{\"cached_tokens\":{},\"cache_write_tokens\":{}}},\
                 \"completion_tokens_details\":{{\"reasoning_tokens\":{}}}}}",
                self.prompt,
                self.completion,
                self.prompt + self.completion,
                self.cached,
                self.creation,
                self.reasoning
            )
        }
    }
}

/// A session, before it is written.
struct SessionRow {
    key: i64,
    id: String,
    user: usize,
    create_time: i64,
}

/// splitmix64: deterministic, so every run writes the same calls.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[low, high)`.
    fn between(&mut self, low: i64, high: i64) -> i64 {
        low + (self.next() % (high - low) as u64) as i64
    }
}

/// One connection of the bench's own to the database.
pub enum Conn {
    Sqlite(sqlx::SqliteConnection),
    Postgres(sqlx::PgConnection),
}

impl Conn {
    pub async fn open(db: &Database) -> anyhow::Result<Conn> {
        let url = db.url();
        Ok(if db.is_postgres() {
            Conn::Postgres(sqlx::PgConnection::connect(&url).await?)
        } else {
            let mut conn = sqlx::SqliteConnection::connect(&url).await?;
            // A fill that is lost in a crash is run again.
            sqlx::raw_sql("PRAGMA synchronous = OFF; PRAGMA foreign_keys = ON")
                .execute(&mut conn)
                .await?;
            Conn::Sqlite(conn)
        })
    }

    pub async fn execute(&mut self, sql: &str) -> anyhow::Result<()> {
        match self {
            Conn::Sqlite(conn) => {
                sqlx::raw_sql(sql).execute(conn).await?;
            }
            Conn::Postgres(conn) => {
                sqlx::raw_sql(sql).execute(conn).await?;
            }
        }
        Ok(())
    }
}

/// Writes `statements` (each a multi-row INSERT) in transactions of
/// [`INSERTS_PER_TRANSACTION`].
async fn write_all(conn: &mut Conn, statements: Vec<String>) -> anyhow::Result<()> {
    for chunk in statements.chunks(INSERTS_PER_TRANSACTION) {
        conn.execute("BEGIN").await?;
        for statement in chunk {
            conn.execute(statement).await?;
        }
        conn.execute("COMMIT").await?;
    }
    Ok(())
}

/// Applies the server's migrations to `db` (`sessionstore migrate`).
pub async fn migrate(binary: &std::path::Path, db: &Database) -> anyhow::Result<()> {
    let status = tokio::process::Command::new(binary)
        .args(["migrate", "--database-url", &db.url()])
        .env("SESSIONSTORE_LOG", "warn")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .status()
        .await
        .with_context(|| format!("run {} migrate", binary.display()))?;
    anyhow::ensure!(status.success(), "sessionstore migrate failed: {status}");
    Ok(())
}

/// Fills a migrated, empty `db` with `shape`'s sessions and provider calls
/// of tenant [`TENANT`]: sessions as the server writes them after their
/// calls were appended (counters, last call, times), calls with every
/// bucket, the usage object and the call's tenant and owner, written in
/// the order of their times (as a server records them). Answers what was
/// written.
pub async fn fill(db: &Database, shape: &Shape) -> anyhow::Result<Written> {
    let mut rng = Rng(0x05EE_D0F0_5A6E);
    let span = shape.days * DAY_MICROS;
    let first = FIRST_DAY * DAY_MICROS;
    let mut sessions = Vec::with_capacity(shape.sessions);
    let mut calls = Vec::with_capacity(shape.calls());
    for n in 0..shape.sessions {
        let user = n % shape.users;
        // The last call of a session ends within a day of its start.
        let start = first + rng.between(0, span - DAY_MICROS);
        let mut time = start;
        for _ in 0..shape.calls_per_session {
            time += rng.between(5_000_000, 600_000_000);
            let pick = rng.next() % 100;
            let mut model = 0;
            let mut below = MODELS[0].2;
            while pick >= below {
                model += 1;
                below += MODELS[model].2;
            }
            let prompt = rng.between(200, 20_000);
            let cached = if rng.next().is_multiple_of(2) {
                rng.between(0, prompt / 2)
            } else {
                0
            };
            let creation = if rng.next().is_multiple_of(8) {
                rng.between(0, (prompt - cached) / 2)
            } else {
                0
            };
            let completion = rng.between(20, 2_000);
            let reasoning = if MODELS[model].1 == "o4-mini" {
                rng.between(0, completion)
            } else {
                0
            };
            calls.push(Call {
                time,
                session: n,
                model,
                prompt,
                cached,
                creation,
                completion,
                reasoning,
                duration_micros: rng.between(300_000, 30_000_000),
            });
        }
        sessions.push(SessionRow {
            key: 0,
            id: format!("ses_{}", uuid::Uuid::now_v7().simple()),
            user,
            create_time: start,
        });
    }
    // Keys in the order the sessions were created, calls in the order they
    // were made.
    let mut order: Vec<usize> = (0..sessions.len()).collect();
    order.sort_by_key(|&n| sessions[n].create_time);
    for (rank, &n) in order.iter().enumerate() {
        sessions[n].key = rank as i64 + 1;
    }
    calls.sort_by_key(|call| call.time);

    let mut written = Written {
        sums: BTreeMap::new(),
        calls: calls.len(),
        month_calls: 0,
    };
    // Each session's counters and last call, as AppendExchange keeps them.
    let mut last: Vec<Option<usize>> = vec![None; sessions.len()];
    let mut totals = vec![(0i64, 0i64, 0i64); sessions.len()];
    for (i, call) in calls.iter().enumerate() {
        let session = &sessions[call.session];
        let day = call.time.div_euclid(DAY_MICROS);
        written
            .sums
            .entry((session.user, day, call.model))
            .or_default()
            .add(call);
        if (FIRST_DAY..FIRST_DAY + MONTH_DAYS).contains(&day) {
            written.month_calls += 1;
        }
        last[call.session] = Some(i);
        let total = &mut totals[call.session];
        total.0 += 1;
        total.1 += call.prompt + call.completion;
        total.2 += call.cost();
    }

    let mut conn = Conn::open(db).await?;
    let postgres = db.is_postgres();
    let mut statements = Vec::new();
    for chunk in order.chunks(ROWS_PER_INSERT) {
        let mut sql = String::from(
            "INSERT INTO sessions (key, tenant, id, title, system_prompt, user_name, metadata, \
             revision, next_sequence, message_count, provider_call_count, last_model, \
             last_provider, last_cost_micros_usd, last_request_id, total_tokens, \
             total_cost_micros_usd, create_time, update_time) ",
        );
        if postgres {
            sql.push_str("OVERRIDING SYSTEM VALUE ");
        }
        sql.push_str("VALUES ");
        for (i, &n) in chunk.iter().enumerate() {
            let session = &sessions[n];
            let (count, tokens, cost) = totals[n];
            let (model, last_cost, request_id, update_time) = match last[n] {
                Some(c) => (
                    calls[c].model,
                    calls[c].cost(),
                    format!("gw-{c}"),
                    calls[c].time,
                ),
                None => (0, 0, String::new(), session.create_time),
            };
            let (provider, model) = if count > 0 {
                (MODELS[model].0, MODELS[model].1)
            } else {
                ("", "")
            };
            if i > 0 {
                sql.push(',');
            }
            // Created through the API and then appended to: revision 1,
            // plus one per exchange.
            sql.push_str(&format!(
                "({}, '{TENANT}', '{}', 'usage bench {n}', '', '{}', '{{}}', {}, 0, 0, {count}, \
                 '{model}', '{provider}', {last_cost}, '{request_id}', {tokens}, {cost}, {}, {})",
                session.key,
                session.id,
                user_name(session.user),
                1 + count,
                session.create_time,
                update_time,
            ));
        }
        statements.push(sql);
    }
    if postgres {
        statements.push(
            "SELECT setval(pg_get_serial_sequence('sessions', 'key'), \
             (SELECT max(key) FROM sessions))"
                .to_owned(),
        );
    }
    write_all(&mut conn, statements).await?;

    let mut written_calls = 0;
    let started = Instant::now();
    for (batch, chunk) in calls
        .chunks(ROWS_PER_INSERT * INSERTS_PER_TRANSACTION)
        .enumerate()
    {
        let mut statements = Vec::new();
        for (part, rows) in chunk.chunks(ROWS_PER_INSERT).enumerate() {
            let mut sql = String::from(
                "INSERT INTO provider_calls (tenant, user_name, id, session_key, request_id, \
                 provider, model, requested_provider, requested_model, prompt_tokens, \
                 completion_tokens, total_tokens, cost_micros_usd, create_time, \
                 cached_input_tokens, cache_creation_input_tokens, reasoning_tokens, usage_json, \
                 duration_micros) VALUES ",
            );
            for (i, call) in rows.iter().enumerate() {
                let session = &sessions[call.session];
                let (provider, model, _, _, _) = MODELS[call.model];
                let index = (batch * INSERTS_PER_TRANSACTION + part) * ROWS_PER_INSERT + i;
                if i > 0 {
                    sql.push(',');
                }
                sql.push_str(&format!(
                    "('{TENANT}', '{}', 'call_{}', {}, 'gw-{index}', '{provider}', '{model}', \
                     '{provider}', '{model}', {}, {}, {}, {}, {}, {}, {}, {}, '{}', {})",
                    user_name(session.user),
                    uuid::Uuid::now_v7().simple(),
                    session.key,
                    call.prompt,
                    call.completion,
                    call.prompt + call.completion,
                    call.cost(),
                    call.time,
                    call.cached,
                    call.creation,
                    call.reasoning,
                    call.usage_json(),
                    call.duration_micros,
                ));
            }
            statements.push(sql);
        }
        write_all(&mut conn, statements).await?;
        let before = written_calls;
        written_calls += chunk.len();
        if written_calls / 100_000 > before / 100_000 {
            eprintln!(
                "   {written_calls} calls written ({:.0} s)",
                started.elapsed().as_secs_f64()
            );
        }
    }
    Ok(written)
}

/// `samples` sequential SummarizeUsage calls of `query` for January 2026
/// (users taken in turn for the user's queries), after a tenth as many
/// unmeasured calls. Every answer is checked against what was written,
/// row by row; only the call itself is timed.
pub async fn summaries(
    server: &Server,
    written: &Written,
    shape: &Shape,
    query: Query,
    samples: usize,
) -> anyhow::Result<Vec<Duration>> {
    let client = Client::builder(server.endpoint())
        .retry_policy(RetryPolicy::never())
        .connect()
        .await
        .context("connect the client")?;
    let month_start = FIRST_DAY * 86_400;
    let month_end = (FIRST_DAY + MONTH_DAYS) * 86_400;
    let timestamp = |seconds: i64| prost_types::Timestamp { seconds, nanos: 0 };
    let warmup = (samples / 10).max(1);
    let mut took = Vec::with_capacity(samples);
    for i in 0..warmup + samples {
        // Users spread over the whole range, a different one each call.
        let user = (i * 337) % shape.users;
        let request = pb::SummarizeUsageRequest {
            user: match query {
                Query::TenantByModel => String::new(),
                _ => user_name(user),
            },
            start_time: Some(timestamp(month_start)),
            end_time: Some(timestamp(month_end)),
            group_by: match query {
                Query::UserByDay => pb::UsageGroupBy::Day,
                Query::UserByModel | Query::TenantByModel => pb::UsageGroupBy::Model,
            }
            .into(),
            page_size: 100,
            ..Default::default()
        };
        let started = Instant::now();
        let answer = client
            .summarize_usage(request)
            .await
            .with_context(|| format!("SummarizeUsage, {}", query.label()))?;
        let elapsed = started.elapsed();
        let expected = written.expected(query, user);
        anyhow::ensure!(
            answer.next_page_token.is_empty(),
            "{}: the answer did not fit one page",
            query.label()
        );
        let got: Vec<(String, Sums)> = answer
            .rows
            .iter()
            .map(|row| (row.key.clone(), Sums::of(row)))
            .collect();
        anyhow::ensure!(
            got == expected,
            "{} (user {}): SummarizeUsage answered {got:?}, the fill wrote {expected:?}",
            query.label(),
            user_name(user)
        );
        if i >= warmup {
            took.push(elapsed);
        }
    }
    Ok(took)
}

/// `YYYY-MM-DD` of a day counted from 1970-01-01.
fn date_of_day(day: i64) -> String {
    let z = day + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_month_is_january_2026() {
        assert_eq!(date_of_day(FIRST_DAY), "2026-01-01");
        assert_eq!(date_of_day(FIRST_DAY + MONTH_DAYS - 1), "2026-01-31");
        assert_eq!(date_of_day(FIRST_DAY + MONTH_DAYS), "2026-02-01");
    }

    #[test]
    fn model_shares_add_up_to_all_calls() {
        assert_eq!(MODELS.iter().map(|m| m.2).sum::<u64>(), 100);
    }
}
