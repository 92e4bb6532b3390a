import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Role(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ROLE_UNSPECIFIED: _ClassVar[Role]
    ROLE_SYSTEM: _ClassVar[Role]
    ROLE_USER: _ClassVar[Role]
    ROLE_ASSISTANT: _ClassVar[Role]
    ROLE_TOOL: _ClassVar[Role]
    ROLE_DEVELOPER: _ClassVar[Role]

class InputMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    INPUT_MODE_UNSPECIFIED: _ClassVar[InputMode]
    INPUT_MODE_QUEUE: _ClassVar[InputMode]
    INPUT_MODE_INTERRUPT: _ClassVar[InputMode]
    INPUT_MODE_REJECT: _ClassVar[InputMode]

class ApprovalState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    APPROVAL_STATE_UNSPECIFIED: _ClassVar[ApprovalState]
    APPROVAL_STATE_PENDING: _ClassVar[ApprovalState]
    APPROVAL_STATE_APPROVED: _ClassVar[ApprovalState]
    APPROVAL_STATE_DENIED: _ClassVar[ApprovalState]
    APPROVAL_STATE_EXPIRED: _ClassVar[ApprovalState]

class ApprovalDecision(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    APPROVAL_DECISION_UNSPECIFIED: _ClassVar[ApprovalDecision]
    APPROVAL_DECISION_APPROVE: _ClassVar[ApprovalDecision]
    APPROVAL_DECISION_DENY: _ClassVar[ApprovalDecision]

class TranscriptFormat(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TRANSCRIPT_FORMAT_UNSPECIFIED: _ClassVar[TranscriptFormat]
    TRANSCRIPT_FORMAT_MARKDOWN: _ClassVar[TranscriptFormat]
    TRANSCRIPT_FORMAT_OPENAI_JSON: _ClassVar[TranscriptFormat]
    TRANSCRIPT_FORMAT_ANTHROPIC_MESSAGES: _ClassVar[TranscriptFormat]
    TRANSCRIPT_FORMAT_OPENAI_RESPONSES: _ClassVar[TranscriptFormat]
    TRANSCRIPT_FORMAT_GEMINI_CONTENTS: _ClassVar[TranscriptFormat]

class ReasoningPolicy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REASONING_POLICY_UNSPECIFIED: _ClassVar[ReasoningPolicy]
    REASONING_POLICY_SAME_MODEL: _ClassVar[ReasoningPolicy]
    REASONING_POLICY_SAME_PROVIDER: _ClassVar[ReasoningPolicy]
    REASONING_POLICY_NONE: _ClassVar[ReasoningPolicy]
ROLE_UNSPECIFIED: Role
ROLE_SYSTEM: Role
ROLE_USER: Role
ROLE_ASSISTANT: Role
ROLE_TOOL: Role
ROLE_DEVELOPER: Role
INPUT_MODE_UNSPECIFIED: InputMode
INPUT_MODE_QUEUE: InputMode
INPUT_MODE_INTERRUPT: InputMode
INPUT_MODE_REJECT: InputMode
APPROVAL_STATE_UNSPECIFIED: ApprovalState
APPROVAL_STATE_PENDING: ApprovalState
APPROVAL_STATE_APPROVED: ApprovalState
APPROVAL_STATE_DENIED: ApprovalState
APPROVAL_STATE_EXPIRED: ApprovalState
APPROVAL_DECISION_UNSPECIFIED: ApprovalDecision
APPROVAL_DECISION_APPROVE: ApprovalDecision
APPROVAL_DECISION_DENY: ApprovalDecision
TRANSCRIPT_FORMAT_UNSPECIFIED: TranscriptFormat
TRANSCRIPT_FORMAT_MARKDOWN: TranscriptFormat
TRANSCRIPT_FORMAT_OPENAI_JSON: TranscriptFormat
TRANSCRIPT_FORMAT_ANTHROPIC_MESSAGES: TranscriptFormat
TRANSCRIPT_FORMAT_OPENAI_RESPONSES: TranscriptFormat
TRANSCRIPT_FORMAT_GEMINI_CONTENTS: TranscriptFormat
REASONING_POLICY_UNSPECIFIED: ReasoningPolicy
REASONING_POLICY_SAME_MODEL: ReasoningPolicy
REASONING_POLICY_SAME_PROVIDER: ReasoningPolicy
REASONING_POLICY_NONE: ReasoningPolicy

class Message(_message.Message):
    __slots__ = ("role", "content", "content_blocks", "tool_calls", "tool_call_id", "tool_error", "name", "metadata", "incomplete")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    CONTENT_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALL_ID_FIELD_NUMBER: _ClassVar[int]
    TOOL_ERROR_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    INCOMPLETE_FIELD_NUMBER: _ClassVar[int]
    role: Role
    content: str
    content_blocks: _containers.RepeatedCompositeFieldContainer[ContentBlock]
    tool_calls: _containers.RepeatedCompositeFieldContainer[ToolCall]
    tool_call_id: str
    tool_error: bool
    name: str
    metadata: _containers.ScalarMap[str, str]
    incomplete: bool
    def __init__(self, role: _Optional[_Union[Role, str]] = ..., content: _Optional[str] = ..., content_blocks: _Optional[_Iterable[_Union[ContentBlock, _Mapping]]] = ..., tool_calls: _Optional[_Iterable[_Union[ToolCall, _Mapping]]] = ..., tool_call_id: _Optional[str] = ..., tool_error: _Optional[bool] = ..., name: _Optional[str] = ..., metadata: _Optional[_Mapping[str, str]] = ..., incomplete: _Optional[bool] = ...) -> None: ...

class ContentBlock(_message.Message):
    __slots__ = ("text", "thinking", "redacted_thinking", "image", "tool_use", "tool_result", "json")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    THINKING_FIELD_NUMBER: _ClassVar[int]
    REDACTED_THINKING_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    TOOL_USE_FIELD_NUMBER: _ClassVar[int]
    TOOL_RESULT_FIELD_NUMBER: _ClassVar[int]
    JSON_FIELD_NUMBER: _ClassVar[int]
    text: TextBlock
    thinking: ThinkingBlock
    redacted_thinking: RedactedThinkingBlock
    image: ImageBlock
    tool_use: ToolUseBlock
    tool_result: ToolResultBlock
    json: JsonBlock
    def __init__(self, text: _Optional[_Union[TextBlock, _Mapping]] = ..., thinking: _Optional[_Union[ThinkingBlock, _Mapping]] = ..., redacted_thinking: _Optional[_Union[RedactedThinkingBlock, _Mapping]] = ..., image: _Optional[_Union[ImageBlock, _Mapping]] = ..., tool_use: _Optional[_Union[ToolUseBlock, _Mapping]] = ..., tool_result: _Optional[_Union[ToolResultBlock, _Mapping]] = ..., json: _Optional[_Union[JsonBlock, _Mapping]] = ...) -> None: ...

class TextBlock(_message.Message):
    __slots__ = ("text", "signature")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    text: str
    signature: str
    def __init__(self, text: _Optional[str] = ..., signature: _Optional[str] = ...) -> None: ...

class ThinkingBlock(_message.Message):
    __slots__ = ("thinking", "signature")
    THINKING_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    thinking: str
    signature: str
    def __init__(self, thinking: _Optional[str] = ..., signature: _Optional[str] = ...) -> None: ...

class RedactedThinkingBlock(_message.Message):
    __slots__ = ("data",)
    DATA_FIELD_NUMBER: _ClassVar[int]
    data: str
    def __init__(self, data: _Optional[str] = ...) -> None: ...

class ImageBlock(_message.Message):
    __slots__ = ("media_type", "url", "data")
    MEDIA_TYPE_FIELD_NUMBER: _ClassVar[int]
    URL_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    media_type: str
    url: str
    data: bytes
    def __init__(self, media_type: _Optional[str] = ..., url: _Optional[str] = ..., data: _Optional[bytes] = ...) -> None: ...

class ToolUseBlock(_message.Message):
    __slots__ = ("id", "name", "input", "signature")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    INPUT_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    id: str
    name: str
    input: str
    signature: str
    def __init__(self, id: _Optional[str] = ..., name: _Optional[str] = ..., input: _Optional[str] = ..., signature: _Optional[str] = ...) -> None: ...

class ToolResultBlock(_message.Message):
    __slots__ = ("tool_use_id", "content", "is_error")
    TOOL_USE_ID_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    IS_ERROR_FIELD_NUMBER: _ClassVar[int]
    tool_use_id: str
    content: str
    is_error: bool
    def __init__(self, tool_use_id: _Optional[str] = ..., content: _Optional[str] = ..., is_error: _Optional[bool] = ...) -> None: ...

class JsonBlock(_message.Message):
    __slots__ = ("type", "json")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    JSON_FIELD_NUMBER: _ClassVar[int]
    type: str
    json: str
    def __init__(self, type: _Optional[str] = ..., json: _Optional[str] = ...) -> None: ...

class ToolCall(_message.Message):
    __slots__ = ("id", "name", "arguments", "signature")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    id: str
    name: str
    arguments: str
    signature: str
    def __init__(self, id: _Optional[str] = ..., name: _Optional[str] = ..., arguments: _Optional[str] = ..., signature: _Optional[str] = ...) -> None: ...

class Session(_message.Message):
    __slots__ = ("id", "title", "system_prompt", "user", "metadata", "summary_message_id", "revision", "create_time", "update_time", "parent_session_id", "parent_sequence", "active_run_id", "run_expire_time", "next_sequence", "expire_time", "state")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    TITLE_FIELD_NUMBER: _ClassVar[int]
    SYSTEM_PROMPT_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    UPDATE_TIME_FIELD_NUMBER: _ClassVar[int]
    PARENT_SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    PARENT_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_RUN_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_EXPIRE_TIME_FIELD_NUMBER: _ClassVar[int]
    NEXT_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    EXPIRE_TIME_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    id: str
    title: str
    system_prompt: str
    user: str
    metadata: _containers.ScalarMap[str, str]
    summary_message_id: str
    revision: int
    create_time: _timestamp_pb2.Timestamp
    update_time: _timestamp_pb2.Timestamp
    parent_session_id: str
    parent_sequence: int
    active_run_id: str
    run_expire_time: _timestamp_pb2.Timestamp
    next_sequence: int
    expire_time: _timestamp_pb2.Timestamp
    state: _containers.RepeatedCompositeFieldContainer[StateEntry]
    def __init__(self, id: _Optional[str] = ..., title: _Optional[str] = ..., system_prompt: _Optional[str] = ..., user: _Optional[str] = ..., metadata: _Optional[_Mapping[str, str]] = ..., summary_message_id: _Optional[str] = ..., revision: _Optional[int] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., update_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., parent_session_id: _Optional[str] = ..., parent_sequence: _Optional[int] = ..., active_run_id: _Optional[str] = ..., run_expire_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., next_sequence: _Optional[int] = ..., expire_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., state: _Optional[_Iterable[_Union[StateEntry, _Mapping]]] = ...) -> None: ...

class StoredMessage(_message.Message):
    __slots__ = ("id", "session_id", "sequence", "produced_by_call_id", "message", "create_time", "redacted")
    ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    PRODUCED_BY_CALL_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    REDACTED_FIELD_NUMBER: _ClassVar[int]
    id: str
    session_id: str
    sequence: int
    produced_by_call_id: str
    message: Message
    create_time: _timestamp_pb2.Timestamp
    redacted: bool
    def __init__(self, id: _Optional[str] = ..., session_id: _Optional[str] = ..., sequence: _Optional[int] = ..., produced_by_call_id: _Optional[str] = ..., message: _Optional[_Union[Message, _Mapping]] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., redacted: _Optional[bool] = ...) -> None: ...

class ProviderCall(_message.Message):
    __slots__ = ("id", "session_id", "request_id", "provider", "model", "requested_provider", "requested_model", "prompt_tokens", "completion_tokens", "total_tokens", "cost_micros_usd", "create_time", "cached_input_tokens", "cache_creation_input_tokens", "reasoning_tokens", "usage_json", "duration")
    ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_PROVIDER_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_MODEL_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COST_MICROS_USD_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    CACHED_INPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHE_CREATION_INPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REASONING_TOKENS_FIELD_NUMBER: _ClassVar[int]
    USAGE_JSON_FIELD_NUMBER: _ClassVar[int]
    DURATION_FIELD_NUMBER: _ClassVar[int]
    id: str
    session_id: str
    request_id: str
    provider: str
    model: str
    requested_provider: str
    requested_model: str
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    cost_micros_usd: int
    create_time: _timestamp_pb2.Timestamp
    cached_input_tokens: int
    cache_creation_input_tokens: int
    reasoning_tokens: int
    usage_json: str
    duration: _duration_pb2.Duration
    def __init__(self, id: _Optional[str] = ..., session_id: _Optional[str] = ..., request_id: _Optional[str] = ..., provider: _Optional[str] = ..., model: _Optional[str] = ..., requested_provider: _Optional[str] = ..., requested_model: _Optional[str] = ..., prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., total_tokens: _Optional[int] = ..., cost_micros_usd: _Optional[int] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., cached_input_tokens: _Optional[int] = ..., cache_creation_input_tokens: _Optional[int] = ..., reasoning_tokens: _Optional[int] = ..., usage_json: _Optional[str] = ..., duration: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class SessionSummary(_message.Message):
    __slots__ = ("session", "message_count", "provider_call_count", "last_model", "last_provider", "last_cost_micros_usd", "last_request_id", "total_tokens", "total_cost_micros_usd")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_COUNT_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_CALL_COUNT_FIELD_NUMBER: _ClassVar[int]
    LAST_MODEL_FIELD_NUMBER: _ClassVar[int]
    LAST_PROVIDER_FIELD_NUMBER: _ClassVar[int]
    LAST_COST_MICROS_USD_FIELD_NUMBER: _ClassVar[int]
    LAST_REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TOTAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_COST_MICROS_USD_FIELD_NUMBER: _ClassVar[int]
    session: Session
    message_count: int
    provider_call_count: int
    last_model: str
    last_provider: str
    last_cost_micros_usd: int
    last_request_id: str
    total_tokens: int
    total_cost_micros_usd: int
    def __init__(self, session: _Optional[_Union[Session, _Mapping]] = ..., message_count: _Optional[int] = ..., provider_call_count: _Optional[int] = ..., last_model: _Optional[str] = ..., last_provider: _Optional[str] = ..., last_cost_micros_usd: _Optional[int] = ..., last_request_id: _Optional[str] = ..., total_tokens: _Optional[int] = ..., total_cost_micros_usd: _Optional[int] = ...) -> None: ...

class SessionEvent(_message.Message):
    __slots__ = ("revision", "time", "session_created", "exchange_appended", "session_updated", "session_deleted", "caught_up", "progress", "delta", "run_discarded", "run_begun", "run_ended", "rolled_back", "message_edited", "message_redacted", "state_changed", "run_cancel_requested", "approval_requested", "approval_decided", "input_queued", "input_taken", "input_withdrawn")
    REVISION_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    SESSION_CREATED_FIELD_NUMBER: _ClassVar[int]
    EXCHANGE_APPENDED_FIELD_NUMBER: _ClassVar[int]
    SESSION_UPDATED_FIELD_NUMBER: _ClassVar[int]
    SESSION_DELETED_FIELD_NUMBER: _ClassVar[int]
    CAUGHT_UP_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    RUN_DISCARDED_FIELD_NUMBER: _ClassVar[int]
    RUN_BEGUN_FIELD_NUMBER: _ClassVar[int]
    RUN_ENDED_FIELD_NUMBER: _ClassVar[int]
    ROLLED_BACK_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_EDITED_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_REDACTED_FIELD_NUMBER: _ClassVar[int]
    STATE_CHANGED_FIELD_NUMBER: _ClassVar[int]
    RUN_CANCEL_REQUESTED_FIELD_NUMBER: _ClassVar[int]
    APPROVAL_REQUESTED_FIELD_NUMBER: _ClassVar[int]
    APPROVAL_DECIDED_FIELD_NUMBER: _ClassVar[int]
    INPUT_QUEUED_FIELD_NUMBER: _ClassVar[int]
    INPUT_TAKEN_FIELD_NUMBER: _ClassVar[int]
    INPUT_WITHDRAWN_FIELD_NUMBER: _ClassVar[int]
    revision: int
    time: _timestamp_pb2.Timestamp
    session_created: SessionCreated
    exchange_appended: ExchangeAppended
    session_updated: SessionUpdated
    session_deleted: SessionDeleted
    caught_up: CaughtUp
    progress: Progress
    delta: Delta
    run_discarded: RunDiscarded
    run_begun: RunBegun
    run_ended: RunEnded
    rolled_back: RolledBack
    message_edited: MessageEdited
    message_redacted: MessageRedacted
    state_changed: StateChanged
    run_cancel_requested: RunCancelRequested
    approval_requested: ApprovalRequested
    approval_decided: ApprovalDecided
    input_queued: InputQueued
    input_taken: InputTaken
    input_withdrawn: InputWithdrawn
    def __init__(self, revision: _Optional[int] = ..., time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., session_created: _Optional[_Union[SessionCreated, _Mapping]] = ..., exchange_appended: _Optional[_Union[ExchangeAppended, _Mapping]] = ..., session_updated: _Optional[_Union[SessionUpdated, _Mapping]] = ..., session_deleted: _Optional[_Union[SessionDeleted, _Mapping]] = ..., caught_up: _Optional[_Union[CaughtUp, _Mapping]] = ..., progress: _Optional[_Union[Progress, _Mapping]] = ..., delta: _Optional[_Union[Delta, _Mapping]] = ..., run_discarded: _Optional[_Union[RunDiscarded, _Mapping]] = ..., run_begun: _Optional[_Union[RunBegun, _Mapping]] = ..., run_ended: _Optional[_Union[RunEnded, _Mapping]] = ..., rolled_back: _Optional[_Union[RolledBack, _Mapping]] = ..., message_edited: _Optional[_Union[MessageEdited, _Mapping]] = ..., message_redacted: _Optional[_Union[MessageRedacted, _Mapping]] = ..., state_changed: _Optional[_Union[StateChanged, _Mapping]] = ..., run_cancel_requested: _Optional[_Union[RunCancelRequested, _Mapping]] = ..., approval_requested: _Optional[_Union[ApprovalRequested, _Mapping]] = ..., approval_decided: _Optional[_Union[ApprovalDecided, _Mapping]] = ..., input_queued: _Optional[_Union[InputQueued, _Mapping]] = ..., input_taken: _Optional[_Union[InputTaken, _Mapping]] = ..., input_withdrawn: _Optional[_Union[InputWithdrawn, _Mapping]] = ...) -> None: ...

class InputQueued(_message.Message):
    __slots__ = ("input",)
    INPUT_FIELD_NUMBER: _ClassVar[int]
    input: QueuedInput
    def __init__(self, input: _Optional[_Union[QueuedInput, _Mapping]] = ...) -> None: ...

class InputTaken(_message.Message):
    __slots__ = ("input_id", "position", "run_id", "messages", "next_sequence")
    INPUT_ID_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    NEXT_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    input_id: str
    position: int
    run_id: str
    messages: _containers.RepeatedCompositeFieldContainer[StoredMessage]
    next_sequence: int
    def __init__(self, input_id: _Optional[str] = ..., position: _Optional[int] = ..., run_id: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[StoredMessage, _Mapping]]] = ..., next_sequence: _Optional[int] = ...) -> None: ...

class InputWithdrawn(_message.Message):
    __slots__ = ("input_id", "position")
    INPUT_ID_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    input_id: str
    position: int
    def __init__(self, input_id: _Optional[str] = ..., position: _Optional[int] = ...) -> None: ...

class QueuedInput(_message.Message):
    __slots__ = ("input_id", "session_id", "position", "messages", "mode", "create_time")
    INPUT_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    input_id: str
    session_id: str
    position: int
    messages: _containers.RepeatedCompositeFieldContainer[Message]
    mode: InputMode
    create_time: _timestamp_pb2.Timestamp
    def __init__(self, input_id: _Optional[str] = ..., session_id: _Optional[str] = ..., position: _Optional[int] = ..., messages: _Optional[_Iterable[_Union[Message, _Mapping]]] = ..., mode: _Optional[_Union[InputMode, str]] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ApprovalRequested(_message.Message):
    __slots__ = ("approval",)
    APPROVAL_FIELD_NUMBER: _ClassVar[int]
    approval: Approval
    def __init__(self, approval: _Optional[_Union[Approval, _Mapping]] = ...) -> None: ...

class ApprovalDecided(_message.Message):
    __slots__ = ("approval", "tool_result", "next_sequence")
    APPROVAL_FIELD_NUMBER: _ClassVar[int]
    TOOL_RESULT_FIELD_NUMBER: _ClassVar[int]
    NEXT_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    approval: Approval
    tool_result: StoredMessage
    next_sequence: int
    def __init__(self, approval: _Optional[_Union[Approval, _Mapping]] = ..., tool_result: _Optional[_Union[StoredMessage, _Mapping]] = ..., next_sequence: _Optional[int] = ...) -> None: ...

class Approval(_message.Message):
    __slots__ = ("approval_id", "session_id", "run_id", "tool_call_id", "title", "detail_json", "state", "decided_by", "reason", "create_time", "decide_time", "expire_time")
    APPROVAL_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALL_ID_FIELD_NUMBER: _ClassVar[int]
    TITLE_FIELD_NUMBER: _ClassVar[int]
    DETAIL_JSON_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    DECIDED_BY_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    DECIDE_TIME_FIELD_NUMBER: _ClassVar[int]
    EXPIRE_TIME_FIELD_NUMBER: _ClassVar[int]
    approval_id: str
    session_id: str
    run_id: str
    tool_call_id: str
    title: str
    detail_json: str
    state: ApprovalState
    decided_by: str
    reason: str
    create_time: _timestamp_pb2.Timestamp
    decide_time: _timestamp_pb2.Timestamp
    expire_time: _timestamp_pb2.Timestamp
    def __init__(self, approval_id: _Optional[str] = ..., session_id: _Optional[str] = ..., run_id: _Optional[str] = ..., tool_call_id: _Optional[str] = ..., title: _Optional[str] = ..., detail_json: _Optional[str] = ..., state: _Optional[_Union[ApprovalState, str]] = ..., decided_by: _Optional[str] = ..., reason: _Optional[str] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., decide_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., expire_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class SessionCreated(_message.Message):
    __slots__ = ("session", "messages", "initial_state")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    INITIAL_STATE_FIELD_NUMBER: _ClassVar[int]
    session: Session
    messages: _containers.RepeatedCompositeFieldContainer[StoredMessage]
    initial_state: _containers.RepeatedCompositeFieldContainer[StateEntry]
    def __init__(self, session: _Optional[_Union[Session, _Mapping]] = ..., messages: _Optional[_Iterable[_Union[StoredMessage, _Mapping]]] = ..., initial_state: _Optional[_Iterable[_Union[StateEntry, _Mapping]]] = ...) -> None: ...

class ExchangeAppended(_message.Message):
    __slots__ = ("messages", "provider_call", "run_id", "next_sequence", "state_changes")
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_CALL_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    NEXT_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    STATE_CHANGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[StoredMessage]
    provider_call: ProviderCall
    run_id: str
    next_sequence: int
    state_changes: _containers.RepeatedCompositeFieldContainer[StateChange]
    def __init__(self, messages: _Optional[_Iterable[_Union[StoredMessage, _Mapping]]] = ..., provider_call: _Optional[_Union[ProviderCall, _Mapping]] = ..., run_id: _Optional[str] = ..., next_sequence: _Optional[int] = ..., state_changes: _Optional[_Iterable[_Union[StateChange, _Mapping]]] = ...) -> None: ...

class SessionUpdated(_message.Message):
    __slots__ = ("session",)
    SESSION_FIELD_NUMBER: _ClassVar[int]
    session: Session
    def __init__(self, session: _Optional[_Union[Session, _Mapping]] = ...) -> None: ...

class SessionDeleted(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CaughtUp(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Progress(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Delta(_message.Message):
    __slots__ = ("run_id", "index", "first_index", "text", "block")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    FIRST_INDEX_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    BLOCK_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    index: int
    first_index: int
    text: str
    block: ContentBlock
    def __init__(self, run_id: _Optional[str] = ..., index: _Optional[int] = ..., first_index: _Optional[int] = ..., text: _Optional[str] = ..., block: _Optional[_Union[ContentBlock, _Mapping]] = ...) -> None: ...

class RunDiscarded(_message.Message):
    __slots__ = ("run_id",)
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    def __init__(self, run_id: _Optional[str] = ...) -> None: ...

class RunCancelRequested(_message.Message):
    __slots__ = ("run_id", "reason")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    reason: str
    def __init__(self, run_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class RunBegun(_message.Message):
    __slots__ = ("run_id", "expire_time")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    EXPIRE_TIME_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    expire_time: _timestamp_pb2.Timestamp
    def __init__(self, run_id: _Optional[str] = ..., expire_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class RunEnded(_message.Message):
    __slots__ = ("run_id", "expired")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    EXPIRED_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    expired: bool
    def __init__(self, run_id: _Optional[str] = ..., expired: _Optional[bool] = ...) -> None: ...

class RolledBack(_message.Message):
    __slots__ = ("after_sequence", "removed_message_ids", "next_sequence", "summary_cleared")
    AFTER_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    REMOVED_MESSAGE_IDS_FIELD_NUMBER: _ClassVar[int]
    NEXT_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_CLEARED_FIELD_NUMBER: _ClassVar[int]
    after_sequence: int
    removed_message_ids: _containers.RepeatedScalarFieldContainer[str]
    next_sequence: int
    summary_cleared: bool
    def __init__(self, after_sequence: _Optional[int] = ..., removed_message_ids: _Optional[_Iterable[str]] = ..., next_sequence: _Optional[int] = ..., summary_cleared: _Optional[bool] = ...) -> None: ...

class MessageEdited(_message.Message):
    __slots__ = ("message", "previous", "reason")
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    message: StoredMessage
    previous: Message
    reason: str
    def __init__(self, message: _Optional[_Union[StoredMessage, _Mapping]] = ..., previous: _Optional[_Union[Message, _Mapping]] = ..., reason: _Optional[str] = ...) -> None: ...

class MessageRedacted(_message.Message):
    __slots__ = ("message_id", "sequence", "reason")
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    message_id: str
    sequence: int
    reason: str
    def __init__(self, message_id: _Optional[str] = ..., sequence: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class StateChanged(_message.Message):
    __slots__ = ("key", "value", "version", "deleted")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    DELETED_FIELD_NUMBER: _ClassVar[int]
    key: str
    value: str
    version: int
    deleted: bool
    def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ..., version: _Optional[int] = ..., deleted: _Optional[bool] = ...) -> None: ...

class StateChange(_message.Message):
    __slots__ = ("scope", "key", "value", "delete")
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    DELETE_FIELD_NUMBER: _ClassVar[int]
    scope: str
    key: str
    value: str
    delete: bool
    def __init__(self, scope: _Optional[str] = ..., key: _Optional[str] = ..., value: _Optional[str] = ..., delete: _Optional[bool] = ...) -> None: ...

class StateEntry(_message.Message):
    __slots__ = ("key", "value", "version", "update_time", "scope")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    UPDATE_TIME_FIELD_NUMBER: _ClassVar[int]
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    key: str
    value: str
    version: int
    update_time: _timestamp_pb2.Timestamp
    scope: str
    def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ..., version: _Optional[int] = ..., update_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., scope: _Optional[str] = ...) -> None: ...

class SearchHit(_message.Message):
    __slots__ = ("session_id", "sequence", "message_id", "snippet", "session_title", "role")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    SNIPPET_FIELD_NUMBER: _ClassVar[int]
    SESSION_TITLE_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    sequence: int
    message_id: str
    snippet: str
    session_title: str
    role: Role
    def __init__(self, session_id: _Optional[str] = ..., sequence: _Optional[int] = ..., message_id: _Optional[str] = ..., snippet: _Optional[str] = ..., session_title: _Optional[str] = ..., role: _Optional[_Union[Role, str]] = ...) -> None: ...

class ExportTarget(_message.Message):
    __slots__ = ("provider", "model", "reasoning")
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    REASONING_FIELD_NUMBER: _ClassVar[int]
    provider: str
    model: str
    reasoning: ReasoningPolicy
    def __init__(self, provider: _Optional[str] = ..., model: _Optional[str] = ..., reasoning: _Optional[_Union[ReasoningPolicy, str]] = ...) -> None: ...
