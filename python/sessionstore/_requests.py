"""Request builders shared by ``Client`` and ``AsyncClient``: keyword
arguments in, generated request messages out."""

from __future__ import annotations

import datetime
import json
import uuid
from collections.abc import Iterable, Mapping
from typing import Any, Union

from google.protobuf import duration_pb2, field_mask_pb2, timestamp_pb2

from ._proto.sessionstore.v1 import messages_pb2 as m
from ._proto.sessionstore.v1 import sessionstore_pb2 as s

#: A message as the generated class, or a dict of its fields
#: (``{"role": "ROLE_USER", "content": "Hi"}``), as protobuf constructors take.
MessageLike = Union[m.Message, Mapping[str, Any]]
#: A provider call as the generated class or a dict of its fields.
ProviderCallLike = Union[m.ProviderCall, Mapping[str, Any]]
#: A state change as the generated class or a dict of its fields.
StateChangeLike = Union[m.StateChange, Mapping[str, Any]]
#: A content block as the generated class or a dict of its fields.
ContentBlockLike = Union[m.ContentBlock, Mapping[str, Any]]
#: A transcript format: the enum value, or ``"markdown"`` / ``"openai_json"``.
TranscriptFormatLike = Union[int, str]
#: A lease length or a call's wall time: seconds, or a ``timedelta``.
LeaseLike = Union[float, datetime.timedelta]
#: What SummarizeUsage groups by: the enum value, or ``"session"``,
#: ``"user"``, ``"model"``, ``"day"`` (or the enum's full names); ``None``
#: or ``""`` for the total.
UsageGroupByLike = Union[int, str, None]
#: Which reasoning an export for a model keeps: the enum value, or
#: ``"same_model"``, ``"same_provider"``, ``"none"``.
ReasoningPolicyLike = Union[int, str]
#: A point in time: a ``datetime`` (naive ones are taken as UTC) or a
#: ``Timestamp``.
TimeLike = Union[datetime.datetime, timestamp_pb2.Timestamp]
#: The session an ``append_exchange`` creates if it does not exist: ``True``
#: (no fields), a dict of ``CreateSessionRequest``'s fields (``title``,
#: ``system_prompt``, ``user``, ``metadata``, ``initial_state``,
#: ``expire_time`` as a ``datetime`` or ``Timestamp``), or the request itself.
NewSessionLike = Union[bool, s.CreateSessionRequest, Mapping[str, Any]]
#: A decision on an approval: the enum value, or ``"approve"`` / ``"deny"``
#: (or the enum's full names).
ApprovalDecisionLike = Union[int, str]
#: An approval state to filter by: the enum value, or ``"pending"``,
#: ``"approved"``, ``"denied"``, ``"expired"`` (or the enum's full names);
#: ``None`` or ``""`` for any.
ApprovalStateLike = Union[int, str, None]
#: An approval's details: JSON text, kept verbatim, or a dict (encoded with
#: ``json.dumps``).
DetailLike = Union[str, Mapping[str, Any]]
#: What ``submit_input`` does while the session is busy: the enum value, or
#: ``"queue"``, ``"interrupt"``, ``"reject"`` (or the enum's full names).
InputModeLike = Union[int, str]


def new_request_id() -> str:
    """A fresh idempotency key (a random UUID)."""
    return str(uuid.uuid4())


def create_session(
    session_id: str,
    title: str,
    system_prompt: str,
    user: str,
    metadata: Mapping[str, str] | None,
    initial_history: Iterable[MessageLike],
    initial_state: Mapping[str, str] | None,
    state_changes: Iterable[StateChangeLike] = (),
    state_scopes: Iterable[str] = (),
    request_id: str = "",
) -> s.CreateSessionRequest:
    return s.CreateSessionRequest(
        session_id=session_id,
        title=title,
        system_prompt=system_prompt,
        user=user,
        metadata=dict(metadata or {}),
        initial_history=list(initial_history),
        initial_state=dict(initial_state or {}),
        state_changes=list(state_changes),
        state_scopes=list(state_scopes),
        request_id=request_id,
    )


def get_session(session_id: str, state_scopes: Iterable[str]) -> s.GetSessionRequest:
    return s.GetSessionRequest(session_id=session_id, state_scopes=list(state_scopes))


