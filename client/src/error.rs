//! The client's error type: one variant per failure a caller may want to
//! branch on, built from the gRPC status code and the `google.rpc` details
//! (`ErrorInfo` reason and metadata, `BadRequest`, `RetryInfo`) the server
//! attaches — never from message text.

use std::time::Duration;

use tonic::{Code, Status};
use tonic_types::StatusExt as _;

use crate::v1;

/// A `Result` whose error is the client's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why a call failed.
///
/// Every variant that came from the server keeps the original
/// [`tonic::Status`] (see [`Error::status`]), with its message, code and
/// details, for logging or anything this enum does not cover.
///
/// ```
/// use sessionstore_client::Error;
///
/// fn describe(error: &Error) -> String {
///     match error {
///         Error::NotFound { session_id, .. } => format!("no session {session_id}"),
///         Error::SequenceMismatch { actual_next_sequence, .. } => {
///             format!("someone else wrote first; next sequence is {actual_next_sequence}")
///         }
///         Error::InvalidArgument { field, description, .. } => format!("{field}: {description}"),
///         other if other.is_transient() => "try again later".to_owned(),
///         other => other.to_string(),
///     }
/// }
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The session does not exist, or belongs to another tenant
    /// (`NOT_FOUND`, reason `SESSION_NOT_FOUND`).
    #[error("session {session_id:?} not found")]
    NotFound {
        /// The session id the server looked for.
        session_id: String,
        /// The status as received.
        #[source]
        status: Status,
    },
    /// A message id named in the request does not exist (`NOT_FOUND`,
    /// reason `MESSAGE_NOT_FOUND`).
    #[error("message {message_id:?} not found")]
    MessageNotFound {
        /// The message id the server looked for.
        message_id: String,
        /// The status as received.
        #[source]
        status: Status,
    },
    /// A per-session state key does not exist (`NOT_FOUND`, reason
    /// `STATE_NOT_FOUND`).
    #[error("state entry {key:?} not found")]
    StateNotFound {
        /// The missing key.
        key: String,
        /// The status as received.
        #[source]
        status: Status,
    },
    /// A caller-chosen session id is taken (`ALREADY_EXISTS`, reason
    /// `SESSION_ALREADY_EXISTS`).
    #[error("session {session_id:?} already exists")]
    AlreadyExists {
        /// The taken id.
        session_id: String,
        /// The status as received.
        #[source]
        status: Status,
    },
    /// An `AppendExchange` (or another keyed call, such as a
    /// `SubmitInput`) reused a `request_id` with a different body
    /// (`ALREADY_EXISTS`, reason `REQUEST_ID_REUSED`).
    #[error("request id {request_id:?} was already used for a different exchange")]
    RequestIdReused {
        /// The reused idempotency key.
        request_id: String,
        /// The status as received.
        #[source]
        status: Status,
    },
    /// A field is empty, malformed or out of range (`INVALID_ARGUMENT`).
    #[error("invalid {field}: {description}")]
    InvalidArgument {
        /// The offending field, as named in the request (e.g.
        /// `messages[0].role`); empty if the server named none.
        field: String,
        /// What is wrong with it.
        description: String,
        /// The status as received.
        #[source]
        status: Status,
    },
    /// `expected_next_sequence` did not match (`ABORTED`, reason
    /// `SEQUENCE_MISMATCH`): another writer appended first. Nothing was
    /// written; re-read the history and try again from
    /// `actual_next_sequence`.
    #[error(
        "expected next sequence {expected}, but the session's next sequence is {actual_next_sequence}"
    )]
    SequenceMismatch {
        /// The `expected_next_sequence` the request carried.
        expected: i64,
        /// The session's next sequence when the request was checked.
        actual_next_sequence: i64,
        /// The status as received.
        #[source]
        status: Status,
    },
    /// A `full_history` append does not begin with the stored history
    /// (`FAILED_PRECONDITION`, reason `HISTORY_MISMATCH`).
    #[error("full_history differs from the stored history at index {index}: {description}")]
    HistoryMismatch {
        /// The first differing index, counted in `full_history` as sent.
        index: i64,
        /// How it differs.
        description: String,
        /// The status as received.
        #[source]
        status: Status,
    },
    /// Another run holds the session's lease (`FAILED_PRECONDITION`,
    /// reason `SESSION_BUSY`); for a `SubmitInput` in mode `Reject`, also
    /// inputs waiting in the session's queue.
    #[error("session is busy with run {active_run_id:?}")]
    SessionBusy {
        /// The run holding the lease (empty when the session is busy only
        /// with waiting inputs).
        active_run_id: String,
        /// The status as received.
        #[source]
        status: Status,
    },
    /// `CancelRun` named a run that is not active and was never cancelled
    /// (`FAILED_PRECONDITION`, reason `RUN_NOT_ACTIVE`).
    #[error("run {run_id:?} is not active")]
    RunNotActive {
        /// The run named.
        run_id: String,
        /// The status as received.
        #[source]
        status: Status,
    },
    /// A tool approval was asked for a call that no message of the
    /// session's current history makes (`FAILED_PRECONDITION`, reason
    /// `UNKNOWN_TOOL_CALL`).
    #[error("tool call {tool_call_id:?} is made by no message of the session's history")]
    UnknownToolCall {
        /// The tool call named.
        tool_call_id: String,
        /// The status as received.
        #[source]
        status: Status,
    },
    /// A tool approval was asked for a call that a message of the history
    /// already answers (`FAILED_PRECONDITION`, reason
    /// `TOOL_CALL_ANSWERED`).
    #[error("tool call {tool_call_id:?} already has its result")]
    ToolCallAnswered {
        /// The tool call named.
        tool_call_id: String,
        /// The status as received.
        #[source]
        status: Status,
    },
    /// The tool call already has a pending or approved approval
    /// (`ALREADY_EXISTS`, reason `APPROVAL_EXISTS`): wait for that one's
    /// decision instead.
    #[error("tool call {tool_call_id:?} already has approval {approval_id:?}")]
    ApprovalExists {
        /// The tool call named.
        tool_call_id: String,
        /// Its pending or approved approval.
        approval_id: String,
        /// The status as received.
        #[source]
        status: Status,
    },
    /// The session has no approval by this id (`NOT_FOUND`, reason
    /// `APPROVAL_NOT_FOUND`).
    #[error("approval {approval_id:?} not found")]
    ApprovalNotFound {
        /// The approval id the server looked for.
        approval_id: String,
        /// The status as received.
        #[source]
        status: Status,
    },
    /// The approval was decided before, by another call or by this request
    /// id with another decision, reason or decider
    /// (`FAILED_PRECONDITION`, reason `APPROVAL_ALREADY_DECIDED`). Nothing
    /// was written.
    #[error("approval {approval_id:?} was already decided ({}) by {decided_by:?}", state.as_str_name())]
    ApprovalAlreadyDecided {
        /// The approval.
        approval_id: String,
        /// What it was decided as (`Approved` or `Denied`).
        state: v1::ApprovalState,
        /// Who decided it, as they said.
        decided_by: String,
        /// The status as received.
        #[source]
        status: Status,
    },
    /// The approval expired before anyone decided it
    /// (`FAILED_PRECONDITION`, reason `APPROVAL_EXPIRED`). The tool call may
    /// be asked about again.
    #[error("approval {approval_id:?} expired before it was decided")]
    ApprovalExpired {
        /// The approval.
        approval_id: String,
        /// The status as received.
        #[source]
        status: Status,
    },
    /// The run does not hold the session's lease, and only the lease holder
    /// takes queued input (`FAILED_PRECONDITION`, reason `LEASE_NOT_HELD`).
    #[error("run {run_id:?} does not hold the session's lease")]
    LeaseNotHeld {
        /// The run named.
        run_id: String,
        /// The status as received.
        #[source]
        status: Status,
    },
    /// No input waits in the session's queue (`NOT_FOUND`, reason
    /// `QUEUE_EMPTY`).
    #[error("no input is waiting in the session's queue")]
    QueueEmpty {
        /// The status as received.
        #[source]
        status: Status,
    },
    /// The session's queue holds the most waiting inputs it may
    /// (`RESOURCE_EXHAUSTED`, reason `QUEUE_FULL`). Nothing was queued;
    /// try again once the run has taken some, or withdraw some.
    #[error("the session's queue is full ({limit} waiting inputs)")]
    QueueFull {
        /// How many waiting inputs a queue holds at most.
        limit: i64,
        /// The status as received.
        #[source]
        status: Status,
    },
    /// The session never queued an input by this id (`NOT_FOUND`, reason
    /// `INPUT_NOT_FOUND`).
    #[error("input {input_id:?} not found")]
    InputNotFound {
        /// The input id the server looked for.
        input_id: String,
        /// The status as received.
        #[source]
        status: Status,
    },
    /// The input was taken into the history already, so it cannot be
    /// withdrawn (`FAILED_PRECONDITION`, reason `INPUT_ALREADY_TAKEN`).
    #[error("input {input_id:?} was already taken")]
    InputAlreadyTaken {
        /// The input.
        input_id: String,
        /// The status as received.
        #[source]
        status: Status,
    },
    /// A watch asked for revisions after the session's head (`OUT_OF_RANGE`,
    /// reason `REVISION_OUT_OF_RANGE`).
    #[error("revision {after_revision} is beyond the session's head {head_revision}")]
    RevisionOutOfRange {
        /// The requested `after_revision`.
        after_revision: i64,
        /// The session's current revision.
        head_revision: i64,
        /// The status as received.
        #[source]
        status: Status,
    },
    /// A state write's `expected_version` did not match (`ABORTED`, reason
    /// `STATE_VERSION_MISMATCH`).
    #[error("state entry {key:?} is at version {actual}, not {expected}")]
    StateVersionMismatch {
        /// The entry's key.
        key: String,
        /// The version the request expected.
        expected: i64,
        /// The entry's actual version (0: it does not exist).
        actual: i64,
        /// The status as received.
        #[source]
        status: Status,
    },
    /// The request exceeds one of the server's configured limits (reason
    /// `LIMIT_EXCEEDED`, usually `RESOURCE_EXHAUSTED`).
    #[error("limit {limit} exceeded by {field}: {description}")]
    LimitExceeded {
        /// Which limit, e.g. `max_messages_per_exchange`.
        limit: String,
        /// The field that exceeds it.
        field: String,
        /// What exceeded it, and by how much.
        description: String,
        /// The status as received.
        #[source]
        status: Status,
    },
    /// The tenant sends more requests per second than the server allows
    /// (`RESOURCE_EXHAUSTED`, reason `RATE_LIMITED`). Transient: the client
    /// retries idempotent calls by itself after `retry_after`.
    #[error("rate limited; retry after {retry_after:?}")]
    RateLimited {
        /// How long the server asks to wait (`google.rpc.RetryInfo`).
        retry_after: Option<Duration>,
        /// The status as received.
        #[source]
        status: Status,
    },
    /// Missing or wrong bearer token (`UNAUTHENTICATED`).
    #[error("unauthenticated: {}", status.message())]
    Unauthenticated {
        /// The status as received.
        #[source]
        status: Status,
    },
    /// The server could not be reached, is shutting down (reason
    /// `SHUTTING_DOWN`: reconnect, possibly to another replica), cannot
    /// reach its database (reason `STORAGE_UNAVAILABLE`, with a
    /// `RetryInfo` delay), or the connection broke during the call.
    /// Transient.
    ///
    /// Besides `UNAVAILABLE` from the server this covers a status that
    /// tonic made locally from a transport failure (a status with an error
    /// source and no details): the request may or may not have reached the
    /// server, so only idempotent calls are retried.
    #[error("unavailable: {}", status.message())]
    Unavailable {
        /// The server said it is shutting down.
        shutting_down: bool,
        /// The status, as received or as made from the transport failure.
        #[source]
        status: Status,
    },
    /// The call took longer than the per-request timeout
    /// ([`ClientBuilder::request_timeout`](crate::ClientBuilder::request_timeout)),
    /// or the server's deadline (`DEADLINE_EXCEEDED`).
    #[error("deadline exceeded: {}", status.message())]
    DeadlineExceeded {
        /// The status as received or made locally.
        #[source]
        status: Status,
    },
    /// Connecting failed, or the URL or TLS settings are unusable.
    #[error("transport: {0}")]
    Transport(#[from] tonic::transport::Error),
    /// A client setting cannot be used (e.g. a bearer token that is not a
    /// valid header value, or an `https://` URL without the `tls` feature).
    #[error("invalid client configuration: {0}")]
    InvalidConfig(String),
    /// Any other status: its code, message and details are in the
    /// [`Status`].
    #[error("{}: {}", .0.code(), .0.message())]
    Other(#[source] Status),
}

impl Error {
    /// The gRPC status behind this error, if it came from a call.
    pub fn status(&self) -> Option<&Status> {
        match self {
            Error::NotFound { status, .. }
            | Error::MessageNotFound { status, .. }
            | Error::StateNotFound { status, .. }
            | Error::AlreadyExists { status, .. }
            | Error::RequestIdReused { status, .. }
            | Error::InvalidArgument { status, .. }
            | Error::SequenceMismatch { status, .. }
            | Error::HistoryMismatch { status, .. }
            | Error::SessionBusy { status, .. }
            | Error::RunNotActive { status, .. }
            | Error::UnknownToolCall { status, .. }
            | Error::ToolCallAnswered { status, .. }
            | Error::ApprovalExists { status, .. }
            | Error::ApprovalNotFound { status, .. }
            | Error::ApprovalAlreadyDecided { status, .. }
            | Error::ApprovalExpired { status, .. }
            | Error::LeaseNotHeld { status, .. }
            | Error::QueueEmpty { status }
            | Error::QueueFull { status, .. }
            | Error::InputNotFound { status, .. }
            | Error::InputAlreadyTaken { status, .. }
            | Error::RevisionOutOfRange { status, .. }
            | Error::StateVersionMismatch { status, .. }
            | Error::LimitExceeded { status, .. }
            | Error::RateLimited { status, .. }
            | Error::Unauthenticated { status }
            | Error::Unavailable { status, .. }
            | Error::DeadlineExceeded { status }
            | Error::Other(status) => Some(status),
            Error::Transport(_) | Error::InvalidConfig(_) => None,
        }
    }

    /// The gRPC status code, if this error came from a call.
    pub fn code(&self) -> Option<Code> {
        self.status().map(Status::code)
    }

    /// The `google.rpc.ErrorInfo` reason the server gave (e.g.
    /// `SESSION_NOT_FOUND`), if any.
    pub fn reason(&self) -> Option<String> {
        let details = self.status()?.get_error_details();
        details.error_info().map(|info| info.reason.clone())
    }

    /// Whether trying the same call again later may succeed: the server was
    /// unavailable (or the connection broke), or the tenant was rate
    /// limited. Only idempotent calls should be retried; the client does so
    /// by itself for `append_exchange` (which always carries a
    /// `request_id`), reads and watches.
    pub fn is_transient(&self) -> bool {
        matches!(self, Error::Unavailable { .. } | Error::RateLimited { .. })
    }

    /// How long the server asked to wait before retrying, if it said (a
    /// rate limit, or an unavailable database: `google.rpc.RetryInfo`).
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Error::RateLimited { retry_after, .. } => *retry_after,
            Error::Unavailable { status, .. } => status
                .get_error_details()
                .retry_info()
                .and_then(|retry| retry.retry_delay),
            _ => None,
        }
    }

    /// The client gave up waiting (a local timeout), with a status shaped
    /// like the server's.
    pub(crate) fn deadline(what: &str, timeout: Duration) -> Error {
        Error::DeadlineExceeded {
            status: Status::deadline_exceeded(format!("{what} took longer than {timeout:?}")),
        }
    }
}

