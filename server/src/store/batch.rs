//! The append decider, the one place the rules of AppendExchange live, and
//! the bulk path built on it: a run of requests written with one multi-row
//! statement per table instead of a dozen statements each.
//!
//! Every check an append makes (session exists, lease, expected sequence)
//! is decided in memory from the session rows read (and, on PostgreSQL,
//! locked in key order) at the start, in request order, so a refused
//! request writes nothing and the rest go on. The general path in
//! [`super::ops`] uses the same decider for a single request, as a run of
//! one ([`append_loaded`]), after the steps the bulk path leaves to it.
//! Requests a bulk run does not decide on its own are *deferred* to the
//! general path, which the caller runs after this one, in order:
//! - a `full_history` append (it diffs against the stored history);
//! - one with nothing to write (the general path words the error);
//! - a retry: its request id is stored already, or an earlier request of
//!   this run carries it;
//! - one on a session whose lease ran out (the general path settles it
//!   first);
//! - one with state changes (the general path checks the session's room
//!   for new entries, locks shared entries and writes them first).
//!
//! Once a request on a session is deferred, so is every later one on that
//! session, so each session's requests still apply in arrival order.
//!
//! A statement failing here (a race with another replica, say) fails the
//! whole run; the caller rolls it back and sends every request down the
//! general path.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

use sqlx::any::{AnyArguments, AnyRow};
use sqlx::postgres::{PgArgumentBuffer, PgArguments, PgRow, PgTypeInfo};
use sqlx::query::Query;
use sqlx::{Any, AnyConnection, PgConnection, Postgres};

use super::ops::{Appended, Applied, Dialect, SearchWrites};
use super::rows::{Columns, SESSION_COLUMNS, search_rowid, session_from_row};
use super::text::{escape, unescape};
use crate::domain::{
    AppendedExchange, Change, Error, Message, NewExchange, ProviderCall, Result, Session,
    SessionEvent, StoredMessage, Timestamp, control, ids, search,
};
use crate::wire::EncodedEvent;

/// One request's outcome on this path.
// One per request, moved once into its reply: boxing would only add an allocation.
#[allow(clippy::large_enum_variant)]
pub enum Outcome {
    Done(Result<Applied<Appended>>),
    /// For the general path.
    Deferred,
}

/// Rows per multi-row statement: far under SQLite's 32,766 and
/// PostgreSQL's 65,535 parameters at 12 columns.
const ROWS_PER_STATEMENT: usize = 500;

/// The column of a PostgreSQL session read that carries the run's stored
/// request ids ([`Run::reads_request_ids_with_sessions`]).
const STORED_REQUEST_IDS: &str = "stored_request_ids";

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
}

/// A session a run changed, as it leaves it.
pub struct Changed {
    pub tenant: String,
    pub loaded: Loaded,
    /// Later requests on it were deferred to the general path.
    pub deferred: bool,
}

/// A session a PostgreSQL writer keeps between runs: as its last run left
/// it, and the version (`xmin`) of the row that run wrote.
pub struct Kept {
    pub tenant: String,
    pub loaded: Loaded,
    pub version: String,
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
    for statement in run.session_reads() {
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
        });
    }
    let mut versions = HashMap::new();
    for statement in &writes {
        if dialect == Dialect::Postgres {
            for row in conn.rows(statement).await? {
                versions.insert(
                    row.int("key").map_err(decode_error)?,
                    row.raw_text("version").map_err(decode_error)?,
                );
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
    })
}

/// A live session the caller has read (and, on PostgreSQL, locked) itself.
pub struct Loaded {
    pub key: i64,
    pub session: Session,
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

/// The checks an append must pass on its session before anything else:
/// the lease (another run's, or one held while this request names none)
/// and the expected next sequence.
pub fn admit(session: &Session, exchange: &NewExchange) -> Result<()> {
    let active = &session.active_run_id;
    if !active.is_empty() && *active != exchange.run_id {
        return Err(Error::SessionBusy {
            active_run_id: active.clone(),
            expire_time: session.run_expire_time,
        });
    }
    if let Some(expected) = exchange.expected_next_sequence
        && expected != session.next_sequence
    {
        return Err(Error::SequenceMismatch {
            expected,
            actual: session.next_sequence,
        });
    }
    Ok(())
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

/// A statement with its parameters, numbered `$1…` in order of appearance.
pub struct Statement {
    pub sql: String,
    pub params: Vec<Value>,
}

/// A value bound into a statement.
pub enum Value {
    Int(i64),
    Text(String),
    NullableText(Option<String>),
    Bytes(Vec<u8>),
    /// A message's searchable text, bound as its words (a PostgreSQL
    /// `tsvector`): in the text form [`search::tsvector`], which the
    /// statement casts, or, by a PostgreSQL append writer, in the binary
    /// form.
    Words(String),
}

/// One run of appends, independent of how its statements are executed:
/// read the sessions and stored request ids ([`Run::session_reads`],
/// [`Run::request_id_reads`]), hand over the rows, then [`Run::decide`]
/// gives each request's outcome and the statements that write them.
pub struct Run<'a> {
    dialect: Dialect,
    search: SearchWrites,
    requests: &'a [(&'a str, &'a NewExchange)],
    sessions: HashMap<SessionKey, State>,
    stored_keys: Vec<(String, String)>,
    /// For a run of one on the general path: where the new tail of its
    /// `full_history` starts, diffed by the caller.
    history_from: Option<usize>,
    /// A run of one on the general path, whose caller has done the steps
    /// a bulk run defers (its state changes are written).
    prepared: bool,
    /// PostgreSQL: the version (`xmin`) of each session row, as read or as
    /// kept by the writer ([`Run::add_kept`]). The write checks each row
    /// is still that version and returns the new one.
    versions: HashMap<i64, String>,
    /// Some sessions were given as kept rather than read and locked.
    kept: bool,
}

impl<'a> Run<'a> {
    pub fn new(
        dialect: Dialect,
        search: SearchWrites,
        requests: &'a [(&'a str, &'a NewExchange)],
    ) -> Self {
        Run {
            dialect,
            search,
            requests,
            sessions: HashMap::with_capacity(requests.len()),
            stored_keys: Vec::new(),
            history_from: None,
            prepared: false,
            versions: HashMap::new(),
            kept: false,
        }
    }

