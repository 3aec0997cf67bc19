"""Manual backtest: what a range of stored history would have said, with other thresholds beside it."""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG, Param, task

from lagdoctor.backtest import BACKTEST_DAG_ID
from lagdoctor.pipeline import thresholds_param, use_data_root

with DAG(
    dag_id=BACKTEST_DAG_ID,
    description="Replay stored history through the rules and Slack's decisions; nothing is posted or changed.",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,  # one Spark job of many sweeps at a time on this worker
    tags=["lagdoctor", "kafka", "backtest"],
    default_args={"retries": 0, "on_execute_callback": use_data_root},
    params={
        "from": Param("", type="string", minLength=1, title="From (UTC, ISO-8601)",
                      description="The first sweep's end, e.g. 2026-11-20T00:00:00Z."),
        "to": Param("", type=["string", "null"], title="To (UTC, ISO-8601; empty: now)"),
        "step_minutes": Param(1, type="number", exclusiveMinimum=0, maximum=1440, title="A sweep every (minutes)",
                              description="The sweep DAG's cadence by default."),
        "window_minutes": Param(30, type=["integer", "null"], minimum=1, maximum=10080,
                                title="Each sweep's window (minutes)",
                                description="The sweep DAG's window by default; empty with 'as swept': the sweeps' own."),
        "as_swept": Param(False, type="boolean", title="Replay the sweeps that ran",
                          description="The sweeps that really ran in the range, at their own times, instead of one "
                                      "every step: their verdicts beside what the rules say now."),
        "thresholds": thresholds_param(
            "Threshold overrides to try, as a JSON object, e.g. {\"warning_lag\": 5000}. The backtest runs the "
            "current thresholds and these side by side; empty: the current ones alone."),
        "group_pattern": Param("", type=["string", "null"], title="Consumer groups (optional)",
                               description="Regex, full match (RE2); empty for every group."),
        "topic": Param("", type=["string", "null"], title="Topic (optional)"),
        "clusters": Param("", type=["string", "null"], title="Clusters (optional)",
                          description="Connection ids, comma-separated; empty for every cluster in the store."),
    },
    doc_md="""
### Kafka lag backtest

Replays every sweep the range would have had through the same rules, the same
carry from sweep to sweep and the same Slack decisions, in one Spark job, and
writes a report: per threshold set the alerts and replies Slack would have had,
the flips, the verdicts later corrected and the time from the first sign to the
first message naming the settled cause; with overrides, what they change, sweep by
sweep. With "as swept", it replays instead the sweeps that really ran in the
range, at their own times and window: their verdicts beside the rules' now.
Nothing is posted, acted on or written to lagdoctor's state. The report is
on the lag page (Backtests) and in the task's log.
""",
) as dag:

    @task(execution_timeout=timedelta(hours=2))
    def backtest(params=None) -> dict:
        import logging

        from lagdoctor.backtest import run_backtest, summary_text

        p = dict(params or {})
        clusters = [c.strip() for c in str(p.get("clusters") or "").split(",") if c.strip()] or None
        output, report = run_backtest(
            start=p.get("from"), end=p.get("to") or None, step_minutes=float(p.get("step_minutes") or 1),
            window_minutes=float(p["window_minutes"]) if p.get("window_minutes") else None,
            overrides=p.get("thresholds") or None, groups=p.get("group_pattern") or None,
            topic=p.get("topic") or None, clusters=clusters, as_swept=bool(p.get("as_swept")))
        logging.getLogger("lagdoctor").info("%s\nreport: %s/report.html", summary_text(report), output)
        return {"output": output, "sweeps": report["sweeps"],
                "sets": {s["name"]: {"alerts": s["alerts"], "replies": s["replies"]} for s in report["sets"]}}

    backtest()