/// A metadata value of the `ErrorInfo`, or "".
fn meta(info: Option<&tonic_types::ErrorInfo>, key: &str) -> String {
    info.and_then(|info| info.metadata.get(key))
        .cloned()
        .unwrap_or_default()
}

/// A numeric metadata value of the `ErrorInfo`.
fn meta_i64(info: Option<&tonic_types::ErrorInfo>, key: &str) -> Option<i64> {
    info.and_then(|info| info.metadata.get(key))
        .and_then(|value| value.parse().ok())
}

/// Whether tonic made this status from a local timeout
/// ([`tonic::TimeoutExpired`] somewhere in its source chain).
fn is_local_timeout(status: &Status) -> bool {
    let mut source = std::error::Error::source(status);
    while let Some(error) = source {
        if error.is::<tonic::TimeoutExpired>() {
            return true;
        }
        source = error.source();
    }
    false
}

impl From<Status> for Error {
    fn from(status: Status) -> Self {
        let details = status.get_error_details();
        let info = details.error_info();
        let reason = info.map(|info| info.reason.as_str()).unwrap_or_default();
        let violation = details
            .bad_request()
            .and_then(|bad| bad.field_violations.first());
        let field = violation.map_or_else(|| meta(info, "field"), |v| v.field.clone());
        let description = violation.map_or_else(String::new, |v| v.description.clone());

        // The reason decides first; the code is the fallback.
        match reason {
            "SESSION_NOT_FOUND" => {
                return Error::NotFound {
                    session_id: meta(info, "session_id"),
                    status,
                };
            }
            "MESSAGE_NOT_FOUND" => {
                return Error::MessageNotFound {
                    message_id: meta(info, "message_id"),
                    status,
                };
            }
            "STATE_NOT_FOUND" => {
                return Error::StateNotFound {
                    key: meta(info, "key"),
                    status,
                };
            }
            "SESSION_ALREADY_EXISTS" => {
                return Error::AlreadyExists {
                    session_id: meta(info, "session_id"),
                    status,
                };
            }
            "REQUEST_ID_REUSED" => {
                return Error::RequestIdReused {
                    request_id: meta(info, "request_id"),
                    status,
                };
            }
            "SEQUENCE_MISMATCH" => {
                if let (Some(expected), Some(actual_next_sequence)) = (
                    meta_i64(info, "expected_next_sequence"),
                    meta_i64(info, "actual_next_sequence"),
                ) {
                    return Error::SequenceMismatch {
                        expected,
                        actual_next_sequence,
                        status,
                    };
                }
            }
            "HISTORY_MISMATCH" => {
                if let Some(index) = meta_i64(info, "index") {
                    return Error::HistoryMismatch {
                        index,
                        description,
                        status,
                    };
                }
            }
            "SESSION_BUSY" => {
                return Error::SessionBusy {
                    active_run_id: meta(info, "active_run_id"),
                    status,
                };
            }
            "RUN_NOT_ACTIVE" => {
                return Error::RunNotActive {
                    run_id: meta(info, "run_id"),
                    status,
                };
            }
            "UNKNOWN_TOOL_CALL" => {
                return Error::UnknownToolCall {
                    tool_call_id: meta(info, "tool_call_id"),
                    status,
                };
            }
            "TOOL_CALL_ANSWERED" => {
                return Error::ToolCallAnswered {
                    tool_call_id: meta(info, "tool_call_id"),
                    status,
                };
            }
            "APPROVAL_EXISTS" => {
                return Error::ApprovalExists {
                    tool_call_id: meta(info, "tool_call_id"),
                    approval_id: meta(info, "approval_id"),
                    status,
                };
            }
            "APPROVAL_NOT_FOUND" => {
                return Error::ApprovalNotFound {
                    approval_id: meta(info, "approval_id"),
                    status,
                };
            }
            "APPROVAL_ALREADY_DECIDED" => {
                return Error::ApprovalAlreadyDecided {
                    approval_id: meta(info, "approval_id"),
                    state: v1::ApprovalState::from_str_name(&meta(info, "state"))
                        .unwrap_or_default(),
                    decided_by: meta(info, "decided_by"),
                    status,
                };
            }
            "APPROVAL_EXPIRED" => {
                return Error::ApprovalExpired {
                    approval_id: meta(info, "approval_id"),
                    status,
                };
            }
            "LEASE_NOT_HELD" => {
                return Error::LeaseNotHeld {
                    run_id: meta(info, "run_id"),
                    status,
                };
            }
            "QUEUE_EMPTY" => return Error::QueueEmpty { status },
            "QUEUE_FULL" => {
                if let Some(limit) = meta_i64(info, "limit") {
                    return Error::QueueFull { limit, status };
                }
            }
            "INPUT_NOT_FOUND" => {
                return Error::InputNotFound {
                    input_id: meta(info, "input_id"),
                    status,
                };
            }
            "INPUT_ALREADY_TAKEN" => {
                return Error::InputAlreadyTaken {
                    input_id: meta(info, "input_id"),
                    status,
                };
            }
            "REVISION_OUT_OF_RANGE" => {
                if let (Some(after_revision), Some(head_revision)) = (
                    meta_i64(info, "after_revision"),
                    meta_i64(info, "head_revision"),
                ) {
                    return Error::RevisionOutOfRange {
                        after_revision,
                        head_revision,
                        status,
                    };
                }
            }
            "STATE_VERSION_MISMATCH" => {
                if let (Some(expected), Some(actual)) = (
                    meta_i64(info, "expected_version"),
                    meta_i64(info, "actual_version"),
                ) {
                    return Error::StateVersionMismatch {
                        key: meta(info, "key"),
                        expected,
                        actual,
                        status,
                    };
                }
            }
            "LIMIT_EXCEEDED" => {
                return Error::LimitExceeded {
                    limit: meta(info, "limit"),
                    field,
                    description,
                    status,
                };
            }
            "RATE_LIMITED" => {
                let retry_after = details.retry_info().and_then(|retry| retry.retry_delay);
                return Error::RateLimited {
                    retry_after,
                    status,
                };
            }
            "SHUTTING_DOWN" => {
                return Error::Unavailable {
                    shutting_down: true,
                    status,
                };
            }
            _ => {}
        }
        // A status tonic made from a local transport failure carries its
        // cause as the error source and no details; a server's never does.
        let local = std::error::Error::source(&status).is_some() && status.details().is_empty();
        match status.code() {
            Code::InvalidArgument => Error::InvalidArgument {
                field,
                description: if description.is_empty() {
                    status.message().to_owned()
                } else {
                    description
                },
                status,
            },
            Code::Unauthenticated => Error::Unauthenticated { status },
            Code::Unavailable => Error::Unavailable {
                shutting_down: false,
                status,
            },
            Code::DeadlineExceeded => Error::DeadlineExceeded { status },
            Code::Cancelled if local && is_local_timeout(&status) => {
                Error::DeadlineExceeded { status }
            }
            Code::Unknown | Code::Internal | Code::Cancelled if local => Error::Unavailable {
                shutting_down: false,
                status,
            },
            _ => Error::Other(status),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use tonic_types::ErrorDetails;

    use super::*;

    fn with_info(code: Code, reason: &str, metadata: &[(&str, &str)]) -> Status {
        let metadata: HashMap<String, String> = metadata
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        Status::with_error_details(
            code,
            "text the client never parses",
            ErrorDetails::with_error_info(reason, "sessionstore", metadata),
        )
    }

    #[test]
    fn reasons_and_metadata_pick_the_variant() {
        let error = Error::from(with_info(
            Code::Aborted,
            "SEQUENCE_MISMATCH",
            &[
                ("expected_next_sequence", "3"),
                ("actual_next_sequence", "7"),
            ],
        ));
        assert!(matches!(
            error,
            Error::SequenceMismatch {
                expected: 3,
                actual_next_sequence: 7,
                ..
            }
        ));
        assert_eq!(error.code(), Some(Code::Aborted));
        assert_eq!(error.reason().as_deref(), Some("SEQUENCE_MISMATCH"));

        let error = Error::from(with_info(
            Code::NotFound,
            "SESSION_NOT_FOUND",
            &[("session_id", "ses_x")],
        ));
        assert!(matches!(&error, Error::NotFound { session_id, .. } if session_id == "ses_x"));

        let error = Error::from(with_info(Code::Unavailable, "SHUTTING_DOWN", &[]));
        assert!(matches!(
            error,
            Error::Unavailable {
                shutting_down: true,
                ..
            }
        ));
        assert!(error.is_transient());
    }

    #[test]
    fn approval_reasons_carry_their_metadata() {
        let error = Error::from(with_info(
            Code::FailedPrecondition,
            "APPROVAL_ALREADY_DECIDED",
            &[
                ("approval_id", "apr_1"),
                ("state", "APPROVAL_STATE_DENIED"),
                ("decided_by", "alice"),
            ],
        ));
        assert!(matches!(
            &error,
            Error::ApprovalAlreadyDecided { approval_id, state: v1::ApprovalState::Denied, decided_by, .. }
                if approval_id == "apr_1" && decided_by == "alice"
        ));
        assert_eq!(error.code(), Some(Code::FailedPrecondition));
        assert!(!error.is_transient());

        let error = Error::from(with_info(
            Code::AlreadyExists,
            "APPROVAL_EXISTS",
            &[("tool_call_id", "call_1"), ("approval_id", "apr_2")],
        ));
        assert!(matches!(
            &error,
            Error::ApprovalExists { tool_call_id, approval_id, .. }
                if tool_call_id == "call_1" && approval_id == "apr_2"
        ));
        for (code, reason, key) in [
            (Code::NotFound, "APPROVAL_NOT_FOUND", "approval_id"),
            (Code::FailedPrecondition, "APPROVAL_EXPIRED", "approval_id"),
            (
                Code::FailedPrecondition,
                "UNKNOWN_TOOL_CALL",
                "tool_call_id",
            ),
            (
                Code::FailedPrecondition,
                "TOOL_CALL_ANSWERED",
                "tool_call_id",
            ),
        ] {
            let error = Error::from(with_info(code, reason, &[(key, "x_1")]));
            let named = match &error {
                Error::ApprovalNotFound { approval_id, .. }
                | Error::ApprovalExpired { approval_id, .. } => approval_id,
                Error::UnknownToolCall { tool_call_id, .. }
                | Error::ToolCallAnswered { tool_call_id, .. } => tool_call_id,
                other => panic!("{reason}: got {other:?}"),
            };
            assert_eq!(named, "x_1", "{reason}");
            assert_eq!(error.reason().as_deref(), Some(reason));
        }
        // A state this client does not know reads as unspecified.
        let error = Error::from(with_info(
            Code::FailedPrecondition,
            "APPROVAL_ALREADY_DECIDED",
            &[("approval_id", "apr_1"), ("state", "SOMETHING_NEW")],
        ));
        assert!(matches!(
            error,
            Error::ApprovalAlreadyDecided {
                state: v1::ApprovalState::Unspecified,
                ..
            }
        ));
    }

    #[test]
    fn queue_reasons_carry_their_metadata() {
        let error = Error::from(with_info(
            Code::FailedPrecondition,
            "LEASE_NOT_HELD",
            &[("run_id", "run_1")],
        ));
        assert!(matches!(&error, Error::LeaseNotHeld { run_id, .. } if run_id == "run_1"));
        assert_eq!(error.code(), Some(Code::FailedPrecondition));
        assert!(!error.is_transient());

        let error = Error::from(with_info(Code::NotFound, "QUEUE_EMPTY", &[]));
        assert!(matches!(error, Error::QueueEmpty { .. }));
        assert_eq!(error.code(), Some(Code::NotFound));
        assert_eq!(error.reason().as_deref(), Some("QUEUE_EMPTY"));

        let error = Error::from(with_info(
            Code::ResourceExhausted,
            "QUEUE_FULL",
            &[("limit", "100")],
        ));
        assert!(matches!(error, Error::QueueFull { limit: 100, .. }));
        assert_eq!(error.code(), Some(Code::ResourceExhausted));
        assert!(!error.is_transient(), "a full queue is no rate limit");
        assert_eq!(error.retry_after(), None);
        // A malformed payload falls back instead of guessing.
        let error = Error::from(with_info(Code::ResourceExhausted, "QUEUE_FULL", &[]));
        assert!(matches!(error, Error::Other(_)));

        for (code, reason) in [
            (Code::NotFound, "INPUT_NOT_FOUND"),
            (Code::FailedPrecondition, "INPUT_ALREADY_TAKEN"),
        ] {
            let error = Error::from(with_info(code, reason, &[("input_id", "inp_1")]));
            let named = match (reason, &error) {
                ("INPUT_NOT_FOUND", Error::InputNotFound { input_id, .. })
                | ("INPUT_ALREADY_TAKEN", Error::InputAlreadyTaken { input_id, .. }) => input_id,
                (_, other) => panic!("{reason}: got {other:?}"),
            };
            assert_eq!(named, "inp_1", "{reason}");
            assert_eq!(error.code(), Some(code));
            assert_eq!(error.reason().as_deref(), Some(reason));
            assert!(error.status().is_some());
        }
    }

    #[test]
    fn bad_request_names_the_field() {
        let mut details = ErrorDetails::with_error_info(
            "INVALID_ARGUMENT",
            "sessionstore",
            HashMap::from([("field".to_owned(), "messages[0].role".to_owned())]),
        );
        details.add_bad_request_violation("messages[0].role", "must be set");
        let status = Status::with_error_details(Code::InvalidArgument, "bad", details);
        match Error::from(status) {
            Error::InvalidArgument {
                field, description, ..
            } => {
                assert_eq!(field, "messages[0].role");
                assert_eq!(description, "must be set");
            }
            other => panic!("expected InvalidArgument, got {other:?}"),
        }
    }

    #[test]
    fn rate_limits_carry_retry_info() {
        let mut details =
            ErrorDetails::with_error_info("RATE_LIMITED", "sessionstore", HashMap::new());
        details.set_retry_info(Some(Duration::from_millis(250)));
        let status = Status::with_error_details(Code::ResourceExhausted, "slow down", details);
        let error = Error::from(status);
        assert_eq!(error.retry_after(), Some(Duration::from_millis(250)));
        assert!(error.is_transient());
    }

    #[test]
    fn an_unavailable_database_is_transient_with_the_servers_delay() {
        let mut details =
            ErrorDetails::with_error_info("STORAGE_UNAVAILABLE", "sessionstore", HashMap::new());
        details.set_retry_info(Some(Duration::from_secs(1)));
        let status = Status::with_error_details(Code::Unavailable, "database down", details);
        let error = Error::from(status);
        assert!(matches!(
            error,
            Error::Unavailable {
                shutting_down: false,
                ..
            }
        ));
        assert!(error.is_transient());
        assert_eq!(error.retry_after(), Some(Duration::from_secs(1)));
    }

    #[test]
    fn plain_statuses_fall_back_on_the_code() {
        assert!(matches!(
            Error::from(Status::unavailable("down")),
            Error::Unavailable {
                shutting_down: false,
                ..
            }
        ));
        assert!(matches!(
            Error::from(Status::unauthenticated("who")),
            Error::Unauthenticated { .. }
        ));
        // A server's INTERNAL without a source is not a transport failure.
        let error = Error::from(Status::internal("boom"));
        assert!(matches!(error, Error::Other(_)));
        assert!(!error.is_transient());
        // A malformed reason payload falls back instead of guessing.
        let error = Error::from(with_info(Code::Aborted, "SEQUENCE_MISMATCH", &[]));
        assert!(matches!(error, Error::Other(_)));
    }

    #[test]
    fn local_transport_failures_are_unavailable() {
        let io = std::io::Error::other("reset");
        let status = Status::from_error(Box::new(io));
        assert_eq!(status.code(), Code::Unknown);
        assert!(Error::from(status).is_transient());
    }
}