    /// Reads the live sessions the requests name, rows of `tenant` and
    /// [`SESSION_COLUMNS`]; on PostgreSQL also locks them, in key order, so
    /// concurrent runs never deadlock.
    ///
    /// Where [`Run::reads_request_ids_with_sessions`], each row also
    /// carries the run's stored request ids, for
    /// [`Run::add_stored_request_ids`].
    pub fn session_reads(&self) -> Vec<Statement> {
        let wanted = self.unread_sessions();
        let (version, lock) = match self.dialect {
            Dialect::Sqlite => ("", ""),
            Dialect::Postgres => (
                ", xmin::text AS row_version",
                " ORDER BY key FOR UPDATE OF sessions",
            ),
        };
        // The stored ids, read in the same statement: one round trip fewer
        // per run. Its snapshot is taken before any wait for a lock, so a
        // first attempt committed by another replica during that wait is
        // not seen; its retry then fails the run on the key's primary key,
        // and the general path answers it from the first result.
        let (ids, mut id_params) = if self.reads_request_ids_with_sessions() {
            let keyed = self.keyed_requests();
            let sql = format!(
                ", (SELECT json_agg(json_build_array(k.tenant, k.request_id))::text \
                 FROM idempotency_keys AS k WHERE (k.tenant, k.request_id) IN (VALUES {})) \
                 AS {STORED_REQUEST_IDS}",
                placeholders_from(2 * wanted.len() + 1, keyed.len(), 2)
            );
            (sql, pairs(&keyed))
        } else {
            (String::new(), Vec::new())
        };
        if self.dialect == Dialect::Sqlite {
            // One by one, by the index's key: `IN (VALUES …)` would build a
            // temporary B-tree of the list for every run.
            return wanted
                .iter()
                .map(|wanted| Statement {
                    sql: format!(
                        "SELECT tenant, {SESSION_COLUMNS} FROM sessions WHERE deleted = 0 \
                         AND tenant = $1 AND id = $2"
                    ),
                    params: pairs(std::slice::from_ref(wanted)),
                })
                .collect();
        }
        wanted
            .chunks(ROWS_PER_STATEMENT)
            .map(|chunk| {
                let mut params = pairs(chunk);
                params.append(&mut id_params);
                Statement {
                    sql: format!(
                        "SELECT tenant, {SESSION_COLUMNS}{version}{ids} FROM sessions WHERE deleted = 0 \
                         AND (tenant, id) IN (VALUES {}){lock}",
                        placeholders(chunk.len(), 2)
                    ),
                    params,
                }
            })
            .collect()
    }

    /// Whether [`Run::session_reads`] also reads the stored request ids,
    /// instead of [`Run::request_id_reads`] doing it: on PostgreSQL, for a
    /// run whose sessions and ids each fit in one statement (every run the
    /// writers make).
    pub fn reads_request_ids_with_sessions(&self) -> bool {
        let keyed = self.keyed_requests().len();
        self.dialect == Dialect::Postgres
            && keyed > 0
            && keyed <= ROWS_PER_STATEMENT
            && self.unread_sessions().len() <= ROWS_PER_STATEMENT
    }

    /// The sessions [`Run::session_reads`] reads: those named and not
    /// given already ([`Run::add_kept`]).
    fn unread_sessions(&self) -> Vec<(&'a str, &'a str)> {
        let mut wanted = self.wanted_sessions();
        if self.kept {
            wanted.retain(|(tenant, id)| {
                !self
                    .sessions
                    .contains_key(&((*tenant).to_owned(), (*id).to_owned()))
            });
        }
        wanted
    }

    /// The sessions the requests name, (tenant, id), sorted, once each.
    fn wanted_sessions(&self) -> Vec<(&'a str, &'a str)> {
        let mut wanted: Vec<(&str, &str)> = self
            .requests
            .iter()
            .map(|(tenant, exchange)| (*tenant, exchange.session_id.as_str()))
            .collect();
        wanted.sort_unstable();
        wanted.dedup();
        wanted
    }

    /// The requests' (tenant, request id), of those that have one.
    fn keyed_requests(&self) -> Vec<(&'a str, &'a str)> {
        self.requests
            .iter()
            .filter(|(_, exchange)| !exchange.request_id.is_empty())
            .map(|(tenant, exchange)| (*tenant, exchange.request_id.as_str()))
            .collect()
    }

    /// Reads which of the requests' ids are stored already: rows of
    /// `tenant` and `request_id`.
    pub fn request_id_reads(&self) -> Vec<Statement> {
        if self.dialect == Dialect::Sqlite {
            // One by one, by the primary key, as the sessions are read.
            return self
                .keyed_requests()
                .iter()
                .map(|keyed| Statement {
                    sql: "SELECT tenant, request_id FROM idempotency_keys \
                          WHERE tenant = $1 AND request_id = $2"
                        .to_owned(),
                    params: pairs(std::slice::from_ref(keyed)),
                })
                .collect();
        }
        self.keyed_requests()
            .chunks(ROWS_PER_STATEMENT)
            .map(|chunk| Statement {
                sql: format!(
                    "SELECT tenant, request_id FROM idempotency_keys \
                     WHERE (tenant, request_id) IN (VALUES {})",
                    placeholders(chunk.len(), 2)
                ),
                params: pairs(chunk),
            })
            .collect()
    }

    /// A row read by [`Run::session_reads`].
    pub fn add_session(&mut self, row: &impl Columns, now: Timestamp) -> Result<()> {
        let loaded = Loaded {
            key: row.int("key")?,
            session: session_from_row(row)?,
        };
        if loaded.session.is_expired(now) {
            // Gone from its expire_time on: its requests find no session.
            return Ok(());
        }
        if self.dialect == Dialect::Postgres {
            self.versions
                .insert(loaded.key, row.raw_text("row_version")?);
        }
        self.add_loaded(&row.text("tenant")?, loaded);
        Ok(())
    }

    /// A session a PostgreSQL writer kept from its last run, not read (nor
    /// locked) again: the write checks its row is still `version`, and the
    /// run is [`Written::stale`] if not, or if it refuses a request (the
    /// refusal may come from what the session was). Request ids are not
    /// read either when every session is kept: a retry fails the write on
    /// the key's primary key, and the caller redoes the run from rows read,
    /// which answers it from the first result. A session expired by `now`
    /// is not taken: it is read, and found gone.
    pub fn add_kept(&mut self, kept: Kept, now: Timestamp) {
        if kept.loaded.session.is_expired(now) {
            return;
        }
        self.kept = true;
        self.versions.insert(kept.loaded.key, kept.version);
        self.add_loaded(&kept.tenant, kept.loaded);
    }

