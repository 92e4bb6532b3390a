//! The migration ledger and the replica registry, through the real binary:
//! `migrate --check`'s lines and exit codes, `migrate` and `--finalize`,
//! the refusal of a database finalized past the binary (`serve` too), the
//! registry `serve` keeps and `replicas` lists, and concurrent migrates.

use std::time::Duration;

use sqlx::Connection as _;

use crate::support::{PgDatabase, ServerProcess, sessionstore_binary};

/// PostgreSQL's schema (the highest version the binary ships): sqlx's
/// 1–19, then the ledger's 20 (the replica registry) to 23.
const POSTGRES_SCHEMA: i64 = 23;
/// SQLite's: sqlx's up to 19, then the ledger's 21 to 23 (20 is
/// PostgreSQL's).
const SQLITE_SCHEMA: i64 = 23;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Dialect {
    Sqlite,
    Postgres,
}

/// A database of the test's own, removed when dropped.
struct Db {
    dialect: Dialect,
    url: String,
    _dir: Option<tempfile::TempDir>,
    _pg: Option<PgDatabase>,
}

impl Db {
    /// A database nothing has been applied to (a SQLite file not yet there).
    async fn fresh(dialect: Dialect) -> Db {
        match dialect {
            Dialect::Sqlite => {
                let dir = tempfile::tempdir().unwrap();
                Db {
                    dialect,
                    url: format!("sqlite://{}/ledger.db", dir.path().display()),
                    _dir: Some(dir),
                    _pg: None,
                }
            }
            Dialect::Postgres => {
                let pg = PgDatabase::create().await;
                Db {
                    dialect,
                    url: pg.url.clone(),
                    _dir: None,
                    _pg: Some(pg),
                }
            }
        }
    }

    fn schema(&self) -> i64 {
        match self.dialect {
            Dialect::Sqlite => SQLITE_SCHEMA,
            Dialect::Postgres => POSTGRES_SCHEMA,
        }
    }

    /// Runs `sql` (one statement) on the database.
    async fn execute(&self, sql: &str) {
        match self.dialect {
            Dialect::Sqlite => {
                let mut conn = sqlx::SqliteConnection::connect(&self.url).await.unwrap();
                sqlx::query(sql).execute(&mut conn).await.unwrap();
                conn.close().await.unwrap();
            }
            Dialect::Postgres => {
                let mut conn = sqlx::PgConnection::connect(&self.url).await.unwrap();
                sqlx::query(sql).execute(&mut conn).await.unwrap();
                conn.close().await.unwrap();
            }
        }
    }

    /// One column of `sql`'s rows, as 64-bit integers.
    async fn integers(&self, sql: &str) -> Vec<i64> {
        match self.dialect {
            Dialect::Sqlite => {
                let mut conn = sqlx::SqliteConnection::connect(&self.url).await.unwrap();
                let values = sqlx::query_scalar(sql).fetch_all(&mut conn).await.unwrap();
                conn.close().await.unwrap();
                values
            }
            Dialect::Postgres => {
                let mut conn = sqlx::PgConnection::connect(&self.url).await.unwrap();
                let values = sqlx::query_scalar(sql).fetch_all(&mut conn).await.unwrap();
                conn.close().await.unwrap();
                values
            }
        }
    }

    /// One column of `sql`'s rows, as text.
    async fn texts(&self, sql: &str) -> Vec<String> {
        assert_eq!(self.dialect, Dialect::Postgres);
        let mut conn = sqlx::PgConnection::connect(&self.url).await.unwrap();
        let values = sqlx::query_scalar(sql).fetch_all(&mut conn).await.unwrap();
        conn.close().await.unwrap();
        values
    }
}

