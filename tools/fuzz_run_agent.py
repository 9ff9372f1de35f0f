"""Runs RunAgent's generative harness (beam_agents.testing.fuzz) and prints what it finds: for
each search, the invariant each finding breaks, the minimal scenario Hypothesis shrank it to,
and the seed that replays it.

    PYTHONPATH=$PWD:$PWD/migrations .venv/bin/python tools/fuzz_run_agent.py [--examples N]
        [--seed S] [--item N ...] [--all] [--no-shrink]

It runs one search per item of issue 37 the harness was seeded from (--item: those only):
the base scenarios plus the generator feature of that item (the base scenarios alone for
items 9 and 13, which ordinary inputs reach), the oracle armed for that item, until a scenario
breaks an invariant that catches it (fuzz.CAUGHT_BY); what other scenarios broke on the way is
printed too.
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
    parser.add_argument("--item", action="append", type=int, choices=sorted(fuzz.CAUGHT_BY))
    parser.add_argument("--all", action="store_true")
    parser.add_argument("--no-shrink", action="store_true")
    args = parser.parse_args(argv)
    # A failed bundle is a finding, printed once below: not a page of Beam's retries.
    logging.disable(logging.CRITICAL)
    base = enabled_features(frozenset(FEATURES.values()) | OPEN)
    feature_of = {item: name for name, item in FEATURES.items()}
    if args.all:
        searches = [("every feature", frozenset(FEATURES), None)]
    else:
        searches = []
        for item in args.item or sorted(fuzz.CAUGHT_BY):
            if item in feature_of:
                name = feature_of[item]
                searches.append((f"{name} (issue 37 item {item})", base | {name}, item))
            else:  # ordinary inputs reach it: the oracle is armed for it alone
                searches.append((f"base scenarios (issue 37 item {item})", base, item))
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
