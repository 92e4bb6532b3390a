//! The decider's runs executed through sqlx: reading what a run needs,
//! writing its statements in the caller's transaction, and binding their
//! values for the `Any` driver or PostgreSQL's own. (`sqlite/appends.rs`
//! runs the same [`Run`] through the SQLite engine.)

use std::collections::HashMap;

use sqlx::any::{AnyArguments, AnyRow};
use sqlx::postgres::{PgArgumentBuffer, PgArguments, PgRow, PgTypeInfo};
use sqlx::query::Query;
use sqlx::{Any, AnyConnection, PgConnection, Postgres};

use super::decide::{Changed, Kept, Loaded, Outcome, Run};
use super::statements::{STORED_REQUEST_IDS, Statement, Value};
use crate::domain::{Error, NewExchange, Result, Timestamp, search};
use crate::store::ops::{Appended, Applied, Dialect, SearchWrites};
use crate::store::rows::Columns;

/// Appends `requests` (tenant, exchange) in the caller's transaction,
/// through sqlx. `Err` means a statement failed and the transaction must be
/// rolled back. (`sqlite/appends.rs` runs the same [`Run`] through the
/// SQLite engine.)
pub async fn append_all(
    conn: &mut AnyConnection,
    dialect: Dialect,
    search: SearchWrites,
    requests: &[(&str, &NewExchange)],
) -> std::result::Result<Vec<Outcome>, sqlx::Error> {
    let now = Timestamp::now();
    let written = append_run(conn, Run::new(dialect, search, requests), now).await?;
    Ok(written.outcomes)
}

/// What [`append_run`] wrote.
pub struct Written {
    pub outcomes: Vec<Outcome>,
    /// PostgreSQL: the sessions the run changed, as it left them, with
    /// their rows' new versions: what a writer keeps for its next run
    /// ([`Run::add_kept`]).
    pub sessions: Vec<Kept>,
    /// A kept session's row was not the version kept (another write
    /// changed it since): the transaction must be rolled back and the run
    /// redone from rows read.
    pub stale: bool,
    /// Statements sent, each one round trip.
    pub round_trips: usize,
}

/// Reads what `run` does not have yet (the sessions it was not given, and
/// the stored request ids), decides, and writes, in the caller's
/// transaction. `Err` means a statement failed and the transaction must be
/// rolled back; so does [`Written::stale`].
pub async fn append_run<C: RunConnection>(
    conn: &mut C,
    mut run: Run<'_>,
    now: Timestamp,
) -> std::result::Result<Written, sqlx::Error> {
    let folded = run.reads_request_ids_with_sessions();
    let mut ids_read = false;
    let mut round_trips = 0;
    for statement in run.session_reads() {
        round_trips += 1;
        for row in conn.rows(&statement).await? {
            if folded && !ids_read {
                let ids = row
                    .optional_text(STORED_REQUEST_IDS)
                    .map_err(decode_error)?;
                run.add_stored_request_ids(ids.as_deref())
                    .map_err(decode_error)?;
                ids_read = true;
            }
            run.add_session(&row, now).map_err(decode_error)?;
        }
    }
    // Where the session read did not carry the ids: on SQLite, or when no
    // named session is live, so no row came back to carry them. A run
    // given kept sessions does not read them at all (below).
    if !ids_read && !run.kept {
        for statement in run.request_id_reads() {
            round_trips += 1;
            for row in conn.rows(&statement).await? {
                run.add_stored_request_id(&row).map_err(decode_error)?;
            }
        }
    }
    let (dialect, kept) = (run.dialect, run.kept);
    let (outcomes, writes, changed) = run.decide_settled(now);
    // A refusal decided on a kept session may come from what it was, not
    // what it is (a lease or a sequence changed elsewhere): redone from
    // rows read, as a stale write is.
    if kept
        && outcomes
            .iter()
            .any(|outcome| matches!(outcome, Outcome::Done(Err(_))))
    {
        return Ok(Written {
            outcomes,
            sessions: Vec::new(),
            stale: true,
            round_trips,
        });
    }
    let mut versions = HashMap::new();
    for statement in &writes {
        round_trips += 1;
        if dialect == Dialect::Postgres {
            for row in conn.rows(statement).await? {
                let key = row.int("key").map_err(decode_error)?;
                // The row of the versions' check (`statements::combined`).
                if key == -1 {
                    continue;
                }
                versions.insert(key, row.raw_text("version").map_err(decode_error)?);
            }
        } else {
            conn.run(statement).await?;
        }
    }
    let stale = dialect == Dialect::Postgres
        && changed
            .iter()
            .any(|changed| !versions.contains_key(&changed.loaded.key));
    let sessions = if dialect == Dialect::Postgres && !stale {
        // Not those with requests deferred: the general path writes them next.
        changed
            .into_iter()
            .filter(|changed| !changed.deferred)
            .filter_map(|Changed { tenant, loaded, .. }| {
                let version = versions.remove(&loaded.key)?;
                Some(Kept {
                    tenant,
                    loaded,
                    version,
                })
            })
            .collect()
    } else {
        Vec::new()
    };
    Ok(Written {
        outcomes,
        sessions,
        stale,
        round_trips,
    })
}

