"""Issue 31's notify figure: `post_findings` for a sweep with nothing new to say, before and after.

    .venv/bin/python bench/notify_scale_bench.py --before /work/wt-before-31
    .venv/bin/python bench/notify_scale_bench.py --before /work/wt-before-31 --before-groups 10000

A sweep of --groups healthy groups (default 10,000) and no open thread, on SQLite and on
PostgreSQL (a throwaway server started as tests/fixtures/postgres.py starts one). Each figure
runs in a fresh process against the plugins of one checkout: this one ("after"), and --before
(a worktree of the code before the change, read only). Counted with SQLAlchemy event listeners
on the state engine: DBAPI connects (the PostgreSQL engine has no pool: one per transaction)
and transactions begun; and how often the state URL was resolved (each may ask Airflow for a
connection). The old code takes minutes at 10,000 groups on PostgreSQL, so "before" runs
--before-groups (default 1,000) and its figures are also shown scaled to --groups.

Goal (issue 31): <= 2 s at 10,000 groups. Figures only, no assertion.
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
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GOAL_S = 2.0

CHILD = textwrap.dedent("""
    import json, os, sys, time
    from datetime import datetime, timezone
    import sqlalchemy as sa
    import airflow.sdk  # loaded in any Airflow task before it runs: not part of the figure
    import lagdoctor.state as state
    from lagdoctor.settings import Settings
    from lagdoctor.stages.notify import post_findings

    counts = {"connects": 0, "transactions": 0, "state_url": 0}
    real_url, real_engine = state.state_url, state.engine_for
    hooked = set()

    def state_url(*a, **kw):
        counts["state_url"] += 1
        return real_url(*a, **kw)

    def engine_for(url):
        engine = real_engine(url)
        if id(engine) not in hooked:
            hooked.add(id(engine))
            sa.event.listen(engine, "connect", lambda *_: counts.__setitem__("connects", counts["connects"] + 1))
            sa.event.listen(engine, "begin", lambda *_: counts.__setitem__("transactions", counts["transactions"] + 1))
        return engine

    state.state_url, state.engine_for = state_url, engine_for
    plans, now = sys.argv[1], datetime(2026, 11, 21, 10, 0, tzinfo=timezone.utc)
    settings = Settings.from_env()
    state.state_db(settings)  # the tables exist before the clock starts, as at every sweep but the first
    counts.update(connects=0, transactions=0, state_url=0)
    start = time.perf_counter()
    summary = post_findings(plans, "scheduled__bench", settings=settings, now=now)
    counts["seconds"] = time.perf_counter() - start
    counts["summary"] = summary
    print("RESULT " + json.dumps(counts))
