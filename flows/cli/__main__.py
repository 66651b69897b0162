"""`python -m gymfoundry.flows.cli`: the `gymfoundry` command."""

import sys

from gymfoundry.flows.cli import main

sys.exit(main())
