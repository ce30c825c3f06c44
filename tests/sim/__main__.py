"""`python -m sim [--broker] ...` (with tests/ on the path; `bin/crashsim` sets it up):
the simulator's command line (sim.runner): the log's workload, or with --broker the
whole broker's."""

import sys

from sim.runner import main

sys.exit(main())
