"""Diagnosis engine: offset history (contract 1) -> findings and partition status (contract 2).

Spark side: `session`, `snapshots`, `features`, `timelag`, `patterns`,
`classify`, `status_job`, `output`. Airflow side: `submit` (builds and runs
spark-submit; never imports pyspark). `thresholds` is plain Python and shared
by both. Importing this package imports nothing heavy.
"""
