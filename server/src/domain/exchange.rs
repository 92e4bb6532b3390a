//! AppendExchange: the request, its validation, its idempotency
//! fingerprint, and the `full_history` diff rule.

use serde::Serialize;
use sha2::{Digest, Sha256};

use super::digest;
use super::fields::{MAX_KEY_LEN, check_state_changes, is_system_prompt, validate_new_session_id};
use super::{Error, Message, NewSession, ProviderCall, Result, StateChange};

pub use super::digest::FINGERPRINT_FORM;

/// The length of a fingerprint of the earlier form, the SHA-256 of the
/// request's JSON, which keys stored by earlier servers hold.
const JSON_FINGERPRINT_LEN: usize = 32;

/// An AppendExchange request, already converted from the wire.
#[derive(Clone, Debug, Serialize)]
pub struct NewExchange {
    pub session_id: String,
    /// New client-supplied messages.
    pub messages: Vec<Message>,
    /// The full history as sent to the provider (instead of `messages`).
    pub full_history: Vec<Message>,
    /// The provider call; its `id`, `session_id` and `create_time` are assigned by the store.
    pub provider_call: Option<ProviderCall>,
    /// What the provider call produced.
    pub response_messages: Vec<Message>,
    pub expected_next_sequence: Option<i64>,
    /// Idempotency key (empty: none). Not part of the fingerprint.
    #[serde(skip)]
    pub request_id: String,
    pub run_id: String,
    /// State changes made in the exchange's revision. Left out of the
    /// fingerprint when empty, so requests without them fingerprint as
    /// they always have.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub state_changes: Vec<StateChange>,
    /// The session to create if `session_id` names none (its `id` is
    /// `session_id`; no initial history). Not part of the fingerprint.
    #[serde(skip)]
    pub create_if_missing: Option<NewSession>,
}

/// The largest `usage_json` kept.
pub const MAX_USAGE_JSON_BYTES: usize = 64 * 1024;

/// Checks a provider call's figures: none negative, and the buckets parts
/// of the totals they belong to.
fn check_call(call: &ProviderCall) -> Result<()> {
    for (field, value) in [
        ("provider_call.prompt_tokens", call.prompt_tokens),
        ("provider_call.completion_tokens", call.completion_tokens),
        ("provider_call.total_tokens", call.total_tokens),
        ("provider_call.cost_micros_usd", call.cost_micros_usd),
        (
            "provider_call.cached_input_tokens",
            call.cached_input_tokens,
        ),
        (
            "provider_call.cache_creation_input_tokens",
            call.cache_creation_input_tokens,
        ),
        ("provider_call.reasoning_tokens", call.reasoning_tokens),
        ("provider_call.duration", call.duration_micros),
    ] {
        if value < 0 {
            return Err(Error::invalid(field, "must not be negative"));
        }
    }
    let cache = call
        .cached_input_tokens
        .saturating_add(call.cache_creation_input_tokens);
    if cache > call.prompt_tokens {
        return Err(Error::invalid(
            "provider_call.prompt_tokens",
            format!(
                "counts every input token, the cache buckets included: it must be at least \
                 cached_input_tokens + cache_creation_input_tokens ({cache}); for Anthropic \
                 usage add input_tokens, cache_read_input_tokens and cache_creation_input_tokens"
            ),
        ));
    }
    if call.reasoning_tokens > call.completion_tokens {
        return Err(Error::invalid(
            "provider_call.completion_tokens",
            format!(
                "counts every output token, reasoning included: it must be at least \
                 reasoning_tokens ({})",
                call.reasoning_tokens
            ),
        ));
    }
    if call.usage_json.len() > MAX_USAGE_JSON_BYTES {
        return Err(Error::invalid(
            "provider_call.usage_json",
            format!("must be at most {MAX_USAGE_JSON_BYTES} bytes"),
        ));
    }
    Ok(())
}

