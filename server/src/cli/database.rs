//! The commands that read the database itself, not a server:
//! `sessionstore replicas` (the replica registry) and `sessionstore
//! migrate --check` (the pending migrations). Their output is the point:
//! stdout, no logs.

use std::io::Write;

use clap::{Args, ValueEnum};

use super::print_table;
use crate::store::{self, Checked, Replica};

/// List the live replicas of a PostgreSQL database.
#[derive(Debug, Args)]
pub struct ReplicasArgs {
    /// The database URL: `postgres://USER@HOST:PORT/DB`.
    #[arg(long, env = "SESSIONSTORE_DATABASE_URL")]
    pub database_url: String,

    /// `text`: aligned columns under a header. `json`: one array of
    /// objects keyed by the registry's columns.
    #[arg(long, value_enum, default_value_t = ReplicasFormat::Text)]
    pub format: ReplicasFormat,
}

/// How `replicas` prints.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum ReplicasFormat {
    /// One aligned line per replica, with a header.
    #[default]
    Text,
    /// One JSON array of objects.
    Json,
}

/// `sessionstore replicas`: prints the live replicas, oldest start first.
pub async fn replicas(args: ReplicasArgs) -> anyhow::Result<()> {
    let replicas = store::replicas(&args.database_url).await?;
    let mut out = std::io::stdout().lock();
    match args.format {
        ReplicasFormat::Text => print_replicas(&mut out, &replicas)?,
        ReplicasFormat::Json => {
            serde_json::to_writer(&mut out, &json(&replicas))?;
            writeln!(out)?;
        }
    }
    out.flush()?;
    Ok(())
}

/// The replicas as JSON: each row's six columns, by name.
fn json(replicas: &[Replica]) -> serde_json::Value {
    replicas
        .iter()
        .map(|r| {
            serde_json::json!({
                "replica_id": r.replica_id,
                "version": r.version,
                "schema": r.schema,
                "address": r.address,
                "start_time": r.start_time,
                "heartbeat_time": r.heartbeat_time,
            })
        })
        .collect()
}

fn print_replicas(out: &mut impl Write, replicas: &[Replica]) -> anyhow::Result<()> {
    let mut rows = vec![[
        "REPLICA_ID".to_owned(),
        "VERSION".to_owned(),
        "SCHEMA".to_owned(),
        "ADDRESS".to_owned(),
        "START_TIME".to_owned(),
        "HEARTBEAT_TIME".to_owned(),
    ]];
    rows.extend(replicas.iter().map(|r| {
        [
            r.replica_id.clone(),
            r.version.clone(),
            r.schema.to_string(),
            r.address.clone(),
            r.start_time.clone(),
            r.heartbeat_time.clone(),
        ]
    }));
    print_table(out, &rows, &[2])
}

/// `sessionstore migrate --check`: prints each pending migration as
/// `VERSION KIND DESCRIPTION`; the caller exits with the status's code.
pub async fn check_migrations(database_url: &str) -> anyhow::Result<Checked> {
    let checked = store::check(database_url).await?;
    let mut out = std::io::stdout().lock();
    for migration in &checked.pending {
        writeln!(out, "{migration}")?;
    }
    out.flush()?;
    Ok(checked)
}

#[cfg(test)]
mod tests {
    use super::{json, print_replicas};
    use crate::store::Replica;

    fn replica(id: &str, address: &str) -> Replica {
        Replica {
            replica_id: id.to_owned(),
            version: "sessionstore 0.1.0 (abc1234)".to_owned(),
            schema: 20,
            address: address.to_owned(),
            start_time: "2025-01-02T03:04:05.000006Z".to_owned(),
            heartbeat_time: "2025-01-02T03:04:07.000008Z".to_owned(),
        }
    }

    #[test]
    fn json_has_the_six_columns_by_name() {
        let value = json(&[replica("a", "127.0.0.1:1"), replica("b", "127.0.0.1:22")]);
        let Some(rows) = value.as_array() else {
            panic!("not an array: {value}");
        };
        assert_eq!(rows.len(), 2);
        let Some(first) = rows[0].as_object() else {
            panic!("not an object: {}", rows[0]);
        };
        let mut keys: Vec<&str> = first.keys().map(String::as_str).collect();
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
        assert_eq!(rows[1]["replica_id"], "b");
        assert_eq!(rows[1]["schema"], 20);
        assert_eq!(json(&[]), serde_json::json!([]));
    }

    #[test]
    fn text_is_a_header_and_aligned_lines() -> anyhow::Result<()> {
        let mut out = Vec::new();
        print_replicas(
            &mut out,
            &[replica("a", "127.0.0.1:1"), replica("bb", "127.0.0.1:22")],
        )?;
        let text = String::from_utf8_lossy(&out);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert!(lines[0].starts_with("REPLICA_ID"), "{text}");
        let column = |line: &str| line.find("sessionstore");
        assert_eq!(column(lines[1]), column(lines[2]), "{text}");
        assert_eq!(lines[0].find("VERSION"), column(lines[1]), "{text}");
        Ok(())
    }
}
