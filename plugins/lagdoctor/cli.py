"""The `lagdoctor` command (contract 4).

Errors are one line on stderr and a non-zero exit; nothing half-written is
left behind. Heavy modules are imported inside the subcommands so `--help`
stays instant.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from datetime import datetime, timezone

log = logging.getLogger("lagdoctor")


class CommandError(Exception):
    """A user-facing failure: printed as one line, exit code 1."""


def _fail(message: str) -> int:
    print(f"lagdoctor: error: {' '.join(message.split())}", file=sys.stderr)
    return 1


# -- broker -------------------------------------------------------------------

def cmd_broker(args: argparse.Namespace) -> int:
    from lagdoctor.kafka.broker import BrokerError, EmbeddedBroker

    if args.brokers < 1:
        raise CommandError(f"--brokers must be at least 1, not {args.brokers}")
    # With several nodes, --port N gives them N, N+1, N+2, ... (the bootstrap lists all).
    broker = EmbeddedBroker(args.port, brokers=args.brokers)
    stop = {"signal": None}

    def on_signal(signum, _frame):
        stop["signal"] = signum

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        broker.start()
    except BrokerError as exc:  # start() has stopped the nodes it spawned
        raise CommandError(str(exc)) from None
    try:
        print(f"ready bootstrap={broker.bootstrap}", flush=True)
        while stop["signal"] is None:
            if not broker.running():
                down = [n.node_id for n in broker.nodes if not n.running()]
                which = f" (node {', '.join(map(str, down))})" if broker.brokers > 1 else ""
                return _fail(f"embedded broker on {broker.bootstrap} exited unexpectedly{which}")
            time.sleep(0.2)
    finally:
        broker.stop()
    return 0


# -- snapshot / describe ------------------------------------------------------

def _admin(args: argparse.Namespace):
    from lagdoctor.kafka.clients import admin_client, read_properties, resolve_bootstrap

    bootstrap = resolve_bootstrap(args.bootstrap_servers)
    extra = read_properties(args.command_config) if args.command_config else None
    return bootstrap, admin_client(bootstrap, extra)


def cmd_snapshot(args: argparse.Namespace) -> int:
    from lagdoctor.kafka.collector import collect_snapshot
    from lagdoctor.kafka.group_listing import compile_group_pattern
    from lagdoctor.settings import Settings
    from lagdoctor.store import write_snapshot

    compile_group_pattern(args.groups, what="--groups")  # a bad regex fails before any network call
    if args.samples < 1:
        raise CommandError("--samples must be at least 1")
    if args.interval_seconds < 0:
        raise CommandError("--interval-seconds must not be negative")
    if args.record_partitions is not None and args.record_partitions < 0:
        raise CommandError("--record-partitions must not be negative")
    settings = Settings.from_env()
    output = args.output or settings.snapshots_root
    record_partitions = settings.record_partitions if args.record_partitions is None else args.record_partitions
    bootstrap, admin = _admin(args)
    for sample in range(args.samples):
        started = time.monotonic()
        now = datetime.now(timezone.utc)
        table = collect_snapshot(admin, args.cluster, args.groups, now, bootstrap=bootstrap,
                                 record_partitions=record_partitions, record_budget_s=settings.record_budget_s)
        path = write_snapshot(table, output, args.cluster, now)
        groups = len(set(table.column("group_id").to_pylist()))
        failed = sum(1 for e in table.column("read_error").to_pylist() if e)
        unknown = f", {failed} rows with read errors (offsets unknown, see read_error)" if failed else ""
        print(f"sample {sample + 1}/{args.samples}: {table.num_rows} rows, {groups} groups{unknown} -> {path}",
              flush=True)
        if sample + 1 < args.samples:
            time.sleep(max(0.0, args.interval_seconds - (time.monotonic() - started)))
    return 0


def cmd_describe(args: argparse.Namespace) -> int:
    from lagdoctor.kafka.collector import collect_snapshot
    from lagdoctor.kafka.describe import read_errors_line, render_describe

    bootstrap, admin = _admin(args)
    table = collect_snapshot(admin, "describe", None, bootstrap=bootstrap, group_ids=[args.group])
    rows = table.to_pylist()
    if not rows:
        raise CommandError(f"consumer group {args.group!r} does not exist or has no offsets at {bootstrap}")
    print(render_describe(rows))
    errors = read_errors_line(rows)
    if errors:
        # The table is printed with "-" for what is unknown; the exit status says it is incomplete.
        return _fail(f"group {args.group!r} at {bootstrap}: {errors}")
    if rows[0]["group_members"] == 0:
        print(f"Consumer group '{args.group}' has no active members.", file=sys.stderr)
    return 0


# -- diagnose -----------------------------------------------------------------

def cmd_diagnose(args: argparse.Namespace, passthrough: list[str]) -> int:
    from lagdoctor.diagnosis.submit import run_connect_process, run_diagnosis

    if args.token_file and not args.remote:
        raise CommandError("diagnose: --token-file goes with --remote")
    if args.remote:
        from lagdoctor.connectserver import TOKEN_ENV, client_url
        from lagdoctor.diagnosis.submit import connect_params

        if args.master:
            raise CommandError("diagnose: --remote and --master exclude each other (the server has its master)")
        if connect_params(args.remote).get("token"):
            raise CommandError("diagnose: a token in --remote is readable by every local user (ps); "
                               "use --token-file or $" + TOKEN_ENV)
        token = os.environ.get(TOKEN_ENV)
        if args.token_file:
            try:
                token = Path(args.token_file).read_text(encoding="utf-8").strip()
            except OSError as exc:
                raise CommandError(f"diagnose: cannot read the token file {args.token_file}: "
                                   f"{exc.strerror or exc}") from None
        try:
            return run_connect_process(args.snapshots, args.output, args.as_of, args.window_minutes,
                                       remote=client_url(args.remote, token), extra_args=passthrough,
                                       capture=False).returncode
        except ValueError as exc:
            raise CommandError(f"diagnose: {exc}") from None
    return run_diagnosis(
        snapshots=args.snapshots,
        output=args.output,
        as_of=args.as_of,
        window_minutes=args.window_minutes,
        master=args.master,
        extra_args=passthrough,
    )


# -- backtest -----------------------------------------------------------------

def cmd_backtest(args: argparse.Namespace) -> int:
    import json

    from lagdoctor.backtest import run_backtest, summary_text

    overrides = {}
    for item in args.set or []:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise CommandError(f"backtest: --set takes NAME=VALUE, not {item!r}")
        overrides[name.strip().replace("-", "_")] = value.strip()
    output, report = run_backtest(
        start=args.start, end=args.to, window_minutes=args.window_minutes, step_minutes=args.step_minutes,
        overrides=overrides or None, groups=args.groups, topic=args.topic,
        clusters=[c.strip() for c in args.clusters.split(",") if c.strip()] if args.clusters else None,
        store=args.snapshots, output=args.output, master=args.master, as_swept=args.as_swept)
    if args.json:
        print(json.dumps({k: v for k, v in report.items() if k != "sweep_list"}, indent=1))
    else:
        print(summary_text(report))
        print(f"report: {output}/report.html")
    return 0


# -- compact ------------------------------------------------------------------

def cmd_compact(args: argparse.Namespace) -> int:
    from lagdoctor.settings import Settings
    from lagdoctor.store import compact_snapshots

    settings = Settings(data_root=args.data_root) if args.data_root else Settings.from_env()
    result = compact_snapshots(settings.snapshots_root, datetime.now(timezone.utc), cluster=args.cluster)
    print(f"{result.summary()} under {settings.snapshots_root}", flush=True)
    return 0


# -- metrics ------------------------------------------------------------------

def cmd_metrics(args: argparse.Namespace) -> int:
    import threading

    from lagdoctor.metrics import default_findings_root, local_root_missing, make_server

    findings_root = default_findings_root(args.data_root)
    try:
        server = make_server(args.host, args.port, findings_root)
    except OSError as exc:
        raise CommandError(f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}") from None
    stop = threading.Event()

    def on_signal(_signum, _frame):
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    serving = threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True)
    serving.start()
    try:
        host, port = server.server_address[:2]
        if local_root_missing(findings_root):
            print(f"no findings under {findings_root} yet: serving empty metrics until a diagnosis runs",
                  file=sys.stderr, flush=True)
        print(f"serving metrics on http://{host}:{port}/metrics", flush=True)
        while not stop.wait(0.5):
            pass
    finally:
        server.shutdown()
        server.server_close()
    return 0


# -- connect-server -------------------------------------------------------------

def cmd_connect_server(args: argparse.Namespace) -> int:
    from lagdoctor.connectserver import main as serve

    argv = ["--port", str(args.port), "--master", args.master, "--workdir", args.workdir]
    if args.token_file:
        argv += ["--token-file", args.token_file]
    if args.driver_memory:
        argv += ["--driver-memory", args.driver_memory]
    return serve(argv)


# -- topology -----------------------------------------------------------------

def cmd_topology(args: argparse.Namespace) -> int:
    from lagdoctor.lab.topology import run

    return run(Path(args.workdir), args.port)


# -- wiring -------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lagdoctor", description="Kafka consumer lag diagnosis.")
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="log details to stderr (-vv: librdkafka's own log lines too)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("broker", help="run the embedded Kafka-compatible broker in the foreground")
    p.add_argument("--port", type=int, default=None,
                   help="loopback port (default: a free one); with --brokers K, nodes listen on N..N+K-1")
    p.add_argument("--brokers", type=int, default=1, metavar="K",
                   help="nodes in the cluster, each a combined broker and controller (default: 1; "
                        "3 for a quorum whose nodes can be killed one at a time)")
    p.set_defaults(func=cmd_broker)

    def kafka_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("--bootstrap-servers", metavar="HOSTS",
                       help="host:port[,host:port] (default: $KAFKA_BOOTSTRAP_SERVERS)")
        p.add_argument("--command-config", metavar="FILE",
                       help="librdkafka properties (security settings), as kafka-*.sh takes")

    p = sub.add_parser("snapshot", help="write offset snapshots (contract 1)")
    kafka_args(p)
    p.add_argument("--cluster", required=True, metavar="NAME", help="logical cluster name")
    p.add_argument("--output", metavar="PATH",
                   help="snapshot store root (default: $LAGDOCTOR_DATA_ROOT/snapshots)")
    p.add_argument("--groups", metavar="REGEX", default=None,
                   help="only groups whose id matches this regex in full (default: all)")
    p.add_argument("--samples", type=int, default=1, metavar="N")
    p.add_argument("--interval-seconds", type=float, default=5.0, metavar="S")
    p.add_argument("--record-partitions", type=int, default=None, metavar="K",
                   help="read the record at the committed offset (its timestamp: exact time lag) of the K most "
                        "lagging partitions of each group and topic; 0: none (default: "
                        "$LAGDOCTOR_RECORD_PARTITIONS, else 3)")
    p.set_defaults(func=cmd_snapshot)

    p = sub.add_parser("describe", help="print a group like kafka-consumer-groups.sh --describe")
    kafka_args(p)
    p.add_argument("--group", required=True, metavar="G")
    p.set_defaults(func=cmd_describe)

    p = sub.add_parser("diagnose", help="run the diagnosis job (contract 2) through spark-submit",
                       epilog="Unknown options are passed on to the job (e.g. threshold overrides).")
    p.add_argument("--snapshots", required=True, metavar="PATH")
    p.add_argument("--output", required=True, metavar="PATH")
    p.add_argument("--as-of", default=None, metavar="ISO-8601")
    p.add_argument("--window-minutes", type=float, default=None, metavar="N")
    p.add_argument("--master", default=None, help="Spark master (default: local[*])")
    p.add_argument("--remote", default=None, metavar="sc://HOST:PORT",
                   help="run as a client of this Spark Connect server instead of spark-submit")
    p.add_argument("--token-file", default=None, metavar="PATH",
                   help="with --remote: the file holding the server's token (`lagdoctor connect-server` "
                        "keeps it in DIR/token); or set $SPARK_CONNECT_AUTHENTICATE_TOKEN. Never on the "
                        "command line: other users can read it there")
    p.set_defaults(func=cmd_diagnose)

    p = sub.add_parser("backtest", help="replay stored history through the rules and Slack's decisions: "
                                        "what every sweep of a range would have said, with other thresholds beside")
    p.add_argument("--from", dest="start", required=True, metavar="ISO-8601", help="the first sweep's end (UTC)")
    p.add_argument("--to", default=None, metavar="ISO-8601", help="the last sweep's end (default: now)")
    p.add_argument("--step-minutes", type=float, default=1.0, metavar="N", help="a sweep every N min (default: 1, "
                                                                                "the sweep DAG's)")
    p.add_argument("--window-minutes", type=float, default=None, metavar="N",
                   help="each sweep's window (default: 30, the sweep DAG's; with --as-swept, the sweeps' own)")
    p.add_argument("--as-swept", action="store_true",
                   help="replay the sweeps that really ran in the range, at their own times (their run "
                        "folders), instead of one every --step-minutes: the verdicts to compare with theirs")
    p.add_argument("--set", action="append", metavar="NAME=VALUE",
                   help="a threshold override (repeatable): the backtest then runs the current thresholds and "
                        "these side by side, e.g. --set warning_lag=5000")
    p.add_argument("--groups", default=None, metavar="REGEX", help="only groups whose id matches in full")
    p.add_argument("--topic", default=None, metavar="NAME")
    p.add_argument("--clusters", default=None, metavar="NAME[,NAME...]")
    p.add_argument("--snapshots", default=None, metavar="PATH",
                   help="the snapshot store (default: $LAGDOCTOR_DATA_ROOT/snapshots)")
    p.add_argument("--output", default=None, metavar="PATH",
                   help="where the report goes (default: $LAGDOCTOR_DATA_ROOT/backtests/<time>)")
    p.add_argument("--master", default=None, help="Spark master (default: local[*])")
    p.add_argument("--json", action="store_true", help="print the whole report as JSON")
    p.set_defaults(func=cmd_backtest)

    p = sub.add_parser("connect-server", help="run a Spark Connect server (the warm engine) until Ctrl-C")
    p.add_argument("--port", type=int, default=15002, help="loopback port (default: 15002)")
    p.add_argument("--master", default="local[*]", help="its Spark master (default: local[*])")
    p.add_argument("--driver-memory", default=None, metavar="SIZE", help="e.g. 2g (default: Spark's, 1g)")
    p.add_argument("--workdir", default=".connect-server", metavar="DIR", help="its log (default: .connect-server)")
    p.add_argument("--token-file", default=None, metavar="PATH",
                   help="its token, 0600, kept across restarts (default: DIR/token, created when missing)")
    p.set_defaults(func=cmd_connect_server)

    p = sub.add_parser("compact", help="fold each closed hour's snapshot files into one file")
    p.add_argument("--data-root", default=None, metavar="PATH",
                   help="lagdoctor data root; snapshots under PATH/snapshots (default: $LAGDOCTOR_DATA_ROOT)")
    p.add_argument("--cluster", default=None, metavar="NAME", help="only this cluster (default: all)")
    p.set_defaults(func=cmd_compact)

    p = sub.add_parser("metrics", help="serve Prometheus metrics of the latest findings at /metrics")
    p.add_argument("--port", type=int, required=True, metavar="N", help="port to listen on (0: a free one)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    p.add_argument("--data-root", default=None, metavar="PATH",
                   help="lagdoctor data root (default: $LAGDOCTOR_DATA_ROOT)")
    p.set_defaults(func=cmd_metrics)

    p = sub.add_parser("topology", help="run a cluster on this machine until Ctrl-C: PostgreSQL, Redis, an S3 "
                                        "store, Spark standalone, Kafka, Airflow with two Celery workers")
    p.add_argument("--workdir", default=".topology", metavar="DIR",
                   help="where every part keeps its files and logs (default: .topology; "
                        "a previous one is moved to DIR.previous)")
    p.add_argument("--port", type=int, default=None, metavar="N",
                   help="the Airflow API server's port (default: a free one)")
    p.set_defaults(func=cmd_topology)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if rest and args.command != "diagnose":
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    logging.basicConfig(
        level={0: logging.ERROR, 1: logging.INFO}.get(args.verbose, logging.DEBUG),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    from lagdoctor.kafka.collector import CollectionError
    from lagdoctor.kafka.clients import ConfigError
    from lagdoctor.store import StoreError

    try:
        if args.command == "diagnose":
            return args.func(args, rest)
        return args.func(args)
    except (CommandError, CollectionError, ConfigError, StoreError, ValueError) as exc:
        return _fail(str(exc))
    except RuntimeError as exc:  # the backtest job's one line
        if args.command != "backtest":
            raise
        return _fail(str(exc))
    except KeyboardInterrupt:
        return 130


def console() -> None:
    """The installed `lagdoctor` script: main(), then leave without interpreter teardown.

    Arrow's native thread pools can abort a finished process at teardown
    ("terminate called without an active exception", exit -6; apache/arrow
    #34314): one `lagdoctor compact` in 20-60 did here, after its work and its
    output. Every command has finished (brokers stopped, files renamed into
    place) when main returns, so the output is flushed and the process exits.
    """
    try:
        code = main()
    except SystemExit as exc:  # argparse's usage errors, --help
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else _fail(str(exc.code)))
    try:
        sys.stdout.flush()
    except BrokenPipeError:  # `lagdoctor ... | head`: the reader left, nothing to say
        pass
    sys.stderr.flush()
    logging.shutdown()
    os._exit(code)


if __name__ == "__main__":
    console()
