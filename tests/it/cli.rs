//! The `sessionstore` binary's commands and configuration, run for real.

use std::process::Command;

use sqlx::Connection as _;

use crate::support::{PgDatabase, postgres_available, sessionstore_binary};

#[test]
fn migrate_creates_the_sqlite_schema_and_its_directory() {
    let binary = sessionstore_binary();
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("nested/dir/sessions.db");
    let output = Command::new(&binary)
        .args(["migrate", "--database-url"])
        .arg(format!("sqlite://{}", db.display()))
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    assert!(db.exists(), "migrate creates the file and its directory");

    // Idempotent, and configurable through the environment alone.
    let again = Command::new(&binary)
        .arg("migrate")
        .env(
            "SESSIONSTORE_DATABASE_URL",
            format!("sqlite://{}", db.display()),
        )
        .output()
        .unwrap();
    assert!(again.status.success(), "{again:?}");

    let runtime = tokio::runtime::Runtime::new().unwrap();
    let tables: Vec<String> = runtime.block_on(async {
        let mut conn = sqlx::SqliteConnection::connect(&format!("sqlite://{}", db.display()))
            .await
            .unwrap();
        sqlx::query_scalar("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
            .fetch_all(&mut conn)
            .await
            .unwrap()
    });
    assert_core_tables(&tables);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_creates_the_postgres_schema() {
    if !postgres_available("cli::migrate_creates_the_postgres_schema").await {
        return;
    }
    let binary = sessionstore_binary();
    let db = PgDatabase::create().await;
    let output = tokio::process::Command::new(&binary)
        .args(["migrate", "--database-url", &db.url])
        .output()
        .await
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let mut conn = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT table_name::text FROM information_schema.tables WHERE table_schema = 'public'",
    )
    .fetch_all(&mut conn)
    .await
    .unwrap();
    conn.close().await.unwrap();
    assert_core_tables(&tables);
}

#[test]
fn an_unsupported_database_url_fails_at_start_with_a_clear_message() {
    let output = Command::new(sessionstore_binary())
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--database-url",
            "mysql://x/y",
        ])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let log = String::from_utf8_lossy(&output.stdout) + String::from_utf8_lossy(&output.stderr);
    assert!(log.contains("unsupported database URL"), "{log}");
}

#[test]
fn help_names_every_setting_and_its_environment_variable() {
    let output = Command::new(sessionstore_binary())
        .args(["serve", "--help"])
        .output()
        .unwrap();
    assert!(output.status.success());
    let help = String::from_utf8_lossy(&output.stdout);
    for name in [
        "--listen",
        "SESSIONSTORE_LISTEN",
        "--database-url",
        "SESSIONSTORE_DATABASE_URL",
        "127.0.0.1:50051",
        "sqlite://data/sessionstore.db",
    ] {
        assert!(help.contains(name), "{name} missing from help:\n{help}");
    }
}

/// The schema holds every table the core service needs.
fn assert_core_tables(tables: &[String]) {
    for table in [
        "events",
        "idempotency_keys",
        "messages",
        "provider_calls",
        "sessions",
    ] {
        assert!(
            tables.iter().any(|t| t == table),
            "{table} missing from {tables:?}"
        );
    }
}
