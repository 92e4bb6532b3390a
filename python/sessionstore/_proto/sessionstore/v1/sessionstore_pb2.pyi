import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import field_mask_pb2 as _field_mask_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from . import messages_pb2 as _messages_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class UsageGroupBy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    USAGE_GROUP_BY_UNSPECIFIED: _ClassVar[UsageGroupBy]
    USAGE_GROUP_BY_SESSION: _ClassVar[UsageGroupBy]
    USAGE_GROUP_BY_USER: _ClassVar[UsageGroupBy]
    USAGE_GROUP_BY_MODEL: _ClassVar[UsageGroupBy]
    USAGE_GROUP_BY_DAY: _ClassVar[UsageGroupBy]
USAGE_GROUP_BY_UNSPECIFIED: UsageGroupBy
USAGE_GROUP_BY_SESSION: UsageGroupBy
USAGE_GROUP_BY_USER: UsageGroupBy
USAGE_GROUP_BY_MODEL: UsageGroupBy
USAGE_GROUP_BY_DAY: UsageGroupBy

class SubmitInputRequest(_message.Message):
    __slots__ = ("session_id", "messages", "mode", "request_id")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    messages: _containers.RepeatedCompositeFieldContainer[_messages_pb2.Message]
    mode: _messages_pb2.InputMode
    request_id: str
    def __init__(self, session_id: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[_messages_pb2.Message, _Mapping]]] = ..., mode: _Optional[_Union[_messages_pb2.InputMode, str]] = ..., request_id: _Optional[str] = ...) -> None: ...

class SubmitInputResponse(_message.Message):
    __slots__ = ("queued", "input", "messages", "revision")
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    INPUT_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    queued: bool
    input: _messages_pb2.QueuedInput
    messages: _containers.RepeatedCompositeFieldContainer[_messages_pb2.StoredMessage]
    revision: int
    def __init__(self, queued: _Optional[bool] = ..., input: _Optional[_Union[_messages_pb2.QueuedInput, _Mapping]] = ..., messages: _Optional[_Iterable[_Union[_messages_pb2.StoredMessage, _Mapping]]] = ..., revision: _Optional[int] = ...) -> None: ...

class TakeQueuedInputRequest(_message.Message):
    __slots__ = ("session_id", "run_id")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    run_id: str
    def __init__(self, session_id: _Optional[str] = ..., run_id: _Optional[str] = ...) -> None: ...

class TakeQueuedInputResponse(_message.Message):
    __slots__ = ("input", "messages", "revision", "next_sequence")
    INPUT_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    NEXT_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    input: _messages_pb2.QueuedInput
    messages: _containers.RepeatedCompositeFieldContainer[_messages_pb2.StoredMessage]
    revision: int
    next_sequence: int
    def __init__(self, input: _Optional[_Union[_messages_pb2.QueuedInput, _Mapping]] = ..., messages: _Optional[_Iterable[_Union[_messages_pb2.StoredMessage, _Mapping]]] = ..., revision: _Optional[int] = ..., next_sequence: _Optional[int] = ...) -> None: ...

