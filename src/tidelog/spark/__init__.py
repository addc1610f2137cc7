"""tidelog streams as a Spark data source: ``spark.dataSource.register(TidelogDataSource)``, then
``spark.read.format("tidelog")`` or ``spark.readStream.format("tidelog")`` (see docs/spark.md).

Needs the ``spark`` extra (pyspark, pyarrow). Executors reach the broker over gRPC through
``tidelog.client`` only; nothing here touches broker files.
"""

from tidelog.spark.source import TidelogDataSource

__all__ = ["TidelogDataSource"]
