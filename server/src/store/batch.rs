//! Many appends, few statements: a run of AppendExchange requests written
//! with one multi-row statement per table instead of a dozen statements
//! each (the general path in [`super::ops`]).
//!
//! Every check an append makes (session exists, lease, expected sequence)
//! is decided in memory from the session rows read (and, on PostgreSQL,
//! locked in key order) at the start, in request order, so a refused
//! request writes nothing and the rest go on. Requests this path does not
//! decide on its own are *deferred* to the general path, which the caller
//! runs after this one, in order:
//! - a `full_history` append (it diffs against the stored history);
//! - one with nothing to write (the general path words the error);
//! - a retry: its request id is stored already, or an earlier request of
//!   this run carries it;
//! - one on a session whose lease ran out (the general path settles it
//!   first).
//!
//! Once a request on a session is deferred, so is every later one on that
//! session, so each session's requests still apply in arrival order.
//!
//! A statement failing here (a race with another replica, say) fails the
//! whole run; the caller rolls it back and sends every request down the
//! general path.

use std::collections::HashMap;
use std::sync::Arc;

use sqlx::any::AnyArguments;
use sqlx::query::Query;
use sqlx::{Any, AnyConnection, Row as _};

use super::ops::{
    Applied, Dialect, NOTIFY_CHANNEL, SESSION_COLUMNS, Written, encode, search_rowid,
    session_from_row,
};
use super::text::escape;
use crate::domain::{
    AppendedExchange, Change, Error, NewExchange, ProviderCall, Result, Session, SessionEvent,
    StoredMessage, Timestamp, control, ids,
};

/// One request's outcome on this path.
// One per request, moved once into its reply: boxing would only add an allocation.
#[allow(clippy::large_enum_variant)]
pub enum Outcome {
    Done(Result<Applied>),
    /// For the general path.
    Deferred,
}

/// Rows per multi-row statement: far under SQLite's 32,766 and
/// PostgreSQL's 65,535 parameters at 12 columns.
const ROWS_PER_STATEMENT: usize = 500;

/// Appends `requests` (tenant, exchange) in the caller's transaction.
/// `Err` means a statement failed and the transaction must be rolled back.
pub async fn append_all(
    conn: &mut AnyConnection,
    dialect: Dialect,
    requests: &[(&str, &NewExchange)],
) -> std::result::Result<Vec<Outcome>, sqlx::Error> {
    let now = Timestamp::now();
    let mut sessions = load_sessions(conn, dialect, requests).await?;
    let stored_keys = load_request_ids(conn, requests).await?;

    let mut rows = Rows::default();
    let mut outcomes = Vec::with_capacity(requests.len());
    let mut seen_keys: Vec<(&str, &str)> = Vec::new();
    for &(tenant, exchange) in requests {
        let key_taken = !exchange.request_id.is_empty()
            && (stored_keys.contains(&(tenant.to_owned(), exchange.request_id.clone()))
                || seen_keys.contains(&(tenant, exchange.request_id.as_str())));
        if !exchange.request_id.is_empty() {
            seen_keys.push((tenant, &exchange.request_id));
        }
        let plain = exchange.full_history.is_empty()
            && (!exchange.messages.is_empty()
                || !exchange.response_messages.is_empty()
                || exchange.provider_call.is_some());
        let state = sessions.get_mut(&(tenant.to_owned(), exchange.session_id.clone()));
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
                    Outcome::Done(append_one(state, tenant, exchange, now, dialect, &mut rows))
                }
            }
        };
        outcomes.push(outcome);
    }
    rows.write(conn, dialect, &sessions).await?;
    Ok(outcomes)
}

