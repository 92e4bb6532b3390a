//! The one place domain errors become gRPC statuses, with
//! `google.rpc.ErrorInfo` (an UPPER_SNAKE reason) and, for bad fields,
//! `google.rpc.BadRequest`. Storage error text is logged, never sent.

use std::collections::HashMap;

use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

use crate::domain::Error;

/// The `ErrorInfo.domain` of every error this service returns.
pub const ERROR_DOMAIN: &str = "sessionstore";

/// The `RetryInfo` delay of a `STORAGE_UNAVAILABLE` answer: about how often
/// the health probe retries the database.
const STORAGE_RETRY_DELAY: std::time::Duration = std::time::Duration::from_secs(1);

fn info(reason: &str, metadata: &[(&str, String)]) -> ErrorDetails {
    let metadata: HashMap<String, String> = metadata
        .iter()
        .map(|(k, v)| ((*k).to_owned(), v.clone()))
        .collect();
    ErrorDetails::with_error_info(reason, ERROR_DOMAIN, metadata)
}

impl From<Error> for Status {
    fn from(error: Error) -> Self {
        let message = error.to_string();
        let (code, details) = match error {
            Error::InvalidArgument { field, description } => {
                let mut details = info("INVALID_ARGUMENT", &[("field", field.clone())]);
                details.add_bad_request_violation(field, description);
                (Code::InvalidArgument, details)
            }
            Error::SessionNotFound(id) => (
                Code::NotFound,
                info("SESSION_NOT_FOUND", &[("session_id", id)]),
            ),
            Error::SessionExists(id) => (
                Code::AlreadyExists,
                info("SESSION_ALREADY_EXISTS", &[("session_id", id)]),
            ),
            Error::SequenceMismatch { expected, actual } => (
                Code::Aborted,
                info(
                    "SEQUENCE_MISMATCH",
                    &[
                        ("expected_next_sequence", expected.to_string()),
                        ("actual_next_sequence", actual.to_string()),
                    ],
                ),
            ),
            Error::HistoryMismatch { index, reason } => {
                let field = format!("full_history[{index}]");
                let mut details = info(
                    "HISTORY_MISMATCH",
                    &[("index", index.to_string()), ("field", field.clone())],
                );
                details.add_bad_request_violation(field, reason);
                (Code::FailedPrecondition, details)
            }
            Error::IdempotencyConflict(request_id) => (
                Code::AlreadyExists,
                info("REQUEST_ID_REUSED", &[("request_id", request_id)]),
            ),
            Error::RevisionOutOfRange { requested, head } => (
                Code::OutOfRange,
                info(
                    "REVISION_OUT_OF_RANGE",
                    &[
                        ("after_revision", requested.to_string()),
                        ("head_revision", head.to_string()),
                    ],
                ),
            ),
            Error::SessionBusy {
                active_run_id,
                expire_time,
            } => (
                Code::FailedPrecondition,
                info(
                    "SESSION_BUSY",
                    &[
                        ("active_run_id", active_run_id),
                        ("expire_time_micros", expire_time.0.to_string()),
                    ],
                ),
            ),
            Error::RunNotActive(run_id) => (
                Code::FailedPrecondition,
                info("RUN_NOT_ACTIVE", &[("run_id", run_id)]),
            ),
            Error::UnknownToolCall(id) => (
                Code::FailedPrecondition,
                info("UNKNOWN_TOOL_CALL", &[("tool_call_id", id)]),
            ),
            Error::ToolCallAnswered(id) => (
                Code::FailedPrecondition,
                info("TOOL_CALL_ANSWERED", &[("tool_call_id", id)]),
            ),
            Error::ApprovalExists {
                tool_call_id,
                approval_id,
            } => (
                Code::AlreadyExists,
                info(
                    "APPROVAL_EXISTS",
                    &[("tool_call_id", tool_call_id), ("approval_id", approval_id)],
                ),
            ),
            Error::ApprovalNotFound(id) => (
                Code::NotFound,
                info("APPROVAL_NOT_FOUND", &[("approval_id", id)]),
            ),
            Error::ApprovalAlreadyDecided {
                approval_id,
                state,
                decided_by,
            } => (
                Code::FailedPrecondition,
                info(
                    "APPROVAL_ALREADY_DECIDED",
                    &[
                        ("approval_id", approval_id),
                        ("state", state.to_string()),
                        ("decided_by", decided_by),
                    ],
                ),
            ),
            Error::ApprovalExpired(id) => (
                Code::FailedPrecondition,
                info("APPROVAL_EXPIRED", &[("approval_id", id)]),
            ),
            Error::LeaseNotHeld(run_id) => (
                Code::FailedPrecondition,
                info("LEASE_NOT_HELD", &[("run_id", run_id)]),
            ),
            Error::QueueEmpty => (Code::NotFound, info("QUEUE_EMPTY", &[])),
            Error::QueueFull(limit) => (
                Code::ResourceExhausted,
                info("QUEUE_FULL", &[("limit", limit.to_string())]),
            ),
            Error::InputNotFound(id) => {
                (Code::NotFound, info("INPUT_NOT_FOUND", &[("input_id", id)]))
            }
            Error::InputAlreadyTaken(id) => (
                Code::FailedPrecondition,
                info("INPUT_ALREADY_TAKEN", &[("input_id", id)]),
            ),
            Error::MessageNotFound(id) => (
                Code::NotFound,
                info("MESSAGE_NOT_FOUND", &[("message_id", id)]),
            ),
            Error::StateNotFound(key) => (Code::NotFound, info("STATE_NOT_FOUND", &[("key", key)])),
            Error::StateVersionMismatch {
                key,
                expected,
                actual,
            } => (
                Code::Aborted,
                info(
                    "STATE_VERSION_MISMATCH",
                    &[
                        ("key", key),
                        ("expected_version", expected.to_string()),
                        ("actual_version", actual.to_string()),
                    ],
                ),
            ),
            Error::LimitExceeded {
                field,
                limit,
                description,
            } => {
                let mut details = info(
                    "LIMIT_EXCEEDED",
                    &[("field", field.clone()), ("limit", limit.to_owned())],
                );
                details.add_bad_request_violation(field, description);
                (Code::ResourceExhausted, details)
            }
            Error::RateLimited {
                per_second,
                retry_after,
            } => {
                let mut details = info(
                    "RATE_LIMITED",
                    &[
                        ("limit", "max_requests_per_second".to_owned()),
                        ("per_second", per_second.to_string()),
                    ],
                );
                details.set_retry_info(Some(retry_after));
                (Code::ResourceExhausted, details)
            }
            Error::Unauthenticated(_) => (Code::Unauthenticated, info("UNAUTHENTICATED", &[])),
            Error::ShuttingDown => (Code::Unavailable, info("SHUTTING_DOWN", &[])),
            Error::SearchDisabled => (Code::FailedPrecondition, info("SEARCH_DISABLED", &[])),
            Error::SearchIndexBehind => {
                let mut details = info("SEARCH_INDEX_BEHIND", &[]);
                details.set_retry_info(Some(std::time::Duration::from_secs(5)));
                (Code::Unavailable, details)
            }
            Error::StorageUnavailable(source) => {
                tracing::warn!(error = %source, "database unavailable");
                let mut details = info("STORAGE_UNAVAILABLE", &[]);
                details.set_retry_info(Some(STORAGE_RETRY_DELAY));
                (Code::Unavailable, details)
            }
            Error::StorageFull(source) => {
                tracing::warn!(error = %source, "database disk full");
                (Code::ResourceExhausted, info("STORAGE_FULL", &[]))
            }
            Error::Storage(source) => {
                tracing::error!(error = %source, "storage error");
                (Code::Internal, info("STORAGE_ERROR", &[]))
            }
        };
        Status::with_error_details(code, message, details)
    }
}

/// RESOURCE_EXHAUSTED for a limit of the whole server, not of one field:
/// `ErrorInfo` reason `LIMIT_EXCEEDED` naming the flag (in snake case) in
/// `metadata.limit`, as [`Error::LimitExceeded`] does.
pub fn limit_exceeded(limit: &str, message: String) -> Status {
    Status::with_error_details(
        Code::ResourceExhausted,
        message,
        info("LIMIT_EXCEEDED", &[("limit", limit.to_owned())]),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_search_index_still_building_is_unavailable_with_a_retry_delay() {
        let status = Status::from(Error::SearchIndexBehind);
        assert_eq!(status.code(), Code::Unavailable);
        let details = status.get_error_details();
        let info = details.error_info();
        assert_eq!(
            info.map(|info| (info.reason.as_str(), info.domain.as_str())),
            Some(("SEARCH_INDEX_BEHIND", ERROR_DOMAIN))
        );
        assert_eq!(
            details.retry_info().and_then(|retry| retry.retry_delay),
            Some(std::time::Duration::from_secs(5))
        );
    }
}
