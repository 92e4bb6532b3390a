//! Server-made identifiers: a prefix and a time-sortable UUIDv7 in hex.

fn make(prefix: &str) -> String {
    format!("{prefix}{}", uuid::Uuid::now_v7().simple())
}

/// A new session id (`ses_…`).
pub fn session_id() -> String {
    make("ses_")
}

/// A new message id (`msg_…`).
pub fn message_id() -> String {
    make("msg_")
}

/// A new provider call id (`call_…`).
pub fn call_id() -> String {
    make("call_")
}
