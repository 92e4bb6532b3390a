//! Session-level requests and their rules.

use serde::Serialize;

use super::digest::RequestKey;
use super::fields::{
    MAX_STATE_ENTRIES, check_request_id, check_state_changes, check_state_entry,
    check_state_scopes, is_system_prompt, validate_new_session_id,
};
use super::{Error, Message, Metadata, Result, StateChange, Timestamp};

/// A CreateSession request.
#[derive(Clone, Debug, Default, Serialize)]
pub struct NewSession {
    /// The caller's chosen id, if any.
    pub id: Option<String>,
    pub title: String,
    pub system_prompt: String,
    pub user: String,
    pub metadata: Metadata,
    pub initial_history: Vec<Message>,
    /// Entries of the session's own state, written in revision 1.
    pub initial_state: Metadata,
    /// When it expires (0: never).
    pub expire_time: Timestamp,
    /// Idempotency key (empty: none). Not part of the fingerprint.
    #[serde(skip)]
    pub request_id: String,
    /// State changes written in revision 1: scope `""` adds to
    /// `initial_state`, any other writes that shared scope.
    pub state_changes: Vec<StateChange>,
    /// The scopes whose entries the answer carries (`""`: the session's
    /// own). What is read, not written: not part of the fingerprint.
    #[serde(skip)]
    pub state_scopes: Vec<String>,
}

impl NewSession {
    /// The request's idempotency key, if it has a `request_id`.
    pub fn request_key(&self) -> Option<RequestKey> {
        RequestKey::of("CreateSession", &self.request_id, self)
    }

    /// The session's own state in revision 1: `initial_state` with the
    /// changes of scope `""` (a deletion of a key nobody set is nothing).
    pub fn own_state(&self) -> Metadata {
        let mut state = self.initial_state.clone();
        for change in self.state_changes.iter().filter(|c| c.scope.is_empty()) {
            if change.delete {
                state.remove(&change.key);
            } else {
                state.insert(change.key.clone(), change.value.clone());
            }
        }
        state
    }

    /// The changes to shared scopes.
    pub fn shared_state_changes(&self) -> impl Iterator<Item = &StateChange> {
        self.state_changes.iter().filter(|c| !c.scope.is_empty())
    }

    /// Checks the request's own fields.
    pub fn validate(&self) -> Result<()> {
        self.validate_as("")
    }

    /// As [`NewSession::validate`], for a request held in a field: each
    /// field an error names starts with `prefix` (e.g. `create_if_missing.`).
    pub fn validate_as(&self, prefix: &str) -> Result<()> {
        if let Some(id) = &self.id {
            validate_new_session_id(&format!("{prefix}session_id"), id)?;
        }
        let entries = self.initial_state.len();
        if entries > usize::try_from(MAX_STATE_ENTRIES).unwrap_or(usize::MAX) {
            return Err(Error::LimitExceeded {
                field: format!("{prefix}initial_state"),
                limit: "max_state_entries",
                description: format!(
                    "holds {entries} entries; a session holds at most {MAX_STATE_ENTRIES}"
                ),
            });
        }
        for (key, value) in &self.initial_state {
            let field = format!("{prefix}initial_state[{key:?}]");
            check_state_entry(&format!("{prefix}initial_state"), key, &field, value)?;
        }
        if !prefix.is_empty() {
            // Held in another request, whose own fields carry these.
            for (field, empty) in [
                ("request_id", self.request_id.is_empty()),
                ("state_changes", self.state_changes.is_empty()),
                ("state_scopes", self.state_scopes.is_empty()),
            ] {
                if !empty {
                    return Err(Error::invalid(
                        format!("{prefix}{field}"),
                        format!("must be empty here: use the enclosing request's {field}"),
                    ));
                }
            }
            return Ok(());
        }
        check_request_id("request_id", &self.request_id)?;
        check_state_changes("state_changes", &self.state_changes)?;
        check_state_scopes("state_scopes", &self.state_scopes)?;
        for (i, change) in self.state_changes.iter().enumerate() {
            if change.scope.is_empty() && self.initial_state.contains_key(&change.key) {
                return Err(Error::invalid(
                    format!("state_changes[{i}].key"),
                    format!("{:?} is in initial_state too: give it once", change.key),
                ));
            }
        }
        let entries = self.own_state().len();
        if entries > usize::try_from(MAX_STATE_ENTRIES).unwrap_or(usize::MAX) {
            return Err(Error::LimitExceeded {
                field: "state_changes".into(),
                limit: "max_state_entries",
                description: format!(
                    "with initial_state makes {entries} entries; a session holds at most {MAX_STATE_ENTRIES}"
                ),
            });
        }
        Ok(())
    }

    /// The history to store: `initial_history` without a leading copy of the
    /// system prompt.
    pub fn history_to_store(&self) -> &[Message] {
        match self.initial_history.split_first() {
            Some((first, rest)) if is_system_prompt(first, &self.system_prompt) => rest,
            _ => &self.initial_history,
        }
    }
}

