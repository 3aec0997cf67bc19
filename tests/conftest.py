"""Test configuration shared by the whole suite.

Airflow reads its configuration at import time, so its environment is set
here before any test module can import airflow. Fixtures live in
tests/fixtures/, one module per concern (broker, spark, ...).
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

_airflow_home = Path(tempfile.mkdtemp(prefix="lagdoctor-airflow-"))
os.environ.setdefault("AIRFLOW_HOME", str(_airflow_home))
os.environ.setdefault("AIRFLOW__CORE__DAGS_FOLDER", str(ROOT / "dags"))
os.environ.setdefault("AIRFLOW__CORE__PLUGINS_FOLDER", str(ROOT / "plugins"))
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
os.environ.setdefault("AIRFLOW__CORE__UNIT_TEST_MODE", "True")
os.environ.setdefault(
    "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", f"sqlite:///{_airflow_home / 'airflow.db'}"
)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
# spark-submit locates SPARK_HOME through the first python3 on PATH.
os.environ["PATH"] = str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

# py4j logs "Closing down clientserver connection" from __del__ at interpreter
# exit, after pytest has closed the stream it would write to.
logging.getLogger("py4j").setLevel(logging.WARNING)

pytest_plugins = [
    "tests.fixtures.airflow",
    "tests.fixtures.broker",
    "tests.fixtures.k8s",
    "tests.fixtures.objectstore",
    "tests.fixtures.postgres",
    "tests.fixtures.slack",
    "tests.fixtures.spark",
    "tests.fixtures.web",
]


# A test that takes one of these fixtures needs what the marker names, whether or not its
# module says so: `make check` (-m "not broker and not spark ...") must never start them.
MARKER_OF_FIXTURE = {
    "kafka_bootstrap": "broker",
    "spark": "spark", "connect_server": "spark", "connect_job": "spark", "job_runner": "spark",
}


@pytest.hookimpl(tryfirst=True)  # before -m deselects
def pytest_collection_modifyitems(config, items):
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        have = {mark.name for mark in item.iter_markers()}
        for fixture, marker in MARKER_OF_FIXTURE.items():
            if fixture in names and marker not in have:
                item.add_marker(marker)
                have.add(marker)


def pytest_runtest_setup(item):
    from tests.fixtures import spark as spark_fixtures

    spark_fixtures.CURRENT_MARKS = {mark.name for mark in item.iter_markers()}
