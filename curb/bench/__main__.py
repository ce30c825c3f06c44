"""`python -m curb.bench` runs the benchmark command."""

from curb.bench.cli import main

main()