class ListQueuedInputsRequest(_message.Message):
    __slots__ = ("session_id", "page_size", "page_token")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    page_size: int
    page_token: str
    def __init__(self, session_id: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListQueuedInputsResponse(_message.Message):
    __slots__ = ("inputs", "next_page_token")
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    inputs: _containers.RepeatedCompositeFieldContainer[_messages_pb2.QueuedInput]
    next_page_token: str
    def __init__(self, inputs: _Optional[_Iterable[_Union[_messages_pb2.QueuedInput, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class WithdrawQueuedInputRequest(_message.Message):
    __slots__ = ("session_id", "input_id")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    INPUT_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    input_id: str
    def __init__(self, session_id: _Optional[str] = ..., input_id: _Optional[str] = ...) -> None: ...

class WithdrawQueuedInputResponse(_message.Message):
    __slots__ = ("revision",)
    REVISION_FIELD_NUMBER: _ClassVar[int]
    revision: int
    def __init__(self, revision: _Optional[int] = ...) -> None: ...

class RequestApprovalRequest(_message.Message):
    __slots__ = ("session_id", "run_id", "tool_call_id", "title", "detail_json", "expire_time")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALL_ID_FIELD_NUMBER: _ClassVar[int]
    TITLE_FIELD_NUMBER: _ClassVar[int]
    DETAIL_JSON_FIELD_NUMBER: _ClassVar[int]
    EXPIRE_TIME_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    run_id: str
    tool_call_id: str
    title: str
    detail_json: str
    expire_time: _timestamp_pb2.Timestamp
    def __init__(self, session_id: _Optional[str] = ..., run_id: _Optional[str] = ..., tool_call_id: _Optional[str] = ..., title: _Optional[str] = ..., detail_json: _Optional[str] = ..., expire_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class RequestApprovalResponse(_message.Message):
    __slots__ = ("approval", "revision")
    APPROVAL_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    approval: _messages_pb2.Approval
    revision: int
    def __init__(self, approval: _Optional[_Union[_messages_pb2.Approval, _Mapping]] = ..., revision: _Optional[int] = ...) -> None: ...

class DecideApprovalRequest(_message.Message):
    __slots__ = ("session_id", "approval_id", "decision", "reason", "decided_by", "request_id")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    APPROVAL_ID_FIELD_NUMBER: _ClassVar[int]
    DECISION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DECIDED_BY_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    approval_id: str
    decision: _messages_pb2.ApprovalDecision
    reason: str
    decided_by: str
    request_id: str
    def __init__(self, session_id: _Optional[str] = ..., approval_id: _Optional[str] = ..., decision: _Optional[_Union[_messages_pb2.ApprovalDecision, str]] = ..., reason: _Optional[str] = ..., decided_by: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class DecideApprovalResponse(_message.Message):
    __slots__ = ("approval", "revision", "tool_result")
    APPROVAL_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    TOOL_RESULT_FIELD_NUMBER: _ClassVar[int]
    approval: _messages_pb2.Approval
    revision: int
    tool_result: _messages_pb2.StoredMessage
    def __init__(self, approval: _Optional[_Union[_messages_pb2.Approval, _Mapping]] = ..., revision: _Optional[int] = ..., tool_result: _Optional[_Union[_messages_pb2.StoredMessage, _Mapping]] = ...) -> None: ...

class GetApprovalRequest(_message.Message):
    __slots__ = ("session_id", "approval_id")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    APPROVAL_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    approval_id: str
    def __init__(self, session_id: _Optional[str] = ..., approval_id: _Optional[str] = ...) -> None: ...

class ListApprovalsRequest(_message.Message):
    __slots__ = ("session_id", "user", "state", "page_size", "page_token")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    user: str
    state: _messages_pb2.ApprovalState
    page_size: int
    page_token: str
    def __init__(self, session_id: _Optional[str] = ..., user: _Optional[str] = ..., state: _Optional[_Union[_messages_pb2.ApprovalState, str]] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListApprovalsResponse(_message.Message):
    __slots__ = ("approvals", "next_page_token")
    APPROVALS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    approvals: _containers.RepeatedCompositeFieldContainer[_messages_pb2.Approval]
    next_page_token: str
    def __init__(self, approvals: _Optional[_Iterable[_Union[_messages_pb2.Approval, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class CreateSessionRequest(_message.Message):
    __slots__ = ("session_id", "title", "system_prompt", "user", "metadata", "initial_history", "initial_state", "expire_time", "request_id", "state_changes", "state_scopes")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class InitialStateEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TITLE_FIELD_NUMBER: _ClassVar[int]
    SYSTEM_PROMPT_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    INITIAL_HISTORY_FIELD_NUMBER: _ClassVar[int]
    INITIAL_STATE_FIELD_NUMBER: _ClassVar[int]
    EXPIRE_TIME_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_CHANGES_FIELD_NUMBER: _ClassVar[int]
    STATE_SCOPES_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    title: str
    system_prompt: str
    user: str
    metadata: _containers.ScalarMap[str, str]
    initial_history: _containers.RepeatedCompositeFieldContainer[_messages_pb2.Message]
    initial_state: _containers.ScalarMap[str, str]
    expire_time: _timestamp_pb2.Timestamp
    request_id: str
    state_changes: _containers.RepeatedCompositeFieldContainer[_messages_pb2.StateChange]
    state_scopes: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, session_id: _Optional[str] = ..., title: _Optional[str] = ..., system_prompt: _Optional[str] = ..., user: _Optional[str] = ..., metadata: _Optional[_Mapping[str, str]] = ..., initial_history: _Optional[_Iterable[_Union[_messages_pb2.Message, _Mapping]]] = ..., initial_state: _Optional[_Mapping[str, str]] = ..., expire_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., request_id: _Optional[str] = ..., state_changes: _Optional[_Iterable[_Union[_messages_pb2.StateChange, _Mapping]]] = ..., state_scopes: _Optional[_Iterable[str]] = ...) -> None: ...

class GetSessionRequest(_message.Message):
    __slots__ = ("session_id", "state_scopes")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_SCOPES_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    state_scopes: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, session_id: _Optional[str] = ..., state_scopes: _Optional[_Iterable[str]] = ...) -> None: ...

class ListSessionsRequest(_message.Message):
    __slots__ = ("page_size", "page_token", "user", "filter")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    user: str
    filter: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., user: _Optional[str] = ..., filter: _Optional[str] = ...) -> None: ...

class ListSessionsResponse(_message.Message):
    __slots__ = ("sessions", "next_page_token")
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    sessions: _containers.RepeatedCompositeFieldContainer[_messages_pb2.SessionSummary]
    next_page_token: str
    def __init__(self, sessions: _Optional[_Iterable[_Union[_messages_pb2.SessionSummary, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class UpdateSessionRequest(_message.Message):
    __slots__ = ("session", "update_mask")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    UPDATE_MASK_FIELD_NUMBER: _ClassVar[int]
    session: _messages_pb2.Session
    update_mask: _field_mask_pb2.FieldMask
    def __init__(self, session: _Optional[_Union[_messages_pb2.Session, _Mapping]] = ..., update_mask: _Optional[_Union[_field_mask_pb2.FieldMask, _Mapping]] = ...) -> None: ...

class DeleteSessionRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class DeleteSessionResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class AppendExchangeRequest(_message.Message):
    __slots__ = ("session_id", "messages", "full_history", "provider_call", "response_messages", "expected_next_sequence", "request_id", "run_id", "state_changes", "create_if_missing")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    FULL_HISTORY_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_CALL_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_NEXT_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_CHANGES_FIELD_NUMBER: _ClassVar[int]
    CREATE_IF_MISSING_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    messages: _containers.RepeatedCompositeFieldContainer[_messages_pb2.Message]
    full_history: _containers.RepeatedCompositeFieldContainer[_messages_pb2.Message]
    provider_call: _messages_pb2.ProviderCall
    response_messages: _containers.RepeatedCompositeFieldContainer[_messages_pb2.Message]
    expected_next_sequence: int
    request_id: str
    run_id: str
    state_changes: _containers.RepeatedCompositeFieldContainer[_messages_pb2.StateChange]
    create_if_missing: CreateSessionRequest
    def __init__(self, session_id: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[_messages_pb2.Message, _Mapping]]] = ..., full_history: _Optional[_Iterable[_Union[_messages_pb2.Message, _Mapping]]] = ..., provider_call: _Optional[_Union[_messages_pb2.ProviderCall, _Mapping]] = ..., response_messages: _Optional[_Iterable[_Union[_messages_pb2.Message, _Mapping]]] = ..., expected_next_sequence: _Optional[int] = ..., request_id: _Optional[str] = ..., run_id: _Optional[str] = ..., state_changes: _Optional[_Iterable[_Union[_messages_pb2.StateChange, _Mapping]]] = ..., create_if_missing: _Optional[_Union[CreateSessionRequest, _Mapping]] = ...) -> None: ...

class AppendExchangeResponse(_message.Message):
    __slots__ = ("messages", "provider_call", "revision", "next_sequence", "update_time", "session_created")
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_CALL_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    NEXT_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    UPDATE_TIME_FIELD_NUMBER: _ClassVar[int]
    SESSION_CREATED_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[_messages_pb2.StoredMessage]
    provider_call: _messages_pb2.ProviderCall
    revision: int
    next_sequence: int
    update_time: _timestamp_pb2.Timestamp
    session_created: bool
    def __init__(self, messages: _Optional[_Iterable[_Union[_messages_pb2.StoredMessage, _Mapping]]] = ..., provider_call: _Optional[_Union[_messages_pb2.ProviderCall, _Mapping]] = ..., revision: _Optional[int] = ..., next_sequence: _Optional[int] = ..., update_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., session_created: _Optional[bool] = ...) -> None: ...

class ExportHistoryRequest(_message.Message):
    __slots__ = ("session_id", "include_system_prompt", "from_summary", "after_sequence", "max_messages", "target")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_SYSTEM_PROMPT_FIELD_NUMBER: _ClassVar[int]
    FROM_SUMMARY_FIELD_NUMBER: _ClassVar[int]
    AFTER_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    include_system_prompt: bool
    from_summary: bool
    after_sequence: int
    max_messages: int
    target: _messages_pb2.ExportTarget
    def __init__(self, session_id: _Optional[str] = ..., include_system_prompt: _Optional[bool] = ..., from_summary: _Optional[bool] = ..., after_sequence: _Optional[int] = ..., max_messages: _Optional[int] = ..., target: _Optional[_Union[_messages_pb2.ExportTarget, _Mapping]] = ...) -> None: ...

class ExportHistoryResponse(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[_messages_pb2.Message]
    def __init__(self, messages: _Optional[_Iterable[_Union[_messages_pb2.Message, _Mapping]]] = ...) -> None: ...

class ListMessagesRequest(_message.Message):
    __slots__ = ("session_id", "after_sequence", "page_size", "page_token", "order_by", "before_sequence")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    AFTER_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    ORDER_BY_FIELD_NUMBER: _ClassVar[int]
    BEFORE_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    after_sequence: int
    page_size: int
    page_token: str
    order_by: str
    before_sequence: int
    def __init__(self, session_id: _Optional[str] = ..., after_sequence: _Optional[int] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., order_by: _Optional[str] = ..., before_sequence: _Optional[int] = ...) -> None: ...

class ListMessagesResponse(_message.Message):
    __slots__ = ("messages", "next_page_token")
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[_messages_pb2.StoredMessage]
    next_page_token: str
    def __init__(self, messages: _Optional[_Iterable[_Union[_messages_pb2.StoredMessage, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class ListProviderCallsRequest(_message.Message):
    __slots__ = ("session_id", "page_size", "page_token")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    page_size: int
    page_token: str
    def __init__(self, session_id: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListProviderCallsResponse(_message.Message):
    __slots__ = ("provider_calls", "next_page_token")
    PROVIDER_CALLS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    provider_calls: _containers.RepeatedCompositeFieldContainer[_messages_pb2.ProviderCall]
    next_page_token: str
    def __init__(self, provider_calls: _Optional[_Iterable[_Union[_messages_pb2.ProviderCall, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class WatchSessionRequest(_message.Message):
    __slots__ = ("session_id", "after_revision", "include_active_deltas", "delta_cursors")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    AFTER_REVISION_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_ACTIVE_DELTAS_FIELD_NUMBER: _ClassVar[int]
    DELTA_CURSORS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    after_revision: int
    include_active_deltas: bool
    delta_cursors: _containers.RepeatedCompositeFieldContainer[DeltaCursor]
    def __init__(self, session_id: _Optional[str] = ..., after_revision: _Optional[int] = ..., include_active_deltas: _Optional[bool] = ..., delta_cursors: _Optional[_Iterable[_Union[DeltaCursor, _Mapping]]] = ...) -> None: ...

class DeltaCursor(_message.Message):
    __slots__ = ("run_id", "after_index")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    AFTER_INDEX_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    after_index: int
    def __init__(self, run_id: _Optional[str] = ..., after_index: _Optional[int] = ...) -> None: ...

class PublishDeltaRequest(_message.Message):
    __slots__ = ("session_id", "run_id", "index", "text", "block")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    BLOCK_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    run_id: str
    index: int
    text: str
    block: _messages_pb2.ContentBlock
    def __init__(self, session_id: _Optional[str] = ..., run_id: _Optional[str] = ..., index: _Optional[int] = ..., text: _Optional[str] = ..., block: _Optional[_Union[_messages_pb2.ContentBlock, _Mapping]] = ...) -> None: ...

class PublishDeltaResponse(_message.Message):
    __slots__ = ("revision", "cancel_requested")
    REVISION_FIELD_NUMBER: _ClassVar[int]
    CANCEL_REQUESTED_FIELD_NUMBER: _ClassVar[int]
    revision: int
    cancel_requested: bool
    def __init__(self, revision: _Optional[int] = ..., cancel_requested: _Optional[bool] = ...) -> None: ...

class DiscardRunRequest(_message.Message):
    __slots__ = ("session_id", "run_id")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    run_id: str
    def __init__(self, session_id: _Optional[str] = ..., run_id: _Optional[str] = ...) -> None: ...

class DiscardRunResponse(_message.Message):
    __slots__ = ("revision",)
    REVISION_FIELD_NUMBER: _ClassVar[int]
    revision: int
    def __init__(self, revision: _Optional[int] = ...) -> None: ...

class CancelRunRequest(_message.Message):
    __slots__ = ("session_id", "run_id", "reason")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    run_id: str
    reason: str
    def __init__(self, session_id: _Optional[str] = ..., run_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class CancelRunResponse(_message.Message):
    __slots__ = ("revision",)
    REVISION_FIELD_NUMBER: _ClassVar[int]
    revision: int
    def __init__(self, revision: _Optional[int] = ...) -> None: ...

class BeginRunRequest(_message.Message):
    __slots__ = ("session_id", "run_id", "lease")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    run_id: str
    lease: _duration_pb2.Duration
    def __init__(self, session_id: _Optional[str] = ..., run_id: _Optional[str] = ..., lease: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class BeginRunResponse(_message.Message):
    __slots__ = ("revision", "expire_time")
    REVISION_FIELD_NUMBER: _ClassVar[int]
    EXPIRE_TIME_FIELD_NUMBER: _ClassVar[int]
    revision: int
    expire_time: _timestamp_pb2.Timestamp
    def __init__(self, revision: _Optional[int] = ..., expire_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class EndRunRequest(_message.Message):
    __slots__ = ("session_id", "run_id", "take_next")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    TAKE_NEXT_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    run_id: str
    take_next: bool
    def __init__(self, session_id: _Optional[str] = ..., run_id: _Optional[str] = ..., take_next: _Optional[bool] = ...) -> None: ...

class EndRunResponse(_message.Message):
    __slots__ = ("revision", "taken_input")
    REVISION_FIELD_NUMBER: _ClassVar[int]
    TAKEN_INPUT_FIELD_NUMBER: _ClassVar[int]
    revision: int
    taken_input: _messages_pb2.QueuedInput
    def __init__(self, revision: _Optional[int] = ..., taken_input: _Optional[_Union[_messages_pb2.QueuedInput, _Mapping]] = ...) -> None: ...

class RollbackSessionRequest(_message.Message):
    __slots__ = ("session_id", "after_sequence", "run_id", "expected_next_sequence", "return_removed", "remove_last", "request_id")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    AFTER_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_NEXT_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    RETURN_REMOVED_FIELD_NUMBER: _ClassVar[int]
    REMOVE_LAST_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    after_sequence: int
    run_id: str
    expected_next_sequence: int
    return_removed: bool
    remove_last: int
    request_id: str
    def __init__(self, session_id: _Optional[str] = ..., after_sequence: _Optional[int] = ..., run_id: _Optional[str] = ..., expected_next_sequence: _Optional[int] = ..., return_removed: _Optional[bool] = ..., remove_last: _Optional[int] = ..., request_id: _Optional[str] = ...) -> None: ...

class RollbackSessionResponse(_message.Message):
    __slots__ = ("revision", "next_sequence", "removed_messages")
    REVISION_FIELD_NUMBER: _ClassVar[int]
    NEXT_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    REMOVED_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    revision: int
    next_sequence: int
    removed_messages: _containers.RepeatedCompositeFieldContainer[_messages_pb2.StoredMessage]
    def __init__(self, revision: _Optional[int] = ..., next_sequence: _Optional[int] = ..., removed_messages: _Optional[_Iterable[_Union[_messages_pb2.StoredMessage, _Mapping]]] = ...) -> None: ...

class EditMessageRequest(_message.Message):
    __slots__ = ("session_id", "message_id", "message", "reason", "run_id")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    message_id: str
    message: _messages_pb2.Message
    reason: str
    run_id: str
    def __init__(self, session_id: _Optional[str] = ..., message_id: _Optional[str] = ..., message: _Optional[_Union[_messages_pb2.Message, _Mapping]] = ..., reason: _Optional[str] = ..., run_id: _Optional[str] = ...) -> None: ...

class EditMessageResponse(_message.Message):
    __slots__ = ("revision", "message")
    REVISION_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    revision: int
    message: _messages_pb2.StoredMessage
    def __init__(self, revision: _Optional[int] = ..., message: _Optional[_Union[_messages_pb2.StoredMessage, _Mapping]] = ...) -> None: ...

class RedactMessageRequest(_message.Message):
    __slots__ = ("session_id", "message_id", "reason", "run_id")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    message_id: str
    reason: str
    run_id: str
    def __init__(self, session_id: _Optional[str] = ..., message_id: _Optional[str] = ..., reason: _Optional[str] = ..., run_id: _Optional[str] = ...) -> None: ...

class RedactMessageResponse(_message.Message):
    __slots__ = ("revision",)
    REVISION_FIELD_NUMBER: _ClassVar[int]
    revision: int
    def __init__(self, revision: _Optional[int] = ...) -> None: ...

class ForkSessionRequest(_message.Message):
    __slots__ = ("session_id", "at_sequence", "new_session_id")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    AT_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    NEW_SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    at_sequence: int
    new_session_id: str
    def __init__(self, session_id: _Optional[str] = ..., at_sequence: _Optional[int] = ..., new_session_id: _Optional[str] = ...) -> None: ...

class ExportTranscriptRequest(_message.Message):
    __slots__ = ("session_id", "format", "target")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    format: _messages_pb2.TranscriptFormat
    target: _messages_pb2.ExportTarget
    def __init__(self, session_id: _Optional[str] = ..., format: _Optional[_Union[_messages_pb2.TranscriptFormat, str]] = ..., target: _Optional[_Union[_messages_pb2.ExportTarget, _Mapping]] = ...) -> None: ...

class ExportTranscriptResponse(_message.Message):
    __slots__ = ("data",)
    DATA_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    def __init__(self, data: _Optional[bytes] = ...) -> None: ...

class SetStateRequest(_message.Message):
    __slots__ = ("session_id", "key", "value", "expected_version", "scope")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_VERSION_FIELD_NUMBER: _ClassVar[int]
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    key: str
    value: str
    expected_version: int
    scope: str
    def __init__(self, session_id: _Optional[str] = ..., key: _Optional[str] = ..., value: _Optional[str] = ..., expected_version: _Optional[int] = ..., scope: _Optional[str] = ...) -> None: ...

class GetStateRequest(_message.Message):
    __slots__ = ("session_id", "key", "scope")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    key: str
    scope: str
    def __init__(self, session_id: _Optional[str] = ..., key: _Optional[str] = ..., scope: _Optional[str] = ...) -> None: ...

class ListStateRequest(_message.Message):
    __slots__ = ("session_id", "page_size", "page_token", "scope")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    page_size: int
    page_token: str
    scope: str
    def __init__(self, session_id: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., scope: _Optional[str] = ...) -> None: ...

class ListStateResponse(_message.Message):
    __slots__ = ("entries", "next_page_token")
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[_messages_pb2.StateEntry]
    next_page_token: str
    def __init__(self, entries: _Optional[_Iterable[_Union[_messages_pb2.StateEntry, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class DeleteStateRequest(_message.Message):
    __slots__ = ("session_id", "key", "expected_version", "scope")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_VERSION_FIELD_NUMBER: _ClassVar[int]
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    key: str
    expected_version: int
    scope: str
    def __init__(self, session_id: _Optional[str] = ..., key: _Optional[str] = ..., expected_version: _Optional[int] = ..., scope: _Optional[str] = ...) -> None: ...

class DeleteStateResponse(_message.Message):
    __slots__ = ("revision",)
    REVISION_FIELD_NUMBER: _ClassVar[int]
    revision: int
    def __init__(self, revision: _Optional[int] = ...) -> None: ...

class SearchMessagesRequest(_message.Message):
    __slots__ = ("query", "user", "page_size", "page_token")
    QUERY_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    query: str
    user: str
    page_size: int
    page_token: str
    def __init__(self, query: _Optional[str] = ..., user: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class SearchMessagesResponse(_message.Message):
    __slots__ = ("hits", "next_page_token")
    HITS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    hits: _containers.RepeatedCompositeFieldContainer[_messages_pb2.SearchHit]
    next_page_token: str
    def __init__(self, hits: _Optional[_Iterable[_Union[_messages_pb2.SearchHit, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class SummarizeUsageRequest(_message.Message):
    __slots__ = ("user", "session_id", "start_time", "end_time", "group_by", "page_size", "page_token")
    USER_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    END_TIME_FIELD_NUMBER: _ClassVar[int]
    GROUP_BY_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    user: str
    session_id: str
    start_time: _timestamp_pb2.Timestamp
    end_time: _timestamp_pb2.Timestamp
    group_by: UsageGroupBy
    page_size: int
    page_token: str
    def __init__(self, user: _Optional[str] = ..., session_id: _Optional[str] = ..., start_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., end_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., group_by: _Optional[_Union[UsageGroupBy, str]] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class SummarizeUsageResponse(_message.Message):
    __slots__ = ("rows", "next_page_token")
    ROWS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    rows: _containers.RepeatedCompositeFieldContainer[UsageRow]
    next_page_token: str
    def __init__(self, rows: _Optional[_Iterable[_Union[UsageRow, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class UsageRow(_message.Message):
    __slots__ = ("key", "calls", "prompt_tokens", "completion_tokens", "cached_input_tokens", "cache_creation_input_tokens", "reasoning_tokens", "total_tokens", "cost_micros_usd")
    KEY_FIELD_NUMBER: _ClassVar[int]
    CALLS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_INPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHE_CREATION_INPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REASONING_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COST_MICROS_USD_FIELD_NUMBER: _ClassVar[int]
    key: str
    calls: int
    prompt_tokens: int
    completion_tokens: int
    cached_input_tokens: int
    cache_creation_input_tokens: int
    reasoning_tokens: int
    total_tokens: int
    cost_micros_usd: int
    def __init__(self, key: _Optional[str] = ..., calls: _Optional[int] = ..., prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., cached_input_tokens: _Optional[int] = ..., cache_creation_input_tokens: _Optional[int] = ..., reasoning_tokens: _Optional[int] = ..., total_tokens: _Optional[int] = ..., cost_micros_usd: _Optional[int] = ...) -> None: ...

class EraseUserRequest(_message.Message):
    __slots__ = ("user", "scopes")
    USER_FIELD_NUMBER: _ClassVar[int]
    SCOPES_FIELD_NUMBER: _ClassVar[int]
    user: str
    scopes: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, user: _Optional[str] = ..., scopes: _Optional[_Iterable[str]] = ...) -> None: ...

class EraseUserResponse(_message.Message):
    __slots__ = ("sessions_deleted", "messages_deleted", "provider_calls_deleted")
    SESSIONS_DELETED_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_DELETED_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_CALLS_DELETED_FIELD_NUMBER: _ClassVar[int]
    sessions_deleted: int
    messages_deleted: int
    provider_calls_deleted: int
    def __init__(self, sessions_deleted: _Optional[int] = ..., messages_deleted: _Optional[int] = ..., provider_calls_deleted: _Optional[int] = ...) -> None: ...