    /// A session read by the caller instead of [`Run::session_reads`].
    pub fn add_loaded(&mut self, tenant: &str, loaded: Loaded) {
        self.sessions.insert(
            (tenant.to_owned(), loaded.session.id.clone()),
            State {
                key: loaded.key,
                session: loaded.session,
                deferred: false,
                changed: false,
                added_messages: 0,
                added_calls: 0,
                added_tokens: 0,
                added_cost: 0,
                last_call: None,
            },
        );
    }

    /// A row read by [`Run::request_id_reads`].
    pub fn add_stored_request_id(&mut self, row: &impl Columns) -> Result<()> {
        self.stored_keys
            .push((row.text("tenant")?, row.text("request_id")?));
        Ok(())
    }

    /// The stored request ids a session read carried (a JSON array of
    /// `[tenant, request_id]` as stored; `None` for none).
    pub fn add_stored_request_ids(&mut self, stored: Option<&str>) -> Result<()> {
        let Some(stored) = stored else {
            return Ok(());
        };
        let pairs: Vec<(String, String)> = serde_json::from_str(stored).map_err(Error::storage)?;
        self.stored_keys.extend(
            pairs
                .into_iter()
                .map(|(tenant, request_id)| (unescape(tenant), unescape(request_id))),
        );
        Ok(())
    }

    /// Decides every request, in order, against the rows read: one outcome
    /// per request, and the statements writing what was accepted.
    pub fn decide(self, now: Timestamp) -> (Vec<Outcome>, Vec<Statement>) {
        let (outcomes, writes, _) = self.decide_settled(now);
        (outcomes, writes)
    }

    /// As [`Run::decide`], with every session the run changed as it
    /// leaves it.
    pub fn decide_settled(
        mut self,
        now: Timestamp,
    ) -> (Vec<Outcome>, Vec<Statement>, Vec<Changed>) {
        let (dialect, search) = (self.dialect, self.search);
        let mut rows = Rows::default();
        let mut outcomes = Vec::with_capacity(self.requests.len());
        let mut seen_keys: Vec<(&str, &str)> = Vec::new();
        for &(tenant, exchange) in self.requests {
            let key_taken = !exchange.request_id.is_empty()
                && (self
                    .stored_keys
                    .iter()
                    .any(|(t, id)| t == tenant && *id == exchange.request_id)
                    || seen_keys.contains(&(tenant, exchange.request_id.as_str())));
            if !exchange.request_id.is_empty() {
                seen_keys.push((tenant, &exchange.request_id));
            }
            // The messages it adds before the call's responses: `messages`,
            // or the new tail of a `full_history` diffed by the caller.
            let inputs: Option<&[Message]> = match self.history_from {
                _ if exchange.full_history.is_empty() => Some(&exchange.messages),
                Some(from) => exchange.full_history.get(from..),
                None => None,
            };
            let plain = inputs.is_some_and(|inputs| {
                !inputs.is_empty()
                    || !exchange.response_messages.is_empty()
                    || exchange.provider_call.is_some()
            }) && (self.prepared || exchange.state_changes.is_empty());
            let state = self
                .sessions
                .get_mut(&(tenant.to_owned(), exchange.session_id.clone()));
            let outcome = match state {
                Some(state) if !plain || key_taken => {
                    // Keep the session's arrival order: what follows waits too.
                    state.deferred = true;
                    Outcome::Deferred
                }
                _ if !plain || key_taken => Outcome::Deferred,
                None => Outcome::Done(Err(Error::SessionNotFound(exchange.session_id.clone()))),
                Some(state) if state.deferred => Outcome::Deferred,
                Some(state) => {
                    let lease = &state.session.active_run_id;
                    if !lease.is_empty() && state.session.run_expire_time <= now {
                        state.deferred = true;
                        Outcome::Deferred
                    } else {
                        let inputs = inputs.unwrap_or_default();
                        Outcome::Done(append_one(
                            state, tenant, exchange, inputs, now, search, &mut rows,
                        ))
                    }
                }
            };
            outcomes.push(outcome);
        }
        let writes = rows.statements(dialect, &self.sessions, &self.versions);
        let settled = self
            .sessions
            .into_iter()
            .filter(|(_, state)| state.changed)
            .map(|((tenant, _), state)| {
                let loaded = Loaded {
                    key: state.key,
                    session: state.session,
                };
                Changed {
                    tenant,
                    loaded,
                    deferred: state.deferred,
                }
            })
            .collect();
        (outcomes, writes, settled)
    }
}

/// A session as this run has left it so far.
struct State {
    key: i64,
    /// As read, then as this run leaves it (revision, next sequence, …).
    session: Session,
    /// Requests on it go to the general path from here on.
    deferred: bool,
    /// What this run adds to the session row.
    changed: bool,
    added_messages: i64,
    added_calls: i64,
    added_tokens: i64,
    added_cost: i64,
    last_call: Option<ProviderCall>,
}

type SessionKey = (String, String);

/// Decides one request against its session's state and, if it is
/// accepted, adds its rows: `inputs` (its messages), then the provider
/// call's responses.
#[allow(clippy::too_many_arguments)]
fn append_one(
    state: &mut State,
    tenant: &str,
    exchange: &NewExchange,
    inputs: &[Message],
    now: Timestamp,
    search: SearchWrites,
    rows: &mut Rows,
) -> Result<Applied<Appended>> {
    admit(&state.session, exchange)?;
    let call = exchange.normalized_call().map(|mut call| {
        call.id = ids::call_id();
        call.session_id = state.session.id.clone();
        call.create_time = now;
        call
    });
    let call_id = call.as_ref().map(|c| c.id.clone());
    let responses = exchange
        .response_messages
        .iter()
        .map(|m| (m, call_id.clone()));
    let mut stored = Vec::with_capacity(inputs.len() + exchange.response_messages.len());
    let inputs = inputs.iter().map(|m| (m, None));
    // The event this append records, which refers to its messages.
    let revision = state.session.revision + 1;
    for (offset, (message, produced_by)) in (0_i64..).zip(inputs.chain(responses)) {
        let sequence = state.session.next_sequence + offset;
        let message = StoredMessage {
            id: ids::message_id(),
            session_id: state.session.id.clone(),
            sequence,
            produced_by_call_id: produced_by.unwrap_or_default(),
            message: message.clone(),
            create_time: now,
            redacted: false,
        };
        if search == SearchWrites::Inline {
            let text = control::search_text(&message.message);
            if !text.trim().is_empty() {
                rows.search(state.key, sequence, text);
            }
        }
        stored.push(message);
    }
    let added = i64::try_from(stored.len()).map_err(Error::storage)?;
    if search == SearchWrites::Logged && added > 0 {
        rows.changed(
            state.key,
            state.session.next_sequence,
            state.session.next_sequence + added,
        );
    }
    if let Some(call) = &call {
        rows.call(state.key, tenant, &state.session.user, call);
        state.added_calls += 1;
        state.added_tokens = state.added_tokens.saturating_add(call.total_tokens);
        state.added_cost = state.added_cost.saturating_add(call.cost_micros_usd);
        state.last_call = Some(call.clone());
    }
    state.session.next_sequence += added;
    state.added_messages += added;
    state.session.revision = revision;
    state.session.update_time = now;
    state.changed = true;
    let first_sequence = state.session.next_sequence - added;

    let appended = AppendedExchange {
        messages: stored,
        provider_call: call,
        run_id: exchange.run_id.clone(),
        next_sequence: state.session.next_sequence,
        state_changes: exchange.state_changes.clone(),
        update_time: now,
        replayed: false,
    };
    // The messages' rows take their content from the event's encoding.
    let (event, logged, contents) = EncodedEvent::referring_with_contents(SessionEvent {
        revision,
        time: now,
        change: Change::ExchangeAppended(appended.clone()),
    });
    for (message, content) in appended.messages.iter().zip(contents) {
        rows.message(state.key, message, content, revision);
    }
    rows.event(
        state.key,
        revision,
        now,
        logged,
        first_sequence..state.session.next_sequence,
        &exchange.request_id,
    );
    if !exchange.request_id.is_empty() {
        rows.idempotency_key(
            tenant,
            &exchange.request_id,
            state.key,
            exchange.fingerprint(),
            revision,
        );
    }
    Ok(Applied {
        reply: (revision, appended),
        events: vec![(state.key, Arc::new(event))],
    })
}

/// The rows one run inserts, table by table.
#[derive(Default)]
struct Rows {
    calls: Vec<Value>,
    messages: Vec<Value>,
    /// Session key, sequence and text of each searchable message
    /// ([`SearchWrites::Inline`]).
    search: Vec<(i64, i64, String)>,
    /// Session key and sequence range of the messages added
    /// ([`SearchWrites::Logged`]).
    changed: Vec<(i64, i64, i64)>,
    events: Vec<Value>,
    keys: Vec<Value>,
}

impl Rows {
    /// A call's row, with its session's tenant and owner beside it, so
    /// SummarizeUsage reads a tenant's or a user's calls by time on one
    /// index (a session's owner never changes).
    fn call(&mut self, session_key: i64, tenant: &str, user: &str, call: &ProviderCall) {
        self.calls.extend([
            Value::Text(escape(tenant)),
            Value::Text(escape(user)),
            Value::Text(call.id.clone()),
            Value::Int(session_key),
            Value::Text(escape(&call.request_id)),
            Value::Text(escape(&call.provider)),
            Value::Text(escape(&call.model)),
            Value::Text(escape(&call.requested_provider)),
            Value::Text(escape(&call.requested_model)),
            Value::Int(call.prompt_tokens),
            Value::Int(call.completion_tokens),
            Value::Int(call.total_tokens),
            Value::Int(call.cost_micros_usd),
            Value::Int(call.create_time.0),
            Value::Int(call.cached_input_tokens),
            Value::Int(call.cache_creation_input_tokens),
            Value::Int(call.reasoning_tokens),
            Value::Text(escape(&call.usage_json)),
            Value::Int(call.duration_micros),
        ]);
    }

