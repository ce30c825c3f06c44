"""`bin/bench-router`: Curb through `curb router` against Curb direct, in the same run.

For each count of instances K (default 1, 2 and 4): start K instances and a router with
one destination over all of them, then
- throughput: `bin/bench`'s pipelined receipted SEND (4 producers x 256 in flight) and
  consume + ACK (prefetch 256) workloads, through the router (its side "curb") and
  direct to the first instance (side "reference"), alternating in one run;
- CPU per message: a fixed load (one client: N pipelined receipted SENDs, then N consumed
  and ACKed) through the router and then direct, with each process's CPU time (user +
  system, from /proc) read before and after, divided by N.

Prints one JSON object per K and a table. A benchmark, not a test: figures depend on the
machine, and on a shared one compare only figures of the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from curb.client import Client
from curb.frame import encode
from curb.spawn import BrokerProcess

WORKLOADS = "produce-4x256,consume-p256"
WINDOW = 256


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def fixed_load(port: int, messages: int, dest: str) -> tuple[float, float]:
    """N pipelined receipted SENDs, then N consumed and ACKed: seconds for each phase."""
    with Client("127.0.0.1", port, timeout=60) as client:
        frames = [encode("SEND", {"destination": dest, "receipt": str(n)}, b"x" * 100) for n in range(messages)]
        began = time.perf_counter()
        for start in range(0, messages, WINDOW):
            for data in frames[start : start + WINDOW]:
                client.write(data)
            client.wait_receipt(str(min(start + WINDOW, messages) - 1))
        sent = time.perf_counter() - began
        client.subscribe("s", destination=dest, prefetch=WINDOW)
        began = time.perf_counter()
        got = 0
        while got < messages:
            frame = client.receive(30)
            if frame is None:
                raise RuntimeError(f"only {got} of {messages} messages came back")
            if frame.command == "MESSAGE":
                got += 1
                client.ack(frame.headers["ack"])
        consumed = time.perf_counter() - began
        client.unsubscribe("s")
    return sent, consumed


def measure(pids: dict[str, int], port: int, messages: int, dest: str) -> dict[str, float]:
    """The fixed load on `port`: msg/s of each phase and CPU microseconds per message of each process."""
    before = {name: cpu_seconds(pid) for name, pid in pids.items()}
    sent, consumed = fixed_load(port, messages, dest)
    after = {name: cpu_seconds(pid) for name, pid in pids.items()}
    result = {"send_per_s": messages / sent, "consume_per_s": messages / consumed}
    for name in pids:
        result[f"{name}_cpu_us_per_msg"] = (after[name] - before[name]) / messages * 1e6
    return result


def bench(router_port: int, direct_port: int, runs: int, messages: int) -> dict[str, dict[str, float]]:
    """bin/bench's two workloads, through the router ("curb") and direct ("reference")."""
    top = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmark",
            "--json",
            "--runs",
            str(runs),
            "--messages",
            str(messages),
            "--only",
            WORKLOADS,
            "--addr",
            f"127.0.0.1:{router_port}",
            "--ref-addr",
            f"127.0.0.1:{direct_port}",
        ],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(top / "tests")},
    )
    rows = json.loads(out.stdout)["rows"]
    return {
        row["key"]: {
            "router": row["curb"]["median"],
            "direct": row["reference"]["median"],
            "share": row["curb"]["median"] / row["reference"]["median"],
        }
        for row in rows
    }


def one(count: int, runs: int, messages: int, workdir: Path) -> dict[str, object]:
    instances = [BrokerProcess(cwd=workdir) for _ in range(count)]
    router = BrokerProcess(cwd=workdir)
    try:
        ports = [
            child.start(["-addr", "127.0.0.1:0", "-file", str(workdir / f"k{count}-{n}.log"), "-cap", "1GiB"])
            for n, child in enumerate(instances)
        ]
        route = "bench=" + ",".join(f"127.0.0.1:{port}" for port in ports)
        router_port = router.start(["router", "-addr", "127.0.0.1:0", "-route", route])
        pids = {"router": router.pid, **{f"instance{n}": child.pid for n, child in enumerate(instances)}}
        through = measure(pids, router_port, messages, "/queue/bench")
        direct = measure({"instance0": instances[0].pid}, ports[0], messages, "/queue/bench")
        return {
            "instances": count,
            "bench": bench(router_port, ports[0], runs, messages),
            "fixed_load_through_router": through,
            "fixed_load_direct": direct,
        }
    finally:
        router.kill()
        for child in instances:
            child.kill()


def table(results: list[dict]) -> str:
    lines = [
        "instances  SEND 4x256 router/direct msg/s    consume+ACK p256 router/direct msg/s   "
        "router CPU us/msg (send+consume)  instance CPU us/msg direct",
    ]
    for r in results:
        b, t, d = r["bench"], r["fixed_load_through_router"], r["fixed_load_direct"]
        send, cons = b["produce-4x256"], b["consume-p256"]
        lines.append(
            f"{r['instances']:>9}  {send['router']:>8,.0f} / {send['direct']:>8,.0f} = {send['share']:.2f}"
            f"    {cons['router']:>8,.0f} / {cons['direct']:>8,.0f} = {cons['share']:.2f}"
            f"    {t['router_cpu_us_per_msg']:>10.1f}"
            f"                  {d['instance0_cpu_us_per_msg']:>10.1f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bin/bench-router", description=__doc__.split("\n\n")[0])
    parser.add_argument("--instances", default="1,2,4", help="counts of instances behind the router (default 1,2,4)")
    parser.add_argument("--runs", type=int, default=3, help="runs of each bin/bench workload (default 3)")
    parser.add_argument("--messages", type=int, default=20000, help="messages per measurement (default 20000)")
    args = parser.parse_args(argv)
    counts = [int(part) for part in args.instances.split(",") if part.strip()]
    results = []
    with tempfile.TemporaryDirectory(prefix="curb-bench-router-") as workdir:
        for count in counts:
            result = one(count, args.runs, args.messages, Path(workdir))
            print(json.dumps(result), flush=True)
            results.append(result)
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