/// A session as this run has left it so far.
struct State {
    key: i64,
    session: Session,
    next_sequence: i64,
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

/// Reads the live sessions the requests name; on PostgreSQL locks them, in
/// key order, so concurrent runs never deadlock.
async fn load_sessions(
    conn: &mut AnyConnection,
    dialect: Dialect,
    requests: &[(&str, &NewExchange)],
) -> std::result::Result<HashMap<SessionKey, State>, sqlx::Error> {
    let mut wanted: Vec<(&str, &str)> = requests
        .iter()
        .map(|(tenant, exchange)| (*tenant, exchange.session_id.as_str()))
        .collect();
    wanted.sort_unstable();
    wanted.dedup();
    let mut sessions = HashMap::with_capacity(wanted.len());
    for chunk in wanted.chunks(ROWS_PER_STATEMENT) {
        let lock = match dialect {
            Dialect::Sqlite => "",
            Dialect::Postgres => " ORDER BY key FOR UPDATE OF sessions",
        };
        let sql = format!(
            "SELECT tenant, {SESSION_COLUMNS} FROM sessions WHERE deleted = 0 \
             AND (tenant, id) IN (VALUES {}){lock}",
            placeholders(chunk.len(), 2)
        );
        let mut query = sqlx::query(&sql);
        for (tenant, id) in chunk {
            query = query.bind(escape(tenant)).bind(escape(id));
        }
        for row in query.fetch_all(&mut *conn).await? {
            let session = session_from_row(&row).map_err(decode_error)?;
            let tenant = super::ops::text_col(&row, "tenant").map_err(decode_error)?;
            sessions.insert(
                (tenant, session.id.clone()),
                State {
                    key: row.try_get("key")?,
                    next_sequence: row.try_get("next_sequence")?,
                    session,
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
    }
    Ok(sessions)
}

/// The request ids among `requests` already stored.
async fn load_request_ids(
    conn: &mut AnyConnection,
    requests: &[(&str, &NewExchange)],
) -> std::result::Result<Vec<(String, String)>, sqlx::Error> {
    let keyed: Vec<(&str, &str)> = requests
        .iter()
        .filter(|(_, exchange)| !exchange.request_id.is_empty())
        .map(|(tenant, exchange)| (*tenant, exchange.request_id.as_str()))
        .collect();
    let mut stored = Vec::new();
    for chunk in keyed.chunks(ROWS_PER_STATEMENT) {
        let sql = format!(
            "SELECT tenant, request_id FROM idempotency_keys \
             WHERE (tenant, request_id) IN (VALUES {})",
            placeholders(chunk.len(), 2)
        );
        let mut query = sqlx::query(&sql);
        for (tenant, request_id) in chunk {
            query = query.bind(escape(tenant)).bind(escape(request_id));
        }
        for row in query.fetch_all(&mut *conn).await? {
            stored.push((
                super::ops::text_col(&row, "tenant").map_err(decode_error)?,
                super::ops::text_col(&row, "request_id").map_err(decode_error)?,
            ));
        }
    }
    Ok(stored)
}

fn decode_error(error: Error) -> sqlx::Error {
    sqlx::Error::Decode(Box::new(error))
}

/// Decides one request against its session's state and, if it is
/// accepted, adds its rows.
fn append_one(
    state: &mut State,
    tenant: &str,
    exchange: &NewExchange,
    now: Timestamp,
    dialect: Dialect,
    rows: &mut Rows,
) -> Result<Applied> {
    let active = &state.session.active_run_id;
    if !active.is_empty() && *active != exchange.run_id {
        return Err(Error::SessionBusy {
            active_run_id: active.clone(),
            expire_time: state.session.run_expire_time,
        });
    }
    if let Some(expected) = exchange.expected_next_sequence
        && expected != state.next_sequence
    {
        return Err(Error::SequenceMismatch {
            expected,
            actual: state.next_sequence,
        });
    }
    let call = exchange.normalized_call().map(|mut call| {
        call.id = ids::call_id();
        call.session_id = state.session.id.clone();
        call.create_time = now;
        call
    });
    let call_id = call.as_ref().map(|c| c.id.clone());
    let inputs = exchange.messages.iter().map(|m| (m, None));
    let responses = exchange
        .response_messages
        .iter()
        .map(|m| (m, call_id.clone()));
    let mut stored = Vec::with_capacity(exchange.messages.len() + exchange.response_messages.len());
    for (offset, (message, produced_by)) in (0_i64..).zip(inputs.chain(responses)) {
        let sequence = state.next_sequence + offset;
        let id = ids::message_id();
        rows.message(
            state.key,
            sequence,
            &id,
            produced_by.as_deref(),
            encode(message)?,
            now,
        );
        let text = control::search_text(message);
        if !text.trim().is_empty() {
            rows.search(dialect, state.key, sequence, text);
        }
        stored.push(StoredMessage {
            id,
            session_id: state.session.id.clone(),
            sequence,
            produced_by_call_id: produced_by.unwrap_or_default(),
            message: message.clone(),
            create_time: now,
            redacted: false,
        });
    }
    let added = i64::try_from(stored.len()).map_err(Error::storage)?;
    if let Some(call) = &call {
        rows.call(state.key, call);
        state.added_calls += 1;
        state.added_tokens = state.added_tokens.saturating_add(call.total_tokens);
        state.added_cost = state.added_cost.saturating_add(call.cost_micros_usd);
        state.last_call = Some(call.clone());
    }
    state.next_sequence += added;
    state.added_messages += added;
    state.session.revision += 1;
    state.session.update_time = now;
    state.changed = true;
    let revision = state.session.revision;

    let appended = AppendedExchange {
        messages: stored,
        provider_call: call,
        run_id: exchange.run_id.clone(),
        next_sequence: state.next_sequence,
    };
    let change = Change::ExchangeAppended(appended.clone());
    rows.event(state.key, revision, now, encode(&change)?);
    if dialect == Dialect::Postgres {
        rows.hints.push(if exchange.run_id.is_empty() {
            format!("{}:{revision}", state.key)
        } else {
            format!("{}:{revision}:{}", state.key, exchange.run_id)
        });
    }
    if !exchange.request_id.is_empty() {
        rows.idempotency_key(
            tenant,
            &exchange.request_id,
            state.key,
            exchange.fingerprint(),
            revision,
        );
    }
    let event = SessionEvent {
        revision,
        time: now,
        change,
    };
    Ok(Applied {
        written: Written::Appended(revision, appended),
        events: vec![(state.key, Arc::new(event))],
    })
}

/// A value bound into a multi-row statement.
enum Value {
    Int(i64),
    Text(String),
    NullableText(Option<String>),
    Bytes(Vec<u8>),
}

/// The rows one run inserts, table by table.
#[derive(Default)]
struct Rows {
    calls: Vec<Value>,
    messages: Vec<Value>,
    search: Vec<Value>,
    events: Vec<Value>,
    keys: Vec<Value>,
    hints: Vec<String>,
}

impl Rows {
    fn call(&mut self, session_key: i64, call: &ProviderCall) {
        self.calls.extend([
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
        ]);
    }

    fn message(
        &mut self,
        session_key: i64,
        sequence: i64,
        id: &str,
        produced_by: Option<&str>,
        body: String,
        now: Timestamp,
    ) {
        self.messages.extend([
            Value::Int(session_key),
            Value::Int(sequence),
            Value::Text(id.to_owned()),
            Value::NullableText(produced_by.map(str::to_owned)),
            Value::Text(body),
            Value::Int(now.0),
            Value::Int(0),
        ]);
    }

    fn search(&mut self, dialect: Dialect, session_key: i64, sequence: i64, text: String) {
        match dialect {
            Dialect::Sqlite => self.search.extend([
                Value::Int(search_rowid(session_key, sequence)),
                Value::Text(text),
            ]),
            Dialect::Postgres => self.search.extend([
                Value::Int(session_key),
                Value::Int(sequence),
                Value::Text(text),
            ]),
        }
    }

    fn event(&mut self, session_key: i64, revision: i64, now: Timestamp, body: String) {
        self.events.extend([
            Value::Int(session_key),
            Value::Int(revision),
            Value::Int(now.0),
            Value::Text(body),
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
        self.keys.extend([
            Value::Text(escape(tenant)),
            Value::Text(escape(request_id)),
            Value::Int(session_key),
            Value::Bytes(fingerprint),
            Value::Int(revision),
        ]);
    }

    /// Writes everything: a statement per table, the sessions' UPDATE
    /// included (per [`ROWS_PER_STATEMENT`] rows).
    async fn write(
        self,
        conn: &mut AnyConnection,
        dialect: Dialect,
        sessions: &HashMap<SessionKey, State>,
    ) -> std::result::Result<(), sqlx::Error> {
        // Calls before the messages that reference them.
        insert(
            conn,
            "INSERT INTO provider_calls (id, session_key, request_id, provider, model, \
             requested_provider, requested_model, prompt_tokens, completion_tokens, \
             total_tokens, cost_micros_usd, create_time) VALUES ",
            12,
            self.calls,
        )
        .await?;
        insert(
            conn,
            "INSERT INTO messages (session_key, sequence, id, produced_by_call_id, body, \
             create_time, redacted) VALUES ",
            7,
            self.messages,
        )
        .await?;
        match dialect {
            Dialect::Sqlite => {
                insert(
                    conn,
                    "INSERT INTO message_search (rowid, text) VALUES ",
                    2,
                    self.search,
                )
                .await?;
            }
            Dialect::Postgres => {
                insert(
                    conn,
                    "INSERT INTO message_search (session_key, sequence, text) VALUES ",
                    3,
                    self.search,
                )
                .await?;
            }
        }
        let mut changed: Vec<&State> = sessions.values().filter(|s| s.changed).collect();
        changed.sort_unstable_by_key(|s| s.key);
        update_sessions(conn, &changed).await?;
        insert(
            conn,
            "INSERT INTO events (session_key, revision, time, body) VALUES ",
            4,
            self.events,
        )
        .await?;
        insert(
            conn,
            "INSERT INTO idempotency_keys (tenant, request_id, session_key, fingerprint, \
             revision) VALUES ",
            5,
            self.keys,
        )
        .await?;
        for chunk in self.hints.chunks(ROWS_PER_STATEMENT) {
            // Delivered at commit, to every replica's listener.
            let sql = format!(
                "SELECT pg_notify('{NOTIFY_CHANNEL}', hint) FROM (VALUES {}) AS hints (hint)",
                placeholders(chunk.len(), 1)
            );
            let mut query = sqlx::query(&sql);
            for hint in chunk {
                query = query.bind(hint.as_str());
            }
            query.execute(&mut *conn).await?;
        }
        Ok(())
    }
}

/// The changed session rows after this run, in one statement per
/// [`ROWS_PER_STATEMENT`] sessions: each one's revision and sequence, its
/// counters grown by what the run added (totals saturate, as in the general
/// path) and, if the run recorded a call on it, the last call's fields.
/// `VALUES` columns are `column1…` on both engines.
async fn update_sessions(
    conn: &mut AnyConnection,
    changed: &[&State],
) -> std::result::Result<(), sqlx::Error> {
    const COLUMNS: usize = 13;
    for chunk in changed.chunks(ROWS_PER_STATEMENT) {
        let sql = format!(
            "UPDATE sessions SET revision = v.column2, next_sequence = v.column3, \
             message_count = message_count + v.column4, update_time = v.column5, \
             provider_call_count = provider_call_count + v.column6, \
             total_tokens = CASE WHEN total_tokens > 9223372036854775807 - v.column7 \
                 THEN 9223372036854775807 ELSE total_tokens + v.column7 END, \
             total_cost_micros_usd = CASE WHEN total_cost_micros_usd > 9223372036854775807 - v.column8 \
                 THEN 9223372036854775807 ELSE total_cost_micros_usd + v.column8 END, \
             last_model = CASE WHEN v.column9 = 1 THEN v.column10 ELSE last_model END, \
             last_provider = CASE WHEN v.column9 = 1 THEN v.column11 ELSE last_provider END, \
             last_cost_micros_usd = CASE WHEN v.column9 = 1 THEN v.column12 ELSE last_cost_micros_usd END, \
             last_request_id = CASE WHEN v.column9 = 1 THEN v.column13 ELSE last_request_id END \
             FROM (VALUES {}) AS v WHERE sessions.key = v.column1",
            placeholders(chunk.len(), COLUMNS)
        );
        let mut query = sqlx::query(&sql);
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
            query = query
                .bind(state.key)
                .bind(state.session.revision)
                .bind(state.next_sequence)
                .bind(state.added_messages)
                .bind(state.session.update_time.0)
                .bind(state.added_calls)
                .bind(state.added_tokens)
                .bind(state.added_cost)
                .bind(has_call)
                .bind(model)
                .bind(provider)
                .bind(cost)
                .bind(request_id);
        }
        query.execute(&mut *conn).await?;
    }
    Ok(())
}

/// `($1, $2), ($3, $4)`: `rows` groups of `columns` numbered placeholders.
fn placeholders(rows: usize, columns: usize) -> String {
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
            sql.push_str(&(row * columns + column + 1).to_string());
        }
        sql.push(')');
    }
    sql
}

/// Inserts `values` (`columns` per row) with `head` (`INSERT … VALUES `).
async fn insert(
    conn: &mut AnyConnection,
    head: &str,
    columns: usize,
    values: Vec<Value>,
) -> std::result::Result<(), sqlx::Error> {
    let mut values = values.into_iter();
    let mut left = values.len() / columns;
    while left > 0 {
        let rows = left.min(ROWS_PER_STATEMENT);
        left -= rows;
        let sql = format!("{head}{}", placeholders(rows, columns));
        let mut query: Query<'_, Any, AnyArguments<'_>> = sqlx::query(&sql);
        for value in values.by_ref().take(rows * columns) {
            query = match value {
                Value::Int(v) => query.bind(v),
                Value::Text(v) => query.bind(v),
                Value::NullableText(v) => query.bind(v),
                Value::Bytes(v) => query.bind(v),
            };
        }
        query.execute(&mut *conn).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::placeholders;

    #[test]
    fn numbers_placeholders_row_by_row() {
        assert_eq!(placeholders(1, 1), "($1)");
        assert_eq!(placeholders(2, 3), "($1, $2, $3), ($4, $5, $6)");
    }
}