    /// A message's row, its content `content` (as
    /// [`encode_content`](super::rows::encode_content)
    /// writes it), referred to by the event at `referenced_by`.
    fn message(
        &mut self,
        session_key: i64,
        message: &StoredMessage,
        content: Vec<u8>,
        referenced_by: i64,
    ) {
        let produced_by = &message.produced_by_call_id;
        self.messages.extend([
            Value::Int(session_key),
            Value::Int(message.sequence),
            Value::Text(message.id.clone()),
            Value::NullableText((!produced_by.is_empty()).then(|| produced_by.clone())),
            Value::Text(String::new()),
            Value::Bytes(content),
            Value::Int(message.create_time.0),
            Value::Int(0),
            Value::Int(referenced_by),
        ]);
    }

    fn search(&mut self, session_key: i64, sequence: i64, text: String) {
        self.search.push((session_key, sequence, text));
    }

    fn changed(&mut self, session_key: i64, from: i64, until: i64) {
        self.changed.push((session_key, from, until));
    }

    /// An event row: its encoding in `wire`, `body` left empty (see
    /// [`super::ops::INSERT_EVENT`]), referring to the messages `refers`
    /// for their content ([`EncodedEvent::referring`]), and naming the
    /// exchange's request id, if it has one: deleting the session's history
    /// finds its idempotency keys through its events (migration 0019).
    fn event(
        &mut self,
        session_key: i64,
        revision: i64,
        now: Timestamp,
        encoding: Vec<u8>,
        refers: Range<i64>,
        request_id: &str,
    ) {
        self.events.extend([
            Value::Int(session_key),
            Value::Int(revision),
            Value::Int(now.0),
            Value::Text(String::new()),
            Value::Bytes(encoding),
            Value::Int(refers.start),
            Value::Int(refers.end),
            Value::NullableText((!request_id.is_empty()).then(|| escape(request_id))),
        ]);
    }

    fn idempotency_key(
        &mut self,
        tenant: &str,
        request_id: &str,
        session_key: i64,
        fingerprint: Vec<u8>,
        revision: i64,
    ) {
        // Found through its event, not in the index by session kept for
        // keys written before (migration 0019).
        self.keys.extend([
            Value::Text(escape(tenant)),
            Value::Text(escape(request_id)),
            Value::Int(session_key),
            Value::Bytes(fingerprint),
            Value::Int(revision),
            Value::Int(1),
        ]);
    }