def update_session(
    session_id: str,
    title: str | None,
    system_prompt: str | None,
    metadata: Mapping[str, str] | None,
    summary_message_id: str | None,
) -> s.UpdateSessionRequest:
    session = m.Session(id=session_id)
    paths = []
    if title is not None:
        session.title = title
        paths.append("title")
    if system_prompt is not None:
        session.system_prompt = system_prompt
        paths.append("system_prompt")
    if metadata is not None:
        session.metadata.update(metadata)
        paths.append("metadata")
    if summary_message_id is not None:
        session.summary_message_id = summary_message_id
        paths.append("summary_message_id")
    if not paths:
        raise ValueError("update_session needs at least one field to update")
    return s.UpdateSessionRequest(
        session=session, update_mask=field_mask_pb2.FieldMask(paths=paths)
    )


def append_exchange(
    session_id: str,
    messages: Iterable[MessageLike],
    full_history: Iterable[MessageLike] | None,
    provider_call: ProviderCallLike | None,
    response_messages: Iterable[MessageLike],
    expected_next_sequence: int | None,
    request_id: str | None,
    run_id: str,
    state_changes: Iterable[StateChangeLike],
    create_if_missing: NewSessionLike | None = None,
) -> s.AppendExchangeRequest:
    request = s.AppendExchangeRequest(
        session_id=session_id,
        messages=list(messages),
        full_history=list(full_history) if full_history is not None else [],
        response_messages=list(response_messages),
        request_id=request_id if request_id is not None else new_request_id(),
        run_id=run_id,
        state_changes=list(state_changes),
    )
    if full_history is not None and request.messages:
        raise ValueError("give messages or full_history, not both")
    if provider_call is not None:
        if isinstance(provider_call, m.ProviderCall):
            request.provider_call.CopyFrom(provider_call)
        else:
            request.provider_call.CopyFrom(m.ProviderCall(**provider_call))
    if expected_next_sequence is not None:
        request.expected_next_sequence = expected_next_sequence
    new_session = _new_session(create_if_missing)
    if new_session is not None:
        request.create_if_missing.CopyFrom(new_session)
    return request


def _new_session(value: NewSessionLike | None) -> s.CreateSessionRequest | None:
    """``create_if_missing`` as the request it stands for (``None``: none)."""
    if value is None or value is False:
        return None
    if value is True:
        return s.CreateSessionRequest()
    if isinstance(value, s.CreateSessionRequest):
        return value
    if not isinstance(value, Mapping):
        raise TypeError(
            "create_if_missing takes True, a dict of CreateSessionRequest fields or a "
            f"CreateSessionRequest, not {type(value).__name__}"
        )
    fields = dict(value)
    expire_time = fields.pop("expire_time", None)
    request = s.CreateSessionRequest(**fields)
    if expire_time is not None:
        _set_time(request.expire_time, expire_time)
    return request


def export_history(
    session_id: str,
    include_system_prompt: bool,
    from_summary: bool,
    after_sequence: int | None,
    max_messages: int,
    target: m.ExportTarget | None = None,
) -> s.ExportHistoryRequest:
    request = s.ExportHistoryRequest(
        session_id=session_id,
        include_system_prompt=include_system_prompt,
        from_summary=from_summary,
        max_messages=max_messages,
    )
    if after_sequence is not None:
        request.after_sequence = after_sequence
    if target is not None:
        request.target.CopyFrom(target)
    return request


def reasoning_policy(value: ReasoningPolicyLike) -> m.ReasoningPolicy:
    """``"same_model"``, ``"same_provider"``, ``"none"`` (or the enum's full
    names) or the enum value."""
    if isinstance(value, int):
        return value  # type: ignore[return-value]
    name = value.upper()
    if not name.startswith("REASONING_POLICY_"):
        name = "REASONING_POLICY_" + name
    return m.ReasoningPolicy.Value(name)  # type: ignore[no-any-return]


def export_target(provider: str, model: str, reasoning: ReasoningPolicyLike) -> m.ExportTarget:
    return m.ExportTarget(provider=provider, model=model, reasoning=reasoning_policy(reasoning))


def export_transcript(
    session_id: str,
    format: TranscriptFormatLike,
    provider: str,
    model: str,
    reasoning: ReasoningPolicyLike,
) -> s.ExportTranscriptRequest:
    request = s.ExportTranscriptRequest(session_id=session_id, format=transcript_format(format))
    if provider:
        request.target.CopyFrom(export_target(provider, model, reasoning))
    return request


