"""`python -m beam_agents.ops.demo`: the demo's command line (`beam_agents.ops.demo.command`)."""

import sys

from beam_agents.ops.demo.command import main

sys.exit(main())
