"""Diagnosis engine: offset history (contract 1) -> findings and partition status (contract 2).

Spark side: `session`, `snapshots` (the store read into Spark; its files
listed and inspected in `store_files`, bad ones moved by `quarantine`),
`features`, `timelag`, `patterns`, `classify`, `status_job`, `output`. Airflow
side: `submit` (builds and runs spark-submit; never imports pyspark).
`thresholds`, `window`, `input_errors` and `store_files` import no pyspark and
are shared by both. Importing this package imports nothing heavy.
"""