/// The general path's append: decides `exchange` on the session the caller
/// loaded and writes it in the caller's transaction, through the same
/// decider as a bulk run. The caller has done the steps the bulk path
/// defers: a retry answered from its first result, an expired lease
/// settled, and, for a `full_history` append, the stored history diffed
/// (`history_from`: where its new tail starts).
// The session's whole context: grouping it would only rename the arguments.
#[allow(clippy::too_many_arguments)]
pub async fn append_loaded(
    conn: &mut AnyConnection,
    dialect: Dialect,
    search: SearchWrites,
    tenant: &str,
    exchange: &NewExchange,
    loaded: Loaded,
    history_from: Option<usize>,
    now: Timestamp,
) -> Result<Applied<Appended>> {
    let requests = [(tenant, exchange)];
    let mut run = Run::new(dialect, search, &requests);
    run.history_from = history_from;
    run.prepared = true;
    run.add_loaded(tenant, loaded);
    let (outcomes, writes) = run.decide(now);
    let applied = match outcomes.into_iter().next() {
        Some(Outcome::Done(result)) => result?,
        Some(Outcome::Deferred) | None => {
            return Err(Error::storage(std::io::Error::other(
                "the append decider deferred a request the general path had prepared",
            )));
        }
    };
    for statement in &writes {
        bind(statement).execute(&mut *conn).await?;
    }
    Ok(applied)
}

/// Where a run's statements are executed through sqlx: a connection of
/// the store's pool (`Any`), or a PostgreSQL append writer's own, which
/// sends a message's search words in PostgreSQL's binary form.
pub trait RunConnection: Send {
    type Row: Columns + Send;

    /// The rows `statement` returns.
    fn rows<'c>(
        &'c mut self,
        statement: &'c Statement,
    ) -> impl Future<Output = std::result::Result<Vec<Self::Row>, sqlx::Error>> + Send + 'c;

    /// Executes `statement`.
    fn run<'c>(
        &'c mut self,
        statement: &'c Statement,
    ) -> impl Future<Output = std::result::Result<(), sqlx::Error>> + Send + 'c;
}

/// A [`RunConnection`] over a sqlx connection, its rows, and the function
/// binding a statement for it.
macro_rules! run_connection {
    ($connection:ty, $row:ty, $bind:ident) => {
        impl RunConnection for $connection {
            type Row = $row;

            async fn rows(
                &mut self,
                statement: &Statement,
            ) -> std::result::Result<Vec<$row>, sqlx::Error> {
                $bind(statement).fetch_all(self).await
            }

            async fn run(&mut self, statement: &Statement) -> std::result::Result<(), sqlx::Error> {
                $bind(statement).execute(self).await.map(|_| ())
            }
        }
    };
}

run_connection!(AnyConnection, AnyRow, bind);
run_connection!(PgConnection, PgRow, bind_postgres);

/// A statement's values bound for sqlx's `Any` driver (the words in their
/// text form, which the statement casts) or its PostgreSQL driver (in
/// their binary form).
macro_rules! binder {
    ($name:ident, $database:ty, $arguments:ty, $words:expr) => {
        fn $name(statement: &Statement) -> Query<'_, $database, $arguments> {
            let mut query = sqlx::query(&statement.sql);
            for value in &statement.params {
                query = match value {
                    Value::Int(v) => query.bind(*v),
                    Value::Text(v) => query.bind(v.as_str()),
                    Value::NullableText(v) => query.bind(v.as_deref()),
                    Value::Bytes(v) => query.bind(v.as_slice()),
                    Value::Words(v) => query.bind($words(v)),
                };
            }
            query
        }
    };
}

binder!(bind, Any, AnyArguments<'_>, |text: &String| {
    search::tsvector(text)
});
binder!(bind_postgres, Postgres, PgArguments, |text: &String| {
    Tsvector(search::tsvector_binary(text))
});

/// A `tsvector` in PostgreSQL's binary form ([`search::tsvector_binary`]).
struct Tsvector(Vec<u8>);

impl sqlx::Type<Postgres> for Tsvector {
    fn type_info() -> PgTypeInfo {
        PgTypeInfo::with_name("tsvector")
    }
}

impl sqlx::Encode<'_, Postgres> for Tsvector {
    fn encode_by_ref(
        &self,
        buf: &mut PgArgumentBuffer,
    ) -> std::result::Result<sqlx::encode::IsNull, sqlx::error::BoxDynError> {
        buf.extend_from_slice(&self.0);
        Ok(sqlx::encode::IsNull::No)
    }
}

fn decode_error(error: Error) -> sqlx::Error {
    sqlx::Error::Decode(Box::new(error))
}
