"""A short sessionstore scenario through a Python client generated from
proto/ with grpcio-tools: create, append, export, list, watch, and an error
read from its google.rpc details. Usage: scenario.py GENERATED_DIR HOST:PORT"""

import sys

sys.path.insert(0, sys.argv[1])

import grpc  # noqa: E402
from google.rpc import error_details_pb2, status_pb2  # noqa: E402
from sessionstore.v1 import messages_pb2 as m  # noqa: E402
from sessionstore.v1 import sessionstore_pb2 as s  # noqa: E402
from sessionstore.v1 import sessionstore_pb2_grpc as rpc  # noqa: E402


def check(condition, what):
    if not condition:
        raise SystemExit(f"FAILED: {what}")


channel = grpc.insecure_channel(sys.argv[2])
stub = rpc.SessionStoreStub(channel)

session = stub.CreateSession(
    s.CreateSessionRequest(
        session_id="py-1", title="from Python", system_prompt="Be brief.", user="py"
    ),
    timeout=10,
)
check(session.id == "py-1" and session.revision == 1, f"create: {session}")

thinking = m.ContentBlock(thinking=m.ThinkingBlock(thinking="hmm", signature="sig=="))
appended = stub.AppendExchange(
    s.AppendExchangeRequest(
        session_id="py-1",
        messages=[m.Message(role=m.ROLE_USER, content="hello \u0000 world")],
        provider_call=m.ProviderCall(
            provider="openai", model="gpt-x", prompt_tokens=3, completion_tokens=2,
            cost_micros_usd=7,
        ),
        response_messages=[
            m.Message(role=m.ROLE_ASSISTANT, content="hi", content_blocks=[thinking])
        ],
        request_id="py-req-1",
        expected_next_sequence=0,
    ),
    timeout=10,
)
check(appended.revision == 2 and appended.next_sequence == 2, f"append: {appended}")

exported = [
    msg
    for chunk in stub.ExportHistory(
        s.ExportHistoryRequest(session_id="py-1", include_system_prompt=True), timeout=10
    )
    for msg in chunk.messages
]
check([x.role for x in exported] == [m.ROLE_SYSTEM, m.ROLE_USER, m.ROLE_ASSISTANT],
      f"export roles: {exported}")
check(exported[1].content == "hello \u0000 world", "U+0000 survives the round trip")
check(exported[2].content_blocks[0].thinking.signature == "sig==", "thinking signature kept")

listed = stub.ListSessions(s.ListSessionsRequest(user="py"), timeout=10)
check([x.session.id for x in listed.sessions] == ["py-1"], f"list: {listed}")
check(listed.sessions[0].total_cost_micros_usd == 7, "cost is summed")

kinds = []
for event in stub.WatchSession(s.WatchSessionRequest(session_id="py-1"), timeout=10):
    kinds.append(event.WhichOneof("event"))
    if kinds[-1] == "caught_up":
        break
check(kinds == ["session_created", "exchange_appended", "caught_up"], f"watch: {kinds}")

try:
    stub.AppendExchange(
        s.AppendExchangeRequest(
            session_id="py-1",
            messages=[m.Message(role=m.ROLE_USER, content="late")],
            expected_next_sequence=0,
        ),
        timeout=10,
    )
    check(False, "a stale expected_next_sequence was accepted")
except grpc.RpcError as error:
    check(error.code() == grpc.StatusCode.ABORTED, f"code: {error.code()}")
    details = dict(error.trailing_metadata()).get("grpc-status-details-bin")
    check(details is not None, "the status carries details")
    status = status_pb2.Status.FromString(details)
    info = error_details_pb2.ErrorInfo()
    check(any(d.Unpack(info) for d in status.details), "an ErrorInfo is attached")
    check(info.reason == "SEQUENCE_MISMATCH", f"reason: {info.reason}")
    check(info.metadata["actual_next_sequence"] == "2", f"metadata: {info.metadata}")

print("python scenario ok")
