//! SQLite's side of the migration ledger (`store/ledger/`): reading what a
//! database has applied, and applying a plan. Each ledger migration runs
//! in a `BEGIN IMMEDIATE` transaction with its ledger row, after checking
//! the row is not there: two processes migrating one file apply it once.

use sqlx::{AnyConnection, AnyPool, Connection as _, Executor as _};

use super::{MIGRATOR, connections};
use crate::store::OpenError;
use crate::store::ledger::{
    self, Applied, Checked, Known, LedgerMigration, Mode, PendingMigration, RECORD, Source,
    pending_migration,
};

/// Every migration a SQLite binary knows.
fn known() -> Vec<Known> {
    ledger::known(&MIGRATOR, ledger::SQLITE)
}

/// This binary's SQLite schema.
pub(in crate::store) fn schema() -> i64 {
    known().iter().map(|m| m.version).max().unwrap_or(0)
}

/// Counts the main database's tables named `$1`.
const TABLE_EXISTS: &str = "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = $1";

/// What the database has applied.
async fn applied(conn: &mut AnyConnection) -> Result<Applied, sqlx::Error> {
    ledger::applied(conn, TABLE_EXISTS).await
}

/// `migrate --check`: reads, applies and creates nothing.
pub(in crate::store) async fn check(url: &str) -> Result<Checked, OpenError> {
    let applied = match connections::inspection(url).await? {
        Some(mut conn) => {
            let applied = applied(&mut conn).await;
            let _ = conn.close().await;
            applied?
        }
        None => Applied::default(),
    };
    let plan = ledger::plan(known(), &applied);
    Ok(Checked {
        status: plan.status(),
        pending: plan.pending(),
        refusal: plan.refusal(),
    })
}

/// Applies what `mode` applies, refusing a database finalized past this
/// binary; returns what it applied.
pub(in crate::store) async fn migrate(
    pool: &AnyPool,
    mode: Mode,
) -> Result<Vec<PendingMigration>, OpenError> {
    let applied = {
        let mut conn = pool.acquire().await?;
        applied(&mut conn).await?
    };
    let plan = ledger::plan(known(), &applied);
    if let Some(refusal) = plan.refusal() {
        return Err(refusal.into());
    }
    // sqlx's own (1–19), as every earlier release did at start.
    // (`run_direct`: `run` over the pool is not seen to be `Send`.)
    {
        let mut conn = pool.acquire().await?;
        MIGRATOR.run_direct(&mut *conn).await?;
        let table = ledger::ledger_table("TEXT", "(strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))");
        conn.execute(table.as_str()).await?;
    }
    let to_apply: Vec<Known> = plan.to_apply(mode).cloned().collect();
    let mut done = Vec::new();
    for migration in &to_apply {
        if let Source::Ledger(file) = migration.source {
            apply(pool, migration, file).await?;
        }
        let migration = pending_migration(migration);
        tracing::info!(%migration, "applied migration");
        done.push(migration);
    }
    Ok(done)
}

/// One ledger migration and its row, in one `BEGIN IMMEDIATE` transaction
/// (no other writer between the check and the row), unless another
/// process recorded it first.
async fn apply(pool: &AnyPool, migration: &Known, file: &LedgerMigration) -> Result<(), OpenError> {
    let mut conn = pool.acquire().await?;
    let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
    let recorded: i64 =
        sqlx::query_scalar("SELECT count(*) FROM sessionstore_migrations WHERE version = $1")
            .bind(migration.version)
            .fetch_one(&mut *tx)
            .await?;
    if recorded == 0 {
        tx.execute(file.sql).await?;
        sqlx::query(RECORD)
            .bind(migration.version)
            .bind(migration.kind.as_str())
            .bind(migration.description.as_ref())
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await?;
    Ok(())
}
