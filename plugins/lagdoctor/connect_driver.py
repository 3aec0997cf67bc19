"""The driver of lagdoctor's Spark Connect server (lagdoctor.connectserver): a Spark
application with the Connect plugin, alive until TERM.

Not `SparkConnectServer`: that class turns artifact isolation on, so every client
session gets a class loader of its own, and Spark keys its compiled-code cache by
class loader: each warm diagnosis compiled its ~205 generated classes again
(measured: 2,000 x 10 warm in 17-18 s against 10-11 s here, the same findings).
The sessions here share the application's class loader; they send plans, never
classes or artifacts (the job's one Python function, series.py's aggregates, travels
pickled by value inside the plan).
"""

from __future__ import annotations

import signal
import sys
import time

READY_LINE = "Spark Connect server started"  # lagdoctor.connectserver waits for it


def main() -> int:
    from pyspark.sql import SparkSession

    SparkSession.builder.getOrCreate()  # the plugin starts the gRPC service with the context
    print(READY_LINE, flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    sys.exit(main())
