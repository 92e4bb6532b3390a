//! EraseUser: what a request names, the checks on it, and what an erasure
//! counts.

use super::fields::check_scope_name;
use super::{Error, Result};

/// Shared scopes one EraseUser may name.
pub const MAX_ERASE_SCOPES: usize = 100;

/// An erasure asked for: every session of `user` in the caller's tenant,
/// and the shared state scopes named.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Erasure {
    pub user: String,
    pub scopes: Vec<String>,
}

impl Erasure {
    /// Checks a request: a user is required, and each scope is a scope
    /// name (named by its index), at most [`MAX_ERASE_SCOPES`] of them.
    pub fn new(user: String, scopes: Vec<String>) -> Result<Self> {
        if user.is_empty() {
            return Err(Error::invalid("user", "is required"));
        }
        if scopes.len() > MAX_ERASE_SCOPES {
            return Err(Error::invalid(
                "scopes",
                format!("must name at most {MAX_ERASE_SCOPES} scopes"),
            ));
        }
        for (index, scope) in scopes.iter().enumerate() {
            check_scope_name(&format!("scopes[{index}]"), scope)?;
        }
        Ok(Erasure { user, scopes })
    }
}

/// What an erasure deleted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Erased {
    /// Live sessions of the user.
    pub sessions: i64,
    /// Their messages.
    pub messages: i64,
    /// Their provider calls.
    pub provider_calls: i64,
    /// Entries of the shared scopes named.
    pub state_entries: i64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field_of(result: Result<Erasure>) -> String {
        match result {
            Err(Error::InvalidArgument { field, .. }) => field,
            other => panic!("expected INVALID_ARGUMENT, got {other:?}"),
        }
    }

    #[test]
    fn a_user_is_required() {
        assert_eq!(field_of(Erasure::new(String::new(), Vec::new())), "user");
    }

    #[test]
    fn each_scope_is_checked_by_index() {
        let scopes = vec!["user:app:alice".to_owned(), "no spaces".to_owned()];
        assert_eq!(field_of(Erasure::new("alice".into(), scopes)), "scopes[1]");
        let many = vec!["app:x".to_owned(); MAX_ERASE_SCOPES + 1];
        assert_eq!(field_of(Erasure::new("alice".into(), many)), "scopes");
    }

    #[test]
    fn a_plain_request_passes() {
        let erasure = Erasure::new("alice".into(), vec!["user:app:alice".into()]);
        assert!(erasure.is_ok());
    }
}