impl NewExchange {
    /// Checks the rules that need no stored state.
    pub fn validate(&self) -> Result<()> {
        if !self.messages.is_empty() && !self.full_history.is_empty() {
            return Err(Error::invalid(
                "full_history",
                "cannot be combined with messages; send one or the other",
            ));
        }
        if !self.response_messages.is_empty() && self.provider_call.is_none() {
            return Err(Error::invalid(
                "provider_call",
                "is required when response_messages are given",
            ));
        }
        if self.messages.is_empty()
            && self.full_history.is_empty()
            && self.provider_call.is_none()
            && self.response_messages.is_empty()
        {
            return Err(Error::invalid(
                "messages",
                "the exchange has nothing to write: give messages, full_history, provider_call or response_messages",
            ));
        }
        if let Some(call) = &self.provider_call {
            check_call(call)?;
        }
        check_state_changes("state_changes", &self.state_changes)?;
        if self.expected_next_sequence.is_some_and(|e| e < 0) {
            return Err(Error::invalid(
                "expected_next_sequence",
                "must not be negative",
            ));
        }
        if let Some(new) = &self.create_if_missing {
            if new.id.as_ref().is_some_and(|id| *id != self.session_id) {
                return Err(Error::invalid(
                    "create_if_missing.session_id",
                    "must be empty or the request's session_id",
                ));
            }
            if !new.initial_history.is_empty() {
                return Err(Error::invalid(
                    "create_if_missing.initial_history",
                    "must be empty: the exchange is the session's first history",
                ));
            }
            validate_new_session_id("session_id", &self.session_id)?;
            new.validate_as("create_if_missing.")?;
        }
        for (field, value) in [("request_id", &self.request_id), ("run_id", &self.run_id)] {
            if value.len() > MAX_KEY_LEN {
                return Err(Error::invalid(
                    field,
                    format!("must be at most {MAX_KEY_LEN} bytes"),
                ));
            }
        }
        Ok(())
    }

    /// A digest of everything that makes two requests "the same body" for
    /// idempotency: all fields except `request_id`. Its first byte names
    /// its form ([`FINGERPRINT_FORM`]): the SHA-256 of the request's serde
    /// form, taken without making text of it. (Serializing a struct of
    /// BTreeMaps and Vecs is deterministic.)
    pub fn fingerprint(&self) -> Vec<u8> {
        match digest::sha256(self) {
            Some(sha) => {
                let mut fingerprint = Vec::with_capacity(1 + sha.len());
                fingerprint.push(FINGERPRINT_FORM);
                fingerprint.extend_from_slice(&sha);
                fingerprint
            }
            None => self.json_fingerprint(),
        }
    }

    /// Whether `stored`, the fingerprint an earlier request with the same
    /// `request_id` left, is this request's: in the form of
    /// [`Self::fingerprint`], or in the form servers wrote before it (32
    /// bytes, the SHA-256 of the request's JSON).
    pub fn has_fingerprint(&self, stored: &[u8]) -> bool {
        if stored.len() == JSON_FINGERPRINT_LEN {
            stored == self.json_fingerprint()
        } else {
            stored == self.fingerprint()
        }
    }

    /// The fingerprint's earlier form: the SHA-256 of the request's JSON.
    fn json_fingerprint(&self) -> Vec<u8> {
        let encoded = serde_json::to_vec(self).unwrap_or_default();
        Sha256::digest(&encoded).to_vec()
    }

    /// The provider call with `total_tokens` filled in when it was sent as 0.
    pub fn normalized_call(&self) -> Option<ProviderCall> {
        self.provider_call.clone().map(|mut call| {
            if call.total_tokens == 0 {
                call.total_tokens = call.prompt_tokens.saturating_add(call.completion_tokens);
            }
            call
        })
    }
}

