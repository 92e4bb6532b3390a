//! The command line: `sessionstore [COMMAND]`, serving without one.

use clap::{Args, Parser, Subcommand};

use crate::config::{DatabaseConfig, ServeConfig};

/// How logs are filtered, for `--help` (it is an environment variable only).
const LOG_HELP: &str =
    "Logs: SESSIONSTORE_LOG (or RUST_LOG) filters them, e.g. `info,sessionstore_server=debug`.";

/// sessionstore: a gRPC service that stores LLM chat sessions.
///
/// Without a command it serves: `sessionstore --database-url URL` is
/// `sessionstore serve --database-url URL`.
#[derive(Debug, Parser)]
#[command(
    name = "sessionstore",
    version = crate::VERSION,
    about,
    args_conflicts_with_subcommands = true,
    after_help = LOG_HELP
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,

    /// `serve`'s flags, for when no command is given.
    #[command(flatten)]
    pub serve: ServeConfig,
}

impl Cli {
    /// The command to run: the one given, or `serve` with the top-level flags.
    pub fn into_command(self) -> Command {
        self.command
            .unwrap_or_else(|| Command::Serve(Box::new(self.serve)))
    }
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the gRPC server (the default).
    #[command(after_help = LOG_HELP)]
    Serve(Box<ServeConfig>),
    /// Apply the database's pending expand migrations and exit (with
    /// --finalize, every pending migration; with --check, none).
    ///
    /// Migrations are of two kinds. `expand`: the previous release keeps
    /// working on the result (new tables, new nullable or defaulted
    /// columns, indexes); `migrate` applies these, and so does every
    /// `serve` at start. `finalize`: the previous release would not
    /// (dropping or renaming what it reads or writes); only `migrate
    /// --finalize` applies these, once every replica runs this release.
    ///
    /// Exit codes: 0 done; 1 the database cannot be reached (or another
    /// failure); 12 the database holds a finalize migration past this
    /// binary's schema (it applies nothing: run a newer release); 13
    /// `--finalize` while a live replica runs an older schema (it applies
    /// nothing and names each such replica). With --check: 0 nothing
    /// pending, 10 an expand migration pending, 11 only finalize
    /// migrations pending, 12 as above.
    Migrate(MigrateArgs),
    /// List the live replicas of a PostgreSQL database (those whose
    /// registry heartbeat is less than 20 s old), oldest start first.
    ///
    /// Reads the database's replica registry, `sessionstore_replicas`, so
    /// it works with every replica down. Text: one aligned line each under
    /// a header; `--format json`: one array of objects keyed `replica_id`,
    /// `version`, `schema`, `address`, `start_time`, `heartbeat_time`
    /// (times RFC 3339, UTC). A SQLite database has no registry: an error.
    Replicas(super::ReplicasArgs),
    /// Copy a SQLite database to one file while a server serves it
    /// (online and consistent: the database as of one commit, WAL
    /// included). Refuses an existing --to unless --force. The search index
    /// is not copied: a server rebuilds it at start. For PostgreSQL use
    /// `pg_dump -Fc` (README, "Backups"). Exit codes: 0 done, 1 failed.
    Backup(super::BackupArgs),
    /// Replace a SQLite database with a backup: checks the backup
    /// (integrity_check, sessionstore's tables), refuses a database a
    /// server has open, writes the file atomically and removes the
    /// target's old `-wal`, `-shm` and search files (the search index is
    /// rebuilt at the next start). Exit codes: 0 done, 1 failed (nothing
    /// changed).
    Restore(super::RestoreArgs),
    /// Look at and manage sessions on a running server (`--server URL`).
    Sessions(super::SessionsArgs),
    /// Ask a running server whether it is serving: prints its status and
    /// exits 0 when SERVING, 1 otherwise (for container probes and scripts).
    Health(super::HealthArgs),
    /// Print a shell completion script: `sessionstore completions bash >
    /// /etc/bash_completion.d/sessionstore` (or zsh, fish, elvish, powershell).
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

/// `migrate`'s flags.
#[derive(Clone, Debug, Args)]
pub struct MigrateArgs {
    #[command(flatten)]
    pub database: DatabaseConfig,

    /// Apply every pending migration, finalize ones too. First reads the
    /// replica registry: while a live replica runs a schema below this
    /// binary's, applies nothing and exits 13 naming each (id, address,
    /// version). Run it once every replica runs this release.
    #[arg(long, conflicts_with = "check")]
    pub finalize: bool,

