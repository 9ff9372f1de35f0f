"""The peers benchmark runs, on a tiny budget: beam_agents and every installed peer complete
their keys in interleaved rounds, and after a kill right after the tool's side effect
beam_agents' ledger counts one run of the tool. Skipped when the `peers` extra is not
installed (`pip install 'beam-agents[peers]'`): the script needs LangGraph's SQLite saver and
DBOS to be the benchmark it is. No time is asserted."""

from __future__ import annotations

import pytest

from benchmarks.peers_benchmark import PEERS, kill_check, peers_installed, run

pytestmark = pytest.mark.skipif(
    peers_installed() != list(PEERS),
    reason="the peers extra is not installed (pip install 'beam-agents[peers]')",
)


def test_every_system_completes_its_keys_in_interleaved_rounds(tmp_path):
    systems = ["beam_agents", *PEERS]
    figures = run(systems, keys=3, rounds=1, folder=tmp_path)
    for name in systems:
        assert len(figures[name]["latency"]) == 3 and len(figures[name]["cpu"]) == 1
        assert all(bytes_ >= 0 for bytes_ in figures[name]["bytes"])


def test_beam_agents_runs_the_tool_once_when_killed_right_after_its_side_effect(tmp_path):
    assert kill_check("beam_agents", tmp_path) == (1, b"sent")


def test_a_peer_resumes_the_key_after_the_kill(tmp_path):
    """DBOS re-runs a step that did not record its output: the tool's second run is what the
    benchmark reports, and the key still completes."""
    runs, outcome = kill_check("dbos", tmp_path)
    assert outcome == b"sent" and runs in (1, 2)