/// What one run of the binary did.
#[derive(Debug)]
struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// Runs `sessionstore ARGS` to its end (at most a minute).
async fn sessionstore(args: &[&str]) -> Run {
    let output = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::process::Command::new(sessionstore_binary())
            .args(args)
            .env_remove("SESSIONSTORE_DATABASE_URL")
            .env_remove("SESSIONSTORE_AUTH_TOKENS")
            .env("SESSIONSTORE_LOG", "info")
            .env("NO_COLOR", "1")
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("sessionstore ends within a minute")
    .expect("run sessionstore");
    Run {
        code: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

async fn check(db: &Db) -> Run {
    sessionstore(&["migrate", "--check", "--database-url", &db.url]).await
}

async fn migrate(db: &Db) -> Run {
    sessionstore(&["migrate", "--database-url", &db.url]).await
}

async fn finalize(db: &Db) -> Run {
    sessionstore(&["migrate", "--finalize", "--database-url", &db.url]).await
}

/// A fresh database has every migration pending, all expand: 10, one
/// line each; `migrate` applies them; then 0 and nothing printed.
async fn check_then_migrate(dialect: Dialect) {
    let db = Db::fresh(dialect).await;
    let before = check(&db).await;
    assert_eq!(before.code, Some(10), "{before:?}");
    let lines: Vec<&str> = before.stdout.lines().collect();
    assert_eq!(lines.first().copied(), Some("1 expand core"), "{before:?}");
    let last = match dialect {
        Dialect::Sqlite | Dialect::Postgres => "23 expand queued input",
    };
    assert_eq!(lines.last().copied(), Some(last), "{before:?}");
    for line in &lines {
        let mut parts = line.splitn(3, ' ');
        let version = parts.next().unwrap_or_default();
        assert!(version.parse::<i64>().is_ok(), "{line}");
        assert_eq!(parts.next(), Some("expand"), "{line}");
        assert!(parts.next().is_some_and(|d| !d.is_empty()), "{line}");
    }
    assert!(before.stderr.is_empty(), "{before:?}");
    if dialect == Dialect::Sqlite {
        // --check creates nothing.
        let path = db.url.trim_start_matches("sqlite://");
        assert!(!std::path::Path::new(path).exists(), "{path} was created");
    }

    let migrated = migrate(&db).await;
    assert_eq!(migrated.code, Some(0), "{migrated:?}");

    let after = check(&db).await;
    assert_eq!(after.code, Some(0), "{after:?}");
    assert_eq!(after.stdout, "", "{after:?}");

    // sqlx's ledger keeps its versions only; later ones are in ours.
    let sqlx = db
        .integers("SELECT version FROM _sqlx_migrations ORDER BY version")
        .await;
    assert_eq!(sqlx.last().copied(), Some(19), "{sqlx:?}");
    let ledger = db
        .integers("SELECT version FROM sessionstore_migrations ORDER BY version")
        .await;
    match dialect {
        Dialect::Sqlite => assert_eq!(ledger, [21, 22, 23]),
        Dialect::Postgres => {
            assert_eq!(ledger, [20, 21, 22, 23]);
            let kinds = db
                .texts(
                    "SELECT kind || ' ' || description FROM sessionstore_migrations \
                     ORDER BY version",
                )
                .await;
            assert_eq!(
                kinds,
                [
                    "expand replica registry",
                    "expand idempotent replies",
                    "expand approvals",
                    "expand queued input"
                ]
            );
        }
    }

    // Again: nothing to apply, 0.
    let again = migrate(&db).await;
    assert_eq!(again.code, Some(0), "{again:?}");
    let finalized = finalize(&db).await;
    assert_eq!(finalized.code, Some(0), "{finalized:?}");
}

/// The stderr of a refusal: one line naming `version` and the schema.
fn assert_one_line_naming(run: &Run, version: i64, schema: i64) {
    let lines: Vec<&str> = run.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "one line on stderr: {run:?}");
    assert!(
        lines[0].contains(&version.to_string()) && lines[0].contains(&format!("schema {schema}")),
        "names {version} and schema {schema}: {run:?}"
    );
}

/// A finalize migration past the binary's schema: `--check`, `migrate`
/// and `serve` all exit 12 with one line on stderr, and apply nothing.
async fn finalized_past_is_refused(dialect: Dialect) {
    let db = Db::fresh(dialect).await;
    assert_eq!(migrate(&db).await.code, Some(0));
    db.execute(
        "INSERT INTO sessionstore_migrations (version, kind, description) \
         VALUES (9999, 'finalize', 'from a later release')",
    )
    .await;
    let schema = db.schema();

    let checked = check(&db).await;
    assert_eq!(checked.code, Some(12), "{checked:?}");
    assert_one_line_naming(&checked, 9999, schema);

    let migrated = migrate(&db).await;
    assert_eq!(migrated.code, Some(12), "{migrated:?}");
    assert_one_line_naming(&migrated, 9999, schema);

    let finalized = finalize(&db).await;
    assert_eq!(finalized.code, Some(12), "{finalized:?}");
    assert_one_line_naming(&finalized, 9999, schema);

    let served = sessionstore(&[
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--database-url",
        &db.url,
    ])
    .await;
    assert_eq!(served.code, Some(12), "{served:?}");
    assert_one_line_naming(&served, 9999, schema);
    assert!(
        !served.stdout.contains("sessionstore serving"),
        "{served:?}"
    );
    if dialect == Dialect::Postgres {
        let registered = db
            .integers("SELECT count(*) FROM sessionstore_replicas")
            .await;
        assert_eq!(registered, [0], "a refused serve never registers");
    }
}

/// An applied expand migration the binary does not know is no reason to
/// refuse: nothing pending, and it serves.
async fn unknown_expand_is_not_refused(dialect: Dialect) {
    let db = Db::fresh(dialect).await;
    assert_eq!(migrate(&db).await.code, Some(0));
    db.execute(
        "INSERT INTO sessionstore_migrations (version, kind, description) \
         VALUES (9999, 'expand', 'from a later release')",
    )
    .await;
    let checked = check(&db).await;
    assert_eq!(checked.code, Some(0), "{checked:?}");
    assert_eq!(checked.stdout, "", "{checked:?}");
    let migrated = migrate(&db).await;
    assert_eq!(migrated.code, Some(0), "{migrated:?}");
    let dir = tempfile::tempdir().unwrap();
    let mut server = ServerProcess::start(
        &sessionstore_binary(),
        &db.url,
        "127.0.0.1:0",
        dir.path().join("server.log"),
        &[],
    )
    .await;
    assert!(server.terminate().await.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_check_is_ten_until_migrated() {
    check_then_migrate(Dialect::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_finalized_past_the_binary_is_refused_with_twelve() {
    finalized_past_is_refused(Dialect::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_an_unknown_expand_migration_is_not_refused() {
    unknown_expand_is_not_refused(Dialect::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_has_no_replica_registry() {
    let db = Db::fresh(Dialect::Sqlite).await;
    let listed = sessionstore(&["replicas", "--database-url", &db.url]).await;
    assert_ne!(listed.code, Some(0), "{listed:?}");
    assert!(listed.stderr.contains("no replica registry"), "{listed:?}");
    assert_eq!(listed.stdout, "", "{listed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_of_an_unreachable_database_exits_one() {
    // A port nothing listens on: bound, then released.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("postgres://postgres@127.0.0.1:{port}/nowhere");
    let checked = sessionstore(&["migrate", "--check", "--database-url", &url]).await;
    assert_eq!(checked.code, Some(1), "{checked:?}");
    assert_eq!(checked.stderr.lines().count(), 1, "{checked:?}");
    let listed = sessionstore(&["replicas", "--database-url", &url]).await;
    assert_eq!(listed.code, Some(1), "{listed:?}");
}

async fn postgres_check_is_ten_until_migrated() {
    check_then_migrate(Dialect::Postgres).await;
}

async fn postgres_finalized_past_the_binary_is_refused_with_twelve() {
    finalized_past_is_refused(Dialect::Postgres).await;
}

async fn postgres_an_unknown_expand_migration_is_not_refused() {
    unknown_expand_is_not_refused(Dialect::Postgres).await;
}

/// Live replicas, oldest start first, each with the six columns; a stale
/// row is left out; a served replica heartbeats and leaves on SIGTERM.
async fn replicas_lists_the_live_ones() {
    let db = Db::fresh(Dialect::Postgres).await;
    // Nothing migrated yet: no registry, no replicas, no error.
    let empty = sessionstore(&["replicas", "--database-url", &db.url, "--format", "json"]).await;
    assert_eq!(empty.code, Some(0), "{empty:?}");
    assert_eq!(empty.stdout.trim(), "[]", "{empty:?}");

    let binary = sessionstore_binary();
    let dir = tempfile::tempdir().unwrap();
    let mut server = ServerProcess::start(
        &binary,
        &db.url,
        "127.0.0.1:0",
        dir.path().join("a.log"),
        &[],
    )
    .await;
    // A row another tool wrote, started earlier and live; a stale one.
    db.execute(
        "INSERT INTO sessionstore_replicas \
         (replica_id, version, schema, address, start_time, heartbeat_time) \
         VALUES ('tool-replica', 'sessionstore 0.0.1', 19, '10.9.8.7:50051', \
                 now() - interval '1 hour', now() + interval '1 minute')",
    )
    .await;
    db.execute(
        "INSERT INTO sessionstore_replicas \
         (replica_id, version, schema, address, start_time, heartbeat_time) \
         VALUES ('stale-replica', 'sessionstore 0.0.1', 19, '10.9.8.6:50051', \
                 now() - interval '2 hours', now() - interval '21 seconds')",
    )
    .await;

    let listed = sessionstore(&["replicas", "--database-url", &db.url, "--format", "json"]).await;
    assert_eq!(listed.code, Some(0), "{listed:?}");
    let rows: serde_json::Value = serde_json::from_str(&listed.stdout).expect("JSON");
    let rows = rows.as_array().expect("an array");
    assert_eq!(rows.len(), 2, "{rows:?}");
    for row in rows {
        let mut keys: Vec<&str> = row
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            [
                "address",
                "heartbeat_time",
                "replica_id",
                "schema",
                "start_time",
                "version"
            ]
        );
        for time in ["start_time", "heartbeat_time"] {
            let text = row[time].as_str().unwrap();
            assert!(
                text.len() >= 20 && &text[10..11] == "T" && text.ends_with('Z'),
                "{time} is RFC 3339: {text}"
            );
        }
    }
    assert_eq!(rows[0]["replica_id"], "tool-replica");
    assert_eq!(rows[0]["schema"], 19);
    let ours = &rows[1];
    assert_eq!(ours["address"], format!("127.0.0.1:{}", server.port));
    assert_eq!(ours["schema"], POSTGRES_SCHEMA);
    let version = std::process::Command::new(&binary)
        .arg("--version")
        .output()
        .unwrap();
    assert_eq!(
        ours["version"],
        String::from_utf8_lossy(&version.stdout).trim(),
        "the version --version prints"
    );
    let id = ours["replica_id"].as_str().unwrap().to_owned();

    // Text: a header and one aligned line each.
    let text = sessionstore(&["replicas", "--database-url", &db.url]).await;
    assert_eq!(text.code, Some(0), "{text:?}");
    let lines: Vec<&str> = text.stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{text:?}");
    assert!(lines[0].starts_with("REPLICA_ID"), "{text:?}");
    assert!(lines[1].starts_with("tool-replica"), "{text:?}");
    assert!(lines[2].starts_with(&id), "{text:?}");
    assert_eq!(lines[1].find("sessionstore"), lines[2].find("sessionstore"));

    // It heartbeats (by the database's clock, every 2 s).
    let beat = |db: &Db, id: String| {
        let sql = format!(
            "SELECT CAST(extract(epoch FROM heartbeat_time) * 1000000 AS BIGINT) \
             FROM sessionstore_replicas WHERE replica_id = '{id}'"
        );
        let db_url = db.url.clone();
        async move {
            let mut conn = sqlx::PgConnection::connect(&db_url).await.unwrap();
            let value: i64 = sqlx::query_scalar(&sql).fetch_one(&mut conn).await.unwrap();
            conn.close().await.unwrap();
            value
        }
    };
    let first = beat(&db, id.clone()).await;
    tokio::time::sleep(Duration::from_millis(4500)).await;
    let second = beat(&db, id.clone()).await;
    assert!(second > first, "the heartbeat moved: {first} → {second}");

    // A clean shutdown removes its row.
    assert!(server.terminate().await.success());
    let left = db
        .integers(&format!(
            "SELECT count(*) FROM sessionstore_replicas WHERE replica_id = '{id}'"
        ))
        .await;
    assert_eq!(left, [0], "deregistered on SIGTERM");
    let after = sessionstore(&["replicas", "--database-url", &db.url, "--format", "json"]).await;
    let rows: serde_json::Value = serde_json::from_str(&after.stdout).expect("JSON");
    assert_eq!(rows.as_array().map(Vec::len), Some(1), "{after:?}");
}

/// `--finalize` applies nothing while a live replica runs an older
/// schema (13, naming it); once its row is stale, it applies everything.
async fn finalize_waits_for_older_replicas() {
    let db = Db::fresh(Dialect::Postgres).await;
    // A registry an older tool made, on a database nothing migrated.
    db.execute(
        "CREATE TABLE sessionstore_replicas (replica_id TEXT PRIMARY KEY, version TEXT NOT NULL, \
         schema BIGINT NOT NULL, address TEXT NOT NULL, \
         start_time TIMESTAMPTZ NOT NULL DEFAULT now(), \
         heartbeat_time TIMESTAMPTZ NOT NULL DEFAULT now())",
    )
    .await;
    db.execute(
        "INSERT INTO sessionstore_replicas (replica_id, version, schema, address, heartbeat_time) \
         VALUES ('old-replica', 'sessionstore 0.0.9 (0123abc)', 19, '10.1.2.3:50051', \
                 now() + interval '1 minute'), \
                ('same-replica', 'sessionstore 0.2.0', 23, '10.1.2.4:50051', \
                 now() + interval '1 minute'), \
                ('gone-replica', 'sessionstore 0.0.8', 18, '10.1.2.5:50051', \
                 now() - interval '30 seconds')",
    )
    .await;
    let refused = finalize(&db).await;
    assert_eq!(refused.code, Some(13), "{refused:?}");
    let lines: Vec<&str> = refused.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{refused:?}");
    for part in [
        "old-replica",
        "10.1.2.3:50051",
        "sessionstore 0.0.9 (0123abc)",
    ] {
        assert!(lines[0].contains(part), "{part}: {refused:?}");
    }
    for absent in ["same-replica", "gone-replica"] {
        assert!(!lines[0].contains(absent), "{absent}: {refused:?}");
    }
    // Nothing applied.
    let tables = db
        .integers(
            "SELECT count(*) FROM pg_tables WHERE schemaname = current_schema() \
             AND tablename IN ('_sqlx_migrations', 'sessionstore_migrations', 'sessions')",
        )
        .await;
    assert_eq!(tables, [0], "applied nothing");
    // A plain migrate does not read the registry.
    assert_eq!(migrate(&db).await.code, Some(0));
    // Still refused with nothing pending.
    let again = finalize(&db).await;
    assert_eq!(again.code, Some(13), "{again:?}");

    db.execute(
        "UPDATE sessionstore_replicas SET heartbeat_time = now() - interval '20 seconds' \
         WHERE replica_id = 'old-replica'",
    )
    .await;
    let finalized = finalize(&db).await;
    assert_eq!(finalized.code, Some(0), "{finalized:?}");
    assert_eq!(check(&db).await.code, Some(0));
}

/// Four `migrate`s of one fresh database at once: all succeed, and each
/// version is recorded once.
async fn concurrent_migrates_apply_each_version_once() {
    let db = Db::fresh(Dialect::Postgres).await;
    let runs = futures_util::future::join_all((0..4).map(|_| migrate(&db))).await;
    for run in &runs {
        assert_eq!(run.code, Some(0), "{run:?}");
    }
    let sqlx = db
        .integers("SELECT version FROM _sqlx_migrations ORDER BY version")
        .await;
    let expected: Vec<i64> = (1..=19).filter(|v| *v != 9).collect();
    assert_eq!(sqlx, expected);
    let ledger = db
        .integers("SELECT version FROM sessionstore_migrations ORDER BY version")
        .await;
    assert_eq!(ledger, [20, 21, 22, 23]);
    assert_eq!(check(&db).await.code, Some(0));
}

crate::postgres_tests!(
    postgres_check_is_ten_until_migrated,
    postgres_finalized_past_the_binary_is_refused_with_twelve,
    postgres_an_unknown_expand_migration_is_not_refused,
    replicas_lists_the_live_ones,
    finalize_waits_for_older_replicas,
    concurrent_migrates_apply_each_version_once,
);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_finalize_applies_everything() {
    let db = Db::fresh(Dialect::Sqlite).await;
    let finalized = finalize(&db).await;
    assert_eq!(finalized.code, Some(0), "{finalized:?}");
    assert_eq!(check(&db).await.code, Some(0));
}
