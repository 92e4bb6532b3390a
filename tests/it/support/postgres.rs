//! The PostgreSQL the tests use: where it is, whether it answers, and a
//! database of its own per test.

/// The PostgreSQL server tests create their databases on.
pub fn postgres_admin_url() -> String {
    std::env::var("SESSIONSTORE_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned())
}

/// Whether PostgreSQL tests can run. Without a server the test fails,
/// saying how to provide one, unless `SESSIONSTORE_TEST_SKIP` names
/// `postgres`: then it is skipped, saying so (see [`super::prereq`]).
pub async fn postgres_available(test: &str) -> bool {
    use sqlx::Connection as _;
    let url = postgres_admin_url();
    match sqlx::PgConnection::connect(&url).await {
        Ok(conn) => {
            let _ = conn.close().await;
            true
        }
        Err(error) => {
            super::prereq::missing(
                super::prereq::Prerequisite::Postgres,
                test,
                &super::prereq::postgres_unreachable(&url, &error),
            );
            false
        }
    }
}

/// A database created for one test and dropped after it.
pub struct PgDatabase {
    pub url: String,
    name: String,
}

impl PgDatabase {
    pub async fn create() -> PgDatabase {
        use sqlx::Connection as _;
        let admin = postgres_admin_url();
        let name = format!(
            "sessionstore_test_{}_{}",
            std::process::id(),
            NEXT_DB.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        let mut conn = match sqlx::PgConnection::connect(&admin).await {
            Ok(conn) => conn,
            Err(error) => {
                // A test that reaches here (no `postgres_available` first)
                // has no way to skip: it fails, opted out or not.
                let test = super::prereq::current_test();
                let missing = super::prereq::postgres_unreachable(&admin, &error);
                let postgres = super::prereq::Prerequisite::Postgres;
                if !postgres.skipped_by_choice() {
                    super::prereq::missing(postgres, &test, &missing);
                }
                panic!(
                    "{test}: {missing}; SESSIONSTORE_TEST_SKIP names postgres, \
                     but this test has no way to skip"
                );
            }
        };
        sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
            .execute(&mut conn)
            .await
            .expect("drop stale test database");
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(&mut conn)
            .await
            .expect("create test database");
        let _ = conn.close().await;
        let base = admin.rsplit_once('/').map_or(admin.as_str(), |(b, _)| b);
        PgDatabase {
            url: format!("{base}/{name}"),
            name,
        }
    }
}

static NEXT_DB: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

impl Drop for PgDatabase {
    fn drop(&mut self) {
        let name = self.name.clone();
        // Drop runs inside a runtime; do the async cleanup on a thread of its own.
        let done = std::thread::spawn(move || {
            use sqlx::Connection as _;
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(async {
                if let Ok(mut conn) = sqlx::PgConnection::connect(&postgres_admin_url()).await {
                    let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                        .execute(&mut conn)
                        .await;
                    let _ = conn.close().await;
                }
            });
        });
        let _ = done.join();
    }
}

/// Terminates every LISTEN connection to `database`; returns how many.
pub async fn kill_listeners(conn: &mut sqlx::PgConnection, database: &str) -> usize {
    let killed: Vec<bool> = sqlx::query_scalar(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE datname = $1 AND query ILIKE 'LISTEN%' AND pid <> pg_backend_pid()",
    )
    .bind(database)
    .fetch_all(conn)
    .await
    .expect("terminate LISTEN backends");
    killed.into_iter().filter(|k| *k).count()
}

// ---------------------------------------------------------------------------
// Bearer tokens
