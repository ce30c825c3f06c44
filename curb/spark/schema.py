"""The row shapes of the `curb` format, and Arrow record batches built to match them exactly.

Readers hand Spark Arrow batches rather than Python tuples: Spark checks a batch's schema
against the declared one and skips its slow per-value conversion.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

# Rows per Arrow batch a reader hands Spark: large enough to amortise the hand-over, small
# enough that a task's memory does not grow with its partition.
ROWS_PER_BATCH = 4096

HEADERS = MapType(StringType(), StringType())

MESSAGE_SCHEMA = StructType(
    [
        StructField("endpoint", StringType(), False),
        StructField("seq", LongType(), False),
        StructField("message_id", StringType(), False),
        StructField("headers", HEADERS, False),
        StructField("body", BinaryType(), False),
    ]
)

LOG_SCHEMA = StructType(
    [
        StructField("file", StringType(), False),
        StructField("id", LongType(), False),
        StructField("state", StringType(), False),
        StructField("deliveries", IntegerType(), False),
        StructField("timestamp", TimestampType(), False),
        StructField("offset", LongType(), False),
        StructField("headers", HEADERS, False),
        StructField("body", BinaryType(), False),
    ]
)


def record_batch(schema: StructType, columns: Sequence[list[object]]) -> pa.RecordBatch:
    """An Arrow batch with exactly the Arrow schema Spark derives from `schema` (timestamps in microseconds)."""
    arrow_schema = to_arrow_schema(schema, timezone="UTC")
    return pa.RecordBatch.from_arrays(
        [pa.array(values, type=field.type) for values, field in zip(columns, arrow_schema, strict=True)],
        schema=arrow_schema,
    )
