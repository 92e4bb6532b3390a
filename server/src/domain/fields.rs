//! Field rules and fixed limits that several requests share: ids, state
//! entries, scope names. A leaf: it needs only the domain's types.

use super::{Error, Message, Result, Role, StateChange};

/// The longest caller-chosen session id.
pub const MAX_SESSION_ID_LEN: usize = 128;
/// The longest idempotency key or run id accepted.
pub const MAX_KEY_LEN: usize = 256;
/// The longest state key.
pub const MAX_STATE_KEY_LEN: usize = 256;
/// The largest state value: state is for small things.
pub const MAX_STATE_VALUE_LEN: usize = 64 * 1024;
/// The most state entries one session may hold.
pub const MAX_STATE_ENTRIES: i64 = 1000;

/// Checks the state changes of a request's `field` (AppendExchange's or
/// CreateSession's `state_changes`): at most [`MAX_STATE_ENTRIES`], each
/// scope a valid name or `""`, each key and value within bounds.
pub fn check_state_changes(field: &str, changes: &[StateChange]) -> Result<()> {
    if changes.len() > usize::try_from(MAX_STATE_ENTRIES).unwrap_or(usize::MAX) {
        return Err(Error::LimitExceeded {
            field: field.into(),
            limit: "max_state_entries",
            description: format!("must hold at most {MAX_STATE_ENTRIES} changes"),
        });
    }
    for (i, change) in changes.iter().enumerate() {
        if !change.scope.is_empty() {
            check_scope_name(&format!("{field}[{i}].scope"), &change.scope)?;
        }
        let value = if change.delete { "" } else { &change.value };
        check_state_entry(
            &format!("{field}[{i}].key"),
            &change.key,
            &format!("{field}[{i}].value"),
            value,
        )?;
    }
    Ok(())
}

/// The most state scopes one GetSession may name.
pub const MAX_STATE_SCOPES: usize = 16;

/// Checks GetSession's `state_scopes`: at most [`MAX_STATE_SCOPES`], each
/// `""` (the session's own state) or a valid shared scope name.
pub fn check_state_scopes(field: &str, scopes: &[String]) -> Result<()> {
    if scopes.len() > MAX_STATE_SCOPES {
        return Err(Error::invalid(
            field,
            format!("names {} scopes; at most {MAX_STATE_SCOPES}", scopes.len()),
        ));
    }
    for (i, scope) in scopes.iter().enumerate() {
        if !scope.is_empty() {
            check_scope_name(&format!("{field}[{i}]"), scope)?;
        }
    }
    Ok(())
}

/// Checks an idempotency key's length (it may be empty: none).
pub fn check_request_id(field: &str, request_id: &str) -> Result<()> {
    check_len(field, request_id, MAX_KEY_LEN, false)
}

/// Checks a field's length, and that it is present when `required`.
pub fn check_len(field: &str, value: &str, max: usize, required: bool) -> Result<()> {
    if required && value.is_empty() {
        return Err(Error::invalid(field, "is required"));
    }
    if value.len() > max {
        return Err(Error::invalid(
            field,
            format!("must be at most {max} bytes"),
        ));
    }
    Ok(())
}

/// Checks a caller-chosen session id: 1–128 ASCII letters, digits, `_ - . :`.
pub fn validate_new_session_id(field: &str, id: &str) -> Result<()> {
    if id.len() > MAX_SESSION_ID_LEN {
        return Err(Error::invalid(
            field,
            format!("must be at most {MAX_SESSION_ID_LEN} characters"),
        ));
    }
    if !id
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b':'))
    {
        return Err(Error::invalid(
            field,
            "may hold only ASCII letters, digits and _ - . :",
        ));
    }
    Ok(())
}

/// Checks that a session id naming an existing session is present.
pub fn require_session_id(field: &str, id: &str) -> Result<()> {
    if id.is_empty() {
        return Err(Error::invalid(field, "is required"));
    }
    if id.len() > MAX_SESSION_ID_LEN {
        // No such session can exist; say so plainly rather than querying.
        return Err(Error::invalid(
            field,
            format!("must be at most {MAX_SESSION_ID_LEN} characters"),
        ));
    }
    Ok(())
}

/// Whether `message` is just the session's system prompt restated (as an
/// export with `include_system_prompt` emits it), and so not history.
pub fn is_system_prompt(message: &Message, system_prompt: &str) -> bool {
    !system_prompt.is_empty() && *message == Message::text(Role::System, system_prompt)
}

/// Checks a state key: present and short.
pub fn check_state_key(key: &str) -> Result<()> {
    check_len("key", key, MAX_STATE_KEY_LEN, true)
}

/// Checks a state entry to write: its key (named `key_field` in an error)
/// and its value (`value_field`).
pub fn check_state_entry(key_field: &str, key: &str, value_field: &str, value: &str) -> Result<()> {
    check_len(key_field, key, MAX_STATE_KEY_LEN, true)?;
    if value.len() > MAX_STATE_VALUE_LEN {
        return Err(Error::LimitExceeded {
            field: value_field.into(),
            limit: "max_state_value_bytes",
            description: format!(
                "must be at most {MAX_STATE_VALUE_LEN} bytes; state is for small entries"
            ),
        });
    }
    Ok(())
}
/// Checks a shared scope's name (`[A-Za-z0-9_.:/-]`, 1–256 bytes).
pub fn check_scope_name(field: &str, scope: &str) -> Result<()> {
    check_len(field, scope, MAX_STATE_KEY_LEN, true)?;
    if !scope
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b':' | b'/' | b'-'))
    {
        return Err(Error::invalid(
            field,
            "may hold only ASCII letters, digits and _ . : / -",
        ));
    }
    Ok(())
}
