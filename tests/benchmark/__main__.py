"""`python -m benchmark` (what `bin/bench` runs) runs the benchmark command; importing this module runs nothing."""

from benchmark.cli import main

if __name__ == "__main__":
    main(prog_name="bin/bench")
