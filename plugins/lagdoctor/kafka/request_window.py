"""The admin requests of one snapshot: how many may wait on the cluster at once,
and until when a new one may start (the snapshot's read budget)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from typing import Any

# Requests waiting on the cluster at once: enough to hide round trips (the group
# reads of 10,000 groups took about 6 s on the embedded broker, and 1,024 in flight
# were no faster), far below a broker's request queue (queued.max.requests, 500).
DEFAULT_MAX_IN_FLIGHT = 128


def read_budget(timeout_s: float) -> float:
    """Seconds after which a snapshot starts no more reads, by default: about eight
    times a snapshot of 10,000 groups on the embedded broker (7.6 s), six timeouts."""
    return max(60.0, 6 * timeout_s)


def _failed(exc: BaseException) -> Future:
    fut: Future = Future()
    fut.set_exception(exc)
    return fut


class RequestWindow:
    """Bounds the admin requests outstanding at once and when the last may start.

    `call` takes `weight` slots (the requests the call sends) before sending and
    frees them when every future the call returned is done, so at most `limit`
    requests wait on the cluster: a request's timeout then measures the broker's
    answer, not a queue of thousands behind it, and a real cluster is not
    flooded. A call that would start after `budget_s` is not sent: its futures
    fail with "not read: ..." (recorded as read errors), so a cluster that
    stops answering mid-snapshot costs at most the budget plus one timeout,
    not one timeout per window of groups.
    """

    def __init__(self, limit: int, budget_s: float) -> None:
        if limit < 1:
            raise ValueError(f"max_in_flight must be at least 1, not {limit}")
        self.limit, self.budget_s = limit, budget_s
        self._slots = threading.Semaphore(limit)
        self._deadline = time.monotonic() + budget_s

    def remaining(self) -> float:
        """Seconds left before no more calls start."""
        return self._deadline - time.monotonic()

    def call(self, keys: Iterable[Any], send: Callable[[], dict[Any, Future]], weight: int = 1) -> dict[Any, Future]:
        weight = min(max(1, weight), self.limit)
        taken = 0
        while taken < weight and self._slots.acquire(timeout=max(0.0, self._deadline - time.monotonic())):
            taken += 1
        if taken < weight or time.monotonic() > self._deadline:
            if taken:
                self._slots.release(taken)
            late = TimeoutError(f"not read: the snapshot's {self.budget_s:g} s read budget ran out first")
            return {key: _failed(late) for key in keys}
        try:
            futures = send()
        except BaseException:
            self._slots.release(taken)
            raise
        if not futures:
            self._slots.release(taken)
            return futures
        pending = [len(futures)]
        lock = threading.Lock()

        def done(_: Future) -> None:  # on librdkafka's thread, or here if already done
            with lock:
                pending[0] -= 1
                last = pending[0] == 0
            if last:
                self._slots.release(taken)

        for fut in futures.values():
            fut.add_done_callback(done)
        return futures
