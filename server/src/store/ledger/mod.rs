//! The migrations after sqlx's: their kinds (expand, finalize), their
//! ledger, and what a binary does with a database's migrations.
//!
//! Versions 1–19 are sqlx's (`migrations/{postgres,sqlite}/`, embedded with
//! `sqlx::migrate!`, recorded in `_sqlx_migrations`). That set is frozen:
//! the release before this ledger runs sqlx's migrator at start and refuses
//! a database whose `_sqlx_migrations` holds a version it does not know.
//! Every later migration is a file of the folder's `ledger/` subfolder,
//! which `sqlx::migrate!` does not read, named
//! `VERSION_KIND_DESCRIPTION.sql`, listed below (a test checks the list
//! against the folder) and recorded, once applied, in
//! `sessionstore_migrations` with its kind.
//!
//! - **expand**: the previous release keeps working on the result. Applied
//!   by `sessionstore migrate` and by every `serve` at start. Versions 1–19
//!   count as expand.
//! - **finalize**: the previous release would not. Applied only by
//!   `sessionstore migrate --finalize`.
//!
//! A binary's *schema* is the highest version it ships. It refuses a
//! database holding an applied finalize migration above its schema (exit
//! 12); an applied expand migration it does not know is no reason to.
//!
//! [`plan`] decides, from the migrations a binary knows and what the
//! database has applied, everything the commands need; each backend's
//! `ledger.rs` reads the database and carries the plan out.

use std::borrow::Cow;

use sqlx::migrate::Migrator;
use sqlx::{AnyConnection, Row as _};

use super::Replica;

mod plan;

pub use plan::CheckStatus;
pub(super) use plan::{Applied, Plan, pending_migration, plan};

/// Whether the previous release keeps working once a migration is applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// It does: applied at every start and by `migrate`.
    Expand,
    /// It does not: applied by `migrate --finalize` alone.
    Finalize,
}

impl Kind {
    /// The name the ledger, file names and `--check` use.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Expand => "expand",
            Kind::Finalize => "finalize",
        }
    }

    /// A ledger row's kind. Anything but `expand` counts as finalize: a
    /// kind a later release might invent is not assumed to be harmless.
    pub(super) fn of_row(text: &str) -> Kind {
        if text == Kind::Expand.as_str() {
            Kind::Expand
        } else {
            Kind::Finalize
        }
    }
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What `migrate` (or a start) applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// The pending expand migrations (`migrate`, `serve`).
    Expand,
    /// Every pending migration (`migrate --finalize`).
    Finalize,
}

/// One migration of a `ledger/` folder, embedded.
#[derive(Debug)]
pub(super) struct LedgerMigration {
    pub(super) version: i64,
    pub(super) kind: Kind,
    pub(super) description: &'static str,
    /// The file's name in the dialect's `ledger/` folder.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(super) file: &'static str,
    pub(super) sql: &'static str,
}

impl LedgerMigration {
    /// Whether it runs outside a transaction (its first line says
    /// `-- no-transaction`, as sqlx's files do): statements such as
    /// `CREATE INDEX CONCURRENTLY` cannot run inside one.
    pub(super) fn no_transaction(&self) -> bool {
        self.sql.starts_with("-- no-transaction")
    }
}

/// What the database has applied: sqlx's versions and the ledger's rows.
/// `table_exists` counts the tables named `$1` (each backend's catalog).
pub(super) async fn applied(
    conn: &mut AnyConnection,
    table_exists: &str,
) -> Result<Applied, sqlx::Error> {
    let mut applied = Applied::default();
    if has_table(conn, table_exists, "_sqlx_migrations").await? {
        let versions: Vec<i64> =
            sqlx::query_scalar("SELECT version FROM _sqlx_migrations WHERE success")
                .fetch_all(&mut *conn)
                .await?;
        applied.sqlx = versions.into_iter().collect();
    }
    if has_table(conn, table_exists, "sessionstore_migrations").await? {
        let rows = sqlx::query("SELECT version, kind FROM sessionstore_migrations")
            .fetch_all(&mut *conn)
            .await?;
        for row in rows {
            let version: i64 = row.try_get(0)?;
            let kind: String = row.try_get(1)?;
            applied.ledger.insert(version, Kind::of_row(&kind));
        }
    }
    Ok(applied)
}

async fn has_table(
    conn: &mut AnyConnection,
    table_exists: &str,
    name: &str,
) -> Result<bool, sqlx::Error> {
    let found: i64 = sqlx::query_scalar(table_exists)
        .bind(name)
        .fetch_one(&mut *conn)
        .await?;
    Ok(found > 0)
}

