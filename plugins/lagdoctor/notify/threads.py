"""Incident threads: durable state per incident key, and the rule for what to send.

One row per incident key (cluster, group, topic, diagnosis) in the state
database's ``incident_threads`` table (lagdoctor.state: SQLite under the data
root, or PostgreSQL shared by every worker), so state survives any XCom
cleanup and holds across hosts. The coordinator (incidents.py) decides and
writes in one transaction with the (cluster, group, topic) locked, and queues
the Slack message in that same transaction (outbox.py).

The decision rules (pure; one test case each in tests/test_notify_threads.py):

  1. post      a non-healthy finding with no open thread starts one.
  2. same run  a thread already updated by this run gets nothing more (task retry).
  3. reply     an open thread gets a reply on a material change since what it last said:
               severity rose above any it told; a partition it never named is involved;
               or total lag at least doubled or halved AND moved by LAG_MATERIAL_MIN messages,
               at most once per LAG_UPDATE_MIN_SECONDS when that is all that changed.
               Hysteresis, so a sweep every minute does not flap: a severity that falls
               back, a partition set that shrinks, a new lag pattern or a lag of 4 -> 73
               is said in the next material reply (or the recovery), not on its own.
  4. nothing   otherwise: a sweep every minute must not repeat itself.
  5. recover   a ``healthy`` finding closes every open thread of that
               (cluster, group, topic) with a recovery reply.
  7. decided   an open thread that last said the cause was provisional (issue 18) gets
               the decided message once a finding for one of its candidates is decided:
               the same thread, re-keyed to the decided cause, not a new one and not a
               change of diagnosis. A provisional finding whose leading candidate changed
               stays in the thread too. Between decided causes a new thread, as before.
  6. unknown   a ``healthy`` finding whose ``evidence.data_complete`` is false is
               not recovery: it never closes a thread, posts nothing without an
               open thread, and replies once that the data is incomplete (not again
               until a complete finding came in between).
  8. superseded  an open provisional thread that a non-healthy finding of its (cluster, group,
               topic) did not land in (the decided cause is outside its candidates, another
               open thread already holds it, or other candidates lead now) is closed with
               one reply saying what it became and which thread follows it; unless
               another finding of the same sweep lands in it (a sweep may find a rebalance
               loop beside the imbalance it is still deciding on).
 10. one thread  a decided non-healthy finding whose cause has no open thread, while its (cluster,
               group, topic) has an open decided one, replies there instead of posting anew: one
               incident, one top-level message. The thread's cause gone from the sweep: it is
               re-keyed to the new one ("Cause changed"); still found beside it (or no sweep to
               tell): the new cause shares the thread ("Also"). A recovery closes every cause of
               the thread with one reply. Provisional findings keep rules 7-9.
  9. undecided a provisional thread whose promised time (decided_by, stored on the thread)
               passed while the sweep is still provisional gets one reply saying so, with the
               new time; once per new promise, not every sweep.
 11. collecting a ``collecting_history`` finding (issue 29: too few snapshots for a verdict) does
               nothing: it opens no thread and, like rule 6's unknown, closes none as recovered
               (the coordinator answers it before these rules; tests/test_collecting_history.py).
 12. held     a provisional finding that may yet be healthy because it is young (rule case 36: a
               rise, a burst or a surge's start, deciding_between producer_surge and healthy; 37:
               churn, a loop's start or one member restarting across a sweep, deciding_between
               rebalance_loop and healthy; 38: no commit seen yet, a batch committer between
               commits or a stall, any cause against healthy) says nothing and changes no thread:
               a burst drains, a restart settles, a batch commits by the next sweeps; a surge, a
               loop or a stall is said decided.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Iterator, Mapping

import sqlalchemy as sa

from lagdoctor.notify.evidence import lag_total
from lagdoctor.notify.provisional import promise_overdue, promised_at

if TYPE_CHECKING:
    from lagdoctor.state import StateDB

HEALTHY = "healthy"


@dataclass(frozen=True)
class IncidentKey:
    cluster: str
    group_id: str
    topic: str
    diagnosis: str

    @classmethod
    def of(cls, finding: Mapping[str, Any], diagnosis: str | None = None) -> "IncidentKey":
        return cls(str(finding.get("cluster", "")), str(finding.get("group_id", "")),
                   str(finding.get("topic", "")), str(diagnosis or finding.get("diagnosis", "")))

    def filename(self) -> str:
        # Names may hold any character: a readable prefix plus a hash keeps keys apart.
        readable = re.sub(r"[^A-Za-z0-9._-]+", "_", f"{self.group_id}.{self.diagnosis}")[:60]
        return f"{readable}.{self.digest()}.json"

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:16]

    def lock_name(self) -> str:
        """What the coordinator locks: every diagnosis of one (cluster, group, topic),
        since a recovery closes them all."""
        return "incident:" + json.dumps([self.cluster, self.group_id, self.topic])


@dataclass
class ThreadState:
    key: IncidentKey
    channel: str
    thread_ts: str
    status: str = "open"  # open | closed
    opened_at: str = ""
    updated_at: str = ""
    closed_at: str | None = None
    severity: str = ""
    pattern: str = ""
    partitions: list[int] = field(default_factory=list)
    lag_total: float | None = None
    last_run_id: str = ""
    replies: int = 0
    posted_actions: list[str] = field(default_factory=list)  # "<idempotency_key>:<status>"
    root_message_id: int | None = None  # the outbox row of the thread's first message
    data_incomplete: bool = False  # rule 6: the thread was told the data is incomplete
    provisional: bool = False  # rule 7: the thread last said the cause is not decided yet
    deciding_between: list[str] = field(default_factory=list)
    # rule 9: the decided_by the thread last promised (ISO); rows written before it read None
    decided_by: str | None = None
    # rule 3: every partition the thread has named (a set that shrinks and grows back is not news)
    told_partitions: list[int] = field(default_factory=list)
    # say-once action replies: action -> what the thread last said of it (incidents.action_signature)
    said_actions: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "ThreadState":
        data = dict(data)
        data["key"] = IncidentKey(**data["key"])
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known})


def reply_target(state: ThreadState) -> dict[str, Any]:
    """Where a reply in `state`'s thread goes: the known ts, or the parent row to wait for."""
    return {"parent_id": state.root_message_id, "thread_ts": state.thread_ts or None,
            "channel": (state.channel or None) if state.thread_ts else None}