    /// The statements writing everything: one per table (per
    /// [`ROWS_PER_STATEMENT`] rows), the sessions' UPDATE included.
    fn statements(
        self,
        dialect: Dialect,
        sessions: &HashMap<SessionKey, State>,
        versions: &HashMap<i64, String>,
    ) -> Vec<Statement> {
        let mut statements = Vec::new();
        // On SQLite, `OR FAIL` rather than the default `ABORT`: a statement
        // that may abort halfway must keep a statement journal, a copy of
        // every page it changes that the transaction had already changed
        // (about 8% of the engine's append thread, BENCHMARKS.md). A failed
        // statement keeps the rows it wrote before failing, but every caller
        // rolls the whole run back on any error (the engine's transaction,
        // sqlx's savepoint), so they are never committed.
        let insert_into = match dialect {
            Dialect::Sqlite => "INSERT OR FAIL INTO",
            Dialect::Postgres => "INSERT INTO",
        };
        // Calls before the messages that reference them.
        insert(
            &mut statements,
            &format!(
                "{insert_into} provider_calls (tenant, user_name, id, session_key, request_id, provider, model, \
             requested_provider, requested_model, prompt_tokens, completion_tokens, \
             total_tokens, cost_micros_usd, create_time, cached_input_tokens, \
             cache_creation_input_tokens, reasoning_tokens, usage_json, duration_micros) VALUES "
            ),
            19,
            self.calls,
        );
        insert(
            &mut statements,
            &format!(
                "{insert_into} messages (session_key, sequence, id, produced_by_call_id, body, \
             wire, create_time, redacted, referenced_by) VALUES "
            ),
            9,
            self.messages,
        );
        // In row id order: FTS5 flushes its pending terms to a new segment
        // whenever a row id is lower than the last one written, so rows in
        // arrival order (sessions interleaved) cost a segment, and later
        // merges, per step back (BENCHMARKS.md).
        let mut search = self.search;
        search.sort_unstable_by_key(|(session_key, sequence, _)| (*session_key, *sequence));
        let (head, columns, tail) = match dialect {
            Dialect::Sqlite => (
                "INSERT INTO search.message_search (rowid, text) VALUES ",
                2,
                "",
            ),
            // The words only (`domain::search::tsvector`): the text itself
            // is in the message's body.
            Dialect::Postgres => (
                "INSERT INTO message_search (session_key, sequence, words) \
                 SELECT v.k, v.s, CAST(v.t AS tsvector) FROM (VALUES ",
                3,
                ") AS v (k, s, t)",
            ),
        };
        let mut values = Vec::with_capacity(search.len() * columns);
        for (session_key, sequence, text) in search {
            match dialect {
                Dialect::Sqlite => {
                    values.push(Value::Int(search_rowid(session_key, sequence)));
                    values.push(Value::Text(text));
                }
                Dialect::Postgres => values.extend([
                    Value::Int(session_key),
                    Value::Int(sequence),
                    Value::Words(text),
                ]),
            }
        }
        insert_with(&mut statements, (head, tail), columns, values);
        // One range per session: its appends in a run are contiguous.
        let mut changed = self.changed;
        changed.sort_unstable();
        let mut ranges: Vec<(i64, i64, i64)> = Vec::with_capacity(changed.len());
        for (key, from, until) in changed {
            match ranges.last_mut() {
                Some(last) if last.0 == key && last.2 >= from => last.2 = last.2.max(until),
                _ => ranges.push((key, from, until)),
            }
        }
        insert(
            &mut statements,
            &format!(
                "{insert_into} search_log (session_key, from_sequence, until_sequence) VALUES "
            ),
            3,
            ranges
                .into_iter()
                .flat_map(|(key, from, until)| {
                    [Value::Int(key), Value::Int(from), Value::Int(until)]
                })
                .collect(),
        );
        let mut changed: Vec<&State> = sessions.values().filter(|s| s.changed).collect();
        changed.sort_unstable_by_key(|s| s.key);
        let updates =
            statements.len()..statements.len() + changed.len().div_ceil(ROWS_PER_STATEMENT);
        update_sessions(&mut statements, dialect, &changed, versions);
        insert(
            &mut statements,
            &format!(
                "{insert_into} events (session_key, revision, time, body, wire, refers_from, \
                 refers_until, request_id) VALUES "
            ),
            8,
            self.events,
        );
        insert(
            &mut statements,
            &format!(
                "{insert_into} idempotency_keys (tenant, request_id, session_key, fingerprint, \
             revision, found_through_event) VALUES "
            ),
            6,
            self.keys,
        );
        if dialect == Dialect::Postgres && !statements.is_empty() {
            return vec![combined(statements, updates)];
        }
        statements
    }
}

/// PostgreSQL: a run's statements as one, so a run writes in one round
/// trip. Each becomes a data-modifying `WITH` query (PostgreSQL runs them
/// all; the tables they write have no foreign keys to check, migration
/// 0012). It returns what the session updates (the statements at
/// `updates`) return: each changed session's key and new row version. The
/// commit hints are sent after the commit (`postgres/hints.rs`).
fn combined(statements: Vec<Statement>, updates: Range<usize>) -> Statement {
    let mut sql = String::from("WITH ");
    let mut params = Vec::new();
    for (number, statement) in statements.into_iter().enumerate() {
        if number > 0 {
            sql.push_str(", ");
        }
        sql.push_str(&format!(
            "w{number} AS ({})",
            renumbered(&statement.sql, params.len())
        ));
        params.extend(statement.params);
    }
    let returned: Vec<String> = updates
        .map(|number| format!("SELECT key, version FROM w{number}"))
        .collect();
    if returned.is_empty() {
        sql.push_str(" SELECT 1 WHERE false");
    } else {
        sql.push(' ');
        sql.push_str(&returned.join(" UNION ALL "));
    }
    Statement { sql, params }
}

/// `sql` with every placeholder `$N` moved up by `offset`.
fn renumbered(sql: &str, offset: usize) -> String {
    let mut out = String::with_capacity(sql.len() + sql.len() / 8);
    let mut rest = sql;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..=at]);
        rest = &rest[at + 1..];
        let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        match rest[..digits].parse::<usize>() {
            Ok(number) => out.push_str(&(number + offset).to_string()),
            Err(_) => out.push_str(&rest[..digits]),
        }
        rest = &rest[digits..];
    }
    out.push_str(rest);
    out
}