def list_messages(
    session_id: str,
    after_sequence: int | None,
    page_size: int,
    page_token: str,
    order_by: str = "",
    before_sequence: int | None = None,
) -> s.ListMessagesRequest:
    request = s.ListMessagesRequest(
        session_id=session_id, page_size=page_size, page_token=page_token, order_by=order_by
    )
    if after_sequence is not None:
        request.after_sequence = after_sequence
    if before_sequence is not None:
        request.before_sequence = before_sequence
    return request


def publish_delta(
    session_id: str, run_id: str, index: int, text: str | None, block: ContentBlockLike | None
) -> s.PublishDeltaRequest:
    if (text is None) == (block is None):
        raise ValueError("publish_delta takes exactly one of text and block")
    request = s.PublishDeltaRequest(session_id=session_id, run_id=run_id, index=index)
    if text is not None:
        request.text = text
    elif isinstance(block, m.ContentBlock):
        request.block.CopyFrom(block)
    elif block is not None:
        request.block.CopyFrom(m.ContentBlock(**block))
    return request


def duration(value: LeaseLike | duration_pb2.Duration) -> duration_pb2.Duration:
    """Seconds, a ``timedelta`` or a ``Duration`` as a ``Duration``."""
    if isinstance(value, duration_pb2.Duration):
        return value
    if isinstance(value, datetime.timedelta):
        seconds = value.total_seconds()
    else:
        seconds = float(value)
    result = duration_pb2.Duration()
    result.FromNanoseconds(int(round(seconds * 1e9)))
    return result


def begin_run(session_id: str, run_id: str, lease: LeaseLike) -> s.BeginRunRequest:
    return s.BeginRunRequest(session_id=session_id, run_id=run_id, lease=duration(lease))


def rollback_session(
    session_id: str,
    after_sequence: int | None,
    run_id: str,
    expected_next_sequence: int | None,
    return_removed: bool,
    remove_last: int = 0,
    request_id: str = "",
) -> s.RollbackSessionRequest:
    if remove_last:
        if after_sequence is not None:
            raise ValueError("rollback_session takes after_sequence or remove_last, not both")
    elif after_sequence is None:
        raise ValueError("rollback_session needs after_sequence (-1: all) or remove_last")
    request = s.RollbackSessionRequest(
        session_id=session_id,
        after_sequence=after_sequence or 0,
        run_id=run_id,
        return_removed=return_removed,
        remove_last=remove_last,
        request_id=request_id,
    )
    if expected_next_sequence is not None:
        request.expected_next_sequence = expected_next_sequence
    return request


def edit_message(
    session_id: str, message_id: str, message: MessageLike, reason: str, run_id: str
) -> s.EditMessageRequest:
    request = s.EditMessageRequest(
        session_id=session_id, message_id=message_id, reason=reason, run_id=run_id
    )
    if isinstance(message, m.Message):
        request.message.CopyFrom(message)
    else:
        request.message.CopyFrom(m.Message(**message))
    return request


def transcript_format(value: TranscriptFormatLike) -> m.TranscriptFormat:
    """``"markdown"``, ``"openai_json"`` (or the enum's full names) or the enum value."""
    if isinstance(value, int):
        return value  # type: ignore[return-value]
    name = value.upper()
    if not name.startswith("TRANSCRIPT_FORMAT_"):
        name = "TRANSCRIPT_FORMAT_" + name
    return m.TranscriptFormat.Value(name)  # type: ignore[no-any-return]


def usage_group_by(value: UsageGroupByLike) -> s.UsageGroupBy:
    """``"session"``, ``"user"``, ``"model"``, ``"day"`` (or the enum's full
    names), ``None``/``""``/``"total"`` for none, or the enum value."""
    if value is None:
        return s.USAGE_GROUP_BY_UNSPECIFIED
    if isinstance(value, int):
        return value  # type: ignore[return-value]
    name = value.upper()
    if name in ("", "TOTAL"):
        return s.USAGE_GROUP_BY_UNSPECIFIED
    if not name.startswith("USAGE_GROUP_BY_"):
        name = "USAGE_GROUP_BY_" + name
    return s.UsageGroupBy.Value(name)  # type: ignore[no-any-return]


