"""The API's protobuf messages and enums (package ``sessionstore.v1``), e.g.
``v1.Message(role=v1.ROLE_USER, content="Hi")``. Generated from ``proto/``."""

from ._proto.sessionstore.v1.messages_pb2 import *  # noqa: F401,F403
from ._proto.sessionstore.v1.sessionstore_pb2 import *  # noqa: F401,F403
from ._proto.sessionstore.v1.sessionstore_pb2_grpc import SessionStoreStub  # noqa: F401