/// The changed session rows after this run, in one statement per
/// [`ROWS_PER_STATEMENT`] sessions: each one's revision and sequence, its
/// counters grown by what the run added (totals saturate, as in the general
/// path) and, if the run recorded a call on it, the last call's fields.
/// `VALUES` columns are `column1…` on both engines.
///
/// On PostgreSQL each update returns the session's key and its row's new
/// version (`xmin`), and, where every row's version is known (`versions`,
/// as read or kept), updates only a row still at that version: a session
/// changed since is left out of what it returns.
fn update_sessions(
    statements: &mut Vec<Statement>,
    dialect: Dialect,
    changed: &[&State],
    versions: &HashMap<i64, String>,
) {
    let checked = dialect == Dialect::Postgres
        && changed
            .iter()
            .all(|state| versions.contains_key(&state.key));
    let columns = if checked { 14 } else { 13 };
    let (update, check, returning) = match dialect {
        Dialect::Sqlite => ("UPDATE OR FAIL", "", ""),
        Dialect::Postgres if checked => (
            "UPDATE",
            " AND sessions.xmin::text = v.column14",
            " RETURNING sessions.key, sessions.xmin::text AS version",
        ),
        Dialect::Postgres => (
            "UPDATE",
            "",
            " RETURNING sessions.key, sessions.xmin::text AS version",
        ),
    };
    // SQLite updates each session by its key, its values bound directly:
    // `UPDATE … FROM (VALUES …)` would build two temporary B-trees per
    // statement (the VALUES and the rows to change), each costing more
    // than a whole one-row update.
    let per_session = dialect == Dialect::Sqlite;
    let rows_per_statement = if per_session { 1 } else { ROWS_PER_STATEMENT };
    for chunk in changed.chunks(rows_per_statement) {
        let set = "revision = v.column2, next_sequence = v.column3, \
             message_count = message_count + v.column4, update_time = v.column5, \
             provider_call_count = provider_call_count + v.column6, \
             total_tokens = CASE WHEN total_tokens > 9223372036854775807 - v.column7 \
                 THEN 9223372036854775807 ELSE total_tokens + v.column7 END, \
             total_cost_micros_usd = CASE WHEN total_cost_micros_usd > 9223372036854775807 - v.column8 \
                 THEN 9223372036854775807 ELSE total_cost_micros_usd + v.column8 END, \
             last_model = CASE WHEN v.column9 = 1 THEN v.column10 ELSE last_model END, \
             last_provider = CASE WHEN v.column9 = 1 THEN v.column11 ELSE last_provider END, \
             last_cost_micros_usd = CASE WHEN v.column9 = 1 THEN v.column12 ELSE last_cost_micros_usd END, \
             last_request_id = CASE WHEN v.column9 = 1 THEN v.column13 ELSE last_request_id END";
        let sql = if per_session {
            format!(
                "{update} sessions SET {} WHERE key = $1",
                set.replace("v.column", "$")
            )
        } else {
            format!(
                "{update} sessions SET {set} FROM (VALUES {values}) AS v \
                 WHERE sessions.key = v.column1{check}{returning}",
                values = placeholders(chunk.len(), columns)
            )
        };
        let mut params = Vec::with_capacity(chunk.len() * columns);
        for state in chunk {
            let (has_call, model, provider, cost, request_id) = match &state.last_call {
                Some(call) => (
                    1_i64,
                    escape(&call.model),
                    escape(&call.provider),
                    call.cost_micros_usd,
                    escape(&call.request_id),
                ),
                None => (0, String::new(), String::new(), 0, String::new()),
            };
            params.extend([
                Value::Int(state.key),
                Value::Int(state.session.revision),
                Value::Int(state.session.next_sequence),
                Value::Int(state.added_messages),
                Value::Int(state.session.update_time.0),
                Value::Int(state.added_calls),
                Value::Int(state.added_tokens),
                Value::Int(state.added_cost),
                Value::Int(has_call),
                Value::Text(model),
                Value::Text(provider),
                Value::Int(cost),
                Value::Text(request_id),
            ]);
            if checked {
                let version = versions.get(&state.key).cloned().unwrap_or_default();
                params.push(Value::Text(version));
            }
        }
        statements.push(Statement { sql, params });
    }
}

/// `($1, $2), ($3, $4)`: `rows` groups of `columns` numbered placeholders.
fn placeholders(rows: usize, columns: usize) -> String {
    placeholders_from(1, rows, columns)
}

/// As [`placeholders`], numbered from `first`.
fn placeholders_from(first: usize, rows: usize, columns: usize) -> String {
    let mut sql = String::with_capacity(rows * columns * 5);
    for row in 0..rows {
        if row > 0 {
            sql.push_str(", ");
        }
        sql.push('(');
        for column in 0..columns {
            if column > 0 {
                sql.push_str(", ");
            }
            sql.push('$');
            sql.push_str(&(first + row * columns + column).to_string());
        }
        sql.push(')');
    }
    sql
}

/// (tenant, text) pairs as parameters, escaped as stored.
fn pairs(pairs: &[(&str, &str)]) -> Vec<Value> {
    pairs
        .iter()
        .flat_map(|(tenant, text)| [Value::Text(escape(tenant)), Value::Text(escape(text))])
        .collect()
}

/// Inserts `values` (`columns` per row) with `head` (`INSERT … VALUES `).
fn insert(statements: &mut Vec<Statement>, head: &str, columns: usize, values: Vec<Value>) {
    insert_with(statements, (head, ""), columns, values);
}