class ThreadStore:
    """Thread state in the state database; ``conn`` joins a caller's transaction."""

    def __init__(self, db: "StateDB | None" = None, *, settings: Any = None) -> None:
        if isinstance(db, str):
            raise TypeError("ThreadStore takes a StateDB: thread state lives in the state database, not in files")
        if db is None:
            from lagdoctor.state import state_db

            db = state_db(settings)
        self.db = db

    def _load(self, conn: sa.Connection, data: Mapping[str, Any]) -> ThreadState:
        from lagdoctor.notify.outbox import message_ts

        state = ThreadState.from_json(data)
        if not state.thread_ts and state.root_message_id is not None:
            sent = message_ts(conn, state.root_message_id)
            if sent is not None:  # until then the thread's first message waits in the outbox
                state.channel, state.thread_ts = sent
        return state

    def _select(self, conn: sa.Connection, *where: Any) -> list[ThreadState]:
        from lagdoctor.state import incident_threads as t

        rows = conn.execute(sa.select(t.c.data).where(*where).order_by(t.c.id)).all()
        return [self._load(conn, row.data) for row in rows]

    def get(self, key: IncidentKey, *, conn: sa.Connection | None = None) -> ThreadState | None:
        from lagdoctor.state import incident_threads as t

        if conn is None:
            with self.db.engine.connect() as c:
                return self.get(key, conn=c)
        found = self._select(conn, t.c.cluster == key.cluster, t.c.group_id == key.group_id,
                             t.c.topic == key.topic, t.c.diagnosis == key.diagnosis)
        return found[0] if found else None

    def save(self, state: ThreadState, *, conn: sa.Connection | None = None) -> None:
        from lagdoctor.state import incident_threads as t, utcnow

        if conn is None:
            with self.db.transaction() as c:
                return self.save(state, conn=c)
        k = state.key
        stamp = datetime.fromisoformat(state.updated_at) if state.updated_at else utcnow()
        data = json.loads(json.dumps(state.to_json()))
        values = {"cluster": k.cluster, "group_id": k.group_id, "topic": k.topic, "diagnosis": k.diagnosis,
                  "status": state.status, "data": data, "updated_at": stamp}
        if not self.db.insert_ignore(conn, t, values, ("cluster", "group_id", "topic", "diagnosis")):
            conn.execute(sa.update(t).where(t.c.cluster == k.cluster, t.c.group_id == k.group_id,
                                            t.c.topic == k.topic, t.c.diagnosis == k.diagnosis)
                         .values(status=state.status, data=data, updated_at=stamp))

    def rekey(self, state: ThreadState, diagnosis: str, *, conn: sa.Connection) -> ThreadState:
        """Rule 7: the thread now belongs to the decided cause. A closed thread left under that
        key is replaced, as a new post would replace it, but its posted-action markers carry
        over: an action result already posted for that diagnosis must not be posted again."""
        from lagdoctor.state import incident_threads as t

        old, new = state.key, IncidentKey(state.key.cluster, state.key.group_id, state.key.topic, diagnosis)
        if new == old:
            return state
        replaced = self.get(new, conn=conn)
        if replaced is not None:
            state.posted_actions = [*replaced.posted_actions,
                                    *(m for m in state.posted_actions if m not in replaced.posted_actions)]
        conn.execute(sa.delete(t).where(t.c.cluster == new.cluster, t.c.group_id == new.group_id,
                                        t.c.topic == new.topic, t.c.diagnosis == new.diagnosis))
        conn.execute(sa.update(t).where(t.c.cluster == old.cluster, t.c.group_id == old.group_id,
                                        t.c.topic == old.topic, t.c.diagnosis == old.diagnosis)
                     .values(diagnosis=new.diagnosis))
        state.key = new
        self.save(state, conn=conn)  # the carried markers are stored even if nothing is said now
        return state

    def all(self) -> Iterator[ThreadState]:
        with self.db.engine.connect() as conn:
            states = self._select(conn)
        yield from states

    def open_threads(self, cluster: str, group_id: str, topic: str, *,
                     conn: sa.Connection | None = None) -> list[ThreadState]:
        from lagdoctor.state import incident_threads as t

        if conn is None:
            with self.db.engine.connect() as c:
                return self.open_threads(cluster, group_id, topic, conn=c)
        return self._select(conn, t.c.status == "open", t.c.cluster == cluster, t.c.group_id == group_id,
                            t.c.topic == topic)


