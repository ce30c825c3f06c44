"""Curb for Apache Spark (`pip install '.[spark]'` in a checkout): a PySpark data source named `curb`.

from curb.spark import CurbDataSource
spark.dataSource.register(CurbDataSource)

spark.readStream.format("curb").option("endpoints", "h1:61613,h2:61613").load()  # consume
df.write.format("curb").option("endpoints", "h1:61613").mode("append").save()     # produce
spark.read.format("curb").load("path/to/curb.log")                                # inspect a log
"""

from curb.spark.datasource import CurbDataSource

__all__ = ["CurbDataSource"]
