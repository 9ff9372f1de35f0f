"""beam_agents: LLM agents with durable keyed state on Apache Beam and Google Dataflow.

Each agent (one per entity key) keeps its working memory, LLM replay cache and suspension
continuation as protobuf keyed state in a Beam stateful DoFn. The wire and state schemas are in
protos/beam_agents.proto; `beam_agents._protos` exposes their bindings.
"""

__all__: list[str] = []
