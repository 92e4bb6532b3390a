//! The domain's error vocabulary. The gRPC layer maps each variant to one
//! status code (see `grpc::status`); storage maps database errors into it.

/// Everything a sessionstore operation can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A request field is missing, malformed or out of range.
    #[error("{field}: {description}")]
    InvalidArgument { field: String, description: String },

    /// The session does not exist for this tenant.
    #[error("session {0:?} not found")]
    SessionNotFound(String),

    /// A caller-chosen session id is taken.
    #[error("session {0:?} already exists")]
    SessionExists(String),

    /// `expected_next_sequence` did not match.
    #[error("expected_next_sequence is {expected}, but the session's next sequence is {actual}")]
    SequenceMismatch { expected: i64, actual: i64 },

    /// `full_history` does not begin with the stored history.
    #[error("full_history[{index}] {reason}")]
    HistoryMismatch { index: usize, reason: String },

    /// An idempotency key was reused with a different request body.
    #[error("request_id {0:?} was already used with a different request")]
    IdempotencyConflict(String),

    /// `after_revision` lies beyond the session's head.
    #[error("after_revision {requested} is beyond the session's head revision {head}")]
    RevisionOutOfRange { requested: i64, head: i64 },

    /// Another run holds the session's lease.
    #[error("session is busy with run {active_run_id:?} until its lease ends")]
    SessionBusy {
        active_run_id: String,
        expire_time: super::Timestamp,
    },

    /// CancelRun named a run that is not active and was never cancelled.
    #[error("run {0:?} is not active: it holds no lease and is publishing no deltas")]
    RunNotActive(String),

    /// No message with this id in the session.
    #[error("message {0:?} not found in the session")]
    MessageNotFound(String),

    /// No state entry with this key in the session.
    #[error("state key {0:?} not found in the session")]
    StateNotFound(String),

    /// `expected_version` did not match the state entry.
    #[error(
        "expected_version is {expected}, but state key {key:?} is at version {actual} (0: absent)"
    )]
    StateVersionMismatch {
        key: String,
        expected: i64,
        actual: i64,
    },

    /// A tool call named for approval is made by no message of the history.
    #[error("tool call {0:?} is made by no message of the session's history")]
    UnknownToolCall(String),

    /// A tool call named for approval already has its result.
    #[error("tool call {0:?} already has its result")]
    ToolCallAnswered(String),

    /// The tool call already has a pending or approved approval.
    #[error("tool call {tool_call_id:?} already has approval {approval_id:?}")]
    ApprovalExists {
        tool_call_id: String,
        approval_id: String,
    },

    /// No approval with this id in the session.
    #[error("approval {0:?} not found in the session")]
    ApprovalNotFound(String),

    /// The approval was decided before (by another call, or this key with
    /// another body).
    #[error("approval {approval_id:?} was already decided: {state}")]
    ApprovalAlreadyDecided {
        approval_id: String,
        state: &'static str,
        decided_by: String,
    },

    /// The approval expired before it was decided.
    #[error("approval {0:?} expired before it was decided")]
    ApprovalExpired(String),

    /// Only the run holding the session's lease may take its queued input.
    #[error("run {0:?} does not hold the session's lease")]
    LeaseNotHeld(String),

    /// No input is waiting in the session's queue.
    #[error("no input is waiting in the session's queue")]
    QueueEmpty,

    /// The session's queue holds the most waiting inputs allowed.
    #[error("the session's queue holds {0} waiting inputs, the most it may")]
    QueueFull(i64),

    /// No queued input with this id in the session.
    #[error("input {0:?} not found in the session")]
    InputNotFound(String),

    /// The input was taken into the history already.
    #[error("input {0:?} was already taken")]
    InputAlreadyTaken(String),

    /// A request is over a limit; `limit` names it (as its flag, in snake case).
    #[error("{field}: {description}")]
    LimitExceeded {
        field: String,
        limit: &'static str,
        description: String,
    },

    /// The tenant is over its request rate.
    #[error("over the tenant's request rate of {per_second}/s (--max-requests-per-second); retry in {} ms", retry_after.as_millis().max(1))]
    RateLimited {
        per_second: u64,
        retry_after: std::time::Duration,
    },

    /// Missing or wrong credentials.
    #[error("unauthenticated: {0}")]
    Unauthenticated(&'static str),

    /// The search index has not caught up with the writes before the
    /// search (or the erasure) in time: it is being built, or it stalled;
    /// retry later.
    #[error("the search index has not caught up with the writes yet; retry in a few seconds")]
    SearchIndexBehind,

    /// The server runs with `--search off`: no search index is kept.
    #[error("search is switched off on this server (--search off)")]
    SearchDisabled,

    /// The server is shutting down and takes no more writes.
    #[error("the server is shutting down")]
    ShuttingDown,

    /// The database cannot be reached right now (refused or broken
    /// connections, no connection within the acquire timeout, the database
    /// shutting down). Transient: the same call may succeed shortly. The
    /// source is logged, never sent to clients.
    #[error("the database is unavailable; retry shortly")]
    StorageUnavailable(#[source] Box<dyn std::error::Error + Send + Sync>),

    /// The database's disk is full: writes are refused until space is
    /// freed; reads keep working.
    #[error("the database's disk is full; writes resume once space is freed")]
    StorageFull(#[source] Box<dyn std::error::Error + Send + Sync>),

    /// The database failed. The source is logged, never sent to clients.
    #[error("storage error")]
    Storage(#[source] Box<dyn std::error::Error + Send + Sync>),
}

impl Error {
    /// An `InvalidArgument` naming `field`.
    pub fn invalid(field: impl Into<String>, description: impl Into<String>) -> Self {
        Error::InvalidArgument {
            field: field.into(),
            description: description.into(),
        }
    }

    /// Wraps a storage-layer error.
    pub fn storage(source: impl std::error::Error + Send + Sync + 'static) -> Self {
        Error::Storage(Box::new(source))
    }

    /// Wraps a storage-layer error that means the database cannot be reached.
    pub fn unavailable(source: impl std::error::Error + Send + Sync + 'static) -> Self {
        Error::StorageUnavailable(Box::new(source))
    }

    /// Wraps a storage-layer error that means the disk is full.
    pub fn full(source: impl std::error::Error + Send + Sync + 'static) -> Self {
        Error::StorageFull(Box::new(source))
    }

    /// Whether this is a storage fault (unreachable database, full disk, or
    /// any other database failure) rather than an answer about the request.
    pub fn is_storage_fault(&self) -> bool {
        matches!(
            self,
            Error::StorageUnavailable(_) | Error::StorageFull(_) | Error::Storage(_)
        )
    }
}

/// Shorthand for domain results.
pub type Result<T, E = Error> = std::result::Result<T, E>;