    /// Apply nothing: print each pending migration on stdout as `VERSION
    /// KIND DESCRIPTION` and exit 0 (none pending), 10 (an expand one
    /// pending: what `migrate` or a start applies), 11 (only finalize ones
    /// pending) or 12 (the database is finalized past this binary).
    #[arg(long)]
    pub check: bool,
}

#[cfg(test)]
mod tests {
    use super::{Cli, Command};
    use clap::Parser as _;

    fn serve_config(args: &[&str]) -> Option<(String, String)> {
        match Cli::try_parse_from(args).ok()?.into_command() {
            Command::Serve(config) => Some((config.listen, config.database.database_url)),
            _ => None,
        }
    }

    #[test]
    fn serve_flags_work_with_and_without_the_command() {
        let wanted = Some(("0.0.0.0:50051".to_owned(), "postgres://db/s".to_owned()));
        let flags = [
            "--listen",
            "0.0.0.0:50051",
            "--database-url",
            "postgres://db/s",
        ];
        let plain: Vec<&str> = ["sessionstore"].into_iter().chain(flags).collect();
        let serve: Vec<&str> = ["sessionstore", "serve"].into_iter().chain(flags).collect();
        assert_eq!(serve_config(&plain), wanted);
        assert_eq!(serve_config(&serve), wanted);
        assert!(matches!(
            Cli::try_parse_from([
                "sessionstore",
                "migrate",
                "--database-url",
                "sqlite::memory:"
            ])
            .map(Cli::into_command),
            Ok(Command::Migrate(_))
        ));
        // Serve's flags belong to serving, not to another command.
        assert!(Cli::try_parse_from(["sessionstore", "--listen", "0.0.0.0:1", "migrate"]).is_err());
    }

    #[test]
    fn worker_threads_leave_sqlite_files_append_thread_a_core() {
        let workers =
            |args: &[&str], cores| match Cli::try_parse_from(args).ok().map(Cli::into_command) {
                Some(Command::Serve(config)) => Some(config.worker_threads(cores)),
                _ => None,
            };
        let file = ["sessionstore", "--database-url", "sqlite://data/s.db"];
        assert_eq!(workers(&file, 2), Some(1));
        assert_eq!(workers(&file, 8), Some(7));
        assert_eq!(workers(&file, 1), Some(1));
        let memory = ["sessionstore", "--database-url", "sqlite::memory:"];
        assert_eq!(workers(&memory, 2), Some(2));
        let postgres = ["sessionstore", "--database-url", "postgres://db/s"];
        assert_eq!(workers(&postgres, 2), Some(2));
        let asked = [
            "sessionstore",
            "--database-url",
            "sqlite://data/s.db",
            "--worker-threads",
            "3",
        ];
        assert_eq!(workers(&asked, 2), Some(3));
        assert!(Cli::try_parse_from(["sessionstore", "--worker-threads", "0"]).is_err());
    }

    #[test]
    fn migrate_and_replicas_flags_parse() {
        let migrate = |args: &[&str]| match Cli::try_parse_from(args).map(Cli::into_command) {
            Ok(Command::Migrate(args)) => Some((args.finalize, args.check)),
            _ => None,
        };
        let url = ["--database-url", "postgres://db/s"];
        let with = |flags: &[&'static str]| -> Vec<&'static str> {
            ["sessionstore", "migrate"]
                .into_iter()
                .chain(flags.iter().copied())
                .chain(url)
                .collect()
        };
        assert_eq!(migrate(&with(&[])), Some((false, false)));
        assert_eq!(migrate(&with(&["--finalize"])), Some((true, false)));
        assert_eq!(migrate(&with(&["--check"])), Some((false, true)));
        assert_eq!(migrate(&with(&["--check", "--finalize"])), None);
        let replicas = |args: &[&str]| match Cli::try_parse_from(args).map(Cli::into_command) {
            Ok(Command::Replicas(args)) => Some((args.database_url, args.format)),
            _ => None,
        };
        assert_eq!(
            replicas(&[
                "sessionstore",
                "replicas",
                "--database-url",
                "postgres://db/s"
            ]),
            Some((
                "postgres://db/s".to_owned(),
                super::super::ReplicasFormat::Text
            ))
        );
        assert_eq!(
            replicas(&[
                "sessionstore",
                "replicas",
                "--database-url",
                "postgres://db/s",
                "--format",
                "json"
            ]),
            Some((
                "postgres://db/s".to_owned(),
                super::super::ReplicasFormat::Json
            ))
        );
    }
}