/// Given `full_history` as sent and the stored history, returns the index
/// in `full_history` where the new messages begin.
///
/// A leading copy of the system prompt is skipped; the rest must begin with
/// the stored history, compared whole message by whole message. Otherwise
/// the error names the first differing index, counted in `full_history` as
/// sent.
pub fn diff_full_history(
    full_history: &[Message],
    system_prompt: &str,
    stored: &[Message],
) -> Result<usize> {
    let skip = usize::from(
        full_history
            .first()
            .is_some_and(|m| is_system_prompt(m, system_prompt)),
    );
    let sent = &full_history[skip..];
    for (i, stored_message) in stored.iter().enumerate() {
        match sent.get(i) {
            None => {
                return Err(Error::HistoryMismatch {
                    index: skip + i,
                    reason: format!(
                        "is missing: full_history ends before the stored history, which holds {} messages",
                        stored.len()
                    ),
                });
            }
            Some(message) if message != stored_message => {
                return Err(Error::HistoryMismatch {
                    index: skip + i,
                    reason: format!("differs from the stored message at sequence {i}"),
                });
            }
            Some(_) => {}
        }
    }
    Ok(skip + stored.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::Role;

    fn user(text: &str) -> Message {
        Message::text(Role::User, text)
    }

    #[test]
    fn full_history_appends_only_what_is_new() {
        let stored = [user("a"), user("b")];
        let sent = [
            Message::text(Role::System, "prompt"),
            user("a"),
            user("b"),
            user("c"),
        ];
        assert_eq!(diff_full_history(&sent, "prompt", &stored).ok(), Some(3));
        assert_eq!(
            diff_full_history(&sent[1..], "prompt", &stored).ok(),
            Some(2)
        );
    }

    #[test]
    fn full_history_mismatch_names_the_index_as_sent() {
        let stored = [user("a"), user("b")];
        let sent = [Message::text(Role::System, "prompt"), user("a"), user("X")];
        match diff_full_history(&sent, "prompt", &stored) {
            Err(Error::HistoryMismatch { index, .. }) => assert_eq!(index, 2),
            other => panic!("unexpected {other:?}"),
        }
        match diff_full_history(&sent[..2], "prompt", &stored) {
            Err(Error::HistoryMismatch { index, .. }) => assert_eq!(index, 2),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn fingerprint_ignores_request_id_only() {
        let base = NewExchange {
            session_id: "s".into(),
            messages: vec![user("a")],
            full_history: vec![],
            provider_call: None,
            response_messages: vec![],
            expected_next_sequence: None,
            request_id: "k1".into(),
            run_id: String::new(),
            state_changes: Vec::new(),
            create_if_missing: None,
        };
        let mut same = base.clone();
        same.request_id = "k2".into();
        assert_eq!(base.fingerprint(), same.fingerprint());
        let mut other = base.clone();
        other.messages[0].content.push('!');
        assert_ne!(base.fingerprint(), other.fingerprint());
        assert!(same.has_fingerprint(&base.fingerprint()));
        assert!(!other.has_fingerprint(&base.fingerprint()));
    }

    #[test]
    fn fingerprints_of_the_earlier_form_still_match() -> Result<(), serde_json::Error> {
        let base = NewExchange {
            session_id: "s".into(),
            messages: vec![user("a")],
            full_history: vec![],
            provider_call: None,
            response_messages: vec![],
            expected_next_sequence: Some(1),
            request_id: "k1".into(),
            run_id: "r".into(),
            state_changes: Vec::new(),
            create_if_missing: None,
        };
        let fingerprint = base.fingerprint();
        assert_eq!(fingerprint.len(), 33);
        assert_eq!(fingerprint[0], FINGERPRINT_FORM);
        let earlier = Sha256::digest(serde_json::to_vec(&base)?).to_vec();
        assert_eq!(earlier.len(), JSON_FINGERPRINT_LEN);
        assert!(base.has_fingerprint(&earlier));
        let mut other = base.clone();
        other.run_id.clear();
        assert!(!other.has_fingerprint(&earlier));
        assert!(!other.has_fingerprint(&fingerprint));
        Ok(())
    }
}
