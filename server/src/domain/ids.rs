//! Server-made identifiers: a prefix and a time-sortable UUIDv7 in hex.

fn make(prefix: &str) -> String {
    let mut hex = [0; uuid::fmt::Simple::LENGTH];
    let hex = uuid::Uuid::now_v7().simple().encode_lower(&mut hex);
    let mut id = String::with_capacity(prefix.len() + hex.len());
    id.push_str(prefix);
    id.push_str(hex);
    id
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

/// A new approval id (`apr_…`).
pub fn approval_id() -> String {
    make("apr_")
}

/// A new queued input id (`inp_…`).
pub fn input_id() -> String {
    make("inp_")
}

#[cfg(test)]
mod tests {
    #[test]
    fn ids_are_their_prefix_and_32_lowercase_hex_digits() {
        for (id, prefix) in [
            (super::session_id(), "ses_"),
            (super::message_id(), "msg_"),
            (super::call_id(), "call_"),
            (super::approval_id(), "apr_"),
            (super::input_id(), "inp_"),
        ] {
            assert!(id.starts_with(prefix), "{id}");
            let hex = &id[prefix.len()..];
            assert_eq!(hex.len(), 32, "{id}");
            assert!(
                hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')),
                "{id}"
            );
        }
        assert!(super::message_id() < super::message_id(), "time-sortable");
    }
}
