"""An idle broker's cost: the seconds to import the `curb` command and the resident memory
of a broker that serves nothing.

    bin/bench-idle [--runs 5]

Each run imports `curb.cli` in a fresh interpreter under `python -X importtime` (the
cumulative figure of its last line), then starts `curb -cap 10MiB -addr 127.0.0.1:0`
without -http on an empty log and reads its RSS after a CONNECT got CONNECTED. It prints
the median of the runs and whether the web front's libraries (aiohttp, prometheus_client)
were loaded, which they should not be without -http.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time

from benchmark.broker import CurbBroker, rss_bytes

SETTLE = 0.5
TIMEOUT = 30.0
WEB_LIBRARIES = ("aiohttp", "prometheus_client")


def import_seconds() -> float:
    """Seconds `import curb.cli` takes in a fresh interpreter, as -X importtime counts them."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import curb.cli"], capture_output=True, text=True, check=True
    )
    last = done.stderr.strip().splitlines()[-1]  # "import time: self | cumulative | curb.cli"
    return int(last.split("|")[1]) / 1e6


def web_libraries_loaded() -> list[str]:
    """Which of WEB_LIBRARIES importing curb.cli loads."""
    probe = f"import sys, curb.cli; print(' '.join(n for n in {WEB_LIBRARIES!r} if n in sys.modules))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return done.stdout.split()


def idle_rss() -> int:
    """RSS bytes of a broker on an empty log, SETTLE seconds after its first CONNECTED."""
    with tempfile.TemporaryDirectory(prefix="curb-bench-idle-") as workdir:
        broker = CurbBroker(f"{workdir}/curb.log", "10MiB", TIMEOUT)
        try:
            broker.start()
            time.sleep(SETTLE)
            rss = rss_bytes(broker.pid)
            broker.stop()
        except BaseException:
            broker.kill()
            raise
    return rss


def main() -> None:
    parser = argparse.ArgumentParser(prog="bin/bench-idle", description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    imports = [import_seconds() for _ in range(args.runs)]
    rss = [idle_rss() for _ in range(args.runs)]
    loaded = web_libraries_loaded()
    print(f"import curb.cli: {statistics.median(imports):.3f} s (median of {args.runs}; min {min(imports):.3f} s)")
    print(f"idle RSS after CONNECTED: {statistics.median(rss) / 2**20:.1f} MiB (median of {args.runs})")
    print(f"web libraries loaded without -http: {', '.join(loaded) or 'none'}")


if __name__ == "__main__":
    main()
