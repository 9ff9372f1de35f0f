"""Runs RunAgent's generative harness (beam_agents.testing.fuzz) and prints what it finds: for
each search, the invariant each finding breaks, the minimal scenario Hypothesis shrank it to,
and the seed that replays it.

    PYTHONPATH=$PWD:$PWD/migrations .venv/bin/python tools/fuzz_run_agent.py [--examples N]
        [--seed S] [--feature NAME ...] [--all] [--no-shrink]

Without --feature it runs one search per generator feature (the base scenarios plus that
feature: each is seeded from one defect of issue 37, and the oracle is armed for that item),
then two of the base scenarios alone, armed for items 9 and 13 (which ordinary inputs reach).
--all runs one search with every feature, the oracle fully armed. Shrinking runs two
pipelines per step: it takes minutes; --no-shrink reports the first failing scenario. Exit 1
when anything was found.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed

from beam_agents.testing import fuzz
from beam_agents.testing.fuzz_scenarios import FEATURES, OPEN, enabled_features, scenarios


def search(features: frozenset[str], item: int | None, *, examples: int, seed: int, shrink: bool):
    """Scenarios until one breaks an invariant that catches `item` (any invariant when None),
    the oracle armed for that item: the minimal such scenario, its findings, and what other
    scenarios broke on the way (new defects, or open items' others)."""
    last: list = []
    others: dict[str, fuzz.Finding] = {}
    targets = fuzz.CAUGHT_BY.get(item, frozenset(fuzz.INVARIANTS))

    @hypothesis_seed(seed)
    @settings(
        max_examples=examples,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        phases=[Phase.generate, Phase.shrink] if shrink else [Phase.generate],
        print_blob=False,
    )
    @given(scenarios(features))
    def attempt(scenario):
        with tempfile.TemporaryDirectory() as workdir:
            findings = fuzz.check(
                scenario, fuzz.run_both(scenario, workdir), open_items=OPEN - {item}
            )
        if any(f.invariant in targets for f in findings):
            last[:] = [scenario, findings]
            raise AssertionError("\n".join(map(str, findings)))
        for finding in findings:
            others.setdefault(finding.invariant, finding)

    try:
        attempt()
    except AssertionError:
        return last, others
    return None, others


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=fuzz.examples_budget(60))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--feature", action="append", choices=sorted(FEATURES))
    parser.add_argument("--all", action="store_true")
    parser.add_argument("--no-shrink", action="store_true")
    args = parser.parse_args(argv)
    # A failed bundle is a finding, printed once below: not a page of Beam's retries.
    logging.disable(logging.CRITICAL)
    base = enabled_features(frozenset(FEATURES.values()) | OPEN)
    if args.all:
        searches = [("every feature", frozenset(FEATURES), None)]
    else:
        names = args.feature or sorted(FEATURES, key=FEATURES.get)
        searches = [
            (f"{name} (issue 37 item {FEATURES[name]})", base | {name}, FEATURES[name])
            for name in names
        ]
        if not args.feature:
            # Ordinary inputs reach items 9 and 13: the oracle is armed for one at a time.
            searches += [(f"base scenarios (issue 37 item {i})", base, i) for i in (9, 13)]
    found_any = False
    for title, features, item in searches:
        found, others = search(
            features, item, examples=args.examples, seed=args.seed, shrink=not args.no_shrink
        )
        if found:
            found_any = True
            scenario, findings = found
            invariants = sorted({f.invariant for f in findings})
            print(f"== {title}: breaks {', '.join(invariants)} (seed {args.seed})")
            for finding in findings:
                print(f"   {finding}")
            print(f"   minimal scenario: {scenario!r}")
        else:
            print(f"== {title}: nothing found in {args.examples} scenarios (seed {args.seed})")
        for invariant, finding in sorted(others.items()):
            found_any = True
            print(f"   also broken on the way: {invariant}: {finding}")
        sys.stdout.flush()
    return 1 if found_any else 0


if __name__ == "__main__":
    sys.exit(main())
