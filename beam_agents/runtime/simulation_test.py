"""The deterministic simulation of RunAgent under faults (beam_agents.testing.simulation): every
seed keeps every invariant, a seed replays exactly, and the simulation goes red when a guard of
the runtime or the effector is turned off.

BEAM_AGENTS_SIM_SEEDS sets how many seeds run (default 2000, what .ci/run runs);
BEAM_AGENTS_SIM_SEED runs that one seed, as the replay command of a failure says.
"""

from __future__ import annotations

import os

import pytest

from beam_agents.intents.effector import leases
from beam_agents.runtime import machine, machine_answers
from beam_agents.state.memory import ReplayCache
from beam_agents.testing.simulation import Simulation, SimulationFailure

SEEDS = int(os.environ.get("BEAM_AGENTS_SIM_SEEDS", "2000"))
REPLAY = (
    "BEAM_AGENTS_SIM_SEED={seed} .venv/bin/python -m pytest "
    "beam_agents/runtime/simulation_test.py -q -p no:cacheprovider -k every_seed"
)


def _failures(seeds, limit: int = 5) -> list[str]:
    failures = []
    for seed in seeds:
        try:
            Simulation(seed).run()
        except (Exception, SimulationFailure) as e:  # a crash fails its bundle for ever
            failures.append(f"{type(e).__name__}: {e}\n  replay: {REPLAY.format(seed=seed)}")
            if len(failures) >= limit:
                break
    return failures


def test_every_seed_keeps_the_invariants():
    only = os.environ.get("BEAM_AGENTS_SIM_SEED")
    seeds = [int(only)] if only else range(SEEDS)
    failures = _failures(seeds)
    assert not failures, "\n".join(failures)


def test_a_seed_replays_exactly():
    runs = []
    for _ in range(2):
        sim = Simulation(7)
        sim.run()
        runs.append((sim.step, sim.produced, sim.reached, sim.dead_lettered, sim.committed_content))
    assert runs[0] == runs[1]
    assert runs[0][1] and runs[0][2] and runs[0][3]


def _red(seeds: int = 300) -> str:
    """The first failure among the first seeds (the mutation under test is in place)."""
    failures = _failures(range(seeds), limit=1)
    return failures[0] if failures else ""


def test_it_goes_red_when_the_machine_changes_a_blob_it_read(monkeypatch):
    monkeypatch.setattr(machine.KeyMachine, "_copy", lambda self, blob: blob)
    assert "in place" in _red()


def test_it_goes_red_when_an_answer_is_taken_without_its_signature(monkeypatch):
    monkeypatch.setattr(
        machine_answers, "verify", lambda *args, **kwargs: machine_answers.Verification.VALID
    )
    assert "forged answer" in _red()


def test_it_goes_red_when_a_failed_activations_model_calls_are_not_kept(monkeypatch):
    monkeypatch.setattr(machine.KeyMachine, "_keep_paid", lambda self, work, run, ended: None)
    assert "paid" in _red()


def test_it_goes_red_when_a_replay_drops_the_calls_of_its_own_seq(monkeypatch):
    # A retried start (deferred while its model was busy) and a function agent's resume replay
    # what their seq paid for; reading the cache without its calls, as starts once did, pays
    # again.
    original = ReplayCache.from_blob.__func__

    def from_blob(cls, blob, *, only_touched=False, **limits):
        if only_touched:
            return cls.without_calls(blob, **limits)
        return original(cls, blob, **limits)

    monkeypatch.setattr(ReplayCache, "from_blob", classmethod(from_blob))
    assert "paid again" in _red()


def test_it_goes_red_when_the_effector_waits_for_a_claimant_that_died(monkeypatch):
    monkeypatch.setattr(leases.Leases, "expired", lambda self, claim, now: False)
    failure = _red()
    assert "never answered" in failure


@pytest.mark.parametrize("name", ["_copy"])
def test_the_harness_reports_the_replay_command(monkeypatch, name):
    monkeypatch.setattr(machine.KeyMachine, name, lambda self, blob: blob)
    failure = _red()
    assert "replay: BEAM_AGENTS_SIM_SEED=" in failure
    seed = int(failure.split("BEAM_AGENTS_SIM_SEED=")[1].split()[0])
    with pytest.raises(SimulationFailure):
        Simulation(seed).run()
