"""`python -m curb.bench` runs the benchmark command; importing this module runs nothing."""

from curb.bench.cli import main

if __name__ == "__main__":
    main()
