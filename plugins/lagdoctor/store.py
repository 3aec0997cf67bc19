"""The snapshot store: Parquet files under <root>/cluster=<c>/date=<YYYY-MM-DD>/hour=<HH>/.

Each snapshot is one uniquely named file, written under a hidden temporary
name and renamed into place, so a crash never leaves a partial file and
readers (Spark and pyarrow both skip names starting with '.' or '_') never see
one. The root is a local path or any fsspec URI. Stores written before
issue 9 hold their files directly in the date= folders; every reader here
reads both layouts, mixed in one store.

File names are `snapshot-<UTC time>-<key or random tag>.parquet`. A key
(a run and sample index) makes a write idempotent: the file with that key is
found in any date or hour folder of its cluster, whatever time the earlier
attempt stamped on it, so a retried task never samples twice.

Compaction (`compact_snapshots`) folds a closed hour's files into one
`compacted-<YYYYMMDDTHH>-<hash>.parquet` whose Parquet key-value metadata
lists the file names it holds (`lagdoctor.compaction.covers`). A reader that
sees a compacted file skips exactly those names in its folder, so no row is
read twice while the originals still exist; they are deleted a grace period
later (see compact_snapshots).
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from lagdoctor.contracts import SNAPSHOT_COLUMN_NAMES, SNAPSHOT_OPTIONAL_COLUMNS

_SAFE = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")
_PREFIX, _SUFFIX = "snapshot-", ".parquet"
_TS_FORMAT = "%Y%m%dT%H%M%S%fZ"
_TS_LENGTH = len("20261121T031400000000Z")
_OPTIONAL_NAMES = tuple(c[0] for c in SNAPSHOT_OPTIONAL_COLUMNS)

COMPACTED_PREFIX = "compacted-"
# Parquet key-value metadata of a compacted file (JSON values).
META_COVERS = "lagdoctor.compaction.covers"  # names in the same folder whose rows this file holds
META_KEYS = "lagdoctor.compaction.keys"  # the snapshot keys (tags) among them
META_COMPACTED_AT = "lagdoctor.compaction.compacted_at"  # ISO-8601 UTC, the compactor's `now`
_LOCK_NAME = ".compact.lock"
# Sorted by snapshot_ts, so row-group statistics stay tight for readers that prune by time.
_ROW_GROUP_ROWS = 128 * 1024
_SORT_KEYS = ("snapshot_ts", "group_id", "topic", "partition")


class StoreError(RuntimeError):
    """The store could not be written or read; the message is one line."""


def _filesystem(root: str):
    import fsspec

    fs, path = fsspec.core.url_to_fs(root)
    return fs, path.rstrip("/") or "/"


def _is_local(fs: Any) -> bool:
    from fsspec.implementations.local import LocalFileSystem

    return isinstance(fs, LocalFileSystem)


def _safe_part(value: str) -> str:
    # Hive partition values and file names: keep them portable across filesystems.
    return "".join(c if c in _SAFE else "_" for c in value) or "_"


def cluster_folder_name(cluster: str) -> str:
    """The `cluster=` folder name a cluster's snapshots are written under."""
    return f"cluster={_safe_part(cluster)}"


def snapshot_dir(root: str, cluster: str, day: datetime) -> str:
    """The cluster's date= folder for `day` (UTC)."""
    return f"{root.rstrip('/')}/{cluster_folder_name(cluster)}/date={day:%Y-%m-%d}"


def hour_dir(root: str, cluster: str, ts: datetime) -> str:
    """The hour= folder new snapshots taken at `ts` go to (from ts in UTC)."""
    ts = ts.astimezone(timezone.utc)
    return f"{snapshot_dir(root, cluster, ts)}/hour={ts:%H}"


def _name(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1]


