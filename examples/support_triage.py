"""The support-triage example pipeline, with ordinary Beam pipeline options.

    python examples/support_triage.py                      # the DirectRunner
    python examples/support_triage.py --runner=PrismRunner --prism_location=PATH

Each round is one pipeline: RunAgent runs the agent of beam_agents.examples.support_triage,
ExecuteIntents executes its intents once, a scripted approver answers its approval request;
rounds are chained through the key's exported StateSnapshot, as a message bus would close the
loop in production. The same code is `beam-agents demo`.
"""

import sys

from beam_agents.ops.demo import main

if __name__ == "__main__":
    sys.exit(main())
