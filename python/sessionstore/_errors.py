"""Typed errors built from the gRPC status code and the ``google.rpc``
details the server attaches (``ErrorInfo`` reason and metadata,
``BadRequest``, ``RetryInfo``) — never from the message text."""

from __future__ import annotations

from typing import Any

import grpc
from google.rpc import error_details_pb2, status_pb2

from ._proto.sessionstore.v1 import messages_pb2 as m

__all__ = [
    "SessionstoreError",
    "NotFound",
    "SessionNotFound",
    "MessageNotFound",
    "StateNotFound",
    "ApprovalNotFound",
    "QueueEmpty",
    "InputNotFound",
    "AlreadyExists",
    "RequestIdReused",
    "ApprovalExists",
    "InvalidArgument",
    "Aborted",
    "SequenceMismatch",
    "StateVersionMismatch",
    "FailedPrecondition",
    "SessionBusy",
    "HistoryMismatch",
    "UnknownToolCall",
    "ToolCallAnswered",
    "ApprovalAlreadyDecided",
    "ApprovalExpired",
    "LeaseNotHeld",
    "InputAlreadyTaken",
    "OutOfRange",
    "RevisionOutOfRange",
    "ResourceExhausted",
    "RateLimited",
    "LimitExceeded",
    "QueueFull",
    "Unavailable",
    "Unauthenticated",
    "PermissionDenied",
    "DeadlineExceeded",
    "Cancelled",
    "Internal",
]


