"""`python -m sim [--broker | --router] ...` (with tests/ on the path; `bin/crashsim`
sets it up): the simulator's command line (sim.runner): the log's workload, with
--broker the whole broker's, with --router a router's."""

import sys

from sim.runner import main

sys.exit(main())
