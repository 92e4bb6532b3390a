//! Migrations on a database an older server wrote: a database made by the
//! schema up to an older migration (applied by sqlx's own migrator, so
//! `_sqlx_migrations` holds what sqlx writes), filled with fixed SQL shaped
//! like that server's rows, then opened by the real binary, which migrates
//! it to the newest schema; everything is read back through gRPC and
//! compared exactly.
//!
//! [`old_schema_database`] takes the last migration to apply, so the next
//! migration's test is a fixture of the rows the server before it wrote
//! and the readings that must survive it.

use std::path::PathBuf;
use std::pin::Pin;

use sessionstore_client::SessionStoreClient;
use sessionstore_client::v1 as pb;
use sessionstore_client::v1::session_event::Event;
use sqlx::Connection as _;
use sqlx::migrate::{Migration, MigrationSource, Migrator};
use tonic::Code;
use tonic::transport::Channel;

use crate::support::{
    PgDatabase, ServerProcess, all_messages, next_change, postgres_available, sessionstore_binary,
    watch,
};

type Client = SessionStoreClient<Channel>;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_file_written_by_0005_reads_back_after_migrating() {
    migrates_what_0005_wrote(Dialect::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_written_by_0005_reads_back_after_migrating() {
    if postgres_available("migrations::postgres_written_by_0005_reads_back_after_migrating").await {
        migrates_what_0005_wrote(Dialect::Postgres).await;
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dialect {
    Sqlite,
    Postgres,
}

impl Dialect {
    fn migrations(self) -> PathBuf {
        let name = match self {
            Dialect::Sqlite => "sqlite",
            Dialect::Postgres => "postgres",
        };
        PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../migrations")).join(name)
    }
}

/// The migrations of `dialect` as the repository holds them now, read as
/// sqlx reads them (the server embeds the same files).
async fn migrations_on_disk(dialect: Dialect) -> Vec<Migration> {
    let all = Migrator::new(dialect.migrations())
        .await
        .expect("read the migrations");
    all.iter().cloned().collect()
}

/// A chosen list of migrations, as a source for sqlx's [`Migrator`].
#[derive(Debug)]
struct Chosen(Vec<Migration>);

impl MigrationSource<'static> for Chosen {
    fn resolve(
        self,
    ) -> Pin<
        Box<
            dyn Future<Output = Result<Vec<Migration>, Box<dyn std::error::Error + Send + Sync>>>
                + Send,
        >,
    > {
        Box::pin(async move { Ok(self.0) })
    }
}

/// A database whose schema is the migrations up to `up_to` and no further:
/// a SQLite file in a temporary directory, or a PostgreSQL database of the
/// test's own. Dropped with it.
pub struct OldDatabase {
    pub dialect: Dialect,
    pub url: String,
    _dir: Option<tempfile::TempDir>,
    _pg: Option<PgDatabase>,
}

/// Creates an empty database of `dialect` and applies migrations
/// `1..=up_to` with sqlx's migrator, as a server of that time did at start.
pub async fn old_schema_database(dialect: Dialect, up_to: i64) -> OldDatabase {
    let chosen: Vec<Migration> = migrations_on_disk(dialect)
        .await
        .into_iter()
        .filter(|m| m.version <= up_to)
        .collect();
    let versions: Vec<i64> = chosen.iter().map(|m| m.version).collect();
    assert_eq!(
        versions,
        (1..=up_to).collect::<Vec<_>>(),
        "migrations 1..={up_to} of {dialect:?}"
    );
    let migrator = Migrator::new(Chosen(chosen))
        .await
        .expect("a migrator of the chosen migrations");
    let db = match dialect {
        Dialect::Sqlite => {
            let dir = tempfile::tempdir().expect("tempdir");
            OldDatabase {
                dialect,
                url: format!("sqlite://{}/old.db", dir.path().display()),
                _dir: Some(dir),
                _pg: None,
            }
        }
        Dialect::Postgres => {
            let pg = PgDatabase::create().await;
            OldDatabase {
                dialect,
                url: pg.url.clone(),
                _dir: None,
                _pg: Some(pg),
            }
        }
    };
    match dialect {
        Dialect::Sqlite => {
            let options: sqlx::sqlite::SqliteConnectOptions = db.url.parse().expect("a SQLite URL");
            let mut conn = sqlx::SqliteConnection::connect_with(&options.create_if_missing(true))
                .await
                .expect("open the SQLite file");
            migrator
                .run_direct(&mut conn)
                .await
                .expect("apply the old migrations");
            conn.close().await.expect("close");
        }
        Dialect::Postgres => {
            let mut conn = sqlx::PgConnection::connect(&db.url)
                .await
                .expect("connect to PostgreSQL");
            migrator
                .run_direct(&mut conn)
                .await
                .expect("apply the old migrations");
            conn.close().await.expect("close");
        }
    }
    db
}

/// One value of a fixture row.
#[derive(Clone, Copy, Debug)]
pub enum V {
    I(i64),
    /// Text exactly as the column holds it (escaped as the server escapes).
    T(&'static str),
    Null,
    /// Bytes, in hex.
    Hex(&'static str),
}

/// Rows of one table, as an older server left them.
pub struct Table {
    pub name: &'static str,
    /// The identity column given explicit values (PostgreSQL must be told
    /// to take them, and its sequence moved past them).
    pub identity: Option<&'static str>,
    /// Rows only this dialect has (PostgreSQL's search table).
    pub only: Option<Dialect>,
    pub columns: &'static str,
    pub rows: Vec<Vec<V>>,
}

impl V {
    fn literal(self, dialect: Dialect) -> String {
        match self {
            V::I(n) => n.to_string(),
            V::T(text) => {
                assert!(!text.contains('\0'), "a stored text holds no U+0000");
                format!("'{}'", text.replace('\'', "''"))
            }
            V::Null => "NULL".to_owned(),
            V::Hex(hex) => match dialect {
                Dialect::Sqlite => format!("X'{hex}'"),
                Dialect::Postgres => format!("'\\x{hex}'::bytea"),
            },
        }
    }
}

impl OldDatabase {
    /// Writes `tables` in one transaction, in order, with plain INSERTs.
    pub async fn insert(&self, tables: &[Table]) {
        let mut statements = vec!["BEGIN".to_owned()];
        for table in tables {
            if table.only.is_some_and(|only| only != self.dialect) || table.rows.is_empty() {
                continue;
            }
            let overriding = match (self.dialect, table.identity) {
                (Dialect::Postgres, Some(_)) => " OVERRIDING SYSTEM VALUE",
                _ => "",
            };
            let rows: Vec<String> = table
                .rows
                .iter()
                .map(|row| {
                    assert_eq!(
                        row.len(),
                        table.columns.split(',').count(),
                        "a row of {}",
                        table.name
                    );
                    let values: Vec<String> = row.iter().map(|v| v.literal(self.dialect)).collect();
                    format!("({})", values.join(", "))
                })
                .collect();
            statements.push(format!(
                "INSERT INTO {} ({}){overriding} VALUES {}",
                table.name,
                table.columns,
                rows.join(",\n")
            ));
            if let (Dialect::Postgres, Some(column)) = (self.dialect, table.identity) {
                statements.push(format!(
                    "SELECT setval(pg_get_serial_sequence('{0}', '{column}'), \
                     (SELECT max({column}) FROM {0}))",
                    table.name
                ));
            }
        }
        statements.push("COMMIT".to_owned());
        let sql = statements.join(";\n");
        match self.dialect {
            Dialect::Sqlite => {
                let mut conn = sqlx::SqliteConnection::connect(&self.url)
                    .await
                    .expect("open the SQLite file");
                sqlx::raw_sql(&sql)
                    .execute(&mut conn)
                    .await
                    .expect("write the old rows");
                conn.close().await.expect("close");
            }
            Dialect::Postgres => {
                let mut conn = sqlx::PgConnection::connect(&self.url)
                    .await
                    .expect("connect to PostgreSQL");
                sqlx::raw_sql(&sql)
                    .execute(&mut conn)
                    .await
                    .expect("write the old rows");
                conn.close().await.expect("close");
            }
        }
    }

    /// The versions `_sqlx_migrations` records as applied, in order.
    async fn applied_versions(&self) -> Vec<(i64, bool)> {
        self.rows("SELECT version, success FROM _sqlx_migrations ORDER BY version")
            .await
    }

    /// The events stored encoded (0013), as (session key, revision); the
    /// others hold the JSON an older server wrote.
    async fn encoded_events(&self) -> Vec<(i64, i64)> {
        self.rows("SELECT session_key, revision FROM events WHERE wire IS NOT NULL ORDER BY 1, 2")
            .await
    }

    /// The events that refer to their messages for their content (0016),
    /// as (session key, revision).
    async fn referring_events(&self) -> Vec<(i64, i64)> {
        self.rows(
            "SELECT session_key, revision FROM events WHERE refers_until > refers_from \
             ORDER BY 1, 2",
        )
        .await
    }

    /// The messages stored encoded (0017), as (session key, sequence); the
    /// others hold the JSON an older server wrote.
    async fn encoded_messages(&self) -> Vec<(i64, i64)> {
        self.rows("SELECT session_key, sequence FROM messages WHERE wire IS NOT NULL ORDER BY 1, 2")
            .await
    }

    /// The rows `sql` selects, read through a connection of its own.
    async fn rows<T>(&self, sql: &str) -> Vec<T>
    where
        T: for<'r> sqlx::FromRow<'r, sqlx::sqlite::SqliteRow>
            + for<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow>
            + Send
            + Unpin,
    {
        match self.dialect {
            Dialect::Sqlite => {
                let mut conn = sqlx::SqliteConnection::connect(&self.url)
                    .await
                    .expect("open the SQLite file");
                sqlx::query_as(sql)
                    .fetch_all(&mut conn)
                    .await
                    .unwrap_or_else(|e| panic!("{sql}: {e}"))
            }
            Dialect::Postgres => {
                let mut conn = sqlx::PgConnection::connect(&self.url)
                    .await
                    .expect("connect to PostgreSQL");
                sqlx::query_as(sql)
                    .fetch_all(&mut conn)
                    .await
                    .unwrap_or_else(|e| panic!("{sql}: {e}"))
            }
        }
    }

    /// PostgreSQL: the tables holding a foreign key, one entry per key,
    /// sorted.
    async fn tables_with_foreign_keys(&self) -> Vec<String> {
        let mut conn = sqlx::PgConnection::connect(&self.url)
            .await
            .expect("connect to PostgreSQL");
        sqlx::query_scalar(
            "SELECT conrelid::regclass::text FROM pg_constraint WHERE contype = 'f' ORDER BY 1",
        )
        .fetch_all(&mut conn)
        .await
        .expect("read pg_constraint")
    }

    /// The indexes on `table`, by name, sorted.
    async fn indexes(&self, table: &str) -> Vec<String> {
        let sql = match self.dialect {
            Dialect::Sqlite => format!(
                "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = '{table}' \
                 ORDER BY name"
            ),
            Dialect::Postgres => {
                format!("SELECT indexname FROM pg_indexes WHERE tablename = '{table}' ORDER BY 1")
            }
        };
        self.rows::<(String,)>(&sql)
            .await
            .into_iter()
            .map(|(name,)| name)
            .collect()
    }

    /// The real binary serving this database (it migrates it first).
    async fn serve(&self, log_dir: &std::path::Path) -> ServerProcess {
        ServerProcess::start(
            &sessionstore_binary(),
            &self.url,
            "127.0.0.1:0",
            log_dir.join("server.log"),
            &[],
        )
        .await
    }
}

// ---------------------------------------------------------------------------
// What a server at migration 0005 wrote (commit f97a7eb, the parent of the
// commit adding 0006): the rows of a run that made session mig-alpha (a
// title and metadata with U+0000 and a backslash, initial history and
// state, two exchanges with provider calls, a tool call, content blocks and
// an idempotency key), mig-bravo (renamed, a run cancelled, an incomplete
// answer, a redacted message), mig-charlie (deleted: a tombstone, its call
// gone) and mig-delta (forked from mig-alpha at sequence 2), and a shared
// state entry. On SQLite the search index lives in a file beside the
// database that is not part of any migration; it is left out, and the
// server rebuilds it from the messages.

const ALPHA_CREATED: i64 = 1_795_677_188_940_509;
const ALPHA_FIRST: i64 = 1_795_677_188_949_284;
const ALPHA_SECOND: i64 = 1_795_677_188_952_263;
const ALPHA_STATE: i64 = 1_795_677_188_959_739;
const SHARED_STATE: i64 = 1_795_677_188_961_520;
const BRAVO_CREATED: i64 = 1_795_677_188_967_579;
const BRAVO_FIRST: i64 = 1_795_677_188_969_294;
const BRAVO_SECOND: i64 = 1_795_677_188_982_324;
const BRAVO_REDACTED: i64 = 1_795_677_188_983_696;
const DELTA_CREATED: i64 = 1_795_677_188_991_640;

const ALPHA_CALLS: [&str; 2] = [
    "call_01a216b3735576328f7ac107e4e4f868",
    "call_01a216b3735874af8451ed57d738f7ba",
];
const BRAVO_CALLS: [&str; 2] = [
    "call_01a216b37369721bb866e9721db5d732",
    "call_01a216b37376726fb091dabb8fe4f8ea",
];
const ALPHA_MESSAGES: [&str; 6] = [
    "msg_01a216b3734c73ce97b6a233336ae1af",
    "msg_01a216b3734d70f2aac25688bc6f24ce",
    "msg_01a216b3735576328f7ac1084d0b69df",
    "msg_01a216b3735576328f7ac10913150b13",
    "msg_01a216b3735874af8451ed58a9cec0be",
    "msg_01a216b3735874af8451ed59d3e668f4",
];
const BRAVO_MESSAGES: [&str; 4] = [
    "msg_01a216b37369721bb866e9732b86483c",
    "msg_01a216b37369721bb866e974aae4d480",
    "msg_01a216b37376726fb091dabc5cb408c3",
    "msg_01a216b37376726fb091dabdddcd28ad",
];
const DELTA_MESSAGES: [&str; 3] = [
    "msg_01a216b3737f72209129f6937d401564",
    "msg_01a216b373807458ba9d8dfcb0d67895",
    "msg_01a216b373807458ba9d8dfdb81daabf",
];

/// The rows, one per line as the tables hold them.
#[rustfmt::skip]
fn written_by_0005() -> Vec<Table> {
    use V::{Hex, I, Null, T};
    vec![
        Table {
            name: "sessions",
            identity: Some("key"),
            only: None,
            columns: "key, tenant, id, title, system_prompt, user_name, metadata, summary_message_id, revision, next_sequence, message_count, provider_call_count, last_model, last_provider, last_cost_micros_usd, last_request_id, total_tokens, total_cost_micros_usd, create_time, update_time, deleted, parent_session_id, parent_sequence, run_id, run_expire_time",
            rows: vec![
                vec![I(1), T("default"), T("mig-alpha"), T(r"Trip \\ plans\0v2"), T("Be brief."), T("alice"), T(r#"{"app":"travel","note":"a\u0000b\\c"}"#), T(""), I(4), I(6), I(6), I(2), T("claude-sonnet-4-5"), T("anthropic"), I(8250), T(""), I(3650), I(15000), I(1795677188940509), I(1795677188959739), I(0), T(""), I(0), T(""), I(0)],
                vec![I(2), T("default"), T("mig-bravo"), T("Bravo renamed"), T(""), T("bob"), T("{}"), T(""), I(6), I(4), I(4), I(2), T("o4-mini"), T("openai"), I(1100), T(""), I(2210), I(5100), I(1795677188967579), I(1795677188983696), I(0), T(""), I(0), T(""), I(0)],
                vec![I(3), T("default"), T("mig-charlie"), T("Gone"), T(""), T("alice"), T("{}"), T(""), I(3), I(2), I(0), I(1), T("gpt-4o"), T("openai"), I(99), T(""), I(15), I(99), I(1795677188986667), I(1795677188989641), I(1), T(""), I(0), T(""), I(0)],
                vec![I(4), T("default"), T("mig-delta"), T(r"Trip \\ plans\0v2"), T("Be brief."), T("alice"), T(r#"{"app":"travel","note":"a\u0000b\\c"}"#), T(""), I(1), I(3), I(3), I(0), T(""), T(""), I(0), T(""), I(0), I(0), I(1795677188991640), I(1795677188991640), I(0), T("mig-alpha"), I(2), T(""), I(0)],
            ],
        },
        Table {
            name: "provider_calls",
            identity: Some("ordinal"),
            only: None,
            columns: "ordinal, id, session_key, request_id, provider, model, requested_provider, requested_model, prompt_tokens, completion_tokens, total_tokens, cost_micros_usd, create_time",
            rows: vec![
                vec![I(1), T("call_01a216b3735576328f7ac107e4e4f868"), I(1), T("gw-1"), T("openai"), T("gpt-4o-2024-08-06"), T("openai"), T("gpt-4o"), I(1200), I(300), I(1500), I(6750), I(1795677188949284)],
                vec![I(2), T("call_01a216b3735874af8451ed57d738f7ba"), I(1), T(""), T("anthropic"), T("claude-sonnet-4-5"), T(""), T(""), I(2000), I(150), I(2150), I(8250), I(1795677188952263)],
                vec![I(3), T("call_01a216b37369721bb866e9721db5d732"), I(2), T("gw-2"), T("openai"), T("o4-mini"), T(""), T(""), I(500), I(800), I(1300), I(4000), I(1795677188969294)],
                vec![I(4), T("call_01a216b37376726fb091dabb8fe4f8ea"), I(2), T(""), T("openai"), T("o4-mini"), T(""), T(""), I(900), I(10), I(910), I(1100), I(1795677188982324)],
            ],
        },
        Table {
            name: "messages",
            identity: None,
            only: None,
            columns: "session_key, sequence, id, produced_by_call_id, body, create_time, redacted",
            rows: vec![
                vec![I(1), I(0), T("msg_01a216b3734c73ce97b6a233336ae1af"), Null, T(r#"{"role":"user","content":"Hello\u0000world \\ ok"}"#), I(1795677188940509), I(0)],
                vec![I(1), I(1), T("msg_01a216b3734d70f2aac25688bc6f24ce"), Null, T(r#"{"role":"assistant","content":"Hi."}"#), I(1795677188940509), I(0)],
                vec![I(1), I(2), T("msg_01a216b3735576328f7ac1084d0b69df"), Null, T(r#"{"role":"user","content":"Book a flight to Oslo"}"#), I(1795677188949284), I(0)],
                vec![I(1), I(3), T("msg_01a216b3735576328f7ac10913150b13"), T("call_01a216b3735576328f7ac107e4e4f868"), T(r#"{"role":"assistant","tool_calls":[{"id":"call_1","name":"search_flights","arguments":"{\"to\":\"OSL\"}"}]}"#), I(1795677188949284), I(0)],
                vec![I(1), I(4), T("msg_01a216b3735874af8451ed58a9cec0be"), Null, T(r#"{"role":"tool","content":"[{\"flight\":\"SK123\"}]","tool_call_id":"call_1","name":"search_flights"}"#), I(1795677188952263), I(0)],
                vec![I(1), I(5), T("msg_01a216b3735874af8451ed59d3e668f4"), T("call_01a216b3735874af8451ed57d738f7ba"), T(r#"{"role":"assistant","content_blocks":[{"thinking":{"thinking":"Pick the early one.","signature":"sig-1"}},{"text":{"text":"SK123 leaves at 9:05."}}],"metadata":{"lang":"en"}}"#), I(1795677188952263), I(0)],
                vec![I(2), I(0), T("msg_01a216b37369721bb866e9732b86483c"), Null, T(r#"{"role":"user"}"#), I(1795677188969294), I(1)],
                vec![I(2), I(1), T("msg_01a216b37369721bb866e974aae4d480"), T("call_01a216b37369721bb866e9721db5d732"), T(r#"{"role":"assistant","content":"Here is the summary."}"#), I(1795677188969294), I(0)],
                vec![I(2), I(2), T("msg_01a216b37376726fb091dabc5cb408c3"), Null, T(r#"{"role":"user","content":"And the rest?"}"#), I(1795677188982324), I(0)],
                vec![I(2), I(3), T("msg_01a216b37376726fb091dabdddcd28ad"), T("call_01a216b37376726fb091dabb8fe4f8ea"), T(r#"{"role":"assistant","content":"Par","incomplete":true}"#), I(1795677188982324), I(0)],
                vec![I(4), I(0), T("msg_01a216b3737f72209129f6937d401564"), Null, T(r#"{"role":"user","content":"Hello\u0000world \\ ok"}"#), I(1795677188991640), I(0)],
                vec![I(4), I(1), T("msg_01a216b373807458ba9d8dfcb0d67895"), Null, T(r#"{"role":"assistant","content":"Hi."}"#), I(1795677188991640), I(0)],
                vec![I(4), I(2), T("msg_01a216b373807458ba9d8dfdb81daabf"), Null, T(r#"{"role":"user","content":"Book a flight to Oslo"}"#), I(1795677188991640), I(0)],
            ],
        },
        Table {
            name: "events",
            identity: None,
            only: None,
            columns: "session_key, revision, time, body",
            rows: vec![
                vec![I(1), I(1), I(1795677188940509), T(r#"{"session_created":{"session":{"id":"mig-alpha","title":"Trip \\ plans\u0000v2","system_prompt":"Be brief.","user":"alice","metadata":{"app":"travel","note":"a\u0000b\\c"},"summary_message_id":"","revision":1,"create_time":1795677188940509,"update_time":1795677188940509,"parent_sequence":0,"run_expire_time":0,"next_sequence":2},"messages":[{"id":"msg_01a216b3734c73ce97b6a233336ae1af","session_id":"mig-alpha","sequence":0,"produced_by_call_id":"","message":{"role":"user","content":"Hello\u0000world \\ ok"},"create_time":1795677188940509},{"id":"msg_01a216b3734d70f2aac25688bc6f24ce","session_id":"mig-alpha","sequence":1,"produced_by_call_id":"","message":{"role":"assistant","content":"Hi."},"create_time":1795677188940509}],"state":[{"key":"cwd","value":"/home/alice","version":1,"update_time":1795677188940509}]}}"#)],
                vec![I(1), I(2), I(1795677188949284), T(r#"{"exchange_appended":{"messages":[{"id":"msg_01a216b3735576328f7ac1084d0b69df","session_id":"mig-alpha","sequence":2,"produced_by_call_id":"","message":{"role":"user","content":"Book a flight to Oslo"},"create_time":1795677188949284},{"id":"msg_01a216b3735576328f7ac10913150b13","session_id":"mig-alpha","sequence":3,"produced_by_call_id":"call_01a216b3735576328f7ac107e4e4f868","message":{"role":"assistant","tool_calls":[{"id":"call_1","name":"search_flights","arguments":"{\"to\":\"OSL\"}"}]},"create_time":1795677188949284}],"provider_call":{"id":"call_01a216b3735576328f7ac107e4e4f868","session_id":"mig-alpha","request_id":"gw-1","provider":"openai","model":"gpt-4o-2024-08-06","requested_provider":"openai","requested_model":"gpt-4o","prompt_tokens":1200,"completion_tokens":300,"total_tokens":1500,"cost_micros_usd":6750,"create_time":1795677188949284},"next_sequence":4,"state_changes":[{"key":"step","value":"searching"}]}}"#)],
                vec![I(1), I(3), I(1795677188952263), T(r#"{"exchange_appended":{"messages":[{"id":"msg_01a216b3735874af8451ed58a9cec0be","session_id":"mig-alpha","sequence":4,"produced_by_call_id":"","message":{"role":"tool","content":"[{\"flight\":\"SK123\"}]","tool_call_id":"call_1","name":"search_flights"},"create_time":1795677188952263},{"id":"msg_01a216b3735874af8451ed59d3e668f4","session_id":"mig-alpha","sequence":5,"produced_by_call_id":"call_01a216b3735874af8451ed57d738f7ba","message":{"role":"assistant","content_blocks":[{"thinking":{"thinking":"Pick the early one.","signature":"sig-1"}},{"text":{"text":"SK123 leaves at 9:05."}}],"metadata":{"lang":"en"}},"create_time":1795677188952263}],"provider_call":{"id":"call_01a216b3735874af8451ed57d738f7ba","session_id":"mig-alpha","request_id":"","provider":"anthropic","model":"claude-sonnet-4-5","requested_provider":"","requested_model":"","prompt_tokens":2000,"completion_tokens":150,"total_tokens":2150,"cost_micros_usd":8250,"create_time":1795677188952263},"next_sequence":6}}"#)],
                vec![I(1), I(4), I(1795677188959739), T(r#"{"state_changed":{"key":"step","value":"booked","version":4,"deleted":false}}"#)],
                vec![I(2), I(1), I(1795677188967579), T(r#"{"session_created":{"session":{"id":"mig-bravo","title":"Bravo","system_prompt":"","user":"bob","metadata":{},"summary_message_id":"","revision":1,"create_time":1795677188967579,"update_time":1795677188967579,"parent_sequence":0,"run_expire_time":0,"next_sequence":0},"messages":[]}}"#)],
                vec![I(2), I(2), I(1795677188969294), T(r#"{"exchange_appended":{"messages":[{"id":"msg_01a216b37369721bb866e9732b86483c","session_id":"mig-bravo","sequence":0,"produced_by_call_id":"","message":{"role":"user"},"create_time":1795677188969294,"redacted":true},{"id":"msg_01a216b37369721bb866e974aae4d480","session_id":"mig-bravo","sequence":1,"produced_by_call_id":"call_01a216b37369721bb866e9721db5d732","message":{"role":"assistant","content":"Here is the summary."},"create_time":1795677188969294}],"provider_call":{"id":"call_01a216b37369721bb866e9721db5d732","session_id":"mig-bravo","request_id":"gw-2","provider":"openai","model":"o4-mini","requested_provider":"","requested_model":"","prompt_tokens":500,"completion_tokens":800,"total_tokens":1300,"cost_micros_usd":4000,"create_time":1795677188969294},"next_sequence":2}}"#)],
                vec![I(2), I(3), I(1795677188978239), T(r#"{"session_updated":{"session":{"id":"mig-bravo","title":"Bravo renamed","system_prompt":"","user":"bob","metadata":{},"summary_message_id":"","revision":3,"create_time":1795677188967579,"update_time":1795677188978239,"parent_sequence":0,"run_expire_time":0,"next_sequence":2}}}"#)],
                vec![I(2), I(4), I(1795677188980904), T(r#"{"run_cancel_requested":{"run_id":"run-b1","reason":"user pressed stop"}}"#)],
                vec![I(2), I(5), I(1795677188982324), T(r#"{"exchange_appended":{"messages":[{"id":"msg_01a216b37376726fb091dabc5cb408c3","session_id":"mig-bravo","sequence":2,"produced_by_call_id":"","message":{"role":"user","content":"And the rest?"},"create_time":1795677188982324},{"id":"msg_01a216b37376726fb091dabdddcd28ad","session_id":"mig-bravo","sequence":3,"produced_by_call_id":"call_01a216b37376726fb091dabb8fe4f8ea","message":{"role":"assistant","content":"Par","incomplete":true},"create_time":1795677188982324}],"provider_call":{"id":"call_01a216b37376726fb091dabb8fe4f8ea","session_id":"mig-bravo","request_id":"","provider":"openai","model":"o4-mini","requested_provider":"","requested_model":"","prompt_tokens":900,"completion_tokens":10,"total_tokens":910,"cost_micros_usd":1100,"create_time":1795677188982324},"run_id":"run-b1","next_sequence":4}}"#)],
                vec![I(2), I(6), I(1795677188983696), T(r#"{"message_redacted":{"message_id":"msg_01a216b37369721bb866e9732b86483c","sequence":0,"reason":"pii"}}"#)],
                vec![I(3), I(3), I(1795677188989641), T(r#""session_deleted""#)],
                vec![I(4), I(1), I(1795677188991640), T(r#"{"session_created":{"session":{"id":"mig-delta","title":"Trip \\ plans\u0000v2","system_prompt":"Be brief.","user":"alice","metadata":{"app":"travel","note":"a\u0000b\\c"},"summary_message_id":"","revision":1,"create_time":1795677188991640,"update_time":1795677188991640,"parent_session_id":"mig-alpha","parent_sequence":2,"run_expire_time":0,"next_sequence":3},"messages":[{"id":"msg_01a216b3737f72209129f6937d401564","session_id":"mig-delta","sequence":0,"produced_by_call_id":"","message":{"role":"user","content":"Hello\u0000world \\ ok"},"create_time":1795677188991640},{"id":"msg_01a216b373807458ba9d8dfcb0d67895","session_id":"mig-delta","sequence":1,"produced_by_call_id":"","message":{"role":"assistant","content":"Hi."},"create_time":1795677188991640},{"id":"msg_01a216b373807458ba9d8dfdb81daabf","session_id":"mig-delta","sequence":2,"produced_by_call_id":"","message":{"role":"user","content":"Book a flight to Oslo"},"create_time":1795677188991640}]}}"#)],
            ],
        },
        Table {
            name: "idempotency_keys",
            identity: None,
            only: None,
            columns: "tenant, request_id, session_key, fingerprint, revision",
            rows: vec![
                vec![T("default"), T("idem-alpha-1"), I(1), Hex("1d4c5e30c01ba3205f4dab7c1e0aa459258eb35c534ed954ba54c01086993bb5"), I(2)],
            ],
        },
        Table {
            name: "session_state",
            identity: None,
            only: None,
            columns: "session_key, key, value, version, update_time",
            rows: vec![
                vec![I(1), T("cwd"), T("/home/alice"), I(1), I(1795677188940509)],
                vec![I(1), T("step"), T("booked"), I(4), I(1795677188959739)],
            ],
        },
        Table {
            name: "shared_state",
            identity: None,
            only: None,
            columns: "tenant, scope, key, value, version, update_time",
            rows: vec![
                vec![T("default"), T("app:travel"), T("currency"), T("NOK"), I(1), I(1795677188961520)],
            ],
        },
        Table {
            name: "session_metadata",
            identity: None,
            only: None,
            columns: "session_key, tenant, key, value",
            rows: vec![
                vec![I(1), T("default"), T("app"), T("travel")],
                vec![I(4), T("default"), T("app"), T("travel")],
                vec![I(1), T("default"), T("note"), T(r"a\0b\\c")],
                vec![I(4), T("default"), T("note"), T(r"a\0b\\c")],
            ],
        },
        Table {
            name: "run_cancels",
            identity: None,
            only: None,
            columns: "session_key, run_id, revision",
            rows: vec![
                vec![I(2), T("run-b1"), I(4)],
            ],
        },
        Table {
            name: "message_search",
            identity: None,
            only: Some(Dialect::Postgres),
            columns: "session_key, sequence, text",
            rows: vec![
                vec![I(1), I(0), T(r"Hello world \ ok")],
                vec![I(1), I(1), T("Hi.")],
                vec![I(1), I(2), T("Book a flight to Oslo")],
                vec![I(1), I(3), T("search_flights\n{\"to\":\"OSL\"}")],
                vec![I(1), I(4), T(r#"[{"flight":"SK123"}]"#)],
                vec![I(1), I(5), T("SK123 leaves at 9:05.")],
                vec![I(2), I(1), T("Here is the summary.")],
                vec![I(2), I(2), T("And the rest?")],
                vec![I(2), I(3), T("Par")],
                vec![I(4), I(0), T(r"Hello world \ ok")],
                vec![I(4), I(1), T("Hi.")],
                vec![I(4), I(2), T("Book a flight to Oslo")],
            ],
        },
    ]
}

// ---------------------------------------------------------------------------
// Reading it back.

fn at(micros: i64) -> Option<prost_types::Timestamp> {
    Some(prost_types::Timestamp {
        seconds: micros.div_euclid(1_000_000),
        nanos: i32::try_from(micros.rem_euclid(1_000_000) * 1000).expect("nanos"),
    })
}

fn metadata(pairs: &[(&str, &str)]) -> std::collections::BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// mig-alpha at `revision`, as the old server left it there.
fn alpha(revision: i64, update_time: i64, next_sequence: i64) -> pb::Session {
    pb::Session {
        id: "mig-alpha".into(),
        title: "Trip \\ plans\0v2".into(),
        system_prompt: "Be brief.".into(),
        user: "alice".into(),
        metadata: metadata(&[("app", "travel"), ("note", "a\0b\\c")]),
        revision,
        create_time: at(ALPHA_CREATED),
        update_time: at(update_time),
        next_sequence,
        ..Default::default()
    }
}

fn bravo(title: &str, revision: i64, update_time: i64, next_sequence: i64) -> pb::Session {
    pb::Session {
        id: "mig-bravo".into(),
        title: title.into(),
        user: "bob".into(),
        revision,
        create_time: at(BRAVO_CREATED),
        update_time: at(update_time),
        next_sequence,
        ..Default::default()
    }
}

fn delta() -> pb::Session {
    pb::Session {
        id: "mig-delta".into(),
        parent_session_id: "mig-alpha".into(),
        parent_sequence: 2,
        revision: 1,
        create_time: at(DELTA_CREATED),
        update_time: at(DELTA_CREATED),
        next_sequence: 3,
        ..alpha(1, DELTA_CREATED, 3)
    }
}

fn stored(
    session: &str,
    id: &str,
    sequence: i64,
    produced_by: &str,
    message: pb::Message,
    time: i64,
) -> pb::StoredMessage {
    pb::StoredMessage {
        id: id.into(),
        session_id: session.into(),
        sequence,
        produced_by_call_id: produced_by.into(),
        message: Some(message),
        create_time: at(time),
        redacted: false,
    }
}

fn said(role: pb::Role, content: &str) -> pb::Message {
    pb::Message {
        role: role.into(),
        content: content.into(),
        ..Default::default()
    }
}

fn alpha_messages() -> Vec<pb::StoredMessage> {
    use pb::content_block::Block;
    let s = "mig-alpha";
    vec![
        stored(
            s,
            ALPHA_MESSAGES[0],
            0,
            "",
            said(pb::Role::User, "Hello\0world \\ ok"),
            ALPHA_CREATED,
        ),
        stored(
            s,
            ALPHA_MESSAGES[1],
            1,
            "",
            said(pb::Role::Assistant, "Hi."),
            ALPHA_CREATED,
        ),
        stored(
            s,
            ALPHA_MESSAGES[2],
            2,
            "",
            said(pb::Role::User, "Book a flight to Oslo"),
            ALPHA_FIRST,
        ),
        stored(
            s,
            ALPHA_MESSAGES[3],
            3,
            ALPHA_CALLS[0],
            pb::Message {
                role: pb::Role::Assistant.into(),
                tool_calls: vec![pb::ToolCall {
                    id: "call_1".into(),
                    name: "search_flights".into(),
                    arguments: r#"{"to":"OSL"}"#.into(),
                    signature: String::new(),
                }],
                ..Default::default()
            },
            ALPHA_FIRST,
        ),
        stored(
            s,
            ALPHA_MESSAGES[4],
            4,
            "",
            pb::Message {
                role: pb::Role::Tool.into(),
                content: r#"[{"flight":"SK123"}]"#.into(),
                tool_call_id: "call_1".into(),
                name: "search_flights".into(),
                ..Default::default()
            },
            ALPHA_SECOND,
        ),
        stored(
            s,
            ALPHA_MESSAGES[5],
            5,
            ALPHA_CALLS[1],
            pb::Message {
                role: pb::Role::Assistant.into(),
                content_blocks: vec![
                    pb::ContentBlock {
                        block: Some(Block::Thinking(pb::ThinkingBlock {
                            thinking: "Pick the early one.".into(),
                            signature: "sig-1".into(),
                        })),
                    },
                    pb::ContentBlock {
                        block: Some(Block::Text(pb::TextBlock {
                            text: "SK123 leaves at 9:05.".into(),
                            signature: String::new(),
                        })),
                    },
                ],
                metadata: metadata(&[("lang", "en")]),
                ..Default::default()
            },
            ALPHA_SECOND,
        ),
    ]
}

fn bravo_messages() -> Vec<pb::StoredMessage> {
    let s = "mig-bravo";
    vec![
        pb::StoredMessage {
            redacted: true,
            ..stored(
                s,
                BRAVO_MESSAGES[0],
                0,
                "",
                said(pb::Role::User, ""),
                BRAVO_FIRST,
            )
        },
        stored(
            s,
            BRAVO_MESSAGES[1],
            1,
            BRAVO_CALLS[0],
            said(pb::Role::Assistant, "Here is the summary."),
            BRAVO_FIRST,
        ),
        stored(
            s,
            BRAVO_MESSAGES[2],
            2,
            "",
            said(pb::Role::User, "And the rest?"),
            BRAVO_SECOND,
        ),
        stored(
            s,
            BRAVO_MESSAGES[3],
            3,
            BRAVO_CALLS[1],
            pb::Message {
                incomplete: true,
                ..said(pb::Role::Assistant, "Par")
            },
            BRAVO_SECOND,
        ),
    ]
}

fn delta_messages() -> Vec<pb::StoredMessage> {
    alpha_messages()
        .into_iter()
        .take(3)
        .zip(DELTA_MESSAGES)
        .map(|(message, id)| pb::StoredMessage {
            id: id.into(),
            session_id: "mig-delta".into(),
            create_time: at(DELTA_CREATED),
            ..message
        })
        .collect()
}

/// A call as the old server recorded it: the buckets 0, no usage object,
/// no duration.
#[allow(clippy::too_many_arguments)]
fn old_call(
    id: &str,
    session: &str,
    request_id: &str,
    (provider, model): (&str, &str),
    (requested_provider, requested_model): (&str, &str),
    (prompt, completion, cost): (i64, i64, i64),
    time: i64,
) -> pb::ProviderCall {
    pb::ProviderCall {
        id: id.into(),
        session_id: session.into(),
        request_id: request_id.into(),
        provider: provider.into(),
        model: model.into(),
        requested_provider: requested_provider.into(),
        requested_model: requested_model.into(),
        prompt_tokens: prompt,
        completion_tokens: completion,
        total_tokens: prompt + completion,
        cost_micros_usd: cost,
        create_time: at(time),
        ..Default::default()
    }
}

fn alpha_calls() -> Vec<pb::ProviderCall> {
    vec![
        old_call(
            ALPHA_CALLS[0],
            "mig-alpha",
            "gw-1",
            ("openai", "gpt-4o-2024-08-06"),
            ("openai", "gpt-4o"),
            (1200, 300, 6750),
            ALPHA_FIRST,
        ),
        old_call(
            ALPHA_CALLS[1],
            "mig-alpha",
            "",
            ("anthropic", "claude-sonnet-4-5"),
            ("", ""),
            (2000, 150, 8250),
            ALPHA_SECOND,
        ),
    ]
}

fn bravo_calls() -> Vec<pb::ProviderCall> {
    vec![
        old_call(
            BRAVO_CALLS[0],
            "mig-bravo",
            "gw-2",
            ("openai", "o4-mini"),
            ("", ""),
            (500, 800, 4000),
            BRAVO_FIRST,
        ),
        old_call(
            BRAVO_CALLS[1],
            "mig-bravo",
            "",
            ("openai", "o4-mini"),
            ("", ""),
            (900, 10, 1100),
            BRAVO_SECOND,
        ),
    ]
}

/// A SummarizeUsage row of calls with no buckets.
fn usage_row(key: &str, calls: i64, prompt: i64, completion: i64, cost: i64) -> pb::UsageRow {
    pb::UsageRow {
        key: key.into(),
        calls,
        prompt_tokens: prompt,
        completion_tokens: completion,
        total_tokens: prompt + completion,
        cost_micros_usd: cost,
        ..Default::default()
    }
}

async fn summarize(
    client: &mut Client,
    group_by: pb::UsageGroupBy,
    user: &str,
) -> Vec<pb::UsageRow> {
    let answer = client
        .summarize_usage(pb::SummarizeUsageRequest {
            user: user.into(),
            group_by: group_by.into(),
            ..Default::default()
        })
        .await
        .expect("SummarizeUsage")
        .into_inner();
    assert!(answer.next_page_token.is_empty(), "one page: {answer:?}");
    answer.rows
}

async fn provider_calls(client: &mut Client, session: &str) -> Vec<pb::ProviderCall> {
    let page = client
        .list_provider_calls(pb::ListProviderCallsRequest {
            session_id: session.into(),
            page_size: 100,
            ..Default::default()
        })
        .await
        .expect("ListProviderCalls")
        .into_inner();
    assert!(page.next_page_token.is_empty());
    page.provider_calls
}

/// The events a watch from revision 0 replays, up to `caught_up`.
/// A session's whole history through ExportHistory.
async fn exported(client: &mut Client, session: &str) -> Vec<pb::Message> {
    crate::support::export(
        client,
        pb::ExportHistoryRequest {
            session_id: session.into(),
            ..Default::default()
        },
    )
    .await
}

/// The messages of stored messages, as an export sends them.
fn contents(stored: Vec<pb::StoredMessage>) -> Vec<pb::Message> {
    stored.into_iter().filter_map(|m| m.message).collect()
}

async fn replay(client: &mut Client, session: &str) -> Vec<pb::SessionEvent> {
    let mut stream = watch(client, session, 0).await;
    let mut events = Vec::new();
    loop {
        let event = next_change(&mut stream).await;
        if matches!(event.event, Some(Event::CaughtUp(_))) {
            return events;
        }
        events.push(event);
    }
}

async fn migrates_what_0005_wrote(dialect: Dialect) {
    let old = old_schema_database(dialect, 5).await;
    old.insert(&written_by_0005()).await;
    let logs = tempfile::tempdir().expect("tempdir");
    let server = old.serve(logs.path()).await;
    let mut client = crate::support::connect(&server.endpoint()).await;

    // Every migration on disk is applied, the old ones untouched.
    let on_disk: Vec<(i64, bool)> = migrations_on_disk(dialect)
        .await
        .iter()
        .map(|m| (m.version, true))
        .collect();
    assert!(on_disk.len() > 5);
    assert_eq!(old.applied_versions().await, on_disk);
    if dialect == Dialect::Postgres {
        // 0012: the tables appends write keep no foreign keys (those of
        // approvals and queued input, 22 and 23, are never written by one).
        assert_eq!(
            old.tables_with_foreign_keys().await,
            [
                "approvals",
                "queued_inputs",
                "run_cancels",
                "session_metadata",
                "session_state"
            ]
        );
        // 0014: a call's key is its session's and ordinal, no other
        // index than usage's.
        assert_eq!(
            old.indexes("provider_calls").await,
            [
                "provider_calls_by_tenant_time",
                "provider_calls_by_user_time",
                "provider_calls_pkey"
            ]
        );
        assert_eq!(
            old.rows::<(String,)>("SELECT pg_get_indexdef('provider_calls_pkey'::regclass)")
                .await,
            [(
                "CREATE UNIQUE INDEX provider_calls_pkey ON public.provider_calls \
               USING btree (session_key, ordinal)"
                    .to_owned(),
            )]
        );
        // 0015: a message's words stay in its search row.
        assert_eq!(
            old.rows::<(String,)>(
                "SELECT attstorage::text FROM pg_attribute \
                 WHERE attrelid = 'message_search'::regclass AND attname = 'words'"
            )
            .await,
            [("m".to_owned(),)]
        );
    }
    // 0014: no index on the sessions' update_time for the sweeps alone;
    // tombstones have their own.
    let session_indexes = old.indexes("sessions").await;
    assert!(
        !session_indexes
            .iter()
            .any(|name| name == "sessions_by_idle")
            && session_indexes
                .iter()
                .any(|name| name == "sessions_tombstones_by_time"),
        "{session_indexes:?}"
    );

    // Sessions, whole; none expires.
    for expected in [
        alpha(4, ALPHA_STATE, 6),
        bravo("Bravo renamed", 6, BRAVO_REDACTED, 4),
        delta(),
    ] {
        let got = client
            .get_session(pb::GetSessionRequest {
                session_id: expected.id.clone(),
                ..Default::default()
            })
            .await
            .expect("GetSession")
            .into_inner();
        assert_eq!(got, expected);
        assert_eq!(got.expire_time, None);
    }
    let status = client
        .get_session(pb::GetSessionRequest {
            session_id: "mig-charlie".into(),
            ..Default::default()
        })
        .await
        .expect_err("mig-charlie was deleted");
    assert_eq!(status.code(), Code::NotFound);

    // The listing, newest first, with its counters.
    let listed = client
        .list_sessions(pb::ListSessionsRequest {
            page_size: 10,
            ..Default::default()
        })
        .await
        .expect("ListSessions")
        .into_inner();
    assert!(listed.next_page_token.is_empty());
    let summary = |session: pb::Session,
                   messages: i64,
                   calls: i64,
                   (provider, model): (&str, &str),
                   last_cost: i64,
                   tokens: i64,
                   cost: i64| pb::SessionSummary {
        session: Some(session),
        message_count: messages,
        provider_call_count: calls,
        last_model: model.into(),
        last_provider: provider.into(),
        last_cost_micros_usd: last_cost,
        last_request_id: String::new(),
        total_tokens: tokens,
        total_cost_micros_usd: cost,
    };
    assert_eq!(
        listed.sessions,
        vec![
            summary(delta(), 3, 0, ("", ""), 0, 0, 0),
            summary(
                bravo("Bravo renamed", 6, BRAVO_REDACTED, 4),
                4,
                2,
                ("openai", "o4-mini"),
                1100,
                2210,
                5100
            ),
            summary(
                alpha(4, ALPHA_STATE, 6),
                6,
                2,
                ("anthropic", "claude-sonnet-4-5"),
                8250,
                3650,
                15000
            ),
        ]
    );
    let filtered = client
        .list_sessions(pb::ListSessionsRequest {
            filter: r#"metadata.app = "travel""#.into(),
            ..Default::default()
        })
        .await
        .expect("ListSessions with a metadata filter")
        .into_inner();
    let ids: Vec<String> = filtered
        .sessions
        .iter()
        .filter_map(|s| s.session.as_ref().map(|s| s.id.clone()))
        .collect();
    assert_eq!(ids, ["mig-delta", "mig-alpha"]);

    // Messages, whole: bodies, U+0000, tool calls, blocks, redaction.
    assert_eq!(
        all_messages(&mut client, "mig-alpha").await,
        alpha_messages()
    );
    assert_eq!(
        all_messages(&mut client, "mig-bravo").await,
        bravo_messages()
    );
    assert_eq!(
        all_messages(&mut client, "mig-delta").await,
        delta_messages()
    );
    // ExportHistory sends the same messages, encoded from the JSON rows.
    for (session, stored) in [
        ("mig-alpha", alpha_messages()),
        ("mig-bravo", bravo_messages()),
        ("mig-delta", delta_messages()),
    ] {
        assert_eq!(exported(&mut client, session).await, contents(stored));
    }

    // Provider calls: the new buckets 0, no usage object, no duration.
    assert_eq!(
        provider_calls(&mut client, "mig-alpha").await,
        alpha_calls()
    );
    assert_eq!(
        provider_calls(&mut client, "mig-bravo").await,
        bravo_calls()
    );
    assert!(provider_calls(&mut client, "mig-delta").await.is_empty());

    // SummarizeUsage counts the old calls for their tenant and owner (the
    // 0006 backfill); the deleted session's call is gone.
    use pb::UsageGroupBy;
    assert_eq!(
        summarize(&mut client, UsageGroupBy::Unspecified, "").await,
        [usage_row("", 4, 4600, 1260, 20100)]
    );
    assert_eq!(
        summarize(&mut client, UsageGroupBy::User, "").await,
        [
            usage_row("alice", 2, 3200, 450, 15000),
            usage_row("bob", 2, 1400, 810, 5100)
        ]
    );
    assert_eq!(
        summarize(&mut client, UsageGroupBy::Unspecified, "alice").await,
        [usage_row("", 2, 3200, 450, 15000)]
    );
    assert_eq!(
        summarize(&mut client, UsageGroupBy::Model, "").await,
        [
            usage_row("anthropic/claude-sonnet-4-5", 1, 2000, 150, 8250),
            usage_row("openai/gpt-4o-2024-08-06", 1, 1200, 300, 6750),
            usage_row("openai/o4-mini", 2, 1400, 810, 5100),
        ]
    );
    assert_eq!(
        summarize(&mut client, UsageGroupBy::Session, "").await,
        [
            usage_row("mig-alpha", 2, 3200, 450, 15000),
            usage_row("mig-bravo", 2, 1400, 810, 5100)
        ]
    );
    assert_eq!(
        summarize(&mut client, UsageGroupBy::Day, "").await,
        [usage_row("2026-11-26", 4, 4600, 1260, 20100)]
    );

    // State: the session's own and a shared scope's.
    let state = client
        .list_state(pb::ListStateRequest {
            session_id: "mig-alpha".into(),
            ..Default::default()
        })
        .await
        .expect("ListState")
        .into_inner();
    let entry = |key: &str, value: &str, version: i64, time: i64, scope: &str| pb::StateEntry {
        key: key.into(),
        value: value.into(),
        version,
        update_time: at(time),
        scope: scope.into(),
    };
    assert_eq!(
        state.entries,
        [
            entry("cwd", "/home/alice", 1, ALPHA_CREATED, ""),
            entry("step", "booked", 4, ALPHA_STATE, "")
        ]
    );
    let shared = client
        .get_state(pb::GetStateRequest {
            scope: "app:travel".into(),
            key: "currency".into(),
            ..Default::default()
        })
        .await
        .expect("GetState of a shared scope")
        .into_inner();
    assert_eq!(
        shared,
        entry("currency", "NOK", 1, SHARED_STATE, "app:travel")
    );

    // The event logs replay from revision 0, old bodies decoded in full.
    let events = replay(&mut client, "mig-alpha").await;
    let revisions: Vec<i64> = events.iter().map(|e| e.revision).collect();
    assert_eq!(revisions, [1, 2, 3, 4]);
    let times: Vec<_> = events.iter().map(|e| e.time).collect();
    assert_eq!(
        times,
        [
            at(ALPHA_CREATED),
            at(ALPHA_FIRST),
            at(ALPHA_SECOND),
            at(ALPHA_STATE)
        ]
    );
    let messages = alpha_messages();
    let calls = alpha_calls();
    assert_eq!(
        events[0].event,
        Some(Event::SessionCreated(pb::SessionCreated {
            session: Some(alpha(1, ALPHA_CREATED, 2)),
            messages: messages[..2].to_vec(),
            initial_state: vec![entry("cwd", "/home/alice", 1, ALPHA_CREATED, "")],
        }))
    );
    assert_eq!(
        events[1].event,
        Some(Event::ExchangeAppended(pb::ExchangeAppended {
            messages: messages[2..4].to_vec(),
            provider_call: Some(calls[0].clone()),
            run_id: String::new(),
            next_sequence: 4,
            state_changes: vec![pb::StateChange {
                key: "step".into(),
                value: "searching".into(),
                ..Default::default()
            }],
        }))
    );
    assert_eq!(
        events[2].event,
        Some(Event::ExchangeAppended(pb::ExchangeAppended {
            messages: messages[4..].to_vec(),
            provider_call: Some(calls[1].clone()),
            run_id: String::new(),
            next_sequence: 6,
            state_changes: Vec::new(),
        }))
    );
    assert_eq!(
        events[3].event,
        Some(Event::StateChanged(pb::StateChanged {
            key: "step".into(),
            value: "booked".into(),
            version: 4,
            deleted: false,
        }))
    );
    let events = replay(&mut client, "mig-bravo").await;
    let messages = bravo_messages();
    let calls = bravo_calls();
    let changes: Vec<(i64, Option<Event>)> =
        events.into_iter().map(|e| (e.revision, e.event)).collect();
    assert_eq!(
        changes,
        [
            (
                1,
                Some(Event::SessionCreated(pb::SessionCreated {
                    session: Some(bravo("Bravo", 1, BRAVO_CREATED, 0)),
                    messages: Vec::new(),
                    initial_state: Vec::new(),
                }))
            ),
            (
                2,
                Some(Event::ExchangeAppended(pb::ExchangeAppended {
                    messages: messages[..2].to_vec(),
                    provider_call: Some(calls[0].clone()),
                    run_id: String::new(),
                    next_sequence: 2,
                    state_changes: Vec::new(),
                }))
            ),
            (
                3,
                Some(Event::SessionUpdated(pb::SessionUpdated {
                    session: Some(bravo("Bravo renamed", 3, 1_795_677_188_978_239, 2)),
                }))
            ),
            (
                4,
                Some(Event::RunCancelRequested(pb::RunCancelRequested {
                    run_id: "run-b1".into(),
                    reason: "user pressed stop".into(),
                }))
            ),
            (
                5,
                Some(Event::ExchangeAppended(pb::ExchangeAppended {
                    messages: messages[2..].to_vec(),
                    provider_call: Some(calls[1].clone()),
                    run_id: "run-b1".into(),
                    next_sequence: 4,
                    state_changes: Vec::new(),
                }))
            ),
            (
                6,
                Some(Event::MessageRedacted(pb::MessageRedacted {
                    message_id: BRAVO_MESSAGES[0].into(),
                    sequence: 0,
                    reason: "pii".into(),
                }))
            ),
        ]
    );

    // What the old server recorded once answers as it did: the retried
    // exchange by its idempotency key (the stored fingerprint), the
    // repeated cancel by run_cancels.
    let retried = client
        .append_exchange(pb::AppendExchangeRequest {
            session_id: "mig-alpha".into(),
            messages: vec![said(pb::Role::User, "Book a flight to Oslo")],
            provider_call: Some(pb::ProviderCall {
                request_id: "gw-1".into(),
                provider: "openai".into(),
                model: "gpt-4o-2024-08-06".into(),
                requested_provider: "openai".into(),
                requested_model: "gpt-4o".into(),
                prompt_tokens: 1200,
                completion_tokens: 300,
                total_tokens: 1500,
                cost_micros_usd: 6750,
                ..Default::default()
            }),
            response_messages: vec![pb::Message {
                role: pb::Role::Assistant.into(),
                tool_calls: vec![pb::ToolCall {
                    id: "call_1".into(),
                    name: "search_flights".into(),
                    arguments: r#"{"to":"OSL"}"#.into(),
                    signature: String::new(),
                }],
                ..Default::default()
            }],
            request_id: "idem-alpha-1".into(),
            state_changes: vec![pb::StateChange {
                key: "step".into(),
                value: "searching".into(),
                ..Default::default()
            }],
            ..Default::default()
        })
        .await
        .expect("the retried exchange")
        .into_inner();
    assert_eq!(retried.revision, 2);
    assert_eq!(retried.messages, alpha_messages()[2..4]);
    assert_eq!(retried.provider_call, Some(alpha_calls()[0].clone()));
    assert_eq!(retried.next_sequence, 4);
    let cancelled = client
        .cancel_run(pb::CancelRunRequest {
            session_id: "mig-bravo".into(),
            run_id: "run-b1".into(),
            reason: "again".into(),
        })
        .await
        .expect("the repeated CancelRun")
        .into_inner();
    assert_eq!(cancelled.revision, 4);

    // Search finds the old messages, through the index the server rebuilt
    // from them (on SQLite in a file of its own; on PostgreSQL after 0018
    // emptied it, with the words the server splits).
    let hits = loop {
        let searched = client
            .search_messages(pb::SearchMessagesRequest {
                query: "Oslo".into(),
                ..Default::default()
            })
            .await;
        match searched {
            Ok(answer) => break answer.into_inner().hits,
            Err(status) if status.code() == Code::Unavailable => continue,
            Err(status) => panic!("SearchMessages: {status:?}"),
        }
    };
    let mut found: Vec<(String, i64, String, String)> = hits
        .into_iter()
        .map(|h| (h.session_id, h.sequence, h.message_id, h.session_title))
        .collect();
    found.sort();
    let title = "Trip \\ plans\0v2".to_owned();
    assert_eq!(
        found,
        [
            (
                "mig-alpha".into(),
                2,
                ALPHA_MESSAGES[2].into(),
                title.clone()
            ),
            ("mig-delta".into(), 2, DELTA_MESSAGES[2].into(), title),
        ]
    );

    // The old events were read as the old server wrote them.
    assert_eq!(old.encoded_events().await, []);

    // The migrated database takes new writes beside the old rows.
    let appended = client
        .append_exchange(pb::AppendExchangeRequest {
            session_id: "mig-alpha".into(),
            messages: vec![said(pb::Role::User, "And back?")],
            provider_call: Some(pb::ProviderCall {
                provider: "openai".into(),
                model: "o4-mini".into(),
                prompt_tokens: 100,
                cached_input_tokens: 60,
                completion_tokens: 40,
                reasoning_tokens: 30,
                cost_micros_usd: 500,
                ..Default::default()
            }),
            response_messages: vec![said(pb::Role::Assistant, "SK124.")],
            ..Default::default()
        })
        .await
        .expect("a new exchange on an old session")
        .into_inner();
    assert_eq!((appended.revision, appended.next_sequence), (5, 8));
    assert_eq!(
        summarize(&mut client, UsageGroupBy::Unspecified, "alice").await,
        [pb::UsageRow {
            cached_input_tokens: 60,
            reasoning_tokens: 30,
            ..usage_row("", 3, 3300, 490, 15500)
        }]
    );
    let created = client
        .create_session(pb::CreateSessionRequest {
            session_id: "mig-charlie".into(),
            user: "carol".into(),
            ..Default::default()
        })
        .await
        .expect("the deleted session's id, taken again")
        .into_inner();
    assert_eq!(created.revision, 1);

    // New events are stored encoded (0013): the append (mig-alpha, key 1)
    // and the new session (the next key, 5).
    assert_eq!(old.encoded_events().await, [(1, 5), (5, 1)]);
    // The append refers to its messages for their content (0016); no
    // event an older server wrote does.
    assert_eq!(old.referring_events().await, [(1, 5)]);
    // Its messages are stored encoded (0017); the old ones keep their JSON.
    assert_eq!(old.encoded_messages().await, [(1, 6), (1, 7)]);
    // An export of both kinds of row sends what ListMessages lists.
    let listed = all_messages(&mut client, "mig-alpha").await;
    assert_eq!(listed.len(), 8);
    assert_eq!(exported(&mut client, "mig-alpha").await, contents(listed));

    // A redaction erases a message from the old event that carries it,
    // which is stored encoded from then on, and the replay still holds
    // every event in order.
    let redacted = client
        .redact_message(pb::RedactMessageRequest {
            session_id: "mig-alpha".into(),
            message_id: ALPHA_MESSAGES[2].into(),
            reason: "pii".into(),
            ..Default::default()
        })
        .await
        .expect("RedactMessage on an old message")
        .into_inner();
    assert_eq!(redacted.revision, 6);
    assert_eq!(old.encoded_events().await, [(1, 2), (1, 5), (1, 6), (5, 1)]);
    // The redacted message's marker is stored encoded.
    assert_eq!(old.encoded_messages().await, [(1, 2), (1, 6), (1, 7)]);
    let events = replay(&mut client, "mig-alpha").await;
    assert_eq!(
        events.iter().map(|e| e.revision).collect::<Vec<_>>(),
        [1, 2, 3, 4, 5, 6]
    );
    let Some(Event::ExchangeAppended(exchange)) = &events[1].event else {
        panic!("revision 2 is the first exchange: {:?}", events[1]);
    };
    let erased = &exchange.messages[0];
    assert_eq!(erased.id, ALPHA_MESSAGES[2]);
    assert!(erased.redacted);
    assert_eq!(
        erased.message.as_ref().map(|m| m.content.as_str()),
        Some("")
    );
    assert_eq!(exchange.messages[1], alpha_messages()[3]);
    assert!(!format!("{events:?}").contains("Book a flight"));

    // 0019: the old key stays in the index by session, now partial on
    // it; a new exchange's key is found through its event, which names
    // it, and stays out of that index. On SQLite the keys lost their
    // foreign key.
    let indexes = old.indexes("idempotency_keys").await;
    assert!(
        indexes.contains(&"idempotency_keys_without_event_by_session".to_owned())
            && !indexes.contains(&"idempotency_keys_by_session".to_owned()),
        "{indexes:?}"
    );
    if dialect == Dialect::Sqlite {
        assert_eq!(
            old.rows::<(i64,)>("SELECT count(*) FROM pragma_foreign_key_list('idempotency_keys')")
                .await,
            [(0,)]
        );
    }
    for (session, request_id, revision) in [
        ("mig-alpha", "idem-alpha-2", 7),
        ("mig-bravo", "idem-bravo-1", 7),
    ] {
        let appended = client
            .append_exchange(pb::AppendExchangeRequest {
                session_id: session.into(),
                messages: vec![said(pb::Role::User, "A hotel too?")],
                request_id: request_id.into(),
                ..Default::default()
            })
            .await
            .expect("a keyed exchange")
            .into_inner();
        assert_eq!(appended.revision, revision);
    }
    let keys = "SELECT request_id, session_key, found_through_event FROM idempotency_keys \
                ORDER BY 1";
    assert_eq!(
        old.rows::<(String, i64, i64)>(keys).await,
        [
            ("idem-alpha-1".to_owned(), 1, 0),
            ("idem-alpha-2".to_owned(), 1, 1),
            ("idem-bravo-1".to_owned(), 2, 1),
        ]
    );
    assert_eq!(
        old.rows::<(i64, i64, String)>(
            "SELECT session_key, revision, request_id FROM events \
             WHERE request_id IS NOT NULL ORDER BY 1, 2"
        )
        .await,
        [
            (1, 7, "idem-alpha-2".to_owned()),
            (2, 7, "idem-bravo-1".to_owned())
        ]
    );
    // Deleting a session deletes both kinds of its keys; erasing a user
    // deletes those of the user's sessions.
    client
        .delete_session(pb::DeleteSessionRequest {
            session_id: "mig-alpha".into(),
        })
        .await
        .expect("DeleteSession");
    assert_eq!(
        old.rows::<(String, i64, i64)>(keys).await,
        [("idem-bravo-1".to_owned(), 2, 1)]
    );
    client
        .erase_user(pb::EraseUserRequest {
            user: "bob".into(),
            scopes: Vec::new(),
        })
        .await
        .expect("EraseUser");
    assert_eq!(old.rows::<(String, i64, i64)>(keys).await, []);
}
