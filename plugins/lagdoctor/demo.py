"""`make demo`: lagdoctor on the embedded broker, end to end as far as it is built.

Stage one: start the embedded broker, play a workload in which one partition's
owner falls behind, take offset snapshots while it runs, and print the
describe table and where the snapshots are.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

TOPIC = "orders"
GROUP = "orders-processor"
SLOW_PARTITION = 1


def say(message: str) -> None:
    print(f"[demo] {message}", flush=True)


def run_stage_one(data_root: Path, samples: int, interval_s: float) -> int:
    from lagdoctor.broker import EmbeddedBroker
    from lagdoctor.collector import collect_snapshot
    from lagdoctor.describe import render_describe
    from lagdoctor.kafka_clients import admin_client
    from lagdoctor.store import write_snapshot
    from lagdoctor.workload import SteadyProducer, ThrottledConsumer, create_topic

    snapshots_root = str(data_root / "snapshots")
    say("This is stage one of the demo: broker, live workload, offset snapshots.")
    say("Diagnosis, runbooks and Slack come with the next stages.")
    say("starting the embedded Kafka-compatible broker (Tansu) ...")
    with EmbeddedBroker(log_path=data_root / "broker.log") as broker:
        say(f"broker ready at {broker.bootstrap}")
        create_topic(broker.bootstrap, TOPIC, 3)
        producer = SteadyProducer(broker.bootstrap, TOPIC, [0, 1, 2], rate_per_partition=40).start()
        consumer = ThrottledConsumer(
            broker.bootstrap, GROUP, TOPIC, client_id="orders-worker-1", max_rate={SLOW_PARTITION: 8}
        ).start()
        try:
            say(f"producing 40 msg/s to each partition of '{TOPIC}'; group '{GROUP}' "
                f"processes partition {SLOW_PARTITION} at 8 msg/s")
            if not consumer.assigned.wait(30):
                say("the consumer was not assigned partitions within 30 s")
                return 1
            admin = admin_client(broker.bootstrap)
            table = None
            for i in range(samples):
                time.sleep(interval_s)
                now = datetime.now(timezone.utc)
                table = collect_snapshot(admin, "local", None, now, bootstrap=broker.bootstrap)
                path = write_snapshot(table, snapshots_root, "local", now)
                lags = {r["partition"]: r["lag"] for r in table.to_pylist() if r["group_id"] == GROUP}
                say(f"snapshot {i + 1}/{samples}: lag by partition {lags} -> {Path(path).name}")
        finally:
            consumer.stop()
            producer.stop()
        print()
        print(render_describe(r for r in table.to_pylist() if r["group_id"] == GROUP))
        print()
    say(f"{samples} snapshots written under {snapshots_root}")
    say("(Tansu reports live groups as STABLE with no member list, so CONSUMER-ID and HOST show '-'.)")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lagdoctor.demo")
    parser.add_argument("--data-root", default=".demo/lagdoctor")
    parser.add_argument("--samples", type=int, default=6)
    parser.add_argument("--interval-seconds", type=float, default=5.0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    data_root = Path(args.data_root).resolve()
    data_root.mkdir(parents=True, exist_ok=True)
    try:
        return run_stage_one(data_root, args.samples, args.interval_seconds)
    except KeyboardInterrupt:
        say("interrupted; everything started has been stopped")
        return 130


if __name__ == "__main__":
    sys.exit(main())
