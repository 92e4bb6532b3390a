"""What a resuming watch delivers: the bookkeeping shared by the blocking
and the asyncio event iterators (mirrors the Rust client's ``SessionEvents``)."""

from __future__ import annotations

import grpc

from ._errors import SessionstoreError, Unavailable
from ._proto.sessionstore.v1 import messages_pb2 as m
from ._proto.sessionstore.v1 import sessionstore_pb2 as s


class WatchState:
    """Which events have been delivered, so a reconnected stream delivers
    each revision once, in order, and ``caught_up`` once."""

    def __init__(self, after_revision: int) -> None:
        self.last_revision = after_revision
        self.caught_up_sent = False
        self.deltas: dict[str, int] = {}
        self.done = False
        self.failures = 0
        self.reconnects = 0
        self.opened = False

    def admit(self, event: m.SessionEvent) -> bool:
        """Whether to deliver ``event``; records it if so."""
        kind = event.WhichOneof("event")
        if kind == "caught_up":
            if self.caught_up_sent:
                return False
            self.caught_up_sent = True
        elif kind == "progress":
            pass
        elif kind == "delta":
            if event.revision < self.last_revision:
                return False
            sent = self.deltas.get(event.delta.run_id, -1)
            if event.delta.index <= sent:
                return False
            self.deltas[event.delta.run_id] = event.delta.index
        elif kind == "run_discarded":
            if event.revision < self.last_revision:
                return False
            self.deltas.pop(event.run_discarded.run_id, None)
        else:
            # A revision (including kinds newer than this client).
            if event.revision <= self.last_revision:
                return False
            self.last_revision = event.revision
            if kind == "exchange_appended":
                self.deltas.pop(event.exchange_appended.run_id, None)
            elif kind == "run_ended":
                self.deltas.pop(event.run_ended.run_id, None)
            elif kind == "session_deleted":
                self.done = True
        return True

    def request(self, session_id: str, include_active_deltas: bool) -> s.WatchSessionRequest:
        """The WatchSession request resuming after the last delivered revision."""
        return s.WatchSessionRequest(
            session_id=session_id,
            after_revision=self.last_revision,
            include_active_deltas=include_active_deltas,
            # Resume each open run after the last delta delivered.
            delta_cursors=[
                s.DeltaCursor(run_id=run_id, after_index=index)
                for run_id, index in self.deltas.items()
            ],
        )


def resumable(error: SessionstoreError) -> bool:
    """Whether a watch reconnects after ``error``: transient failures, a slow
    start and internal server errors — all bounded by the retry policy."""
    return error.transient or error.code in (
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNKNOWN,
    )


def ended_early() -> Unavailable:
    """The error standing for a stream that ended without ``session_deleted``
    (a server shutting down gracefully)."""
    return Unavailable(
        "the watch stream ended without session_deleted",
        code=grpc.StatusCode.UNAVAILABLE,
        reason="SHUTTING_DOWN",
    )
