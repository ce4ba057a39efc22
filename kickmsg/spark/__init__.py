"""PySpark integration: channels as Spark data sources, driver telemetry.

Needs the ``spark`` extra (pyspark 4, pyarrow, pandas < 3) and Java 17+.
"""
import os
import sys

from pyspark.sql import SparkSession

from kickmsg.spark.source import KickmsgDataSource
from kickmsg.spark.telemetry import DriverTelemetry

__all__ = ["DriverTelemetry", "KickmsgDataSource", "register", "session"]

LOG_CONFIG = os.path.join(os.path.dirname(__file__), "log4j2.properties")  # errors only


def register(spark: SparkSession) -> None:
    """Make ``format("kickmsg")`` available on ``spark``."""
    spark.dataSource.register(KickmsgDataSource)


def session(master: str = "local[*]", app_name: str = "kickmsg") -> SparkSession:
    """A SparkSession whose Python workers run this interpreter (so they can
    import kickmsg), with the data source registered. On a cluster, build
    your own session and call ``register``."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # read when the JVM starts Python workers
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # one host: no need to look for a public interface
    spark = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile={LOG_CONFIG}")
        .config("spark.pyspark.python", sys.executable)
        .config("spark.pyspark.driver.python", sys.executable)
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark
