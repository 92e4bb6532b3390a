//! `sessionstore backup` and `sessionstore restore`: a SQLite database
//! copied while a server serves it, and put back while none does
//! (`store/sqlite/backup.rs` does the work). One line on stdout says what
//! was written; errors are one line on stderr (main.rs).

use std::io::Write as _;
use std::path::PathBuf;

use clap::Args;

use crate::store::DEFAULT_DATABASE_URL;
use crate::store::backup::{self, Written};

/// `sessionstore backup`'s flags.
#[derive(Debug, Args)]
pub struct BackupArgs {
    /// The file to write: one self-contained SQLite database file.
    #[arg(long)]
    pub to: PathBuf,

    /// Replace `--to` when it exists (refused otherwise).
    #[arg(long)]
    pub force: bool,

    /// The database to copy, `sqlite://PATH` (as `serve`'s).
    #[arg(long, env = "SESSIONSTORE_DATABASE_URL", default_value = DEFAULT_DATABASE_URL)]
    pub database_url: String,
}

/// `sessionstore restore`'s flags.
#[derive(Debug, Args)]
pub struct RestoreArgs {
    /// The backup to restore (a file `sessionstore backup` wrote).
    #[arg(long)]
    pub from: PathBuf,

    /// The database to replace, `sqlite://PATH` (as `serve`'s); created
    /// with its directory if missing.
    #[arg(long, env = "SESSIONSTORE_DATABASE_URL", default_value = DEFAULT_DATABASE_URL)]
    pub database_url: String,
}

/// `sessionstore backup`: prints `backed up … to PATH (N bytes, …)`.
pub fn backup(args: &BackupArgs) -> anyhow::Result<()> {
    let written = backup::backup(&args.database_url, &args.to, args.force)?;
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "backed up {} to {} ({}); the search index is not in it: a server rebuilds it at start",
        args.database_url,
        written.path.display(),
        summary(&written)
    )?;
    out.flush()?;
    Ok(())
}

/// `sessionstore restore`: prints `restored PATH from FILE (…)` and the
/// files it removed.
pub fn restore(args: &RestoreArgs) -> anyhow::Result<()> {
    let written = backup::restore(&args.from, &args.database_url)?;
    let removed = if written.removed.is_empty() {
        String::new()
    } else {
        let names: Vec<String> = written
            .removed
            .iter()
            .map(|p| p.display().to_string())
            .collect();
        format!("; removed {}", names.join(", "))
    };
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "restored {} from {} ({}){removed}; the search index is rebuilt when a server starts on it",
        written.path.display(),
        args.from.display(),
        summary(&written)
    )?;
    out.flush()?;
    Ok(())
}

fn summary(written: &Written) -> String {
    format!(
        "{} bytes, {} sessions, {} messages",
        written.bytes, written.sessions, written.messages
    )
}