class SessionstoreError(Exception):
    """A failed call.

    Attributes:
        code: The gRPC status code (``None`` for a failure made by the client).
        reason: The ``google.rpc.ErrorInfo`` reason, e.g. ``"SESSION_NOT_FOUND"``
            (``""`` if the server sent none).
        metadata: The ``ErrorInfo`` metadata (e.g. ``{"session_id": "ses_1"}``).
        message: The status message, for people (never parse it).
        field_violations: ``(field, description)`` pairs from ``google.rpc.BadRequest``.
        retry_delay: Seconds the server asked to wait before retrying
            (``google.rpc.RetryInfo``), or ``None``.
    """

    def __init__(
        self,
        message: str,
        *,
        code: grpc.StatusCode | None = None,
        reason: str = "",
        metadata: dict[str, str] | None = None,
        field_violations: list[tuple[str, str]] | None = None,
        retry_delay: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.reason = reason
        self.metadata: dict[str, str] = dict(metadata or {})
        self.field_violations: list[tuple[str, str]] = list(field_violations or [])
        self.retry_delay = retry_delay

    def __str__(self) -> str:
        code = self.code.name if self.code is not None else "CLIENT"
        reason = f" ({self.reason})" if self.reason else ""
        return f"{code}{reason}: {self.message}"

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(code={self.code!r}, reason={self.reason!r}, "
            f"message={self.message!r}, metadata={self.metadata!r})"
        )

    @property
    def transient(self) -> bool:
        """Whether the same call may succeed later: the server was
        unavailable (or the connection broke), or the tenant was rate
        limited. The client retries idempotent calls by itself."""
        return isinstance(self, (Unavailable, RateLimited))

    def _meta_int(self, key: str) -> int | None:
        try:
            return int(self.metadata[key])
        except (KeyError, ValueError):
            return None


class NotFound(SessionstoreError):
    """``NOT_FOUND``: a session (also one of another tenant), message, state
    entry, approval or queued input, or an empty queue."""

    @property
    def session_id(self) -> str:
        """The session id the server looked for, if it said."""
        return self.metadata.get("session_id", "")


class SessionNotFound(NotFound):
    """The session does not exist, or belongs to another tenant (reason ``SESSION_NOT_FOUND``)."""


class MessageNotFound(NotFound):
    """A message id named in the request does not exist (reason ``MESSAGE_NOT_FOUND``)."""

    @property
    def message_id(self) -> str:
        """The message id the server looked for."""
        return self.metadata.get("message_id", "")


class StateNotFound(NotFound):
    """A state key does not exist (reason ``STATE_NOT_FOUND``)."""

    @property
    def key(self) -> str:
        """The missing key."""
        return self.metadata.get("key", "")


class ApprovalNotFound(NotFound):
    """The session has no approval by this id (reason ``APPROVAL_NOT_FOUND``)."""

    @property
    def approval_id(self) -> str:
        """The approval id the server looked for."""
        return self.metadata.get("approval_id", "")


class QueueEmpty(NotFound):
    """No input waits in the session's queue (reason ``QUEUE_EMPTY``)."""


class InputNotFound(NotFound):
    """The session never queued an input by this id (reason ``INPUT_NOT_FOUND``)."""

    @property
    def input_id(self) -> str:
        """The input id the server looked for."""
        return self.metadata.get("input_id", "")


class AlreadyExists(SessionstoreError):
    """``ALREADY_EXISTS``: a caller-chosen session id is taken."""

    @property
    def session_id(self) -> str:
        """The taken session id, if the server said."""
        return self.metadata.get("session_id", "")


class RequestIdReused(AlreadyExists):
    """An append reused a ``request_id`` with a different body (reason ``REQUEST_ID_REUSED``)."""

    @property
    def request_id(self) -> str:
        """The reused idempotency key."""
        return self.metadata.get("request_id", "")


class ApprovalExists(AlreadyExists):
    """The tool call already has a pending or approved approval (reason
    ``APPROVAL_EXISTS``): wait for that one's decision instead."""

    @property
    def approval_id(self) -> str:
        """The call's pending or approved approval."""
        return self.metadata.get("approval_id", "")

    @property
    def tool_call_id(self) -> str:
        """The tool call named."""
        return self.metadata.get("tool_call_id", "")


class InvalidArgument(SessionstoreError):
    """``INVALID_ARGUMENT``: a field is empty, malformed or out of range."""

    @property
    def field(self) -> str:
        """The offending field as named in the request (e.g. ``messages[0].role``), or ``""``."""
        if self.field_violations:
            return self.field_violations[0][0]
        return self.metadata.get("field", "")

    @property
    def description(self) -> str:
        """What is wrong with the field."""
        if self.field_violations:
            return self.field_violations[0][1]
        return self.message


class Aborted(SessionstoreError):
    """``ABORTED``: a concurrency check failed; nothing was written."""


class SequenceMismatch(Aborted):
    """``expected_next_sequence`` did not match (reason ``SEQUENCE_MISMATCH``):
    another writer appended first. Re-read and retry from ``actual_next_sequence``."""

    @property
    def expected_next_sequence(self) -> int | None:
        """The ``expected_next_sequence`` the request carried."""
        return self._meta_int("expected_next_sequence")

    @property
    def actual_next_sequence(self) -> int | None:
        """The session's next sequence when the request was checked."""
        return self._meta_int("actual_next_sequence")


class StateVersionMismatch(Aborted):
    """A state write's ``expected_version`` did not match (reason ``STATE_VERSION_MISMATCH``)."""

    @property
    def key(self) -> str:
        """The entry's key."""
        return self.metadata.get("key", "")

    @property
    def expected_version(self) -> int | None:
        """The version the request expected."""
        return self._meta_int("expected_version")

    @property
    def actual_version(self) -> int | None:
        """The entry's actual version (0: it does not exist)."""
        return self._meta_int("actual_version")


class FailedPrecondition(SessionstoreError):
    """``FAILED_PRECONDITION``; ``reason`` says which (``SESSION_BUSY``, ``HISTORY_MISMATCH``, …)."""


class SessionBusy(FailedPrecondition):
    """Another run holds the session's lease (reason ``SESSION_BUSY``)."""

    @property
    def active_run_id(self) -> str:
        """The run holding the lease."""
        return self.metadata.get("active_run_id", "")


class HistoryMismatch(FailedPrecondition):
    """A ``full_history`` append does not begin with the stored history (reason ``HISTORY_MISMATCH``)."""

    @property
    def index(self) -> int | None:
        """The first differing index in ``full_history``."""
        return self._meta_int("index")


class UnknownToolCall(FailedPrecondition):
    """An approval was asked for a tool call that no message of the
    session's history makes (reason ``UNKNOWN_TOOL_CALL``)."""

    @property
    def tool_call_id(self) -> str:
        """The tool call named."""
        return self.metadata.get("tool_call_id", "")


class ToolCallAnswered(FailedPrecondition):
    """An approval was asked for a tool call that the history already
    answers (reason ``TOOL_CALL_ANSWERED``)."""

    @property
    def tool_call_id(self) -> str:
        """The tool call named."""
        return self.metadata.get("tool_call_id", "")


class ApprovalAlreadyDecided(FailedPrecondition):
    """The approval was decided before, by another call or by this request
    id with another decision, reason or decider (reason
    ``APPROVAL_ALREADY_DECIDED``). Nothing was written."""

    @property
    def approval_id(self) -> str:
        """The approval."""
        return self.metadata.get("approval_id", "")

    @property
    def state(self) -> int:
        """What it was decided as: ``v1.APPROVAL_STATE_APPROVED`` or
        ``v1.APPROVAL_STATE_DENIED`` (``v1.APPROVAL_STATE_UNSPECIFIED`` for
        a state this client does not know)."""
        name = self.metadata.get("state", "")
        try:
            return int(m.ApprovalState.Value(name))
        except ValueError:
            return int(m.APPROVAL_STATE_UNSPECIFIED)

    @property
    def decided_by(self) -> str:
        """Who decided it, as they said."""
        return self.metadata.get("decided_by", "")


class ApprovalExpired(FailedPrecondition):
    """The approval expired before anyone decided it (reason
    ``APPROVAL_EXPIRED``); the tool call may be asked about again."""

    @property
    def approval_id(self) -> str:
        """The approval."""
        return self.metadata.get("approval_id", "")


class LeaseNotHeld(FailedPrecondition):
    """The run does not hold the session's lease, and only the lease holder
    takes queued input (reason ``LEASE_NOT_HELD``)."""

    @property
    def run_id(self) -> str:
        """The run named."""
        return self.metadata.get("run_id", "")


class InputAlreadyTaken(FailedPrecondition):
    """The input was taken into the history already, so it cannot be
    withdrawn (reason ``INPUT_ALREADY_TAKEN``)."""

    @property
    def input_id(self) -> str:
        """The input."""
        return self.metadata.get("input_id", "")


class OutOfRange(SessionstoreError):
    """``OUT_OF_RANGE``."""


class RevisionOutOfRange(OutOfRange):
    """A watch asked for revisions after the session's head (reason ``REVISION_OUT_OF_RANGE``)."""

    @property
    def after_revision(self) -> int | None:
        """The requested ``after_revision``."""
        return self._meta_int("after_revision")

    @property
    def head_revision(self) -> int | None:
        """The session's current revision."""
        return self._meta_int("head_revision")


class ResourceExhausted(SessionstoreError):
    """``RESOURCE_EXHAUSTED``: a limit (``LIMIT_EXCEEDED``), a rate limit
    (``RATE_LIMITED``), a full queue (``QUEUE_FULL``) or a full disk
    (``STORAGE_FULL``)."""


class RateLimited(ResourceExhausted):
    """The tenant sends more requests per second than allowed (reason
    ``RATE_LIMITED``). Transient; ``retry_delay`` says how long to wait."""


class LimitExceeded(ResourceExhausted):
    """The request exceeds a configured limit (reason ``LIMIT_EXCEEDED``)."""

    @property
    def limit(self) -> str:
        """Which limit, e.g. ``max_messages_per_exchange``."""
        return self.metadata.get("limit", "")

    @property
    def field(self) -> str:
        """The field that exceeds it, if any."""
        if self.field_violations:
            return self.field_violations[0][0]
        return self.metadata.get("field", "")


class QueueFull(ResourceExhausted):
    """The session's queue holds the most waiting inputs it may (reason
    ``QUEUE_FULL``); nothing was queued. Not transient: wait until the run
    takes some, or withdraw some."""

    @property
    def limit(self) -> int | None:
        """How many waiting inputs a queue holds at most."""
        return self._meta_int("limit")


class Unavailable(SessionstoreError):
    """``UNAVAILABLE``: the server cannot be reached, is shutting down
    (reason ``SHUTTING_DOWN``), cannot reach its database
    (``STORAGE_UNAVAILABLE``), or the connection broke. Transient."""

    @property
    def shutting_down(self) -> bool:
        """The server said it is shutting down."""
        return self.reason == "SHUTTING_DOWN"


class Unauthenticated(SessionstoreError):
    """``UNAUTHENTICATED``: a missing or wrong bearer token."""


class PermissionDenied(SessionstoreError):
    """``PERMISSION_DENIED``."""


class DeadlineExceeded(SessionstoreError):
    """``DEADLINE_EXCEEDED``: the call took longer than its timeout."""


class Cancelled(SessionstoreError):
    """``CANCELLED``: the call was cancelled."""


class Internal(SessionstoreError):
    """``INTERNAL`` or ``UNKNOWN``: a server bug (logged there with its cause)."""


_BY_REASON: dict[str, type[SessionstoreError]] = {
    "SESSION_NOT_FOUND": SessionNotFound,
    "MESSAGE_NOT_FOUND": MessageNotFound,
    "STATE_NOT_FOUND": StateNotFound,
    "REQUEST_ID_REUSED": RequestIdReused,
    "SEQUENCE_MISMATCH": SequenceMismatch,
    "STATE_VERSION_MISMATCH": StateVersionMismatch,
    "SESSION_BUSY": SessionBusy,
    "HISTORY_MISMATCH": HistoryMismatch,
    "UNKNOWN_TOOL_CALL": UnknownToolCall,
    "TOOL_CALL_ANSWERED": ToolCallAnswered,
    "APPROVAL_EXISTS": ApprovalExists,
    "APPROVAL_NOT_FOUND": ApprovalNotFound,
    "APPROVAL_ALREADY_DECIDED": ApprovalAlreadyDecided,
    "APPROVAL_EXPIRED": ApprovalExpired,
    "LEASE_NOT_HELD": LeaseNotHeld,
    "QUEUE_EMPTY": QueueEmpty,
    "QUEUE_FULL": QueueFull,
    "INPUT_NOT_FOUND": InputNotFound,
    "INPUT_ALREADY_TAKEN": InputAlreadyTaken,
    "REVISION_OUT_OF_RANGE": RevisionOutOfRange,
    "RATE_LIMITED": RateLimited,
    "LIMIT_EXCEEDED": LimitExceeded,
}

_BY_CODE: dict[grpc.StatusCode, type[SessionstoreError]] = {
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExists,
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.ABORTED: Aborted,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.OUT_OF_RANGE: OutOfRange,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
    grpc.StatusCode.CANCELLED: Cancelled,
    grpc.StatusCode.INTERNAL: Internal,
    grpc.StatusCode.UNKNOWN: Internal,
}


def _status_details(error: Any) -> status_pb2.Status | None:
    try:
        trailing = error.trailing_metadata() or ()
    except Exception:  # not every RpcError is a Call
        return None
    for item in trailing:
        key, value = item[0], item[1]
        if key == "grpc-status-details-bin" and isinstance(value, bytes):
            try:
                return status_pb2.Status.FromString(value)
            except Exception:
                return None
    return None


def from_rpc_error(error: grpc.RpcError) -> SessionstoreError:
    """The typed error for a ``grpc.RpcError`` (sync or ``grpc.aio``).

    The ``ErrorInfo`` reason picks the class where it names one (a reason
    whose class would lack its metadata falls back on the code's class);
    else the status code does.
    """
    code_of = getattr(error, "code", None)
    code: grpc.StatusCode | None = code_of() if callable(code_of) else None
    details_of = getattr(error, "details", None)
    message = (details_of() if callable(details_of) else None) or str(error)
    reason = ""
    metadata: dict[str, str] = {}
    violations: list[tuple[str, str]] = []
    retry_delay: float | None = None
    status = _status_details(error)
    if status is not None:
        for detail in status.details:
            if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                info = error_details_pb2.ErrorInfo()
                detail.Unpack(info)
                reason = info.reason
                metadata = dict(info.metadata)
            elif detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
                bad = error_details_pb2.BadRequest()
                detail.Unpack(bad)
                violations.extend((v.field, v.description) for v in bad.field_violations)
            elif detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
                retry = error_details_pb2.RetryInfo()
                detail.Unpack(retry)
                retry_delay = retry.retry_delay.seconds + retry.retry_delay.nanos / 1e9
    cls = _BY_CODE.get(code, SessionstoreError) if code is not None else SessionstoreError
    by_reason = _BY_REASON.get(reason)
    if by_reason is not None:
        required = {
            SequenceMismatch: ("expected_next_sequence", "actual_next_sequence"),
            StateVersionMismatch: ("expected_version", "actual_version"),
            RevisionOutOfRange: ("after_revision", "head_revision"),
            HistoryMismatch: ("index",),
            QueueFull: ("limit",),
        }.get(by_reason, ())
        if all(key in metadata for key in required):
            cls = by_reason
    return cls(
        message,
        code=code,
        reason=reason,
        metadata=metadata,
        field_violations=violations,
        retry_delay=retry_delay,
    )
