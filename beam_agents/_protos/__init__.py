"""Python bindings of protos/beam_agents.proto (package beam_agents.v1).

beam_agents_pb2.py and beam_agents_pb2.pyi are generated and committed; regenerate them with
`bazel run //tools:gen_proto` (without Bazel: `python tools/gen_proto.py`). This module
re-exports the top-level messages so callers never import the generated module by name.

The .proto registers as "beam_agents.proto" (its import root is protos/, as under Bazel), so
protoc names the generated module "beam_agents_pb2" and every class reports that as its
__module__. No such top-level module exists once installed, and Beam pickles message classes by
reference (ProtoCoder in a pipeline graph, sent to workers), so the classes are re-homed here to
the module they really live in.
"""

from google.protobuf.message import Message

from beam_agents._protos import beam_agents_pb2
from beam_agents._protos.beam_agents_pb2 import (
    ActivationErrorRecord,
    ActivationRecord,
    AgentEnvelope,
    BacktestKeyReport,
    Continuation,
    ExecutionRecord,
    LlmCacheBlob,
    MemoryBlob,
    StateSnapshot,
    ToolIntent,
    ToolResult,
    TraceEvent,
)

__all__ = [
    "ActivationErrorRecord",
    "ActivationRecord",
    "AgentEnvelope",
    "BacktestKeyReport",
    "Continuation",
    "ExecutionRecord",
    "LlmCacheBlob",
    "MemoryBlob",
    "StateSnapshot",
    "ToolIntent",
    "ToolResult",
    "TraceEvent",
]


def _rehome(cls: type[Message]) -> None:
    cls.__module__ = beam_agents_pb2.__name__
    for nested in cls.DESCRIPTOR.nested_types:
        if not nested.GetOptions().map_entry:
            _rehome(getattr(cls, nested.name))


for _name in __all__:
    _rehome(getattr(beam_agents_pb2, _name))