/// An UpdateSession request: `Some` fields are replaced.
#[derive(Clone, Debug, Default)]
pub struct SessionPatch {
    pub title: Option<String>,
    pub system_prompt: Option<String>,
    pub metadata: Option<Metadata>,
    pub summary_message_id: Option<String>,
    /// A new expiry (0: never); changed only when the mask names it.
    pub expire_time: Option<Timestamp>,
}

/// The fields an empty `update_mask` (or `*`) changes.
pub const UPDATABLE_FIELDS: [&str; 4] =
    ["title", "system_prompt", "metadata", "summary_message_id"];
/// Changed only when the `update_mask` names it.
pub const EXPIRE_TIME: &str = "expire_time";

impl SessionPatch {
    /// Keeps the fields an `update_mask` names (all four for an empty mask
    /// or `*`) of a patch that carries every field. An unknown path is
    /// refused, naming the ones that exist.
    pub fn masked(self, paths: &[String]) -> Result<SessionPatch> {
        if let Some(path) = paths
            .iter()
            .find(|p| *p != "*" && *p != EXPIRE_TIME && !UPDATABLE_FIELDS.contains(&p.as_str()))
        {
            return Err(Error::invalid(
                "update_mask",
                format!(
                    "path {path:?} cannot be updated; use title, system_prompt, metadata, summary_message_id or expire_time"
                ),
            ));
        }
        let all = paths.is_empty() || paths.iter().any(|p| p == "*");
        let wants = |name: &str| all || paths.iter().any(|p| p == name);
        Ok(SessionPatch {
            title: self.title.filter(|_| wants("title")),
            system_prompt: self.system_prompt.filter(|_| wants("system_prompt")),
            metadata: self.metadata.filter(|_| wants("metadata")),
            summary_message_id: self
                .summary_message_id
                .filter(|_| wants("summary_message_id")),
            expire_time: self
                .expire_time
                .filter(|_| paths.iter().any(|p| p == EXPIRE_TIME)),
        })
    }

    /// Whether the patch changes nothing.
    pub fn is_empty(&self) -> bool {
        self.title.is_none()
            && self.system_prompt.is_none()
            && self.metadata.is_none()
            && self.summary_message_id.is_none()
            && self.expire_time.is_none()
    }
}

/// Where a ListSessions page starts: after this (update_time, id).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionCursor {
    pub update_time: i64,
    pub id: String,
}

/// A ListSessions query.
#[derive(Clone, Debug)]
pub struct SessionQuery {
    /// Only this user's sessions, if set.
    pub user: Option<String>,
    /// Only sessions whose metadata holds every one of these entries.
    pub metadata: Vec<(String, String)>,
    pub after: Option<SessionCursor>,
    pub limit: usize,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::Role;

    fn full() -> SessionPatch {
        SessionPatch {
            title: Some("t".into()),
            system_prompt: Some("p".into()),
            metadata: Some(Metadata::default()),
            summary_message_id: Some("msg_1".into()),
            expire_time: Some(Timestamp(5)),
        }
    }

    #[test]
    fn an_update_mask_keeps_the_fields_it_names() -> Result<()> {
        let paths = |p: &[&str]| p.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        let all = full().masked(&[])?;
        assert!(all.title.is_some() && all.metadata.is_some() && all.summary_message_id.is_some());
        let star = full().masked(&paths(&["*"]))?;
        assert!(star.system_prompt.is_some());
        assert!(
            all.expire_time.is_none() && star.expire_time.is_none(),
            "expiry changes only when named"
        );
        let expiry = full().masked(&paths(&["expire_time"]))?;
        assert_eq!(expiry.expire_time, Some(Timestamp(5)));
        assert!(expiry.title.is_none());
        let title = full().masked(&paths(&["title"]))?;
        assert_eq!(title.title.as_deref(), Some("t"));
        assert!(title.system_prompt.is_none() && title.metadata.is_none());
        let Err(Error::InvalidArgument { field, .. }) = full().masked(&paths(&["title", "user"]))
        else {
            panic!("an unknown path is refused");
        };
        assert_eq!(field, "update_mask");
        Ok(())
    }

    #[test]
    fn caller_ids_are_checked() {
        assert!(validate_new_session_id("session_id", "ses_abc-1.2:3").is_ok());
        assert!(validate_new_session_id("session_id", "has space").is_err());
        assert!(validate_new_session_id("session_id", &"x".repeat(129)).is_err());
    }

    #[test]
    fn only_a_leading_copy_of_the_prompt_is_dropped() {
        let new = NewSession {
            expire_time: Timestamp(0),
            id: None,
            title: String::new(),
            system_prompt: "be brief".into(),
            user: String::new(),
            metadata: Metadata::new(),
            initial_history: vec![
                Message::text(Role::System, "be brief"),
                Message::text(Role::System, "be brief"),
                Message::text(Role::User, "hi"),
            ],
            initial_state: Default::default(),
            request_id: String::new(),
            state_changes: Vec::new(),
            state_scopes: Vec::new(),
        };
        assert_eq!(new.history_to_store().len(), 2);
    }
}
