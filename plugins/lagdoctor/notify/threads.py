"""Incident threads: durable state per incident key, and the rule for what to send.

One JSON file per incident key (cluster, group, topic, diagnosis) under
``Settings.incidents_root``, written atomically (temp file + rename), so a
crash never leaves half a state and state survives any XCom cleanup.

The decision rules (pure; one test case each in tests/test_notify_threads.py):

  1. post      a non-healthy finding with no open thread starts one.
  2. same run  a thread already updated by this run gets nothing more (task retry).
  3. reply     an open thread gets a reply when severity, pattern or the partitions
               involved changed, or total lag at least doubled or halved since the
               last message (a ratio, not a threshold, so it doesn't flap).
  4. nothing   otherwise: a sweep every 5 minutes must not repeat itself.
  5. recover   a ``healthy`` finding closes every open thread of that
               (cluster, group, topic) with a recovery reply.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping

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
        # Names may hold any character: a readable prefix plus a hash keeps files apart.
        digest = hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:16]
        readable = re.sub(r"[^A-Za-z0-9._-]+", "_", f"{self.group_id}.{self.diagnosis}")[:60]
        return f"{readable}.{digest}.json"


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

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "ThreadState":
        data = dict(data)
        data["key"] = IncidentKey(**data["key"])
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known})


class ThreadStore:
    def __init__(self, root: str) -> None:
        if "://" in root and not root.startswith("file://"):
            raise ValueError(f"incident state needs a local path, got {root.split('://')[0]}:// URI")
        self.root = Path(root[len("file://"):] if root.startswith("file://") else root)

    def _path(self, key: IncidentKey) -> Path:
        return self.root / key.filename()

    def get(self, key: IncidentKey) -> ThreadState | None:
        path = self._path(key)
        if not path.exists():
            return None
        return ThreadState.from_json(json.loads(path.read_text(encoding="utf-8")))

    def save(self, state: ThreadState) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.root, prefix=".tmp-", suffix=".json")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(state.to_json(), fh, sort_keys=True, indent=1)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self._path(state.key))
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def all(self) -> Iterator[ThreadState]:
        if not self.root.exists():
            return
        for path in sorted(self.root.glob("*.json")):
            if path.name.startswith(".tmp-"):
                continue
            yield ThreadState.from_json(json.loads(path.read_text(encoding="utf-8")))

    def open_threads(self, cluster: str, group_id: str, topic: str) -> list[ThreadState]:
        return [s for s in self.all() if s.status == "open"
                and (s.key.cluster, s.key.group_id, s.key.topic) == (cluster, group_id, topic)]


@dataclass(frozen=True)
class Decision:
    kind: str  # post | reply | nothing | recover
    changes: tuple[str, ...] = ()


def lag_total_of(finding: Mapping[str, Any]) -> float | None:
    from lagdoctor.notify.render import _lag_total

    value = _lag_total(finding)
    return float(value) if isinstance(value, (int, float)) else None


def changes_since(state: ThreadState, finding: Mapping[str, Any]) -> list[str]:
    out = []
    severity, pattern = str(finding.get("severity", "")), str(finding.get("pattern", ""))
    parts = sorted(p for p in finding.get("partitions") or [] if isinstance(p, int))
    if severity != state.severity:
        out.append(f"severity {state.severity or '-'} → {severity}")
    if pattern != state.pattern:
        out.append(f"pattern {state.pattern or '-'} → {pattern}")
    if parts != sorted(state.partitions):
        out.append(f"partitions {state.partitions or '-'} → {parts or '-'}")
    lag, before = lag_total_of(finding), state.lag_total
    if lag is not None and before is not None:
        if (before == 0 and lag > 0) or (before > 0 and (lag >= 2 * before or lag <= before / 2)):
            out.append(f"total lag {int(before):,} → {int(lag):,}")
    return out


def decide(finding: Mapping[str, Any], state: ThreadState | None, *, run_id: str) -> Decision:
    """Rules 1-4 for a non-healthy finding (rule 5 is ``ThreadStore.open_threads``)."""
    if state is None or state.status != "open":
        return Decision("post")
    if run_id and state.last_run_id == run_id:
        return Decision("nothing")
    changes = changes_since(state, finding)
    return Decision("reply", tuple(changes)) if changes else Decision("nothing")


def remember(state: ThreadState, finding: Mapping[str, Any], *, run_id: str, now: str) -> ThreadState:
    """Record what the thread last told people about."""
    state.severity = str(finding.get("severity", ""))
    state.pattern = str(finding.get("pattern", ""))
    state.partitions = sorted(p for p in finding.get("partitions") or [] if isinstance(p, int))
    state.lag_total = lag_total_of(finding)
    state.last_run_id = run_id
    state.updated_at = now
    return state
