"""`python -m pytest_agentcgroup.cli`: the same command line as the `agentcgroup` script."""
import sys

from . import main

sys.exit(main())
