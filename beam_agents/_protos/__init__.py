"""Python bindings of protos/beam_agents.proto (package beam_agents.v1).

beam_agents_pb2.py and beam_agents_pb2.pyi are generated and committed; regenerate them with
`bazel run //tools:gen_proto` (without Bazel: `python tools/gen_proto.py`). This module only
re-exports the top-level messages so callers never import the generated module by name.
"""

from beam_agents._protos.beam_agents_pb2 import (
    ActivationErrorRecord,
    AgentEnvelope,
    Continuation,
    LlmCacheBlob,
    MemoryBlob,
    StateSnapshot,
    ToolIntent,
    ToolResult,
    TraceEvent,
)

__all__ = [
    "ActivationErrorRecord",
    "AgentEnvelope",
    "Continuation",
    "LlmCacheBlob",
    "MemoryBlob",
    "StateSnapshot",
    "ToolIntent",
    "ToolResult",
    "TraceEvent",
]
