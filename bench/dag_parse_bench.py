"""How long the scheduler spends parsing each DAG file.

Each file is parsed in a fresh interpreter (as the DAG processor does), with
Airflow itself already imported, so the figure is the file's own cost:

    python bench/dag_parse_bench.py [--repeat 5]

Prints, per file, the median seconds over the repeats and the modules the
parse pulled in that a DAG file should not (pyspark, Kafka, Slack, k8s clients).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

DAGS = Path(__file__).resolve().parents[1] / "dags"
HEAVY = ("pyspark", "confluent_kafka", "slack_sdk", "kubernetes", "pandas", "pyarrow")

PROBE = """
import json, sys, time
import airflow.sdk  # the DAG processor has Airflow loaded already
from airflow.dag_processing.dagbag import DagBag
started = time.perf_counter()
bag = DagBag(dag_folder=sys.argv[1])
elapsed = time.perf_counter() - started
heavy = [m for m in {heavy!r} if m in sys.modules]
print(json.dumps({{"seconds": elapsed, "dags": len(bag.dags), "errors": len(bag.import_errors), "heavy": heavy}}))
""".format(heavy=HEAVY)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    worst = 0
    for dag_file in sorted(DAGS.glob("*.py")):
        runs = []
        for _ in range(args.repeat):
            out = subprocess.run([sys.executable, "-c", PROBE, str(dag_file)], capture_output=True, text=True,
                                 timeout=300)
            if out.returncode != 0:
                print(f"{dag_file.name}: failed: {out.stderr.strip().splitlines()[-1:]}")
                return 1
            runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
        median = statistics.median(r["seconds"] for r in runs)
        worst = max(worst, runs[-1]["errors"])
        print(f"{dag_file.name}: {median:.3f} s median parse over {args.repeat} runs, "
              f"{runs[-1]['dags']} DAG(s), {runs[-1]['errors']} import error(s), "
              f"heavy modules: {', '.join(runs[-1]['heavy']) or 'none'}")
    return 1 if worst else 0


if __name__ == "__main__":
    sys.exit(main())
