"""`python -m beam_agents.demo`: the demo's command line (`beam_agents.demo.command`)."""

import sys

from beam_agents.demo.command import main

sys.exit(main())
