"""Debian's PostgreSQL binaries, run by lagdoctor: where they are, and how to run
them as the `postgres` user when we are root (PostgreSQL refuses to run as root).

Used by the cluster topology (lagdoctor.lab.topology) and the test suite's
throwaway servers (tests/fixtures/postgres.py).
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
from pathlib import Path


def pg_bin() -> Path | None:
    """The folder of initdb/postgres/pg_ctl: the newest Debian version, else the one on PATH."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def runuser() -> str:
    # util-linux puts it in sbin, which a stripped PATH (CI's env -i) leaves out
    for candidate in (shutil.which("runuser"), "/usr/sbin/runuser", "/sbin/runuser"):
        if candidate and os.path.exists(candidate):
            return candidate
    raise RuntimeError("runuser not found: PostgreSQL cannot be started as root without it")


def as_server_user(cmd: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return cmd
    return [runuser(), "-u", "postgres", "--", *cmd]


def own_for_server(*paths: Path) -> None:
    """Folders the server writes to belong to `postgres` when we are root."""
    if os.geteuid() == 0:
        for path in paths:
            shutil.chown(path, "postgres")


def initdb_command(bindir: Path, data: Path, pwfile: Path | None = None) -> list[str]:
    """initdb for superuser `postgres`: with `pwfile` (its password, a file the server user can read)
    every connection must give the password (scram-sha-256); without it, trust (throwaway test servers)."""
    auth = ["--auth", "scram-sha-256", "--pwfile", str(pwfile)] if pwfile else ["--auth", "trust"]
    return as_server_user([str(bindir / "initdb"), "-D", str(data), "-U", "postgres", *auth,
                           "--no-sync", "-E", "UTF8"])


def server_options(port: int, sock: Path, max_connections: int | None = None) -> list[str]:
    """The settings of a throwaway server: loopback only, its socket in its own folder, no fsync."""
    opts = ["-h", "127.0.0.1", "-p", str(port), "-k", str(sock), "-c", "fsync=off", "-c", "full_page_writes=off"]
    if max_connections:
        opts += ["-c", f"max_connections={max_connections}"]
    return opts
