"""How often, and how patiently, the client tries again after a transient failure."""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass

from ._errors import SessionstoreError

logger = logging.getLogger("sessionstore")


@dataclass(frozen=True)
class RetryPolicy:
    """Capped exponential backoff with jitter, and a bound on attempts.

    Retry number ``n`` waits about ``initial_backoff * 2**(n-1)`` seconds,
    never more than ``max_backoff``, randomised between half and all of that.
    A ``RetryInfo`` delay from the server replaces the backoff for that retry.

    Attributes:
        max_attempts: Attempts in all, the first included (at least 1). For a
            watch: failed reconnections in a row, without an event between
            them, before the watch gives up.
        initial_backoff: Seconds before the first retry.
        max_backoff: The longest wait between two attempts, in seconds.
    """

    max_attempts: int = 5
    initial_backoff: float = 0.1
    max_backoff: float = 5.0

    @classmethod
    def never(cls) -> RetryPolicy:
        """One attempt, no retries."""
        return cls(max_attempts=1)

    def backoff(self, retry: int) -> float:
        """The wait before retry number ``retry`` (1 for the first), with jitter."""
        doublings = min(max(retry - 1, 0), 30)
        full = min(self.initial_backoff * float(1 << doublings), self.max_backoff)
        return full / 2 + random.random() * full / 2

    def delay_after(self, error: SessionstoreError, retry: int) -> float:
        """The server's ``RetryInfo`` delay if it gave one, else the backoff."""
        if error.retry_delay is not None:
            return error.retry_delay
        return self.backoff(retry)

    def should_retry(self, error: SessionstoreError, attempt: int) -> bool:
        """Whether to try again after ``error`` ended attempt number ``attempt``."""
        return error.transient and attempt < max(self.max_attempts, 1)


def log_retry(what: str, error: SessionstoreError, attempt: int, delay: float) -> None:
    """Says (at DEBUG, on the ``sessionstore`` logger) that a call is retried."""
    logger.debug(
        "retrying %s after attempt %d failed (%s); waiting %.3fs", what, attempt, error, delay
    )
