"""The Spark page's examples (docs/spark.md, the blocks marked `<!-- example: spark -->`) run as written.

They run in order, in one namespace that holds the shared `spark` session, against two
local brokers: `h1:61613` and `h2:61613` become the brokers' addresses, `r1:61614` a
router's that routes `orders` to both, and the relative
paths given to `path` and `checkpointLocation` move into the test's temporary directory;
nothing else of the text changes. Then the test checks what they did: the batch write's row
and the streaming write's rows reach the brokers, and the consuming query writes each of
them (the write through the router's too), once, to the parquet output.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from pathlib import Path

from readme_examples import Block, all_blocks, example

DEADLINE_S = 180.0
LEAST_SENT = 20  # rows the streaming write must have committed before it is stopped

_ENDPOINT = re.compile(r"\bh([12]):61613\b")
_ROUTER = re.compile(r"\br1:61614\b")
_PATH_OPTION = re.compile(r'(\.option\("(?:path|checkpointLocation)", ")([^"/][^"]*)(")')


def spark_examples() -> list[Block]:
    return [block for block in all_blocks() if example(block).kind == "spark"]


def rewrite(text: str, endpoints: list[str], root: Path, router: str = "r1:61614") -> str:
    """The block as it runs here: brokers h1 and h2 at `endpoints`, the router r1 at `router`,
    relative paths under `root`."""
    text = _ROUTER.sub(router, _ENDPOINT.sub(lambda m: endpoints[int(m.group(1)) - 1], text))
    return _PATH_OPTION.sub(lambda m: f"{m.group(1)}{root / m.group(2)}{m.group(3)}", text)


def wait_for(condition, what: str, queries=()) -> None:
    """Poll `condition` for DEADLINE_S at most; a query that died fails the test at once."""
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        for query in queries:
            assert query.isActive, f"query stopped while waiting for {what}: {query.exception()}"
        assert time.monotonic() < deadline, f"gave up waiting: {what}"
        time.sleep(0.5)


def committed_rows(query) -> int:
    return sum(progress["numInputRows"] for progress in query.recentProgress)


def test_the_rewrite_changes_only_the_endpoints_and_relative_paths(tmp_path):
    text = '.option("endpoints", "h1:61613,h2:61613").option("path", "out").option("checkpointLocation", "ckpt")'
    assert rewrite(text, ["127.0.0.1:1", "127.0.0.1:2"], tmp_path) == (
        f'.option("endpoints", "127.0.0.1:1,127.0.0.1:2").option("path", "{tmp_path}/out")'
        f'.option("checkpointLocation", "{tmp_path}/ckpt")'
    )
    assert rewrite('h11:61613 h1:616130 .option("path", "/data/out")', ["x", "y"], tmp_path) == (
        'h11:61613 h1:616130 .option("path", "/data/out")'
    )
    assert rewrite('.option("router", "r1:61614")', [], tmp_path, "127.0.0.1:3") == '.option("router", "127.0.0.1:3")'


def test_the_spark_examples_run_as_written(spark, brokers, router, tmp_path):
    a, b = brokers
    examples = spark_examples()
    assert len(examples) == 5, "register, consume, a batch write, a streaming write, through a router"
    namespace: dict = {"spark": spark}
    try:
        for block in examples:
            text = rewrite(block.text, [a.endpoint, b.endpoint], tmp_path, f"127.0.0.1:{router}")
            exec(compile(text, block.describe(), "exec"), namespace)
        query, sending = namespace["query"], namespace["sending"]
        assert namespace["df"].count() == 1
        wait_for(lambda: committed_rows(sending) >= LEAST_SENT, f"{LEAST_SENT} rows sent", [query, sending])
        sending.stop()
        sent = committed_rows(sending)  # the rate source counts from 0, with no gaps between batches
        output = tmp_path / "out"

        def consumed() -> list:
            return spark.read.parquet(str(output)).collect() if (output / "_spark_metadata").exists() else []

        def everything_arrived() -> bool:
            bodies = {row.body for row in consumed()}
            return {b"hello", b"routed"} <= bodies and {str(n).encode() for n in range(sent)} <= bodies

        wait_for(everything_arrived, "every sent row in the parquet output", [query])
        query.processAllAvailable()
        query.stop()
        wait_for(lambda: a.is_empty() and b.is_empty(), "both queues acknowledged")
    finally:
        for active in spark.streams.active:
            active.stop()
    rows = consumed()
    assert Counter(row.body for row in rows).most_common(1)[0][1] == 1, "each row once"
    hello = [row for row in rows if row.body == b"hello"]
    assert len(hello) == 1 and hello[0].endpoint in (a.endpoint, b.endpoint)
    routed = [row for row in rows if row.body == b"routed"]
    assert len(routed) == 1 and routed[0].endpoint in (a.endpoint, b.endpoint)
    assert namespace["orders"].isStreaming, "the read through the router loads"
    counter = [row for row in rows if row.body not in (b"hello", b"routed")]
    assert {row.endpoint for row in counter} == {a.endpoint}, "the streaming write goes to h1 only"
    assert len(counter) >= sent >= LEAST_SENT
    assert {str(n).encode() for n in range(sent)} <= {row.body for row in counter}
