"""Curb's benchmark: `python -m curb.bench` (or `bin/bench`) starts Curb brokers of its own,
drives them from separate load processes, checks every message that comes back and prints
one table of figures, optionally side by side with a reference broker."""
