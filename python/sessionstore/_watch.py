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
        # Per open run: the last delta index delivered.
        self.deltas: dict[str, int] = {}
        # Per open run: (last index of each delivered delta, UTF-8 bytes of
        # text delivered through it), to cut a merged delta to what is new.
        self.ends: dict[str, list[tuple[int, int]]] = {}
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
            if not self._admit_delta(event.delta):
                return False
        elif kind == "run_discarded":
            if event.revision < self.last_revision:
                return False
            self._forget(event.run_discarded.run_id)
        else:
            # A revision (including kinds newer than this client).
            if event.revision <= self.last_revision:
                return False
            self.last_revision = event.revision
            if kind == "exchange_appended":
                self._forget(event.exchange_appended.run_id)
            elif kind == "run_ended":
                self._forget(event.run_ended.run_id)
            elif kind == "session_deleted":
                self.done = True
        return True

    def _admit_delta(self, delta: m.Delta) -> bool:
        """Whether ``delta`` brings anything new. A merged text delta
        (``first_index < index``) reaching back before the last index
        delivered is cut to its new part, ``first_index`` moved past it."""
        last = self.deltas.get(delta.run_id, -1)
        if delta.index <= last:
            return False
        ends = self.ends.setdefault(delta.run_id, [])
        first = min(delta.first_index, delta.index)
        if first <= last and delta.WhichOneof("delta") == "text":
            start = next((end for index, end in reversed(ends) if index < first), 0)
            have = (ends[-1][1] if ends else 0) - start
            delta.text = delta.text.encode("utf-8")[have:].decode("utf-8")
            delta.first_index = last + 1
        added = len(delta.text.encode("utf-8")) if delta.WhichOneof("delta") == "text" else 0
        ends.append((delta.index, (ends[-1][1] if ends else 0) + added))
        self.deltas[delta.run_id] = delta.index
        return True

    def _forget(self, run_id: str) -> None:
        self.deltas.pop(run_id, None)
        self.ends.pop(run_id, None)

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