@dataclass(frozen=True)
class Decision:
    kind: str  # post | reply | decided | nothing | recover | incomplete
    changes: tuple[str, ...] = ()


def lag_total_of(finding: Mapping[str, Any]) -> float | None:
    value = lag_total(finding)
    return float(value) if isinstance(value, (int, float)) else None


SEVERITY_RANK = {"ok": 0, "warning": 1, "critical": 2}
# Rule 3's lag hysteresis: a doubling or halving is news only when it moves this many messages
# (the default warning_lag), and a lag-only reply comes at most once per quarter hour.
LAG_MATERIAL_MIN = 1_000
LAG_UPDATE_MIN_SECONDS = 15 * 60


def _rank(severity: str) -> int:
    return SEVERITY_RANK.get(severity, -1)


def _partitions_of(finding: Mapping[str, Any]) -> list[int]:
    return sorted(p for p in finding.get("partitions") or [] if isinstance(p, int))


def _lag_is_news(before: float | None, lag: float | None) -> bool:
    if lag is None or before is None or abs(lag - before) < LAG_MATERIAL_MIN:
        return False
    return (before == 0 and lag > 0) or (before > 0 and (lag >= 2 * before or lag <= before / 2))


def _seconds_since(stamp: str, now: datetime | None) -> float | None:
    if not stamp or now is None:
        return None
    try:
        return (now - datetime.fromisoformat(stamp)).total_seconds()
    except (TypeError, ValueError):
        return None


