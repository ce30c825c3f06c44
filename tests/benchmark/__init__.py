"""Curb's benchmark: `bin/bench` (`python -m benchmark` with tests/ on the path) starts Curb
brokers of its own, drives them from separate load processes, checks every message that
comes back and prints one table of figures, optionally side by side with a reference broker.
`bin/bench-spark` measures the Spark connector (`benchmark.spark`).

It lives under tests/, not in the package: it is a tool for working on Curb, not part of
what `pip install curb` gives an operator."""
