"""The spark-submit API the CLI and the DAGs call (no Spark started here)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path


def test_command_follows_contract_2(tmp_path):
    from lagdoctor.diagnosis.submit import build_spark_submit_command

    cmd = build_spark_submit_command("s3a://lake/snapshots", "s3a://lake/findings/run-1",
                                     as_of="2026-11-21T10:00:00Z", window_minutes=30, master="yarn",
                                     thresholds={"warning_lag": 5000}, work_dir=tmp_path)
    assert cmd[0] == "spark-submit" and cmd[cmd.index("--master") + 1] == "yarn"
    script = cmd.index(next(a for a in cmd if a.endswith("spark_jobs/diagnose_lag.py")))
    assert cmd[script + 1:] == ["--snapshots", "s3a://lake/snapshots", "--output", "s3a://lake/findings/run-1",
                                "--as-of", "2026-11-21T10:00:00Z", "--window-minutes", "30",
                                "--warning-lag", "5000"]
    zip_path = cmd[cmd.index("--py-files") + 1]
    names = zipfile.ZipFile(zip_path).namelist()
    # the whole package travels: the job imports the transforms and lagdoctor.status on executors
    assert {"lagdoctor/__init__.py", "lagdoctor/diagnosis/features.py", "lagdoctor/status.py",
            "lagdoctor/contracts.py"} <= set(names)
    assert not any("__pycache__" in n for n in names)


def test_c1_only_for_a_small_window_on_a_local_jvm(tmp_path):
    """C1 only (cheap JIT) when the window's files are small and the master is local; the size
    comes from the window's folders alone, so a week of history outside it does not count."""
    from datetime import datetime, timedelta, timezone

    from lagdoctor.diagnosis.submit import C1_MAX_INPUT_BYTES, build_spark_submit_command, window_input_bytes

    store = tmp_path / "snapshots"
    now = datetime(2026, 11, 21, 12, 0, tzinfo=timezone.utc)
    recent = store / "cluster=prod" / "date=2026-11-21" / "hour=11"
    old = store / "cluster=prod" / "date=2026-11-14" / "hour=11"
    for folder, size in ((recent, 1000), (old, C1_MAX_INPUT_BYTES + 1)):
        folder.mkdir(parents=True)
        (folder / "snapshot-a.parquet").write_bytes(b"x" * size)

    def java_options(master, **window):
        cmd = build_spark_submit_command(str(store), "out", master=master, work_dir=tmp_path, **window)
        return cmd[cmd.index("--driver-java-options") + 1]

    window = {"as_of": now.isoformat(), "window_minutes": 30}
    assert window_input_bytes(str(store), now, 30) == 1000
    assert "-XX:TieredStopAtLevel=1" in java_options("local[2]", **window)
    assert "-XX:TieredStopAtLevel=1" not in java_options("local[2]")  # the whole week: big
    assert "-XX:TieredStopAtLevel=1" not in java_options("spark://spark-master:7077", **window)
    assert "log4j2.configurationFile" in java_options("yarn")
    assert window_input_bytes(str(tmp_path / "missing")) is None
    assert window_input_bytes(str(store), now - timedelta(days=30), 30) == 0


def test_scoped_run_flags():
    from lagdoctor.diagnosis.submit import job_arguments

    assert job_arguments("s", "o", groups="orders-.*", topic="orders") == [
        "--snapshots", "s", "--output", "o", "--groups", "orders-.*", "--topic", "orders"]
    assert "--groups" not in job_arguments("s", "o")  # a sweep is unscoped


def test_environment_puts_this_interpreter_first(tmp_path):
    from lagdoctor.diagnosis.submit import spark_submit_env

    env = spark_submit_env({"PATH": "/usr/bin"}, master="local[2]")
    assert env["PATH"].split(":")[0] == str(Path(sys.executable).parent)
    assert env["PYSPARK_PYTHON"] == sys.executable and env["SPARK_LOCAL_IP"] == "127.0.0.1"


def test_every_threshold_is_a_job_flag():
    from lagdoctor.diagnosis.thresholds import Thresholds

    root = Path(__file__).resolve().parent.parent
    sys.path.insert(0, str(root / "spark_jobs"))
    try:
        import diagnose_lag
    finally:
        sys.path.pop(0)
    args, th = diagnose_lag.parse_args(["--snapshots", "a", "--output", "b", "--critical-lag", "50000",
                                        "--surge-ratio", "3.5"])
    assert th == Thresholds(critical_lag=50_000, surge_ratio=3.5)
    assert (args.as_of, args.window_minutes) == (None, None)


def test_airflow_side_imports_no_pyspark():
    code = ("import sys, lagdoctor.diagnosis.submit, lagdoctor.diagnosis.thresholds, lagdoctor.lab.sim; "
            "sys.exit('pyspark' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_a_job_out_of_memory_says_so_not_that_the_store_failed(capsys):
    """A week's backtest on Spark's default heap failed with 'the store failed while Spark read a
    file (InternalError)': the JVM's stack names InternalError, but the store was never at fault."""
    root = Path(__file__).resolve().parent.parent
    sys.path.insert(0, str(root / "spark_jobs"))
    try:
        import diagnose_lag
    finally:
        sys.path.pop(0)
    error = RuntimeError("Job aborted due to stage failure: Task 5 in stage 23.0 failed 1 times: "
                         "org.apache.spark.memory.SparkOutOfMemoryError: [UNABLE_TO_ACQUIRE_MEMORY] Unable to "
                         "acquire 67108864 bytes of memory\n\tat java.lang.InternalError.<init>")
    assert diagnose_lag.failure_exit(error, "cannot backtest /store") == diagnose_lag.EXIT_FAILED
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot backtest /store: Spark ran out of memory" in err
    assert "store failed" not in err


def test_a_backtest_driver_gets_a_heap_for_its_range():
    from datetime import datetime, timedelta, timezone

    from lagdoctor.backtest import driver_memory

    t0 = datetime(2026, 11, 21, tzinfo=timezone.utc)
    assert [driver_memory(t0, t0 + timedelta(hours=h)) for h in (1, 24, 168, 336)] == ["3g", "3g", "8g", "8g"]