""")


def healthy(i: int) -> dict:
    return {"cluster": "prod", "group_id": f"bench-group-{i:05d}", "topic": f"bench-topic-{i // 10:04d}",
            "partitions": [], "diagnosis": "healthy", "pattern": "flat", "severity": "ok", "summary": "lag 0",
            "evidence": {"lag_total": 0}, "window_start": "2026-11-21T09:30:00Z",
            "window_end": "2026-11-21T10:00:00Z"}


def write_plans(folder: Path, groups: int) -> Path:
    run = folder / "data" / "findings" / "scheduled__bench"
    run.mkdir(parents=True)
    plans = run / "plans.json"
    plans.write_text(json.dumps([{"finding": healthy(i), "plan": {"actions": [], "next_steps": []}}
                                 for i in range(groups)]))
    return plans


def run_once(checkout: Path, groups: int, state_url: str | None, work: Path) -> dict:
    folder = Path(tempfile.mkdtemp(dir=work))
    plans = write_plans(folder, groups)
    env = {**os.environ, "PYTHONPATH": str(checkout / "plugins"), "PYTHONDONTWRITEBYTECODE": "1",
           "LAGDOCTOR_DATA_ROOT": str(folder / "data"), "AIRFLOW_HOME": str(folder / "airflow"),
           "AIRFLOW__CORE__UNIT_TEST_MODE": "True", "AIRFLOW__CORE__LOAD_EXAMPLES": "False"}
    env.pop("AIRFLOW_CONN_SLACK_API_DEFAULT", None)  # Slack is the local outbox file
    env.pop("LAGDOCTOR_STATE_URL", None)
    if state_url:
        env["LAGDOCTOR_STATE_URL"] = state_url
    out = subprocess.run([sys.executable, "-c", CHILD, str(plans)], env=env, capture_output=True, text=True,
                         timeout=3600)
    line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        raise SystemExit(f"bench child failed: {out.stderr.strip().splitlines()[-1:]}")
    return json.loads(line[len("RESULT "):])


class Postgres:
    """A throwaway PostgreSQL server, as tests/fixtures/postgres.py starts one."""

    def __init__(self, work: Path) -> None:
        sys.path.insert(0, str(ROOT / "plugins"))
        from lagdoctor.lab.postgres import as_server_user, free_port, pg_bin

        self.bindir, self.run = pg_bin(), as_server_user
        if self.bindir is None:
            raise SystemExit("no PostgreSQL binaries (make test installs Debian's postgresql)")
        self.base = work / "pg"
        self.data, sock = self.base / "data", self.base / "sock"
        sock.mkdir(parents=True)
        if os.geteuid() == 0:
            for p in (self.base, sock):
                shutil.chown(p, "postgres")
        self.port = free_port()
        subprocess.run(self.run([str(self.bindir / "initdb"), "-D", str(self.data), "-U", "postgres", "--auth",
                                 "trust", "--no-sync", "-E", "UTF8"]), check=True, capture_output=True, timeout=120)
        options = f"-h 127.0.0.1 -p {self.port} -k {sock} -c fsync=off -c full_page_writes=off"
        subprocess.run(self.run([str(self.bindir / "pg_ctl"), "-D", str(self.data), "-l", str(self.base / "log"),
                                 "-o", options, "-w", "-t", "60", "start"]), check=True, capture_output=True,
                       timeout=90)
        self.n = 0

    def fresh_url(self) -> str:
        import sqlalchemy as sa

        self.n += 1
        name = f"bench_{self.n}"
        admin = sa.create_engine(f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres",
                                 isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
        admin.dispose()
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{name}"

    def stop(self) -> None:
        subprocess.run(self.run([str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w",
                                 "stop"]), capture_output=True, timeout=60)


def show(label: str, groups: int, r: dict, scale: float = 1.0) -> None:
    scaled = "" if scale == 1.0 else f"  (x{scale:g} = {r['seconds'] * scale:7.1f} s, " \
                                     f"{int(r['connects'] * scale):,} connects at the full size)"
    print(f"  {label:<7} {groups:>6,} groups {r['seconds']:8.2f} s  connects {r['connects']:>7,}  "
          f"transactions {r['transactions']:>7,}  state URL resolved {r['state_url']:>6,}{scaled}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--groups", type=int, default=10_000)
    ap.add_argument("--before", type=Path, help="a checkout of the code before the change (read only)")
    ap.add_argument("--before-groups", type=int, default=1_000)
    ap.add_argument("--skip-postgres", action="store_true")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="lagdoctor-notify-bench-"))
    work.chmod(0o755)  # the server runs as `postgres` when we are root
    pg = None if args.skip_postgres else Postgres(work)
    try:
        for backend in ("sqlite", *(() if pg is None else ("postgresql",))):
            print(f"post_findings, every group healthy, no open thread: {backend}")
            url = pg.fresh_url if pg is not None and backend == "postgresql" else (lambda: None)
            if args.before:
                r = run_once(args.before, args.before_groups, url(), work)
                show("before", args.before_groups, r, args.groups / args.before_groups)
            r = run_once(ROOT, args.groups, url(), work)
            show("after", args.groups, r)
            print(f"  goal <= {GOAL_S:g} s at {args.groups:,} groups: {'met' if r['seconds'] <= GOAL_S else 'NOT met'}"
                  f" ({r['summary']})")
    finally:
        if pg is not None:
            pg.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
