"""What a failure says in one line (issue 30: a Spark Connect server killed mid-query said only
`cannot diagnose ...: <_MultiThreadedRendezvous of RPC that terminated with:`)."""

from __future__ import annotations

import grpc

from lagdoctor.connectserver import free_port
from lagdoctor.diagnosis.snapshots import one_line


def _refused_call() -> grpc.RpcError:
    """A real gRPC failure: a call to a port nothing listens on."""
    with grpc.insecure_channel(f"127.0.0.1:{free_port()}") as channel:
        try:
            channel.unary_unary("/spark.connect.SparkConnectService/ExecutePlan")(b"", timeout=5)
        except grpc.RpcError as exc:
            return exc
    raise AssertionError("the call to a closed port succeeded")


def test_a_grpc_failure_is_said_by_its_status_and_details_not_its_repr():
    exc = _refused_call()
    assert str(exc).startswith("<_InactiveRpcError of RPC that terminated with:")  # what was printed before
    said = one_line(exc)
    assert said.startswith("gRPC call failed: UNAVAILABLE: failed to connect to all addresses"), said
    assert "\n" not in said and "<_" not in said
    # the same error's text carried by a wrapper (pyspark re-raises some as its own exceptions)
    wrapped = RuntimeError(str(exc).replace("_InactiveRpcError", "_MultiThreadedRendezvous"))
    assert one_line(wrapped) == said


def test_other_failures_keep_their_first_meaningful_line():
    jvm = RuntimeError("An error occurred while calling o42.load.\n: org.apache.spark.SparkException: "
                       "[FAILED_READ_FILE] cannot read x.parquet\n\tat org.apache.spark.Foo(Foo.scala:1)")
    assert one_line(jvm) == "[FAILED_READ_FILE] cannot read x.parquet"
    assert one_line(ValueError("")) == "ValueError"
