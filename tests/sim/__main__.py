"""`python -m sim` (with tests/ on the path; `bin/crashsim --broker` sets it up): the
whole-broker simulator's command line (sim.driver)."""

import sys

from sim.driver import main

sys.exit(main())