/// As [`insert`], the rows' placeholders between `head` and `tail` (`…
/// FROM (VALUES ` and `) AS v (…)`, for rows a statement computes from).
fn insert_with(
    statements: &mut Vec<Statement>,
    (head, tail): (&str, &str),
    columns: usize,
    values: Vec<Value>,
) {
    let mut values = values.into_iter();
    let mut left = values.len() / columns;
    while left > 0 {
        let rows = left.min(ROWS_PER_STATEMENT);
        left -= rows;
        statements.push(Statement {
            sql: format!("{head}{}{tail}", placeholders(rows, columns)),
            params: values.by_ref().take(rows * columns).collect(),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{Metadata, Role};

    const NOW: Timestamp = Timestamp(1_000_000);

    fn session(id: &str, revision: i64) -> Loaded {
        Loaded {
            key: revision * 100,
            session: Session {
                id: id.to_owned(),
                title: String::new(),
                system_prompt: String::new(),
                user: String::new(),
                metadata: Metadata::default(),
                summary_message_id: String::new(),
                revision,
                create_time: Timestamp(1),
                update_time: Timestamp(1),
                parent_session_id: String::new(),
                parent_sequence: 0,
                active_run_id: String::new(),
                run_expire_time: Timestamp(0),
                next_sequence: 0,
                expire_time: Timestamp(0),
            },
        }
    }

    fn exchange(session_id: &str) -> NewExchange {
        NewExchange {
            session_id: session_id.to_owned(),
            messages: vec![Message::text(Role::User, "hi")],
            full_history: Vec::new(),
            provider_call: Some(ProviderCall {
                provider: "openai".into(),
                model: "gpt".into(),
                prompt_tokens: 3,
                completion_tokens: 2,
                cost_micros_usd: 7,
                ..ProviderCall::default()
            }),
            response_messages: vec![Message::text(Role::Assistant, "hello")],
            expected_next_sequence: None,
            request_id: String::new(),
            run_id: String::new(),
            state_changes: Vec::new(),
        }
    }

    /// Decides `requests` against `sessions` (of tenant `t`) at [`NOW`].
    fn decide(
        dialect: Dialect,
        sessions: Vec<Loaded>,
        stored_keys: &[&str],
        requests: &[(&str, &NewExchange)],
    ) -> (Vec<Outcome>, Vec<Statement>) {
        let mut run = Run::new(dialect, SearchWrites::Inline, requests);
        for loaded in sessions {
            run.add_loaded("t", loaded);
        }
        for key in stored_keys {
            run.stored_keys.push(("t".to_owned(), (*key).to_owned()));
        }
        run.decide(NOW)
    }

    fn done(outcome: Outcome) -> Result<Applied<Appended>> {
        match outcome {
            Outcome::Done(result) => result,
            Outcome::Deferred => panic!("deferred"),
        }
    }

    fn appended(outcome: Outcome) -> (i64, AppendedExchange) {
        match done(outcome) {
            Ok(applied) => applied.reply,
            Err(error) => panic!("refused: {error}"),
        }
    }

    #[test]
    fn numbers_messages_links_responses_and_counts_the_call() {
        let request = exchange("s");
        let (mut outcomes, writes) = decide(
            Dialect::Sqlite,
            vec![session("s", 4)],
            &[],
            &[("t", &request)],
        );
        let (revision, appended) = appended(outcomes.remove(0));
        assert_eq!(revision, 5);
        assert_eq!(appended.next_sequence, 2);
        let Some(call) = appended.provider_call else {
            panic!("the call is recorded");
        };
        assert!(call.id.starts_with("call_"));
        assert_eq!((call.total_tokens, call.create_time), (5, NOW));
        let sequences: Vec<i64> = appended.messages.iter().map(|m| m.sequence).collect();
        assert_eq!(sequences, [0, 1]);
        assert_eq!(appended.messages[0].produced_by_call_id, "");
        assert_eq!(appended.messages[1].produced_by_call_id, call.id);
        // Calls, messages, search, the session row, the event.
        // The table each statement writes: the word after INTO (or FAIL).
        let tables: Vec<&str> = writes
            .iter()
            .map(|w| {
                let words: Vec<&str> = w.sql.split_whitespace().collect();
                let at = (words.iter().position(|w| *w == "INTO"))
                    .or_else(|| words.iter().position(|w| *w == "FAIL"));
                at.and_then(|at| words.get(at + 1))
                    .copied()
                    .unwrap_or_default()
            })
            .collect();
        assert_eq!(
            tables,
            [
                "provider_calls",
                "messages",
                "search.message_search",
                "sessions",
                "events"
            ],
            "{tables:?}"
        );
        assert!(writes[3].sql.starts_with("UPDATE OR FAIL sessions"));
    }

    #[test]
    fn refusals_write_nothing_and_name_the_rule() {
        let missing = exchange("nope");
        let mut busy_session = session("busy", 1);
        busy_session.session.active_run_id = "run-1".into();
        busy_session.session.run_expire_time = Timestamp(NOW.0 + 1);
        let busy = exchange("busy");
        let mut stale = exchange("s");
        stale.expected_next_sequence = Some(3);
        let (outcomes, writes) = decide(
            Dialect::Sqlite,
            vec![session("s", 1), busy_session],
            &[],
            &[("t", &missing), ("t", &busy), ("t", &stale)],
        );
        let errors: Vec<Error> = outcomes
            .into_iter()
            .map(|o| match done(o) {
                Err(error) => error,
                Ok(_) => panic!("refused"),
            })
            .collect();
        assert!(matches!(&errors[0], Error::SessionNotFound(id) if id == "nope"));
        assert!(
            matches!(&errors[1], Error::SessionBusy { active_run_id, .. } if active_run_id == "run-1")
        );
        assert!(matches!(
            errors[2],
            Error::SequenceMismatch {
                expected: 3,
                actual: 0
            }
        ));
        assert!(writes.is_empty(), "a refused request writes nothing");
    }

    #[test]
    fn the_lease_holder_may_append() {
        let mut held = session("s", 1);
        held.session.active_run_id = "run-1".into();
        held.session.run_expire_time = Timestamp(NOW.0 + 1);
        let mut request = exchange("s");
        request.run_id = "run-1".into();
        let (mut outcomes, _) = decide(Dialect::Sqlite, vec![held], &[], &[("t", &request)]);
        assert_eq!(appended(outcomes.remove(0)).1.run_id, "run-1");
    }

    #[test]
    fn defers_what_the_general_path_must_prepare_and_keeps_session_order() {
        let mut expired = session("old", 1);
        expired.session.active_run_id = "run-1".into();
        expired.session.run_expire_time = NOW;
        let on_expired = exchange("old");
        let mut retry = exchange("s");
        retry.request_id = "r1".into();
        let after_retry = exchange("s");
        let mut history = exchange("h");
        history.full_history = vec![Message::text(Role::User, "hi")];
        history.messages.clear();
        let mut twice = exchange("u");
        twice.request_id = "r2".into();
        let (outcomes, _) = decide(
            Dialect::Sqlite,
            vec![expired, session("s", 1), session("h", 1), session("u", 1)],
            &["r1"],
            &[
                ("t", &on_expired),
                ("t", &retry),
                ("t", &after_retry),
                ("t", &history),
                ("t", &twice),
                ("t", &twice),
            ],
        );
        let kinds: Vec<&str> = outcomes
            .iter()
            .map(|o| match o {
                Outcome::Deferred => "deferred",
                Outcome::Done(Ok(_)) => "done",
                Outcome::Done(Err(_)) => "refused",
            })
            .collect();
        assert_eq!(
            kinds,
            [
                "deferred", "deferred", "deferred", "deferred", "done", "deferred"
            ],
            "expired lease, stored key, what follows on that session, full_history, \
             a request id seen earlier in the run"
        );
    }

    #[test]
    fn a_diffed_full_history_appends_its_new_tail() {
        let mut request = exchange("s");
        request.messages.clear();
        request.full_history = vec![
            Message::text(Role::User, "stored"),
            Message::text(Role::User, "new"),
        ];
        let mut loaded = session("s", 2);
        loaded.session.next_sequence = 1;
        let requests = [("t", &request)];
        let mut run = Run::new(Dialect::Sqlite, SearchWrites::Inline, &requests);
        run.history_from = Some(1);
        run.add_loaded("t", loaded);
        let (mut outcomes, _) = run.decide(NOW);
        let (_, appended) = appended(outcomes.remove(0));
        let texts: Vec<(i64, &str)> = appended
            .messages
            .iter()
            .map(|m| (m.sequence, m.message.content.as_str()))
            .collect();
        assert_eq!(texts, [(1, "new"), (2, "hello")]);
    }

    #[test]
    fn several_appends_to_one_session_chain_and_share_statements() {
        let first = exchange("s");
        let mut second = exchange("s");
        second.expected_next_sequence = Some(2);
        second.request_id = "k".into();
        let (outcomes, writes) = decide(
            Dialect::Postgres,
            vec![session("s", 1)],
            &[],
            &[("t", &first), ("t", &second)],
        );
        let revisions: Vec<i64> = outcomes.into_iter().map(|o| appended(o).0).collect();
        assert_eq!(revisions, [2, 3]);
        assert_eq!(writes.len(), 1, "PostgreSQL: one statement for the run");
        let sql = &writes[0].sql;
        assert!(sql.contains("idempotency_keys"), "{sql}");
        assert!(
            !sql.contains("pg_notify"),
            "the commit hints are sent after the commit: {sql}"
        );
    }

    #[test]
    fn kept_sessions_are_written_only_at_their_versions() {
        let (a, b, gone) = (exchange("a"), exchange("b"), exchange("gone"));
        let requests = [("t", &a), ("t", &b), ("t", &gone)];
        let mut run = Run::new(Dialect::Postgres, SearchWrites::Inline, &requests);
        let kept = |loaded: Loaded, version: &str| Kept {
            tenant: "t".into(),
            loaded,
            version: version.into(),
        };
        run.add_kept(kept(session("a", 1), "701"), NOW);
        let mut expired = session("gone", 3);
        expired.session.expire_time = NOW;
        run.add_kept(kept(expired, "703"), NOW);
        // Only what is not kept is read: `b`, and the expired one, which
        // the read then finds gone. No request ids are read on their own.
        let reads = run.session_reads();
        assert_eq!(reads.len(), 1);
        let read = &reads[0];
        assert!(
            read.sql.contains("xmin::text AS row_version"),
            "{}",
            read.sql
        );
        let named: Vec<&str> = read
            .params
            .iter()
            .filter_map(|value| match value {
                Value::Text(text) if text != "t" => Some(text.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(named, ["b", "gone"]);
        // `b` as read and locked, at its row's version.
        run.add_loaded("t", session("b", 2));
        run.versions.insert(200, "702".into());
        let (outcomes, writes, changed) = run.decide_settled(NOW);
        assert!(matches!(
            outcomes.last(),
            Some(Outcome::Done(Err(Error::SessionNotFound(_))))
        ));
        let sql = &writes[0].sql;
        assert!(
            sql.contains("AND sessions.xmin::text = v.column14"),
            "{sql}"
        );
        assert!(
            sql.contains("RETURNING sessions.key, sessions.xmin::text AS version"),
            "{sql}"
        );
        assert!(sql.ends_with("SELECT key, version FROM w3"), "{sql}");
        for version in ["701", "702"] {
            assert!(
                writes[0]
                    .params
                    .iter()
                    .any(|value| matches!(value, Value::Text(text) if text == version)),
                "version {version} is checked"
            );
        }
        // Both as the run leaves them, for the writer to keep.
        let mut left: Vec<(String, i64, i64)> = changed
            .into_iter()
            .map(|c| {
                (
                    c.loaded.session.id,
                    c.loaded.session.revision,
                    c.loaded.session.next_sequence,
                )
            })
            .collect();
        left.sort();
        assert_eq!(left, [("a".into(), 2, 2), ("b".into(), 3, 2)]);
    }

    #[test]
    fn the_lease_and_sequence_checks_come_first() {
        let mut loaded = session("s", 1);
        loaded.session.active_run_id = "other".into();
        let mut request = exchange("s");
        request.expected_next_sequence = Some(9);
        assert!(matches!(
            admit(&loaded.session, &request),
            Err(Error::SessionBusy { .. })
        ));
        loaded.session.active_run_id.clear();
        assert!(matches!(
            admit(&loaded.session, &request),
            Err(Error::SequenceMismatch { .. })
        ));
        request.expected_next_sequence = Some(0);
        assert!(admit(&loaded.session, &request).is_ok());
    }

    #[test]
    fn numbers_placeholders_row_by_row() {
        assert_eq!(placeholders(1, 1), "($1)");
        assert_eq!(placeholders(2, 3), "($1, $2, $3), ($4, $5, $6)");
        assert_eq!(placeholders_from(7, 2, 1), "($7), ($8)");
    }

    #[test]
    fn renumbers_placeholders() {
        assert_eq!(
            renumbered("VALUES ($1, $2), ($10)", 5),
            "VALUES ($6, $7), ($15)"
        );
        assert_eq!(renumbered("no placeholders", 3), "no placeholders");
    }
}
