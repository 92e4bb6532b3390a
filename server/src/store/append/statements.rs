//! The SQL of an append run, per dialect: the reads of its sessions and
//! request ids, and the multi-row statements that write what the decider
//! accepted (one per table, and, on PostgreSQL, all of them as one).

use std::collections::HashMap;
use std::ops::Range;

use crate::domain::{ProviderCall, Session, StoredMessage, Timestamp};
use crate::store::ops::Dialect;
use crate::store::rows::{SESSION_COLUMNS, search_rowid};
use crate::store::text::escape;

/// Rows per multi-row statement: far under SQLite's 32,766 and
/// PostgreSQL's 65,535 parameters at 12 columns.
pub(super) const ROWS_PER_STATEMENT: usize = 500;

/// The column of a PostgreSQL session read that carries the run's stored
/// request ids ([`Run::reads_request_ids_with_sessions`]).
pub(super) const STORED_REQUEST_IDS: &str = "stored_request_ids";

/// The SQLSTATE of a PostgreSQL run's write that found a session changed
/// since the version it was given (see `combined`): `division_by_zero`.
pub const STALE_SESSION: &str = "22012";

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

/// What a run adds to one session's row beside its new revision and
/// sequence: counters, and the last call it recorded.
#[derive(Default)]
pub struct Added {
    pub messages: i64,
    pub calls: i64,
    pub tokens: i64,
    pub cost: i64,
    pub last_call: Option<ProviderCall>,
}

/// A session row to update: as the run leaves it, with what it added.
pub struct SessionWrite<'a> {
    pub key: i64,
    pub session: &'a Session,
    pub added: &'a Added,
}

