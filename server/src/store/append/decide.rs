//! The append decider: the one place the rules of AppendExchange live.
//! Every check an append makes (session exists, lease, expected sequence,
//! a retry's request id) is decided in memory, in request order, from the
//! session rows read at the start, so a refused request writes nothing and
//! the rest go on; what is accepted becomes rows ([`Rows`]).

use std::collections::HashMap;
use std::sync::Arc;

use super::statements::{self, Added, ROWS_PER_STATEMENT, Rows, SessionWrite, Statement};
use crate::domain::{
    AppendedExchange, Change, Error, Message, NewExchange, Result, Session, SessionEvent,
    StoredMessage, Timestamp, control, ids,
};
use crate::store::ops::{Appended, Applied, Dialect, SearchWrites};
use crate::store::rows::{Columns, session_from_row};
use crate::store::text::unescape;
use crate::wire::EncodedEvent;

/// One request's outcome on this path.
// One per request, moved once into its reply: boxing would only add an allocation.
#[allow(clippy::large_enum_variant)]
pub enum Outcome {
    Done(Result<Applied<Appended>>),
    /// For the general path.
    Deferred,
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

/// A live session the caller has read (and, on PostgreSQL, locked) itself.
pub struct Loaded {
    pub key: i64,
    pub session: Session,
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

/// One run of appends, independent of how its statements are executed:
/// read the sessions and stored request ids ([`Run::session_reads`],
/// [`Run::request_id_reads`]), hand over the rows, then [`Run::decide`]
/// gives each request's outcome and the statements that write them.
pub struct Run<'a> {
    pub(super) dialect: Dialect,
    search: SearchWrites,
    requests: &'a [(&'a str, &'a NewExchange)],
    sessions: HashMap<SessionKey, State>,
    pub(super) stored_keys: Vec<(String, String)>,
    /// For a run of one on the general path: where the new tail of its
    /// `full_history` starts, diffed by the caller.
    pub(super) history_from: Option<usize>,
    /// A run of one on the general path, whose caller has done the steps
    /// a bulk run defers (its state changes are written).
    pub(super) prepared: bool,
    /// PostgreSQL: the version (`xmin`) of each session row, as read or as
    /// kept by the writer ([`Run::add_kept`]). The write checks each row
    /// is still that version and returns the new one.
    pub(super) versions: HashMap<i64, String>,
    /// Some sessions were given as kept rather than read and locked.
    pub(super) kept: bool,
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
    /// [`SESSION_COLUMNS`](crate::store::rows::SESSION_COLUMNS); on
    /// PostgreSQL also locks them, in key order, so concurrent runs never
    /// deadlock.
    ///
    /// Where [`Run::reads_request_ids_with_sessions`], each row also
    /// carries the run's stored request ids, for
    /// [`Run::add_stored_request_ids`].
    pub fn session_reads(&self) -> Vec<Statement> {
        let keyed = self
            .reads_request_ids_with_sessions()
            .then(|| self.keyed_requests());
        statements::session_reads(self.dialect, &self.unread_sessions(), keyed.as_deref())
    }

    /// Whether the run reads nothing before it writes: every session it
    /// names was given kept ([`Run::add_kept`]), so it neither reads nor
    /// locks a session, nor reads stored request ids.
    pub fn reads_nothing(&self) -> bool {
        self.kept && self.unread_sessions().is_empty()
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
        statements::request_id_reads(self.dialect, &self.keyed_requests())
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
                added: Added::default(),
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
                // The general path creates it, in the same transaction.
                None if exchange.create_if_missing.is_some() => Outcome::Deferred,
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
        let mut changed: Vec<SessionWrite<'_>> = self
            .sessions
            .values()
            .filter(|state| state.changed)
            .map(|state| SessionWrite {
                key: state.key,
                session: &state.session,
                added: &state.added,
            })
            .collect();
        changed.sort_unstable_by_key(|write| write.key);
        let writes = rows.statements(dialect, &changed, &self.versions);
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
    /// Whether this run changed the session row, and what it added.
    changed: bool,
    added: Added,
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
    let stored = stored_messages(state, exchange, inputs, call_id, now, search, rows);
    // The event this append records, which refers to its messages.
    let revision = state.session.revision + 1;
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
        let added = &mut state.added;
        added.calls += 1;
        added.tokens = added.tokens.saturating_add(call.total_tokens);
        added.cost = added.cost.saturating_add(call.cost_micros_usd);
        added.last_call = Some(call.clone());
    }
    state.session.next_sequence += added;
    state.added.messages += added;
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
        session_created: false,
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

/// The messages an accepted request adds, numbered from the session's next
/// sequence: `inputs`, then the call's responses (produced by `call_id`);
/// their search rows or ranges go into `rows`.
fn stored_messages(
    state: &State,
    exchange: &NewExchange,
    inputs: &[Message],
    call_id: Option<String>,
    now: Timestamp,
    search: SearchWrites,
    rows: &mut Rows,
) -> Vec<StoredMessage> {
    let responses = exchange
        .response_messages
        .iter()
        .map(|m| (m, call_id.clone()));
    let mut stored = Vec::with_capacity(inputs.len() + exchange.response_messages.len());
    let inputs = inputs.iter().map(|m| (m, None));
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
    stored
}
