//! The decider's rules, database-free: a run's outcomes and statements.

use super::decide::*;
use super::statements::{Statement, Value};
use crate::domain::*;
use crate::domain::{Metadata, Role};
use crate::store::ops::{Appended, Applied, Dialect, SearchWrites};

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
        create_if_missing: None,
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
    // The sessions' rows, then the check that each was at its version.
    assert!(
        sql.contains(" SELECT key, version FROM w3 UNION ALL SELECT -1, (1 / (SELECT CASE WHEN count(*) = 2 THEN 1 ELSE 0 END FROM (SELECT key, version FROM w3) AS updated))::text"),
        "{sql}"
    );
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