def summarize_usage(
    group_by: UsageGroupByLike,
    user: str,
    session_id: str,
    start_time: TimeLike | None,
    end_time: TimeLike | None,
    page_size: int,
    page_token: str,
) -> s.SummarizeUsageRequest:
    request = s.SummarizeUsageRequest(
        group_by=usage_group_by(group_by),
        user=user,
        session_id=session_id,
        page_size=page_size,
        page_token=page_token,
    )
    if start_time is not None:
        _set_time(request.start_time, start_time)
    if end_time is not None:
        _set_time(request.end_time, end_time)
    return request


def _set_time(field: timestamp_pb2.Timestamp, value: TimeLike) -> None:
    if isinstance(value, timestamp_pb2.Timestamp):
        field.CopyFrom(value)
    else:
        field.FromDatetime(value)


def set_state(
    session_id: str, key: str, value: str, expected_version: int | None, scope: str
) -> s.SetStateRequest:
    request = s.SetStateRequest(session_id=session_id, key=key, value=value, scope=scope)
    if expected_version is not None:
        request.expected_version = expected_version
    return request


def delete_state(
    session_id: str, key: str, expected_version: int | None, scope: str
) -> s.DeleteStateRequest:
    request = s.DeleteStateRequest(session_id=session_id, key=key, scope=scope)
    if expected_version is not None:
        request.expected_version = expected_version
    return request


def approval_decision(value: ApprovalDecisionLike) -> m.ApprovalDecision:
    """``"approve"``, ``"deny"`` (or the enum's full names) or the enum value."""
    if isinstance(value, int):
        return value  # type: ignore[return-value]
    name = value.upper()
    if not name.startswith("APPROVAL_DECISION_"):
        name = "APPROVAL_DECISION_" + name
    return m.ApprovalDecision.Value(name)  # type: ignore[no-any-return]


def approval_state(value: ApprovalStateLike) -> m.ApprovalState:
    """``"pending"``, ``"approved"``, ``"denied"``, ``"expired"`` (or the
    enum's full names), ``None``/``""``/``"any"`` for any, or the enum value."""
    if value is None:
        return m.APPROVAL_STATE_UNSPECIFIED
    if isinstance(value, int):
        return value  # type: ignore[return-value]
    name = value.upper()
    if name in ("", "ANY"):
        return m.APPROVAL_STATE_UNSPECIFIED
    if not name.startswith("APPROVAL_STATE_"):
        name = "APPROVAL_STATE_" + name
    return m.ApprovalState.Value(name)  # type: ignore[no-any-return]


def request_approval(
    session_id: str,
    tool_call_id: str,
    title: str,
    detail_json: DetailLike,
    run_id: str,
    expire_time: TimeLike | None,
) -> s.RequestApprovalRequest:
    if not isinstance(detail_json, str):
        detail_json = json.dumps(detail_json)
    request = s.RequestApprovalRequest(
        session_id=session_id,
        tool_call_id=tool_call_id,
        title=title,
        detail_json=detail_json,
        run_id=run_id,
    )
    if expire_time is not None:
        _set_time(request.expire_time, expire_time)
    return request


def decide_approval(
    session_id: str,
    approval_id: str,
    decision: ApprovalDecisionLike,
    reason: str,
    decided_by: str,
    request_id: str | None,
) -> s.DecideApprovalRequest:
    return s.DecideApprovalRequest(
        session_id=session_id,
        approval_id=approval_id,
        decision=approval_decision(decision),
        reason=reason,
        decided_by=decided_by,
        request_id=request_id if request_id is not None else new_request_id(),
    )


def list_approvals(
    session_id: str, user: str, state: ApprovalStateLike, page_size: int, page_token: str
) -> s.ListApprovalsRequest:
    return s.ListApprovalsRequest(
        session_id=session_id,
        user=user,
        state=approval_state(state),
        page_size=page_size,
        page_token=page_token,
    )


def input_mode(value: InputModeLike) -> m.InputMode:
    """``"queue"``, ``"interrupt"``, ``"reject"`` (or the enum's full names)
    or the enum value."""
    if isinstance(value, int):
        return value  # type: ignore[return-value]
    name = value.upper()
    if not name.startswith("INPUT_MODE_"):
        name = "INPUT_MODE_" + name
    return m.InputMode.Value(name)  # type: ignore[no-any-return]


def submit_input(
    session_id: str,
    messages: Iterable[MessageLike],
    mode: InputModeLike,
    request_id: str | None,
) -> s.SubmitInputRequest:
    return s.SubmitInputRequest(
        session_id=session_id,
        messages=list(messages),
        mode=input_mode(mode),
        request_id=request_id if request_id is not None else new_request_id(),
    )