def _parent(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[0]


def _tag_of(path: str) -> str | None:
    """The key (or random tag) part of a snapshot file name; None for any other file."""
    name = _name(path)
    if not (name.startswith(_PREFIX) and name.endswith(_SUFFIX)):
        return None
    rest = name[len(_PREFIX):-len(_SUFFIX)]
    if len(rest) <= _TS_LENGTH + 1 or rest[_TS_LENGTH] != "-":
        return None
    return rest[_TS_LENGTH + 1:]


def is_compacted_name(path: str) -> bool:
    name = _name(path)
    return name.startswith(COMPACTED_PREFIX) and name.endswith(_SUFFIX)


def _visible_below(path: str, base: str) -> bool:
    """No component below `base` is hidden or `_`-prefixed (the root itself may be, e.g. ~/.lagdoctor)."""
    relative = path[len(base):] if path.startswith(base) else _name(path)
    return not any(part.startswith((".", "_")) for part in relative.split("/") if part)


# -- compaction metadata and coverage (shared with the diagnosis job's listing) -----------


@dataclass(frozen=True)
class CompactedFacts:
    """What a compacted file's footer says about it."""

    covers: frozenset[str]
    keys: frozenset[str]
    compacted_at: datetime | None


def compaction_facts(key_value: Mapping[bytes | str, bytes | str] | None) -> CompactedFacts | None:
    """A compacted file's facts from its Parquet key-value metadata; None when it has none."""
    if not key_value:
        return None
    meta = {(k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
            for k, v in key_value.items()}
    if META_COVERS not in meta:
        return None
    try:
        covers = frozenset(str(n) for n in json.loads(meta[META_COVERS]))
        keys = frozenset(str(k) for k in json.loads(meta.get(META_KEYS, "[]")))
        at = meta.get(META_COMPACTED_AT)
        compacted_at = datetime.fromisoformat(at).astimezone(timezone.utc) if at else None
    except (ValueError, TypeError):
        return None
    return CompactedFacts(covers, keys, compacted_at)


def read_compaction_facts(fs: Any, path: str) -> CompactedFacts | None:
    """Facts from one compacted file's footer; None when it cannot be read or has none."""
    import pyarrow.parquet as pq

    try:
        with fs.open(path, "rb") as fh:
            return compaction_facts(pq.read_metadata(fh).metadata)
    except Exception:  # a damaged compacted file covers nothing: its originals are read instead
        return None


def covered_names(covers: Mapping[str, frozenset[str]]) -> set[str]:
    """Names in one folder a reader must skip, given each compacted file's covered names.

    Compacted files are accepted largest first: one covered by an accepted file
    is superseded (its rows are in that file), and one that overlaps an
    accepted file without being covered by it is skipped too (only a race
    the compaction lock prevents can make one); the originals it alone holds
    are then read as they are. So no row is ever read twice.
    """
    claimed: set[str] = set()
    skipped: set[str] = set()
    for name, names in sorted(covers.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        if name in claimed or names & claimed:
            skipped.add(name)
            continue
        claimed |= names
    return claimed | skipped


def _without_covered(fs: Any, files: list[str]) -> list[str]:
    """`files` minus the names compacted files in the same folder cover."""
    by_folder: dict[str, list[str]] = {}
    for f in files:
        by_folder.setdefault(_parent(f), []).append(f)
    skip: set[str] = set()
    for folder, paths in by_folder.items():
        compacted = [p for p in paths if is_compacted_name(p)]
        if not compacted or len(paths) < 2:  # the steady state (one compacted file): no footer read
            continue
        covers = {}
        for p in compacted:
            facts = read_compaction_facts(fs, p)
            covers[_name(p)] = facts.covers if facts else frozenset()
        skip |= {f"{folder}/{n}" for n in covered_names(covers)}
    return [f for f in files if f not in skip]


# -- writing and keyed idempotency --------------------------------------------------------


def _keyed_files(fs: Any, base: str, cluster: str, tag: str = "*") -> dict[str, str]:
    """{tag: path} of the cluster's visible snapshot files, in every date and hour folder."""
    cluster_dir = f"{base}/{cluster_folder_name(cluster)}"
    found: dict[str, str] = {}
    for layout in ("date=*", "date=*/hour=*"):  # before issue 9 / since
        for path in sorted(fs.glob(f"{cluster_dir}/{layout}/{_PREFIX}*-{tag}{_SUFFIX}")):
            name_tag = _tag_of(path)
            if name_tag is not None:
                found.setdefault(name_tag, path)
    return found


def _compacted_keys(fs: Any, base: str, cluster: str) -> dict[str, str]:
    """{tag: compacted file} from the compacted files' footers (one small read each)."""
    found: dict[str, str] = {}
    for path in sorted(fs.glob(f"{base}/{cluster_folder_name(cluster)}/date=*/hour=*/{COMPACTED_PREFIX}*{_SUFFIX}")):
        facts = read_compaction_facts(fs, path)
        for key in facts.keys if facts else ():
            found.setdefault(key, path)
    return found


def find_keyed_snapshots(root: str, cluster: str, keys: list[str], *,
                         include_compacted: bool = False) -> dict[str, str]:
    """{key: path} for those of `keys` already written for `cluster`, whatever their
    timestamp, date or hour folder: one listing of the cluster's folders.

    A key whose file was folded by compaction and then deleted is found only
    with `include_compacted` (a footer read per compacted hour). The snapshot
    task does not need it: compaction only touches hours closed for longer
    than any retry can reach back, so a retry's keys are never compacted.
    """
    fs, base = _filesystem(root)
    try:
        existing = _keyed_files(fs, base, cluster)
        if include_compacted:
            existing = {**_compacted_keys(fs, base, cluster), **existing}
    except OSError as exc:
        raise StoreError(f"cannot list snapshots under {root}: {exc.strerror or exc}") from None
    return {key: existing[_safe_part(key)] for key in keys if _safe_part(key) in existing}


def write_snapshot(
    table: Any,
    root: str,
    cluster: str,
    snapshot_ts: datetime,
    *,
    key: str | None = None,
) -> str | None:
    """Write one snapshot atomically and return its final path (fsspec form).

    The file goes to the hour folder of `snapshot_ts` in UTC (the rows'
    snapshot_ts). `key` makes the write idempotent: a retried task that passes
    the same key finds the earlier file (under any timestamp, date or hour
    folder of the cluster) and writes nothing (returns None).
    """
    import pyarrow.parquet as pq

    fs, base = _filesystem(root)
    ts = snapshot_ts.astimezone(timezone.utc)
    directory = hour_dir(base, cluster, ts)
    tag = _safe_part(key) if key else uuid.uuid4().hex[:12]
    name = f"{_PREFIX}{ts:{_TS_FORMAT}}-{tag}{_SUFFIX}"
    final = f"{directory}/{name}"
    tmp = f"{directory}/.{name}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        if key and tag in _keyed_files(fs, base, cluster, tag):
            return None
        fs.makedirs(directory, exist_ok=True)
        try:
            with fs.open(tmp, "wb") as fh:
                pq.write_table(table, fh, compression="zstd")
            fs.mv(tmp, final)
        except BaseException:
            if fs.exists(tmp):
                fs.rm(tmp)
            raise
    except OSError as exc:
        raise StoreError(f"cannot write snapshot under {root}: {exc.strerror or exc}") from None
    return final


# -- reading ------------------------------------------------------------------------------


def list_snapshot_files(root: str) -> list[str]:
    """Visible Parquet files under root, each row in exactly one of them.

    Hidden and `_` names below the root are skipped (temporary files,
    _quarantine); the root itself may live in a dot-folder. Files a compacted
    file covers are left out: it holds their rows.
    """
    fs, base = _filesystem(root)
    if not fs.exists(base):
        return []
    if not fs.isdir(base):
        return [base] if base.endswith(_SUFFIX) else []
    files = [f for f in fs.find(base) if f.endswith(_SUFFIX) and _visible_below(f, base)]
    return sorted(_without_covered(fs, files))


def read_snapshots(root: str, since: datetime | None = None):
    """The store as one pyarrow Table in contract 1 (Python side; Spark reads it itself)."""
    import pyarrow as pa
    import pyarrow.dataset as ds

    fs, base = _filesystem(root)
    files = list_snapshot_files(root)
    if not files:
        from lagdoctor.contracts import snapshot_arrow_schema

        return snapshot_arrow_schema().empty_table()
    # The cluster value lives inside the files too; reading without hive
    # partitioning keeps the file's typed column as the one truth.
    dataset = ds.dataset(files, filesystem=fs, format="parquet")
    # The dataset takes its schema from the first file: add the optional columns
    # (read_error, ...) so they are read from the files that have them, and are
    # null in older files without them, instead of being dropped.
    from lagdoctor.contracts import snapshot_writer_schema

    optional = [f for f in snapshot_writer_schema(*_OPTIONAL_NAMES)
                if f.name in _OPTIONAL_NAMES and f.name not in dataset.schema.names]
    if optional:
        dataset = ds.dataset(files, filesystem=fs, format="parquet",
                             schema=pa.schema([*dataset.schema, *optional]))
    table = dataset.to_table()
    missing = [c for c in SNAPSHOT_COLUMN_NAMES if c not in table.column_names]
    if missing:
        raise StoreError(f"snapshot files under {root} lack contract column(s): {', '.join(missing)}")
    if since is not None:
        import pyarrow.compute as pc

        table = table.filter(pc.greater_equal(table["snapshot_ts"], pa.scalar(since, pa.timestamp("us", tz="UTC"))))
    return table


def prune_snapshots(root: str, keep_days: int, today: datetime) -> list[str]:
    """Delete date= folders older than keep_days before `today`, hour folders and
    compacted files in them included; return what was removed."""
    fs, base = _filesystem(root)
    if not fs.exists(base):
        return []
    cutoff = (today.astimezone(timezone.utc) - timedelta(days=keep_days)).strftime("%Y-%m-%d")
    removed = []
    for cluster_dir in fs.ls(base, detail=False):
        if not _name(cluster_dir).startswith("cluster="):
            continue
        for day_dir in fs.ls(cluster_dir, detail=False):
            day = _name(day_dir)
            if day.startswith("date=") and day[len("date="):] < cutoff:
                fs.rm(day_dir, recursive=True)
                removed.append(day_dir)
    return removed


# -- compaction ---------------------------------------------------------------------------


@dataclass
class CompactionResult:
    """What one compact_snapshots call did."""

    compacted_hours: list[str] = field(default_factory=list)  # hour folders that got a compacted file
    files_folded: int = 0  # files whose rows went into a new compacted file
    files_removed: int = 0  # covered files deleted once their grace had passed
    rows: int = 0  # rows written to compacted files
    left_alone: list[str] = field(default_factory=list)  # "path: reason" for files not folded
    busy_hours: list[str] = field(default_factory=list)  # another compactor held the hour

    def summary(self) -> str:
        line = (f"compacted {len(self.compacted_hours)} hour(s): {self.files_folded} files folded, "
                f"{self.rows} rows; {self.files_removed} covered files removed")
        if self.busy_hours:
            line += f"; {len(self.busy_hours)} hour(s) busy (another compaction)"
        if self.left_alone:
            line += f"; {len(self.left_alone)} file(s) left alone, e.g. {self.left_alone[0]}"
        return line


def compact_snapshots(
    root: str,
    now: datetime,
    *,
    cluster: str | None = None,
    min_age: timedelta = timedelta(hours=2),
    grace: timedelta = timedelta(hours=1),
    lease: timedelta = timedelta(minutes=15),
) -> CompactionResult:
    """Fold each closed hour folder's snapshot files into one compacted file.

    An hour is closed when it ended at least `min_age` before `now`. min_age
    exceeds the snapshot task's retry horizon (a retry comes a minute or so
    later), so no retried keyed write can land in an hour once it is
    compacted. A later file there (not covered) is read as it is and folded
    by a later call, together with the compacted file.

    The compacted file (`compacted-<YYYYMMDDTHH>-<hash of the covered names>
    .parquet`, zstd, rows sorted by snapshot_ts, group_id, topic, partition,
    the union of the files' columns, absent ones null) is written under a
    hidden name and renamed into place; its footer lists the names it covers
    and their keys, so readers skip those. Covered files are deleted only by a
    call at least `grace` after the compacted file was written: a diagnosis
    that listed them just before keeps them for its whole read.

    A file that cannot be read, or whose column types conflict with the
    hour's others, is left alone (never folded, never deleted) and named in
    the result. Concurrent compactors (threads or processes) take an
    exclusive lock file per hour (`.compact.lock`, hidden; O_EXCL-style on
    local paths, "x" mode on fsspec filesystems that support it, else a
    check-then-write that a race can defeat, when the deterministic name and
    readers' coverage rule still keep every row read once). A lock older
    than `lease` (by `now`) is taken over; the other compactor skips the hour.
    """
    if min_age < timedelta(0) or grace < timedelta(0):
        raise ValueError("min_age and grace must not be negative")
    fs, base = _filesystem(root)
    now = now.astimezone(timezone.utc)
    result = CompactionResult()
    try:
        if not fs.isdir(base):
            return result
        for folder, hour_start in _hour_folders(fs, base, cluster):
            if hour_start + timedelta(hours=1) + min_age > now:
                continue
            try:
                entries = [_name(p) for p in fs.ls(folder, detail=False)]
                if len([n for n in entries if n.endswith(_SUFFIX) and not n.startswith((".", "_"))]) < 2:
                    continue  # one file (the usual end state) or none: nothing to do
                with _hour_lock(fs, folder, now, lease) as held:
                    if not held:
                        result.busy_hours.append(folder)
                        continue
                    _compact_hour(fs, folder, hour_start, now, grace, result)
            except FileNotFoundError:
                continue  # retention removed the day meanwhile (the sweep runs both at once)
    except OSError as exc:
        raise StoreError(f"cannot compact snapshots under {root}: {exc.strerror or exc}") from None
    return result


def _ls_or_gone(fs: Any, folder: str) -> list[dict]:
    """A folder's entries; none when retention deleted it since its parent was listed."""
    try:
        return fs.ls(folder, detail=True)
    except FileNotFoundError:
        return []


def _hour_folders(fs: Any, base: str, cluster: str | None) -> Iterator[tuple[str, datetime]]:
    """(hour folder, its start in UTC) of every cluster (or one), oldest first."""
    wanted = cluster_folder_name(cluster) if cluster is not None else None
    for cluster_entry in sorted(fs.ls(base, detail=True), key=lambda e: e["name"]):
        name = _name(cluster_entry["name"])
        if cluster_entry["type"] != "directory" or not name.startswith("cluster="):
            continue
        if wanted is not None and name != wanted:
            continue
        for day_entry in sorted(_ls_or_gone(fs, cluster_entry["name"]), key=lambda e: e["name"]):
            day = _name(day_entry["name"])
            if day_entry["type"] != "directory" or not day.startswith("date="):
                continue
            try:
                day_start = datetime.strptime(day[len("date="):], "%Y-%m-%d").replace(tzinfo=timezone.utc)
            except ValueError:
                continue
            for hour_entry in sorted(_ls_or_gone(fs, day_entry["name"]), key=lambda e: e["name"]):
                hour = _name(hour_entry["name"])
                if hour_entry["type"] != "directory" or not hour.startswith("hour="):
                    continue
                value = hour[len("hour="):]
                if value.isdigit() and 0 <= int(value) <= 23:
                    yield hour_entry["name"], day_start + timedelta(hours=int(value))


def _compact_hour(fs: Any, folder: str, hour_start: datetime, now: datetime, grace: timedelta,
                  result: CompactionResult) -> None:
    """Under the hour's lock: delete what grace allows, then fold what is not covered."""
    entries = sorted(_name(p) for p in fs.ls(folder, detail=False))
    for name in entries:  # a crashed compactor's temporary file: only ever ours, and we hold the lock
        if name.startswith(f".{COMPACTED_PREFIX}") and name.endswith(".tmp"):
            fs.rm(f"{folder}/{name}")
    names = [n for n in entries if n.endswith(_SUFFIX) and not n.startswith((".", "_"))]
    facts = {n: read_compaction_facts(fs, f"{folder}/{n}") for n in names if is_compacted_name(n)}
    covers = {n: f.covers for n, f in facts.items() if f is not None}
    skipped = covered_names(covers)
    accepted = [n for n in covers if n not in skipped]

    # 1. covered files go once the compacted file that holds them is `grace` old
    present = set(names)
    for name in accepted:
        at = facts[name].compacted_at
        if at is None or at + grace > now:
            continue
        for covered in sorted(covers[name] & present):
            fs.rm(f"{folder}/{covered}")
            present.discard(covered)
            result.files_removed += 1

    # 2. fold the accepted compacted file (if any) with every file it does not cover
    candidates = sorted((n for n in present if n not in skipped), key=lambda n: (n not in accepted, n))
    if len(candidates) < 2:
        return
    import pyarrow.parquet as pq

    # Pass 1, footers only: which files fold, under which union schema.
    folded: list[str] = []
    schema: dict[str, Any] = {}
    present_in: dict[str, set[str]] = {}
    for name in candidates:
        path = f"{folder}/{name}"
        try:
            with fs.open(path, "rb") as fh:
                file_schema = pq.read_schema(fh)
        except Exception as exc:  # truncated or foreign: the diagnosis job quarantines it, not us
            result.left_alone.append(f"{path}: not a readable Parquet file: {_one_line(exc)}")
            continue
        conflict = next((f for f in file_schema if f.name in schema and schema[f.name].type != f.type), None)
        if conflict is not None:
            result.left_alone.append(f"{path}: column {conflict.name} is {conflict.type} where the hour's "
                                     f"other files have {schema[conflict.name].type}")
            continue
        for f in file_schema:
            schema.setdefault(f.name, f)
            if f.nullable:
                schema[f.name] = schema[f.name].with_nullable(True)
        present_in[name] = set(file_schema.names)
        folded.append(name)
    if len(folded) < 2:
        return

    all_covered = set(folded)
    for name in folded:
        all_covered |= covers.get(name, frozenset())
    keys = sorted({tag for n in all_covered if (tag := _tag_of(n)) is not None}
                  | {k for n in folded if facts.get(n) for k in facts[n].keys})
    target = _union_schema(schema, [present_in[n] for n in folded]).with_metadata({
        META_COVERS: json.dumps(sorted(all_covered)),
        META_KEYS: json.dumps(keys),
        META_COMPACTED_AT: now.isoformat(),
    })
    digest = hashlib.sha256("\n".join(sorted(all_covered)).encode()).hexdigest()[:16]
    final = f"{folder}/{COMPACTED_PREFIX}{hour_start:%Y%m%dT%H}-{digest}{_SUFFIX}"
    tmp = f"{folder}/.{_name(final)}.{uuid.uuid4().hex[:8]}.tmp"
    # Pass 2, one file in memory at a time: a cluster-hour at 10,000 groups x 20
    # partitions is 36 files of 200k rows, gigabytes if held at once.
    rows, current = 0, None
    try:
        with fs.open(tmp, "wb") as fh, pq.ParquetWriter(fh, target, compression="zstd") as writer:
            for name in folded:
                current = f"{folder}/{name}"
                with fs.open(current, "rb") as src:
                    table = _conform(pq.read_table(src), target)
                writer.write_table(table, row_group_size=_ROW_GROUP_ROWS)
                rows += table.num_rows
            current = None
        fs.mv(tmp, final)
    except Exception as exc:
        if current is None:
            raise
        # a footer that read but data that does not: fold nothing this time, name the file
        result.left_alone.append(f"{current}: not a readable Parquet file: {_one_line(exc)}")
        return
    finally:
        if fs.exists(tmp):
            fs.rm(tmp)
    result.compacted_hours.append(folder)
    result.files_folded += len(folded)
    result.rows += rows


def _union_schema(schema: dict[str, Any], present: list[set[str]]):
    """The hour's columns; one some file lacks is nullable (null in that file's rows)."""
    import pyarrow as pa

    return pa.schema([f if all(f.name in names for names in present) else f.with_nullable(True)
                      for f in schema.values()])


def _conform(table: Any, target: Any):
    """One file's rows under the union schema, sorted (files are in time order already)."""
    import pyarrow as pa

    columns = [table[f.name] if f.name in table.column_names else pa.nulls(table.num_rows, f.type) for f in target]
    table = pa.Table.from_arrays(columns, schema=target.remove_metadata())
    keys = [(k, "ascending") for k in _SORT_KEYS if k in table.column_names]
    return table.sort_by(keys).replace_schema_metadata(target.metadata) if keys else table


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:200] or type(exc).__name__


# -- the per-hour lock --------------------------------------------------------------------


@contextmanager
def _hour_lock(fs: Any, folder: str, now: datetime, lease: timedelta) -> Iterator[bool]:
    """Yields True when this caller holds the hour's lock (released on exit), else False."""
    path = f"{folder}/{_LOCK_NAME}"
    owner = uuid.uuid4().hex
    body = json.dumps({"owner": owner, "expires": (now + lease).isoformat()})
    held = _take_lock(fs, path, body, now)
    try:
        yield held
    finally:
        if held and (_read_lock(fs, path) or {}).get("owner") == owner:
            fs.rm(path)


def _take_lock(fs: Any, path: str, body: str, now: datetime) -> bool:
    for _ in range(3):
        if _create_exclusive(fs, path, body):
            return True
        current = _read_lock(fs, path)
        if current is None:
            continue  # released meanwhile
        try:
            expires = datetime.fromisoformat(current["expires"])
        except (KeyError, TypeError, ValueError):
            return False  # not ours to judge: leave it
        if expires > now:
            return False
        # an expired lease (its compactor died): move it aside, then take the lock
        aside = f"{path}.{uuid.uuid4().hex[:8]}.expired"
        try:
            fs.mv(path, aside)
        except (FileNotFoundError, OSError):
            continue
        moved = _read_lock(fs, aside) or {}
        fs.rm(aside)
        if moved.get("owner") != current.get("owner"):  # another caller's fresh lock: give it back
            _create_exclusive(fs, path, json.dumps(moved))
            return False
    return False


def _create_exclusive(fs: Any, path: str, body: str) -> bool:
    """Create `path` holding `body` unless it exists; True when this call created it."""
    if _is_local(fs):
        # written whole under a temporary name, then hard-linked: link() fails if the lock exists
        tmp = f"{path}.{uuid.uuid4().hex[:8]}.tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(body)
        try:
            os.link(tmp, path)
            return True
        except FileExistsError:
            return False
        finally:
            os.remove(tmp)
    try:
        with fs.open(path, "xb") as fh:
            fh.write(body.encode())
        return True
    except FileExistsError:
        return False
    except (ValueError, NotImplementedError, TypeError):  # no exclusive create here: best effort
        if fs.exists(path):
            return False
        with fs.open(path, "wb") as fh:
            fh.write(body.encode())
        return True


def _read_lock(fs: Any, path: str) -> dict | None:
    try:
        with fs.open(path, "rb") as fh:
            value = json.loads(fh.read().decode() or "{}")
    except FileNotFoundError:
        return None
    except (ValueError, OSError):
        return {}
    return value if isinstance(value, dict) else {}