def changes_since(state: ThreadState, finding: Mapping[str, Any], now: datetime | None = None) -> list[str]:
    """Rule 3: the material changes since what the thread last said; empty when nothing is news.
    Secondary changes (a lower severity, another pattern, fewer partitions) ride along with a
    material one and are never news alone."""
    material: list[str] = []
    severity, pattern = str(finding.get("severity", "")), str(finding.get("pattern", ""))
    parts = _partitions_of(finding)
    told = sorted(set(state.told_partitions) | set(state.partitions))
    if _rank(severity) > _rank(state.severity):
        material.append(f"severity {state.severity or '-'} → {severity}")
    if set(parts) - set(told):
        material.append(f"partitions {told or '-'} → {parts or '-'}")
    lag, before = lag_total_of(finding), state.lag_total
    if _lag_is_news(before, lag):
        since = _seconds_since(state.updated_at, now)
        if material or since is None or since >= LAG_UPDATE_MIN_SECONDS:
            material.append(f"total lag {int(before):,} → {int(lag):,}")
    if not material:
        return []
    if _rank(severity) < _rank(state.severity):
        material.append(f"severity {state.severity} → {severity}")
    if pattern != state.pattern:
        material.append(f"pattern {state.pattern or '-'} → {pattern}")
    if parts != sorted(state.partitions) and not set(parts) - set(told):
        material.append(f"partitions {state.partitions or '-'} → {parts or '-'}")
    return material


def data_complete(finding: Mapping[str, Any]) -> bool:
    """False only when the diagnosis says some offsets could not be read."""
    evidence = finding.get("evidence") or {}
    return not (isinstance(evidence, Mapping) and evidence.get("data_complete") is False)


def decide_healthy(finding: Mapping[str, Any], state: ThreadState) -> Decision:
    """Rules 5 and 6: what a ``healthy`` finding does to one open thread."""
    if data_complete(finding):
        return Decision("recover")
    return Decision("nothing") if state.data_incomplete else Decision("incomplete")


def provisional_thread_for(finding: Mapping[str, Any], open_threads: list[ThreadState]) -> ThreadState | None:
    """Rule 7: the open provisional thread of this (cluster, group, topic) among whose candidates
    the finding's diagnosis is, or None."""
    diagnosis = str(finding.get("diagnosis", ""))
    return next((s for s in open_threads if s.provisional and diagnosis in s.deciding_between), None)


def thread_to_join(finding: Mapping[str, Any], open_threads: list[ThreadState],
                   sweep: list[Mapping[str, Any]] | None = None) -> tuple[ThreadState, bool] | None:
    """Rule 10: (the open decided thread of this (cluster, group, topic) a finding without a thread of its
    own replies in, whether that thread's cause is still found in the sweep), or None. ``sweep``: the sweep's
    findings of this (cluster, group, topic); None: this one alone. The thread opened first wins."""
    key = IncidentKey.of(finding)
    if finding.get("provisional") is True:  # rules 7-9 follow a cause not decided yet
        return None
    candidates = [s for s in open_threads if s.status == "open" and not s.provisional and s.key != key]
    if not candidates:
        return None
    thread = min(candidates, key=lambda s: s.opened_at or "")
    if sweep is None:  # without the sweep, the thread's cause is not known to be gone
        return thread, True
    return thread, thread.key.diagnosis in {str(f.get("diagnosis", "")) for f in sweep}


