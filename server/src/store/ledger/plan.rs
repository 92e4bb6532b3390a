//! The planner: from the migrations a binary knows and what a database
//! has applied, whether the binary refuses the database, what `migrate`
//! (or a start) and `migrate --finalize` apply, and what `migrate --check`
//! says. Pure: the backends read the database and carry it out.

use std::collections::{BTreeMap, BTreeSet};

use super::{Kind, Known, Mode, PendingMigration, Refusal, Source};

/// What a database has applied.
#[derive(Clone, Debug, Default)]
pub(in crate::store) struct Applied {
    /// The versions `_sqlx_migrations` holds as applied.
    pub(in crate::store) sqlx: BTreeSet<i64>,
    /// `sessionstore_migrations`' rows: version and kind.
    pub(in crate::store) ledger: BTreeMap<i64, Kind>,
}

/// What `migrate --check` says, as its exit code says it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CheckStatus {
    /// Nothing pending (exit 0).
    Current,
    /// An expand migration is pending: what `migrate` or a start applies
    /// (exit 10).
    ExpandPending,
    /// Only finalize migrations are pending (exit 11).
    FinalizePending,
    /// The database holds a finalize migration past this binary's schema
    /// (exit 12).
    FinalizedPast,
}

impl CheckStatus {
    pub fn exit_code(self) -> u8 {
        match self {
            CheckStatus::Current => 0,
            CheckStatus::ExpandPending => 10,
            CheckStatus::FinalizePending => 11,
            CheckStatus::FinalizedPast => 12,
        }
    }
}

/// A database's migrations as one binary sees them.
#[derive(Debug)]
pub(in crate::store) struct Plan {
    /// The binary's schema: the highest version it ships.
    schema: i64,
    /// The highest applied finalize migration past `schema`, if any.
    finalized_past: Option<i64>,
    /// The known migrations not applied, in version order.
    pending: Vec<Known>,
}

/// Plans for a database that has `applied`, with the binary's `known`
/// migrations (in any order).
pub(in crate::store) fn plan(mut known: Vec<Known>, applied: &Applied) -> Plan {
    known.sort_by_key(|m| m.version);
    let schema = known.iter().map(|m| m.version).max().unwrap_or(0);
    let finalized_past = applied
        .ledger
        .iter()
        .filter(|(version, kind)| **version > schema && **kind == Kind::Finalize)
        .map(|(version, _)| *version)
        .max();
    let pending = known
        .into_iter()
        .filter(|m| match m.source {
            // sqlx's migrator applies its own, whatever the ledger says.
            Source::Sqlx => !applied.sqlx.contains(&m.version),
            Source::Ledger(_) => !applied.ledger.contains_key(&m.version),
        })
        .collect();
    Plan {
        schema,
        finalized_past,
        pending,
    }
}

impl Plan {
    /// The binary's schema.
    pub(in crate::store) fn schema(&self) -> i64 {
        self.schema
    }

    /// Why the binary must not touch the database, if it must not.
    pub(in crate::store) fn refusal(&self) -> Option<Refusal> {
        self.finalized_past.map(|version| Refusal::FinalizedPast {
            version,
            schema: self.schema,
        })
    }

    /// What a migrate in `mode` applies, in version order: every pending
    /// expand migration (they never depend on a finalize one), or with
    /// `--finalize` every pending one.
    pub(in crate::store) fn to_apply(&self, mode: Mode) -> impl Iterator<Item = &Known> {
        self.pending
            .iter()
            .filter(move |m| mode == Mode::Finalize || m.kind == Kind::Expand)
    }

    /// `migrate --check`'s verdict.
    pub(in crate::store) fn status(&self) -> CheckStatus {
        if self.finalized_past.is_some() {
            CheckStatus::FinalizedPast
        } else if self.pending.iter().any(|m| m.kind == Kind::Expand) {
            CheckStatus::ExpandPending
        } else if self.pending.is_empty() {
            CheckStatus::Current
        } else {
            CheckStatus::FinalizePending
        }
    }

    /// The pending migrations, as `--check` lists them.
    pub(in crate::store) fn pending(&self) -> Vec<PendingMigration> {
        self.pending.iter().map(pending_migration).collect()
    }
}

