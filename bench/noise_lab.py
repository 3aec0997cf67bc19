"""Noise lab (issue 29): what Slack hears from a loop left on.

`make airflow`'s live incidents are played on the embedded Kafka, swept by
Airflow at the default cadence (one sweep a minute) for --incident-minutes,
then every incident is mended (healthy consumers in the same groups, the surge
back to its baseline) and the cluster stays healthy for --healthy-minutes.
Each checkout given runs its own `python -m lagdoctor.lab.standalone
--no-workloads` (its own broker, Airflow and Spark Connect server, its own
code on PYTHONPATH); the workloads are this checkout's, so every side plays
the same incidents at the same moments. With --before, both sides run at
once on this machine: the same load on both.

Per incident it prints, for each side:
  messages           top-level / replies while the incident lasts
  repeats            replies that say nothing new: the text, digits masked,
                     already said in the same thread
  short history      verdicts given on fewer than 3 snapshots (anything but
                     collecting_history or a provisional finding)
  false healthy      healthy verdicts on the incident's group once it has
                     lasted a minute (false alarms on the healthy group)
  own actions        findings within 30 min of one of lagdoctor's own real
                     actions on the group without own_actions in evidence
  first right        minutes from onset to the first message naming the cause
  healthy half       messages after the mend: recoveries / anything else

    python bench/noise_lab.py                                # this checkout, 30 + 30 min
    python bench/noise_lab.py --before ../wt-before          # beside the commit before issue 29
    python bench/noise_lab.py --analyse .noise-lab/now .noise-lab/before   # tables again
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "plugins"))

MIN_HISTORY = 3  # snapshots a verdict needs (thresholds.min_history_snapshots)
ONSET_GRACE_S = 60.0  # a healthy verdict this long after onset is false
ATTRIBUTION_S = 1800.0  # findings this long after an own action should say so (remediation/postcheck)
CRASH_AFTER_S = 15.0
SURGE_AFTER_UP_S = 140.0  # as `make airflow`: 120 s after the first sweep, which starts ~20 s after Airflow is up
NO_PROBLEM = {"healthy", "collecting_history"}


def say(message: str) -> None:
    print(f"[noise-lab {time.strftime('%H:%M:%S')}] {message}", flush=True)


# -- playing ------------------------------------------------------------------------------------

@dataclass
class Side:
    name: str
    checkout: Path
    workdir: Path
    port: int
    events: dict[str, float] = field(default_factory=dict)
    error: str | None = None


def _watch_output(proc: subprocess.Popen, log_path: Path, side: Side, seen: dict[str, threading.Event],
                  found: dict[str, str]) -> None:
    patterns = {"broker": re.compile(r"embedded broker at (\S+)"), "up": re.compile(r"Airflow is up")}
    with open(log_path, "w", encoding="utf-8") as log:
        for line in proc.stdout:
            log.write(line)
            log.flush()
            for key, pattern in patterns.items():
                m = pattern.search(line)
                if m and not seen[key].is_set():
                    found[key] = m.group(1) if m.groups() else line.strip()
                    side.events[key] = time.time()
                    seen[key].set()


def _wait(event: threading.Event, proc: subprocess.Popen, what: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not event.wait(2):
        if proc.poll() is not None:
            raise RuntimeError(f"the standalone exited ({proc.returncode}) before {what}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"no {what} in {timeout_s:.0f} s")


def mend(incidents: list, bootstrap: str) -> None:
    """Every incident fixed as an operator would: healthy consumers, the surge ended."""
    from lagdoctor.lab.workload import ConsumerProcess

    for inc in incidents:
        if inc.expect == "healthy":
            continue
        if inc.expect == "producer_surge":
            inc.producer.rate = inc.produce_rate
            continue
        for member in inc.consumers:
            member.stop()
        inc.consumers = [ConsumerProcess(bootstrap, inc.group, inc.topic, client_id=f"{inc.group}-mended-{i}").start()
                         for i in range(1, len(inc.members) + 1)]


def play(side: Side, incident_s: float, healthy_s: float) -> None:
    """One side's whole run; side.events gets the wall-clock time of each moment, lab.json all of it."""
    from lagdoctor.lab.demo import CRASHED_GROUP, kill_consumer, live_incidents, start_workloads, stop_workloads, surge

    side.workdir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(side.checkout / "plugins"),
                                                        os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    env.pop("SLACK_BOT_TOKEN", None)  # the local outbox is what the lab counts
    cmd = [sys.executable, "-m", "lagdoctor.lab.standalone", "--workdir", str(side.workdir),
           "--port", str(side.port), "--no-workloads"]
    proc = subprocess.Popen(cmd, cwd=side.checkout, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    seen = {"broker": threading.Event(), "up": threading.Event()}
    found: dict[str, str] = {}
    threading.Thread(target=_watch_output, args=(proc, side.workdir / "standalone.log", side, seen, found),
                     daemon=True).start()
    incidents = live_incidents(CRASH_AFTER_S)
    try:
        _wait(seen["broker"], proc, "embedded broker", 300)
        bootstrap = found["broker"]
        start_workloads(bootstrap, incidents)
        side.events["workloads"] = time.time()
        time.sleep(CRASH_AFTER_S)
        kill_consumer(incidents, CRASHED_GROUP)
        side.events["crash"] = time.time()
        _wait(seen["up"], proc, "healthy Airflow", 1200)
        say(f"{side.name}: Airflow up; incidents for {incident_s / 60:.0f} min")
        surge_at = side.events["up"] + SURGE_AFTER_UP_S
        fixed_at = side.events["up"] + incident_s
        while time.time() < fixed_at:
            if "surge" not in side.events and time.time() >= surge_at:
                surge(incidents)
                side.events["surge"] = time.time()
            if proc.poll() is not None:
                raise RuntimeError(f"the standalone exited ({proc.returncode}) mid-run")
            time.sleep(1)
        mend(incidents, bootstrap)
        side.events["mended"] = time.time()
        say(f"{side.name}: incidents mended; healthy for {healthy_s / 60:.0f} min")
        while time.time() < side.events["mended"] + healthy_s:
            if proc.poll() is not None:
                raise RuntimeError(f"the standalone exited ({proc.returncode}) mid-run")
            time.sleep(1)
        side.events["end"] = time.time()
    except Exception as exc:  # noqa: BLE001 (said in the table)
        side.error = " ".join(str(exc).split())
        say(f"{side.name}: {side.error}")
    finally:
        stop_workloads(incidents)  # before the broker goes: a producer's flush waits on it
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(120)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        commit = subprocess.run(["git", "-C", str(side.checkout), "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True).stdout.strip()
        (side.workdir / "lab.json").write_text(json.dumps({
            "side": side.name, "checkout": str(side.checkout), "commit": commit, "events": side.events,
            "error": side.error, "incidents": [{"group": i.group, "expect": i.expect} for i in incidents],
        }, indent=1))


# -- reading a run --------------------------------------------------------------------------------

def masked(text: str) -> str:
    """A reply's text with every number masked: what it says, not the figures it says it with."""
    return re.sub(r"\d[\d,.:]*", "#", text.lower())


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _epoch(iso: str | None) -> float | None:
    if not iso:
        return None
    t = datetime.fromisoformat(str(iso).replace("Z", "+00:00"))
    return (t if t.tzinfo else t.replace(tzinfo=timezone.utc)).timestamp()


def read_findings(data_root: Path) -> list[dict[str, Any]]:
    """Every complete run's findings, each with `_t` (its window's end, epoch s)."""
    out = []
    for path in sorted(data_root.glob("findings/*/findings.jsonl")):
        if not (path.parent / "_SUCCESS").exists():
            continue
        for f in read_jsonl(path):
            f["_t"] = _epoch(f.get("window_end"))
            out.append(f)
    return out


def read_own_actions(data_root: Path) -> list[dict[str, Any]]:
    """lagdoctor's own real changes (not dry runs), from its audit log."""
    db = data_root / "state" / "lagdoctor.db"
    if not db.exists():
        return []
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT ts, action, group_id FROM action_log WHERE dry_run = 0 AND status = 'executed'")
        return [{"t": _epoch(ts), "action": action, "group_id": group} for ts, action, group in rows]


def onsets(lab: dict[str, Any]) -> dict[str, float]:
    ev = lab["events"]
    out = {}
    for inc in lab["incidents"]:
        if inc["expect"] == "crashed_consumer":
            out[inc["group"]] = ev.get("crash", ev.get("workloads", 0.0))
        elif inc["expect"] == "producer_surge":
            out[inc["group"]] = ev.get("surge", float("inf"))
        else:
            out[inc["group"]] = ev.get("workloads", 0.0)
    return out


def about(text: str, groups: dict[str, str]) -> str:
    """The one incident group a top-level message names; "(other)" for none or several (a notice)."""
    named = [g for g in groups if re.search(rf"(?<![\w-]){re.escape(g)}(?![\w-])", text)]
    return named[0] if len(named) == 1 else "(other)"


def analyse(workdir: Path) -> dict[str, Any]:
    """The figures of one played run, per incident group (and "(other)" for messages about none)."""
    lab = json.loads((workdir / "lab.json").read_text())
    data_root = workdir / "lagdoctor"
    posts = read_jsonl(data_root / "outbox" / "slack.jsonl")
    findings = read_findings(data_root)
    actions = read_own_actions(data_root)
    groups = {i["group"]: i["expect"] for i in lab["incidents"]}
    onset = onsets(lab)
    mended = lab["events"].get("mended", float("inf"))
    roots = {p["ts"]: about(p["text"], groups) for p in posts if not p.get("thread_ts")}

    def blank() -> dict[str, Any]:
        return {"top_level": 0, "replies": 0, "repeats": 0, "short_history": 0, "false_healthy": 0,
                "false_alarms": 0, "unattributed": 0, "own_actions": 0, "first_right_min": None,
                "healthy_recoveries": 0, "healthy_other": 0, "sweeps": 0}

    table = {g: blank() for g in groups}
    table["(other)"] = blank()
    said: dict[str, set[str]] = {}
    for p in sorted(posts, key=lambda p: float(p["ts"])):
        t = float(p["ts"])
        thread = p.get("thread_ts") or p["ts"]
        group = roots.get(thread, "(other)")
        row = table[group]
        if t >= mended:
            if re.search(r"\brecover", p["text"], re.I):
                row["healthy_recoveries"] += 1
            else:
                row["healthy_other"] += 1
            continue
        if p.get("thread_ts"):
            row["replies"] += 1
            seen = said.setdefault(thread, set())
            key = masked(p["text"])
            row["repeats"] += key in seen
            seen.add(key)
        else:
            row["top_level"] += 1
        cause = groups.get(group, "")
        text = p["text"].lower()
        if (group in onset and row["first_right_min"] is None and cause not in NO_PROBLEM
                and (cause in text or cause.replace("_", " ") in text) and "deciding between" not in text):
            row["first_right_min"] = round((t - onset[group]) / 60.0, 1)
    for f in findings:
        group = f.get("group_id")
        if group not in groups or f["_t"] is None or f["_t"] >= mended:
            continue
        row = table[group]
        row["sweeps"] += 1
        ev = f.get("evidence") or {}
        decided = f.get("diagnosis") != "collecting_history" and f.get("provisional") is not True
        if decided and (ev.get("snapshots") or 0) < MIN_HISTORY:
            row["short_history"] += 1
        lasting = f["_t"] >= onset[group] + ONSET_GRACE_S
        if groups[group] != "healthy" and f.get("diagnosis") == "healthy" and lasting:
            row["false_healthy"] += 1
        if groups[group] == "healthy" and decided and f.get("diagnosis") not in NO_PROBLEM:
            row["false_alarms"] += 1
        if any(a["group_id"] == group and 0 <= f["_t"] - a["t"] <= ATTRIBUTION_S for a in actions) \
                and f.get("diagnosis") not in NO_PROBLEM:
            row["own_actions"] += 1
            row["unattributed"] += not ev.get("own_actions")
    return {"lab": lab, "table": table, "actions_run": len(actions), "posts": len(posts)}


# -- printing -------------------------------------------------------------------------------------

ROWS = [
    ("messages (top-level / replies)", lambda r: f"{r['top_level']} / {r['replies']}", "1 / <=5"),
    ("replies saying nothing new", lambda r: str(r["repeats"]), "0"),
    ("verdicts on < 3 snapshots", lambda r: str(r["short_history"]), "0"),
    ("false healthy (false alarms)", lambda r: f"{r['false_healthy']} ({r['false_alarms']})", "0 (0)"),
    ("own-action findings unattributed", lambda r: f"{r['unattributed']} of {r['own_actions']}", "0"),
    ("first right message, min after onset", lambda r: "-" if r["first_right_min"] is None else f"{r['first_right_min']:g}", ""),
    ("healthy half: recoveries / other", lambda r: f"{r['healthy_recoveries']} / {r['healthy_other']}", "<=1 / 0"),
]


def render(results: list[dict[str, Any]]) -> str:
    names = [f"{r['lab']['side']} {r['lab']['commit']}" for r in results]
    lines = []
    for r, name in zip(results, names):
        ev = r["lab"]["events"]
        span = lambda a, b: f"{(ev[b] - ev[a]) / 60:.0f}" if a in ev and b in ev else "?"  # noqa: E731
        lines.append(f"{name}: Airflow up {span('workloads', 'up')} min after the workloads; incidents "
                     f"{span('up', 'mended')} min, healthy {span('mended', 'end')} min; {r['posts']} Slack "
                     f"messages; own real actions {r['actions_run']}"
                     + (f"; stopped early: {r['lab']['error']}" if r["lab"].get("error") else ""))
    groups = list(results[0]["table"])
    width = max(len(label) for label, _, _ in ROWS)
    for group in groups:
        expect = next((i["expect"] for i in results[0]["lab"]["incidents"] if i["group"] == group), "")
        lines.append("")
        lines.append(f"{group}" + (f" ({expect})" if expect else " (messages about no incident group)"))
        lines.append(f"  {'':<{width}}  " + "  ".join(f"{n:>16}" for n in names) + f"  {'goal':>8}")
        for label, cell, goal in ROWS:
            if expect in ("healthy", "") and label.startswith("messages"):
                goal = "0 / 0" if expect else "-"  # the healthy group hears nothing; a notice has no goal here
            values = [cell(r["table"].get(group) or {}) if r["table"].get(group) else "-" for r in results]
            lines.append(f"  {label:<{width}}  " + "  ".join(f"{v:>16}" for v in values) + f"  {goal:>8}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--incident-minutes", type=float, default=30.0)
    parser.add_argument("--healthy-minutes", type=float, default=30.0)
    parser.add_argument("--before", type=Path, help="a checkout of the commit to compare with, run beside this one")
    parser.add_argument("--workdir", type=Path, default=ROOT / ".noise-lab")
    parser.add_argument("--port", type=int, default=8091, help="this side's Airflow port (--before: the next one)")
    parser.add_argument("--analyse", type=Path, nargs="+", help="print the tables of runs already played")
    args = parser.parse_args(argv)
    if args.analyse:
        missing = [str(d) for d in args.analyse if not (d / "lab.json").exists()]
        if missing:
            parser.error(f"no lab.json in {', '.join(missing)}: not a played run")
        print(render([analyse(d) for d in args.analyse]))
        return 0
    if args.incident_minutes <= 0 or args.healthy_minutes < 0:
        parser.error("--incident-minutes must be > 0 and --healthy-minutes >= 0")
    sides = [Side("now", ROOT, args.workdir / "now", args.port)]
    if args.before:
        if not (args.before / "plugins" / "lagdoctor" / "lab" / "standalone.py").exists():
            parser.error(f"{args.before} is not a lagdoctor checkout with lab/standalone.py")
        sides.append(Side("before", args.before.resolve(), args.workdir / "before", args.port + 1))
    for side in sides:
        if side.workdir.exists():
            import shutil

            shutil.rmtree(side.workdir)
    threads = [threading.Thread(target=play, args=(s, args.incident_minutes * 60, args.healthy_minutes * 60))
               for s in sides]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(render([analyse(s.workdir) for s in sides]))
    return 1 if any(s.error for s in sides) else 0


if __name__ == "__main__":
    sys.exit(main())
