//! PostgreSQL's side of the migration ledger (`store/ledger/`): reading
//! what a database has applied, and applying a plan on one connection
//! under an advisory lock, so that replicas starting together apply each
//! migration once.
//!
//! The connection is taken out of the pool for the run and closed after
//! it: its session ends, and with it the lock, whatever happened, and its
//! `statement_timeout` (turned off, since a migration may take longer than
//! a call) goes with it.

use sqlx::{AnyConnection, AnyPool, Connection as _, Executor as _};

use super::{MIGRATOR, registry};
use crate::store::OpenError;
use crate::store::ledger::{
    self, Applied, Checked, Known, LedgerMigration, Mode, PendingMigration, Plan, RECORD, Refusal,
    Source, pending_migration,
};

/// The advisory lock key every migrating sessionstore takes (`SESSLEDG` in
/// ASCII). sqlx's migrator takes its own, another key, inside it.
const LOCK_KEY: i64 = 0x5345_5353_4c45_4447;

/// Every migration a PostgreSQL binary knows.
fn known() -> Vec<Known> {
    ledger::known(&MIGRATOR, ledger::POSTGRES)
}

/// This binary's PostgreSQL schema.
pub(in crate::store) fn schema() -> i64 {
    known().iter().map(|m| m.version).max().unwrap_or(0)
}

/// Counts the tables named `$1` (in the schema the search path puts first).
const TABLE_EXISTS: &str = "SELECT count(*) FROM pg_catalog.pg_tables \
     WHERE schemaname = current_schema() AND tablename = $1";

/// What the database has applied.
async fn applied(conn: &mut AnyConnection) -> Result<Applied, sqlx::Error> {
    ledger::applied(conn, TABLE_EXISTS).await
}

/// `migrate --check`: reads, applies nothing, takes no lock.
pub(in crate::store) async fn check(pool: &AnyPool) -> Result<Checked, OpenError> {
    let mut conn = pool.acquire().await?;
    let plan = ledger::plan(known(), &applied(&mut conn).await?);
    Ok(Checked {
        status: plan.status(),
        pending: plan.pending(),
        refusal: plan.refusal(),
    })
}

/// Applies what `mode` applies (refusing a database finalized past this
/// binary, and, for `--finalize`, while a live replica runs an older
/// schema); returns what it applied.
pub(in crate::store) async fn migrate(
    pool: &AnyPool,
    mode: Mode,
) -> Result<Vec<PendingMigration>, OpenError> {
    let mut conn = pool.acquire().await?.detach();
    let result = migrate_locked(&mut conn, mode).await;
    // Ends the session: the advisory lock is released with it.
    let _ = conn.close().await;
    result
}

async fn migrate_locked(
    conn: &mut AnyConnection,
    mode: Mode,
) -> Result<Vec<PendingMigration>, OpenError> {
    conn.execute("SET statement_timeout = 0").await?;
    let locked: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
        .bind(LOCK_KEY)
        .fetch_one(&mut *conn)
        .await?;
    if !locked {
        tracing::info!("another process is migrating the database: waiting for it");
        sqlx::query("SELECT pg_advisory_lock($1)")
            .bind(LOCK_KEY)
            .execute(&mut *conn)
            .await?;
    }
    let plan = ledger::plan(known(), &applied(conn).await?);
    if let Some(refusal) = plan.refusal() {
        return Err(refusal.into());
    }
    if mode == Mode::Finalize {
        refuse_replicas_behind(conn, &plan).await?;
    }
    // sqlx's own (1–19): applies those pending, checks the others'
    // checksums, as every earlier release did at start. (`run_direct`:
    // `run` over a `&mut` connection is not seen to be `Send`.)
    MIGRATOR.run_direct(&mut *conn).await?;
    let table = ledger::ledger_table("TIMESTAMPTZ", "now()");
    conn.execute(table.as_str()).await?;
    let to_apply: Vec<Known> = plan.to_apply(mode).cloned().collect();
    let mut done = Vec::new();
    for migration in &to_apply {
        if let Source::Ledger(file) = migration.source {
            apply(conn, migration, file).await?;
        }
        let migration = pending_migration(migration);
        tracing::info!(%migration, "applied migration");
        done.push(migration);
    }
    Ok(done)
}

/// `--finalize` applies nothing while a live replica runs a schema below
/// this binary's.
async fn refuse_replicas_behind(conn: &mut AnyConnection, plan: &Plan) -> Result<(), OpenError> {
    let behind: Vec<_> = registry::live(conn)
        .await?
        .into_iter()
        .filter(|replica| replica.schema < plan.schema())
        .collect();
    if behind.is_empty() {
        Ok(())
    } else {
        Err(Refusal::ReplicasBehind {
            schema: plan.schema(),
            replicas: behind,
        }
        .into())
    }
}

/// One ledger migration and its ledger row, in one transaction unless the
/// file asks for none.
async fn apply(
    conn: &mut AnyConnection,
    migration: &Known,
    file: &LedgerMigration,
) -> Result<(), OpenError> {
    let record = sqlx::query(RECORD)
        .bind(migration.version)
        .bind(migration.kind.as_str())
        .bind(migration.description.as_ref());
    if file.no_transaction() {
        conn.execute(file.sql).await?;
        record.execute(&mut *conn).await?;
    } else {
        let mut tx = conn.begin().await?;
        tx.execute(file.sql).await?;
        record.execute(&mut *tx).await?;
        tx.commit().await?;
    }
    Ok(())
}
