//! The `Store` contract without gRPC: the same cases on every backend,
//! through `store::open` as the server opens it. The gRPC suites check what
//! a client sees; these pin what the store itself promises (numbering,
//! idempotency, refusals that write nothing, the lease, `full_history`), so
//! a backend's machinery can change under them: appends, control (the
//! lease, state, rollback), edits and redaction, forks, search and the
//! sweeper's reads and writes.

use std::sync::Arc;

use sessionstore_server::domain::control as controls;
use sessionstore_server::domain::{
    Change, Error, Message, Metadata, NewExchange, NewSession, ProviderCall, Role, SessionEvent,
    StoredMessage,
};
use sessionstore_server::store::{self, SqlStore, Store, StoreOptions};
use sessionstore_server::watch::Hub;

use crate::support::{Backend, Storage};

const TENANT: &str = "acme";

/// The store over a fresh database of `backend` (kept alive by the
/// returned `Storage`).
async fn open(backend: Backend) -> (Storage, SqlStore) {
    open_with(backend, &StoreOptions::default()).await
}

async fn open_with(backend: Backend, options: &StoreOptions) -> (Storage, SqlStore) {
    let storage = Storage::new(backend).await;
    sessionstore_server::server::prepare_sqlite_path(&storage.url).unwrap();
    let store = store::open(&storage.url, Arc::new(Hub::default()), options)
        .await
        .unwrap();
    (storage, store)
}

async fn create(store: &SqlStore, id: &str) {
    create_in(store, TENANT, id).await;
}

async fn create_in(store: &SqlStore, tenant: &str, id: &str) {
    let new = NewSession {
        id: Some(id.to_owned()),
        title: "t".into(),
        system_prompt: "Be brief.".into(),
        user: "u".into(),
        metadata: Metadata::default(),
        initial_history: Vec::new(),
        initial_state: Default::default(),
        ..Default::default()
    };
    let (session, _) = store.create_session(tenant, new).await.unwrap();
    assert_eq!(session.revision, 1);
}

fn exchange(session_id: &str, question: &str) -> NewExchange {
    NewExchange {
        session_id: session_id.to_owned(),
        messages: vec![Message::text(Role::User, question)],
        full_history: Vec::new(),
        provider_call: Some(ProviderCall {
            provider: "openai".into(),
            model: "gpt-4o".into(),
            prompt_tokens: 10,
            completion_tokens: 2,
            cost_micros_usd: 85,
            ..ProviderCall::default()
        }),
        response_messages: vec![Message::text(Role::Assistant, "an answer")],
        expected_next_sequence: None,
        request_id: String::new(),
        run_id: String::new(),
        state_changes: Vec::new(),
        create_if_missing: None,
    }
}

/// The session's current messages, in order.
async fn stored(store: &SqlStore, id: &str) -> Vec<StoredMessage> {
    let handle = store.resolve(TENANT, id).await.unwrap();
    store.read_messages(&handle, -1, 1000).await.unwrap()
}

/// The session's current messages' texts, in order.
async fn texts(store: &SqlStore, id: &str) -> Vec<String> {
    stored(store, id)
        .await
        .into_iter()
        .map(|m| m.message.content)
        .collect()
}

/// The session's whole event log.
async fn log(store: &SqlStore, id: &str) -> Vec<SessionEvent> {
    let handle = store.resolve(TENANT, id).await.unwrap();
    store.read_events(handle.key, 0, 1000).await.unwrap()
}

/// The revisions of `events`, in order.
fn revisions(events: &[SessionEvent]) -> Vec<i64> {
    events.iter().map(|e| e.revision).collect()
}

mod appends;
mod control;
mod edits;
mod forks;
mod listing;
mod search;
mod sweeps;
