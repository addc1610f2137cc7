"""A streaming copy, tidelog to tidelog, in a process of its own, for the kill -9 test
(``test_sink_kill.py``): ``python sink_query.py SOURCE SINK CHECKPOINT``.

Copies stream "input" of SOURCE into "output" of SINK with ``Trigger.AvailableNow``, 1,000
offsets per micro-batch, chunks of 100 records, and a UDF that sleeps 2 ms per row so that a
micro-batch takes long enough to be killed in the middle.
"""

from __future__ import annotations

import sys

from pyspark.sql import SparkSession
from pyspark.sql.functions import col, udf
from pyspark.sql.types import BinaryType

from tidelog.spark import TidelogDataSource

MAX_OFFSETS_PER_TRIGGER = 1000
CHUNK_RECORDS = 100


def pause(value):  # type: ignore[no-untyped-def]  # type hints would make it a pandas UDF
    import time

    time.sleep(0.002)
    return value


def main(source: str, sink: str, checkpoint: str) -> None:
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("tidelog-sink-kill")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(TidelogDataSource)
    query = (
        spark.readStream.format("tidelog")
        .option("servers", source)
        .option("stream", "input")
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(MAX_OFFSETS_PER_TRIGGER))
        .load()
        .select(udf(pause, BinaryType())(col("value")).alias("value"))
        .writeStream.format("tidelog")
        .option("servers", sink)
        .option("stream", "output")
        .option("maxChunkRecords", str(CHUNK_RECORDS))
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    print("started", flush=True)
    query.awaitTermination()


if __name__ == "__main__":
    main(*sys.argv[1:4])
