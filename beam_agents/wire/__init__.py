"""The wire: beam_agents' bytes, before any meaning is given to them.

It owns the protobuf wire format at the level of fields (`fields`: varints, length-delimited
sequences, fields stripped from a sender's exact bytes), the decoding of bytes whose message
type is unknown (`decoding`, for operator tools), and how Beam carries the messages (`beam_support`:
the coders of typed PCollections, timer timestamps).

It may import only the bottom layer: `beam_agents.errors` and the bindings
(`beam_agents._protos`). Every other package builds on it (`beam_agents/layout_test.py`).
"""