/// A `ledger/` migration of `dialect`: its file, version, kind and
/// description (the test below checks them against the file's name).
macro_rules! ledger_migration {
    ($dialect:literal, $file:literal, $version:literal, $kind:expr, $description:literal) => {
        LedgerMigration {
            version: $version,
            kind: $kind,
            description: $description,
            file: $file,
            sql: include_str!(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../migrations/",
                $dialect,
                "/ledger/",
                $file
            )),
        }
    };
}

/// PostgreSQL's migrations after sqlx's, in version order.
pub(super) static POSTGRES: &[LedgerMigration] = &[
    ledger_migration!(
        "postgres",
        "0020_expand_replica_registry.sql",
        20,
        Kind::Expand,
        "replica registry"
    ),
    ledger_migration!(
        "postgres",
        "0021_expand_idempotent_replies.sql",
        21,
        Kind::Expand,
        "idempotent replies"
    ),
    ledger_migration!(
        "postgres",
        "0022_expand_approvals.sql",
        22,
        Kind::Expand,
        "approvals"
    ),
    ledger_migration!(
        "postgres",
        "0023_expand_queued_input.sql",
        23,
        Kind::Expand,
        "queued input"
    ),
];

/// SQLite's migrations after sqlx's, in version order.
pub(super) static SQLITE: &[LedgerMigration] = &[
    ledger_migration!(
        "sqlite",
        "0021_expand_idempotent_replies.sql",
        21,
        Kind::Expand,
        "idempotent replies"
    ),
    ledger_migration!(
        "sqlite",
        "0022_expand_approvals.sql",
        22,
        Kind::Expand,
        "approvals"
    ),
    ledger_migration!(
        "sqlite",
        "0023_expand_queued_input.sql",
        23,
        Kind::Expand,
        "queued input"
    ),
];

/// The last version sqlx's migrator may apply, on either dialect: later
/// ones go through the ledger.
#[cfg_attr(not(test), allow(dead_code))]
pub(super) const LAST_SQLX_VERSION: i64 = 19;

/// The ledger's own table (the same SQL on both dialects; `applied_at`
/// is a `timestamptz` on PostgreSQL and text on SQLite).
pub(super) fn ledger_table(timestamp: &str, now: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS sessionstore_migrations (\
         version BIGINT PRIMARY KEY, \
         kind TEXT NOT NULL, \
         description TEXT NOT NULL, \
         applied_at {timestamp} NOT NULL DEFAULT {now})"
    )
}

/// Records an applied ledger migration (in its transaction, if it has one).
pub(super) const RECORD: &str =
    "INSERT INTO sessionstore_migrations (version, kind, description) VALUES ($1, $2, $3)";

/// Where a migration a binary knows comes from.
#[derive(Clone, Copy, Debug)]
pub(super) enum Source {
    /// sqlx's embedded set (versions 1–19), applied by its migrator.
    Sqlx,
    /// A `ledger/` file.
    Ledger(&'static LedgerMigration),
}

/// A migration a binary knows.
#[derive(Clone, Debug)]
pub(super) struct Known {
    pub(super) version: i64,
    pub(super) kind: Kind,
    pub(super) description: Cow<'static, str>,
    pub(super) source: Source,
}

/// Every migration of a dialect, in version order: sqlx's (expand) and
/// the ledger's.
pub(super) fn known(migrator: &Migrator, ledger: &'static [LedgerMigration]) -> Vec<Known> {
    let mut known: Vec<Known> = migrator
        .iter()
        .filter(|m| !m.migration_type.is_down_migration())
        .map(|m| Known {
            version: m.version,
            kind: Kind::Expand,
            description: m.description.clone(),
            source: Source::Sqlx,
        })
        .chain(ledger.iter().map(|m| Known {
            version: m.version,
            kind: m.kind,
            description: Cow::Borrowed(m.description),
            source: Source::Ledger(m),
        }))
        .collect();
    known.sort_by_key(|m| m.version);
    known
}

/// A migration not yet applied, as `migrate --check` prints it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PendingMigration {
    pub version: i64,
    pub kind: Kind,
    pub description: String,
}

impl std::fmt::Display for PendingMigration {
    /// `VERSION KIND DESCRIPTION`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {} {}", self.version, self.kind, self.description)
    }
}

/// What `migrate --check` found.
#[derive(Debug)]
pub struct Checked {
    pub status: CheckStatus,
    /// The migrations not applied, in version order.
    pub pending: Vec<PendingMigration>,
    /// Why this binary would refuse the database, when it would.
    pub refusal: Option<Refusal>,
}

