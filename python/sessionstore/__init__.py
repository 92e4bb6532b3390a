"""Python client for sessionstore, the gRPC service that stores LLM chat sessions.

``Client`` is the blocking client; ``AsyncClient`` the ``asyncio`` one
(``grpc.aio``). Both return the generated protobuf messages, found in
``sessionstore.v1``; errors are ``SessionstoreError`` subclasses.
``from_openai_usage`` and ``from_anthropic_usage`` (``sessionstore.usage``)
turn a provider's usage object into a ``v1.ProviderCall``.
"""

__version__ = "0.1.0"

from . import _errors, usage, v1  # noqa: E402
from ._errors import (  # noqa: E402
    Aborted,
    AlreadyExists,
    ApprovalAlreadyDecided,
    ApprovalExists,
    ApprovalExpired,
    ApprovalNotFound,
    Cancelled,
    DeadlineExceeded,
    FailedPrecondition,
    HistoryMismatch,
    InputAlreadyTaken,
    InputNotFound,
    Internal,
    InvalidArgument,
    LeaseNotHeld,
    LimitExceeded,
    MessageNotFound,
    NotFound,
    OutOfRange,
    PermissionDenied,
    QueueEmpty,
    QueueFull,
    RateLimited,
    RequestIdReused,
    ResourceExhausted,
    RevisionOutOfRange,
    SequenceMismatch,
    SessionBusy,
    SessionNotFound,
    SessionstoreError,
    StateNotFound,
    StateVersionMismatch,
    ToolCallAnswered,
    Unauthenticated,
    Unavailable,
    UnknownToolCall,
)
from ._retry import RetryPolicy  # noqa: E402
from .aio import AsyncClient, AsyncSessionEvents  # noqa: E402
from .client import Client, SessionEvents  # noqa: E402
from .usage import from_anthropic_usage, from_openai_usage  # noqa: E402

__all__ = [
    "__version__",
    "v1",
    "Client",
    "AsyncClient",
    "SessionEvents",
    "AsyncSessionEvents",
    "RetryPolicy",
    "usage",
    "from_openai_usage",
    "from_anthropic_usage",
]
# Every error class, as the errors module lists them.
__all__ += _errors.__all__