/// Reads the live sessions `wanted` (tenant, id), rows of `tenant` and
/// [`SESSION_COLUMNS`]; on PostgreSQL also locks them, in key order, so
/// concurrent runs never deadlock.
///
/// With `keyed` (tenant, request id), each row also carries which of
/// them are stored, in the column [`STORED_REQUEST_IDS`].
pub fn session_reads(
    dialect: Dialect,
    wanted: &[(&str, &str)],
    keyed: Option<&[(&str, &str)]>,
) -> Vec<Statement> {
    let (version, lock) = match dialect {
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
    let (ids, mut id_params) = if let Some(keyed) = keyed {
        let sql = format!(
            ", (SELECT json_agg(json_build_array(k.tenant, k.request_id))::text \
             FROM idempotency_keys AS k WHERE (k.tenant, k.request_id) IN (VALUES {})) \
             AS {STORED_REQUEST_IDS}",
            placeholders_from(2 * wanted.len() + 1, keyed.len(), 2)
        );
        (sql, pairs(keyed))
    } else {
        (String::new(), Vec::new())
    };
    if dialect == Dialect::Sqlite {
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

/// Reads which of `keyed` (tenant, request id) are stored already:
/// rows of `tenant` and `request_id`.
pub fn request_id_reads(dialect: Dialect, keyed: &[(&str, &str)]) -> Vec<Statement> {
    if dialect == Dialect::Sqlite {
        // One by one, by the primary key, as the sessions are read.
        return keyed
            .iter()
            .map(|keyed| Statement {
                sql: "SELECT tenant, request_id FROM idempotency_keys \
                      WHERE tenant = $1 AND request_id = $2"
                    .to_owned(),
                params: pairs(std::slice::from_ref(keyed)),
            })
            .collect();
    }
    keyed
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

/// The rows one run inserts, table by table.
#[derive(Default)]
pub(super) struct Rows {
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
    pub(super) fn call(&mut self, session_key: i64, tenant: &str, user: &str, call: &ProviderCall) {
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
    pub(super) fn message(
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

    pub(super) fn search(&mut self, session_key: i64, sequence: i64, text: String) {
        self.search.push((session_key, sequence, text));
    }

    pub(super) fn changed(&mut self, session_key: i64, from: i64, until: i64) {
        self.changed.push((session_key, from, until));
    }

    /// An event row: its encoding in `wire`, `body` left empty (see
    /// [`super::ops::INSERT_EVENT`]), referring to the messages `refers`
    /// for their content ([`EncodedEvent::referring`]), and naming the
    /// exchange's request id, if it has one: deleting the session's history
    /// finds its idempotency keys through its events (migration 0019).
    pub(super) fn event(
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

    pub(super) fn idempotency_key(
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
    /// [`ROWS_PER_STATEMENT`] rows), the UPDATE of the `changed` sessions
    /// (in key order) included.
    pub(super) fn statements(
        self,
        dialect: Dialect,
        changed: &[SessionWrite<'_>],
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
        insert_search(&mut statements, dialect, self.search);
        insert_search_log(&mut statements, insert_into, self.changed);
        let updates =
            statements.len()..statements.len() + changed.len().div_ceil(ROWS_PER_STATEMENT);
        // PostgreSQL, every session's version known: each update applies
        // only to the row at that version, and the statement fails unless
        // all did.
        let checked = dialect == Dialect::Postgres
            && !changed.is_empty()
            && changed
                .iter()
                .all(|state| versions.contains_key(&state.key));
        update_sessions(&mut statements, dialect, changed, versions, checked);
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
            return vec![combined(
                statements,
                updates,
                checked.then_some(changed.len()),
            )];
        }
        statements
    }
}
/// The search index's rows of the messages a run adds
/// ([`SearchWrites::Inline`](crate::store::ops::SearchWrites::Inline)).
fn insert_search(
    statements: &mut Vec<Statement>,
    dialect: Dialect,
    search: Vec<(i64, i64, String)>,
) {
    // In row id order: FTS5 flushes its pending terms to a new segment
    // whenever a row id is lower than the last one written, so rows in
    // arrival order (sessions interleaved) cost a segment, and later
    // merges, per step back (BENCHMARKS.md).
    let mut search = search;
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
    insert_with(statements, (head, tail), columns, values);
}

/// The search log's rows: each session's range of messages a run adds
/// ([`SearchWrites::Logged`](crate::store::ops::SearchWrites::Logged)).
fn insert_search_log(
    statements: &mut Vec<Statement>,
    insert_into: &str,
    changed: Vec<(i64, i64, i64)>,
) {
    // One range per session: its appends in a run are contiguous.
    let mut changed = changed;
    changed.sort_unstable();
    let mut ranges: Vec<(i64, i64, i64)> = Vec::with_capacity(changed.len());
    for (key, from, until) in changed {
        match ranges.last_mut() {
            Some(last) if last.0 == key && last.2 >= from => last.2 = last.2.max(until),
            _ => ranges.push((key, from, until)),
        }
    }
    insert(
        statements,
        &format!("{insert_into} search_log (session_key, from_sequence, until_sequence) VALUES "),
        3,
        ranges
            .into_iter()
            .flat_map(|(key, from, until)| [Value::Int(key), Value::Int(from), Value::Int(until)])
            .collect(),
    );
}

/// PostgreSQL: a run's statements as one, so a run writes in one round
/// trip. Each becomes a data-modifying `WITH` query (PostgreSQL runs them
/// all; the tables they write have no foreign keys to check, migration
/// 0012). It returns what the session updates (the statements at
/// `updates`) return: each changed session's key and new row version. The
/// commit hints are sent after the commit (`postgres/hints.rs`).
///
/// With `checked` (the sessions updated only at the versions given, this
/// many), the statement fails (`division_by_zero`, [`STALE_SESSION`])
/// unless every one was at its version, so it writes nothing when one
/// changed elsewhere: it may then run as a transaction of its own, which
/// commits when it succeeds (the PostgreSQL append writers' one round
/// trip). The check is a row of its own, key -1, after the sessions'.
fn combined(
    statements: Vec<Statement>,
    updates: Range<usize>,
    checked: Option<usize>,
) -> Statement {
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
        let returned = returned.join(" UNION ALL ");
        sql.push(' ');
        sql.push_str(&returned);
        if let Some(count) = checked {
            sql.push_str(&format!(
                " UNION ALL SELECT -1, (1 / (SELECT CASE WHEN count(*) = {count} THEN 1 ELSE 0 END \
                 FROM ({returned}) AS updated))::text"
            ));
        }
    }
    Statement { sql, params }
}

/// `sql` with every placeholder `$N` moved up by `offset`.
pub(super) fn renumbered(sql: &str, offset: usize) -> String {
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
/// version (`xmin`), and, `checked` (every row's version known in
/// `versions`, as read or kept), updates only a row still at that
/// version: a session changed since is left out of what it returns.
fn update_sessions(
    statements: &mut Vec<Statement>,
    dialect: Dialect,
    changed: &[SessionWrite<'_>],
    versions: &HashMap<i64, String>,
    checked: bool,
) {
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
            let (has_call, model, provider, cost, request_id) = match &state.added.last_call {
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
                Value::Int(state.added.messages),
                Value::Int(state.session.update_time.0),
                Value::Int(state.added.calls),
                Value::Int(state.added.tokens),
                Value::Int(state.added.cost),
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
pub(super) fn placeholders(rows: usize, columns: usize) -> String {
    placeholders_from(1, rows, columns)
}

/// As [`placeholders`], numbered from `first`.
pub(super) fn placeholders_from(first: usize, rows: usize, columns: usize) -> String {
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
