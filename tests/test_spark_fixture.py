"""The suite's local Spark: a JVM that dies is said and replaced, not a cascade of "Connection refused"."""

from __future__ import annotations

import pytest


@pytest.mark.spark
def test_a_dead_local_jvm_is_replaced_by_the_next_session():
    from lagdoctor.diagnosis.session import start_spark
    from tests.fixtures.spark import _forget_a_dead_gateway, _gateway_proc

    session = start_spark("lagdoctor-tests", master="local[2]")
    assert session.range(3).count() == 3
    dead = _gateway_proc()
    dead.kill()
    dead.wait(30)
    assert _forget_a_dead_gateway() == -9
    session = start_spark("lagdoctor-tests", master="local[2]")
    try:
        assert session.range(5).count() == 5
        assert _gateway_proc().pid != dead.pid and _gateway_proc().poll() is None
    finally:
        session.stop()