/// Why a binary applies nothing and stops: each one line, with its exit
/// code.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    /// The database holds a finalize migration this binary does not know:
    /// it would read or write what that migration changed.
    #[error(
        "the database holds finalize migration {version}, past this binary's schema {schema}: \
         run a release whose schema is at least {version}"
    )]
    FinalizedPast { version: i64, schema: i64 },
    /// `migrate --finalize` while live replicas run an older schema,
    /// which the finalize migrations would break.
    #[error(
        "not finalizing to schema {schema}: {} live replica(s) run an older schema: {}; \
         upgrade or stop them first",
        replicas.len(),
        behind(replicas)
    )]
    ReplicasBehind { schema: i64, replicas: Vec<Replica> },
}

impl Refusal {
    /// The process's exit code for it.
    pub fn exit_code(&self) -> u8 {
        match self {
            Refusal::FinalizedPast { .. } => CheckStatus::FinalizedPast.exit_code(),
            Refusal::ReplicasBehind { .. } => 13,
        }
    }
}

/// Each replica behind, on one line: id, address, version and schema.
fn behind(replicas: &[Replica]) -> String {
    replicas
        .iter()
        .map(|r| {
            format!(
                "{} at {} ({}, schema {})",
                r.replica_id, r.address, r.version, r.schema
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::path::PathBuf;

    use super::{Kind, LAST_SQLX_VERSION, LedgerMigration, POSTGRES, SQLITE};

    /// A ledger file's name, split: version, kind, description.
    fn parse(name: &str) -> Option<(i64, Kind, String)> {
        let stem = name.strip_suffix(".sql")?;
        let (version, rest) = stem.split_once('_')?;
        let (kind, description) = rest.split_once('_')?;
        let kind = match kind {
            "expand" => Kind::Expand,
            "finalize" => Kind::Finalize,
            _ => return None,
        };
        Some((version.parse().ok()?, kind, description.replace('_', " ")))
    }

    fn check_folder(dialect: &str, listed: &[LedgerMigration]) {
        let folder = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../migrations")
            .join(dialect)
            .join("ledger");
        let mut files: Vec<String> = std::fs::read_dir(&folder)
            .map(|entries| {
                entries
                    .filter_map(|entry| entry.ok())
                    .map(|entry| entry.file_name().to_string_lossy().into_owned())
                    .filter(|name| name.ends_with(".sql"))
                    .collect()
            })
            .unwrap_or_default();
        files.sort();
        let names: Vec<&str> = listed.iter().map(|m| m.file).collect();
        assert_eq!(
            files,
            names,
            "every .sql file of {} is listed, in order",
            folder.display()
        );
        for migration in listed {
            let parsed = parse(migration.file);
            assert_eq!(
                parsed,
                Some((
                    migration.version,
                    migration.kind,
                    migration.description.to_owned()
                )),
                "{dialect}/ledger/{}: VERSION_KIND_DESCRIPTION.sql, as listed",
                migration.file
            );
            assert!(
                migration.version > LAST_SQLX_VERSION,
                "{} is past sqlx's versions",
                migration.file
            );
        }
        let versions: Vec<i64> = listed.iter().map(|m| m.version).collect();
        let mut sorted = versions.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(versions, sorted, "{dialect}: versions ascend, once each");
    }

    #[test]
    fn every_ledger_file_is_listed_with_the_kind_its_name_says() {
        check_folder("postgres", POSTGRES);
        check_folder("sqlite", SQLITE);
    }

    #[test]
    fn sqlx_embeds_exactly_the_frozen_versions() {
        let frozen = |migrator: &sqlx::migrate::Migrator| -> BTreeSet<i64> {
            migrator.iter().map(|m| m.version).collect()
        };
        let postgres: BTreeSet<i64> = (1..=LAST_SQLX_VERSION).filter(|v| *v != 9).collect();
        assert_eq!(frozen(&crate::store::postgres::MIGRATOR), postgres);
        let sqlite: BTreeSet<i64> = [1, 2, 3, 4, 5, 6, 7, 8, 13, 14, 16, 17, 19].into();
        assert_eq!(frozen(&crate::store::sqlite::MIGRATOR), sqlite);
    }

    #[test]
    fn names_parse() {
        assert_eq!(
            parse("0021_finalize_drop_old_index.sql"),
            Some((21, Kind::Finalize, "drop old index".to_owned()))
        );
        assert_eq!(parse("0021_shrink_x.sql"), None);
        assert_eq!(parse("0021_expand.sql"), None);
    }

    #[test]
    fn unknown_row_kinds_count_as_finalize() {
        assert_eq!(Kind::of_row("expand"), Kind::Expand);
        assert_eq!(Kind::of_row("finalize"), Kind::Finalize);
        assert_eq!(Kind::of_row("contract"), Kind::Finalize);
    }
}