/// A known migration as `--check` and the logs name it.
pub(in crate::store) fn pending_migration(known: &Known) -> PendingMigration {
    PendingMigration {
        version: known.version,
        kind: known.kind,
        description: known.description.clone().into_owned(),
    }
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;

    use super::super::{Kind, Known, LedgerMigration, Mode, Refusal, Source};
    use super::{Applied, CheckStatus, plan};

    static EXPAND_20: LedgerMigration = LedgerMigration {
        version: 20,
        kind: Kind::Expand,
        description: "replica registry",
        file: "0020_expand_replica_registry.sql",
        sql: "",
    };
    static FINALIZE_21: LedgerMigration = LedgerMigration {
        version: 21,
        kind: Kind::Finalize,
        description: "drop old column",
        file: "0021_finalize_drop_old_column.sql",
        sql: "",
    };
    static EXPAND_22: LedgerMigration = LedgerMigration {
        version: 22,
        kind: Kind::Expand,
        description: "new index",
        file: "0022_expand_new_index.sql",
        sql: "",
    };

    fn sqlx(version: i64, description: &'static str) -> Known {
        Known {
            version,
            kind: Kind::Expand,
            description: Cow::Borrowed(description),
            source: Source::Sqlx,
        }
    }

    fn ledger(migration: &'static LedgerMigration) -> Known {
        Known {
            version: migration.version,
            kind: migration.kind,
            description: Cow::Borrowed(migration.description),
            source: Source::Ledger(migration),
        }
    }

    /// sqlx's 1–3 and the ledger's 20–22, out of order on purpose.
    fn binary() -> Vec<Known> {
        vec![
            ledger(&EXPAND_22),
            sqlx(1, "core"),
            sqlx(2, "conversation control"),
            ledger(&EXPAND_20),
            sqlx(3, "lz4 bodies"),
            ledger(&FINALIZE_21),
        ]
    }

    fn applied(sqlx: &[i64], ledger: &[(i64, Kind)]) -> Applied {
        Applied {
            sqlx: sqlx.iter().copied().collect(),
            ledger: ledger.iter().copied().collect(),
        }
    }

    fn versions<'a>(known: impl Iterator<Item = &'a Known>) -> Vec<i64> {
        known.map(|m| m.version).collect()
    }

    #[test]
    fn a_fresh_database_has_everything_pending_and_a_start_applies_the_expand_ones() {
        let plan = plan(binary(), &Applied::default());
        assert_eq!(plan.schema(), 22);
        assert!(plan.refusal().is_none());
        assert_eq!(versions(plan.to_apply(Mode::Expand)), [1, 2, 3, 20, 22]);
        assert_eq!(
            versions(plan.to_apply(Mode::Finalize)),
            [1, 2, 3, 20, 21, 22]
        );
        assert_eq!(plan.status(), CheckStatus::ExpandPending);
        assert_eq!(plan.status().exit_code(), 10);
        let lines: Vec<String> = plan.pending().iter().map(ToString::to_string).collect();
        assert_eq!(
            lines,
            [
                "1 expand core",
                "2 expand conversation control",
                "3 expand lz4 bodies",
                "20 expand replica registry",
                "21 finalize drop old column",
                "22 expand new index",
            ]
        );
    }

    #[test]
    fn pending_sqlx_versions_count_as_expand() {
        let plan = plan(
            binary(),
            &applied(
                &[1, 2],
                &[(20, Kind::Expand), (21, Kind::Finalize), (22, Kind::Expand)],
            ),
        );
        assert_eq!(plan.status(), CheckStatus::ExpandPending);
        assert_eq!(versions(plan.to_apply(Mode::Expand)), [3]);
    }

    #[test]
    fn only_finalize_pending_is_eleven_and_migrate_applies_nothing() {
        let plan = plan(
            binary(),
            &applied(&[1, 2, 3], &[(20, Kind::Expand), (22, Kind::Expand)]),
        );
        assert_eq!(plan.status(), CheckStatus::FinalizePending);
        assert_eq!(plan.status().exit_code(), 11);
        assert_eq!(versions(plan.to_apply(Mode::Expand)), Vec::<i64>::new());
        assert_eq!(versions(plan.to_apply(Mode::Finalize)), [21]);
        let lines: Vec<String> = plan.pending().iter().map(ToString::to_string).collect();
        assert_eq!(lines, ["21 finalize drop old column"]);
    }

    #[test]
    fn everything_applied_is_current() {
        let plan = plan(
            binary(),
            &applied(
                &[1, 2, 3],
                &[(20, Kind::Expand), (21, Kind::Finalize), (22, Kind::Expand)],
            ),
        );
        assert_eq!(plan.status(), CheckStatus::Current);
        assert_eq!(plan.status().exit_code(), 0);
        assert!(plan.pending().is_empty());
        assert_eq!(versions(plan.to_apply(Mode::Finalize)), Vec::<i64>::new());
    }

    #[test]
    fn an_expand_after_a_pending_finalize_is_applied_without_it() {
        let plan = plan(binary(), &applied(&[1, 2, 3], &[(20, Kind::Expand)]));
        assert_eq!(versions(plan.to_apply(Mode::Expand)), [22]);
        assert_eq!(versions(plan.to_apply(Mode::Finalize)), [21, 22]);
        assert_eq!(plan.status(), CheckStatus::ExpandPending);
    }

    #[test]
    fn a_finalize_migration_past_the_schema_is_refused_naming_it() {
        let plan = plan(
            binary(),
            &applied(
                &[1, 2, 3],
                &[
                    (20, Kind::Expand),
                    (21, Kind::Finalize),
                    (22, Kind::Expand),
                    (30, Kind::Finalize),
                    (9999, Kind::Finalize),
                    (10_000, Kind::Expand),
                ],
            ),
        );
        assert_eq!(plan.status(), CheckStatus::FinalizedPast);
        assert_eq!(plan.status().exit_code(), 12);
        let Some(refusal) = plan.refusal() else {
            panic!("a database finalized past this binary is refused");
        };
        assert!(matches!(
            refusal,
            Refusal::FinalizedPast {
                version: 9999,
                schema: 22
            }
        ));
        assert_eq!(refusal.exit_code(), 12);
        let message = refusal.to_string();
        assert!(
            message.contains("9999") && message.contains("22"),
            "{message}"
        );
        assert!(!message.contains('\n'));
    }

    #[test]
    fn refused_even_with_migrations_of_its_own_pending() {
        let plan = plan(binary(), &applied(&[], &[(9999, Kind::Finalize)]));
        assert_eq!(plan.status(), CheckStatus::FinalizedPast);
        assert!(plan.refusal().is_some());
    }

    #[test]
    fn an_unknown_expand_migration_is_no_reason_to_refuse() {
        let plan = plan(
            binary(),
            &applied(
                &[1, 2, 3],
                &[
                    (20, Kind::Expand),
                    (21, Kind::Finalize),
                    (22, Kind::Expand),
                    (9999, Kind::Expand),
                ],
            ),
        );
        assert!(plan.refusal().is_none());
        assert_eq!(plan.status(), CheckStatus::Current);
    }

    #[test]
    fn a_finalize_migration_at_or_below_the_schema_is_not_past_it() {
        // 21 is the binary's own; a finalize row at a version it does not
        // ship but below its schema is another release's business.
        let plan = plan(
            binary(),
            &applied(
                &[1, 2, 3],
                &[(19, Kind::Finalize), (20, Kind::Expand), (22, Kind::Expand)],
            ),
        );
        assert!(plan.refusal().is_none());
        assert_eq!(plan.status(), CheckStatus::FinalizePending);
    }

    #[test]
    fn a_ledger_row_does_not_stand_for_a_sqlx_version() {
        // sqlx's migrator applies its own versions whatever the ledger says.
        let plan = plan(binary(), &applied(&[1, 2], &[(3, Kind::Expand)]));
        assert_eq!(versions(plan.to_apply(Mode::Expand)), [3, 20, 22]);
    }

    #[test]
    fn replicas_behind_are_thirteen_and_named_on_one_line() {
        let replica = |id: &str, address: &str| crate::store::Replica {
            replica_id: id.to_owned(),
            version: "sessionstore 0.1.0 (abc)".to_owned(),
            schema: 19,
            address: address.to_owned(),
            start_time: "2025-01-01T00:00:00.000000Z".to_owned(),
            heartbeat_time: "2025-01-01T00:00:01.000000Z".to_owned(),
        };
        let refusal = Refusal::ReplicasBehind {
            schema: 20,
            replicas: vec![
                replica("r1", "10.0.0.1:50051"),
                replica("r2", "10.0.0.2:50051"),
            ],
        };
        assert_eq!(refusal.exit_code(), 13);
        let message = refusal.to_string();
        assert!(!message.contains('\n'), "{message}");
        for part in [
            "r1",
            "10.0.0.1:50051",
            "r2",
            "10.0.0.2:50051",
            "sessionstore 0.1.0 (abc)",
        ] {
            assert!(message.contains(part), "{part} in {message}");
        }
    }
}