def superseded_threads(finding: Mapping[str, Any], open_threads: list[ThreadState],
                       sweep: list[Mapping[str, Any]] | None = None) -> list[ThreadState]:
    """Rule 8: the open provisional threads of this (cluster, group, topic) that the (non-healthy)
    finding did not land in, nor any other finding of its sweep (``sweep``: the sweep's findings of
    this (cluster, group, topic); None: this one alone) would land in. ``open_threads`` as read
    before the finding's own thread was chosen (one adopted by rule 7 carries its key by then)."""
    key = IncidentKey.of(finding)
    others = [f for f in sweep or [] if IncidentKey.of(f) != key]

    def lands_in(state: ThreadState) -> bool:
        return any(str(f.get("diagnosis", "")) in (state.key.diagnosis, *state.deciding_between) for f in others)

    return [s for s in open_threads if s.provisional and s.status == "open" and s.key != key and not lands_in(s)]


# rule 12: the provisional choices a sweep keeps to itself until decided
HELD_UNTIL_DECIDED = frozenset({("producer_surge", "healthy"), ("rebalance_loop", "healthy"),
                                ("stalled_consumer", "healthy"), ("slow_consumer", "healthy"),
                                ("partition_imbalance", "healthy")})


def held_until_decided(finding: Mapping[str, Any]) -> bool:
    """Rule 12: a young rise (a burst or a surge's start), young churn (a loop's start or one member
    restarting across a sweep) and a window with no commit yet (a batch committer or a stall) are said once
    decided."""
    return finding.get("provisional") is True and tuple(finding.get("deciding_between") or ()) in HELD_UNTIL_DECIDED


def decide(finding: Mapping[str, Any], state: ThreadState | None, *, run_id: str,
           now: datetime | None = None) -> Decision:
    """Rules 1-4, 7 and 9 for a non-healthy finding (rules 5-6 are ``decide_healthy``)."""
    if state is None or state.status != "open":
        return Decision("post")
    if run_id and state.last_run_id == run_id:
        return Decision("nothing")
    if state.provisional and finding.get("provisional") is not True:
        return Decision("decided", tuple(changes_since(state, finding, now)))
    changes = changes_since(state, finding, now)
    if (state.provisional and finding.get("provisional") is True and promise_overdue(state.decided_by, now)
            and promised_at(finding.get("decided_by")) != promised_at(state.decided_by)):  # a new time, as said
        return Decision("undecided", tuple(changes))
    return Decision("reply", tuple(changes)) if changes else Decision("nothing")


def remember(state: ThreadState, finding: Mapping[str, Any], *, run_id: str, now: str,
             opened: bool = False, promised: bool = False) -> ThreadState:
    """Record what the thread last told people about. It is provisional only while
    what it said was "still deciding": a provisional thread stays so until a decided
    finding; a thread that named a cause (or stayed quiet since `opened`) does not
    become provisional because a later sweep is unsure. Its decided_by is the time it
    promised: set when it said one (`opened`, `promised`), kept otherwise."""
    state.severity = str(finding.get("severity", ""))
    state.pattern = str(finding.get("pattern", ""))
    state.partitions = _partitions_of(finding)
    state.told_partitions = sorted(set(state.partitions) | (set() if opened else set(state.told_partitions)))
    state.lag_total = lag_total_of(finding)
    state.last_run_id = run_id
    state.updated_at = now
    state.data_incomplete = False
    state.provisional = finding.get("provisional") is True and (opened or state.provisional)
    state.deciding_between = [str(d) for d in finding.get("deciding_between") or []] if state.provisional else []
    if not state.provisional:
        state.decided_by = None
    elif opened or promised or state.decided_by is None:  # None: a thread stored before rule 9
        by = finding.get("decided_by")
        state.decided_by = str(by) if by else None
    return state
