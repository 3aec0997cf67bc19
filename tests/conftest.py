"""Test configuration shared by the whole suite.

Airflow reads its configuration at import time, so its environment is set
here before any test module can import airflow. Fixtures live in
tests/fixtures/, one module per concern (broker, spark, ...).
"""

from __future__ import annotations

import json
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
    "spark": "spark", "connect_server": "spark", "warm_engine": "spark", "connect_job": "spark", "job_runner": "spark",
    "spark_standalone": "spark",
}


# `make test` runs the files on several processes, longest first, so that no process begins the
# topology's minutes when the others are done: each file's seconds as last measured
# (tests/durations.json: `make test PYTEST_ARGS=--write-durations` writes it), or for a file not
# measured yet, a rough cost per test of each kind.
DURATIONS = ROOT / "tests" / "durations.json"
COST_OF_MARKER = {"topology": 30.0, "airflow": 8.0, "spark": 4.0, "broker": 2.0}


@pytest.hookimpl(tryfirst=True)  # before -m deselects
def pytest_collection_modifyitems(config, items):
    measured = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
    cost: dict[str, float] = {}
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        have = {mark.name for mark in item.iter_markers()}
        for fixture, marker in MARKER_OF_FIXTURE.items():
            if fixture in names and marker not in have:
                item.add_marker(marker)
                have.add(marker)
        path = item.nodeid.split("::")[0]
        cost[path] = cost.get(path, 0.0) + max((c for m, c in COST_OF_MARKER.items() if m in have), default=0.1)
    cost.update((path, seconds) for path, seconds in measured.items() if path in cost)
    items.sort(key=lambda item: -cost[item.nodeid.split("::")[0]])  # stable: each file keeps its own order


def pytest_addoption(parser):
    parser.addoption("--write-durations", action="store_true",
                     help="write each test file's seconds to tests/durations.json (the order `make test` runs them in)")


class _FileSeconds:
    """Each file's seconds (setup, call and teardown of its tests), written at the end of the run."""

    def __init__(self):
        self.seconds: dict[str, float] = {}

    def pytest_runtest_logreport(self, report):
        path = report.nodeid.split("::")[0]
        self.seconds[path] = self.seconds.get(path, 0.0) + report.duration

    def pytest_sessionfinish(self, session, exitstatus):
        # a run of some files updates those: the others keep what they last measured
        seconds = {**(json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}), **self.seconds}
        ranked = sorted(seconds.items(), key=lambda kv: -kv[1])
        DURATIONS.write_text(json.dumps({path: round(s) for path, s in ranked}, indent=0) + "\n")


def pytest_configure(config):
    # on the controlling process only: under xdist it receives every worker's reports
    if config.getoption("--write-durations") and not hasattr(config, "workerinput"):
        config.pluginmanager.register(_FileSeconds(), "lagdoctor-file-seconds")


def pytest_runtest_setup(item):
    from tests.fixtures import spark as spark_fixtures

    spark_fixtures.CURRENT_MARKS = {mark.name for mark in item.iter_markers()}
