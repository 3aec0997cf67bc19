"""hadoop-aws for pip's pyspark, fetched from Maven Central on first use.

pyspark 4.3.0 ships Hadoop 3.5.0's client jars but no S3A, so s3a:// (and
s3://) fail as shipped. These are hadoop-aws 3.5.0 and its compile and
runtime dependencies (hadoop-project-3.5.0.pom), each checked against its
pinned SHA-1, into the user's cache folder ($LAGDOCTOR_CACHE or
$XDG_CACHE_HOME/lagdoctor, as the embedded broker's jars), once.
The AWS SDK bundle is the bulk: 654 MiB.

    jars = hadoop_aws_jars()          # [Path, ...], fetched if absent
    conf = classpath_conf(jars)       # driver/executor extraClassPath (one host)

`python -m lagdoctor.s3jars [--quiet-if-present]` fetches only.
On a cluster, bake the jars into the image's $SPARK_HOME/jars (or pass them
as spark.jars from a URI the nodes can read): every executor copying 654 MiB
per application is slow.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from lagdoctor.kafka.broker import cache_root

HADOOP_VERSION = "3.5.0"  # pyspark 4.3.0's hadoop-client-api
MAVEN_CENTRAL = "https://repo1.maven.org/maven2"
# (group, artifact, version, sha1) of hadoop-aws's compile/runtime dependencies
JARS = (
    ("org.apache.hadoop", "hadoop-aws", HADOOP_VERSION, "9e594525d264c0db653c7f68da98b245f7d61ea5"),
    ("software.amazon.awssdk", "bundle", "2.35.4", "7252265e3970b214708e68a8b74a8fa8c875af1e"),
    ("software.amazon.s3.analyticsaccelerator", "analyticsaccelerator-s3", "1.3.1",
     "6c9bd0f6c440c9a78e82d272f5f0252d942419f6"),
    ("org.wildfly.openssl", "wildfly-openssl", "2.2.5.Final", "78a86a04b5ddbfb75d6f3a2812cc724cde4a26f1"),
)


class JarFetchError(RuntimeError):
    """The jars could not be fetched or did not match their checksum; one line."""


def jars_dir(version: str = HADOOP_VERSION) -> Path:
    return cache_root() / f"hadoop-aws-{version}"


def _jar_name(artifact: str, version: str) -> str:
    return f"{artifact}-{version}.jar"


def _url(group: str, artifact: str, version: str) -> str:
    return f"{MAVEN_CENTRAL}/{group.replace('.', '/')}/{artifact}/{version}/{_jar_name(artifact, version)}"


def _download(url: str, dest: Path, sha1: str) -> None:
    digest = hashlib.sha1()
    try:
        with urllib.request.urlopen(url, timeout=60) as response, open(dest, "wb") as out:
            while chunk := response.read(1 << 20):
                digest.update(chunk)
                out.write(chunk)
    except OSError as exc:
        raise JarFetchError(f"could not fetch {url}: {exc}") from None
    if digest.hexdigest() != sha1:
        raise JarFetchError(f"{url}: SHA-1 {digest.hexdigest()} is not the pinned {sha1}")


def is_present(version: str = HADOOP_VERSION) -> bool:
    return (jars_dir(version) / ".complete").exists()


def hadoop_aws_jars(*, quiet: bool = False) -> list[Path]:
    """The jars' paths, fetched on first use (a lock keeps two processes from
    fetching at once; the folder appears whole or not at all)."""
    target = jars_dir()
    if not (target / ".complete").exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target.parent / f".hadoop-aws-{HADOOP_VERSION}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (target / ".complete").exists():
                if not quiet:
                    print(f"==> fetching hadoop-aws {HADOOP_VERSION} and the AWS SDK bundle from Maven Central "
                          f"into {target} (once, about 660 MB)", file=sys.stderr, flush=True)
                work = Path(tempfile.mkdtemp(prefix="fetch-", dir=target.parent))
                try:
                    started = time.monotonic()
                    for group, artifact, version, sha1 in JARS:
                        _download(_url(group, artifact, version), work / _jar_name(artifact, version), sha1)
                    (work / ".complete").write_text(f"{time.monotonic() - started:.1f}s\n")
                    shutil.rmtree(target, ignore_errors=True)
                    os.replace(work, target)
                finally:
                    shutil.rmtree(work, ignore_errors=True)
    return [target / _jar_name(artifact, version) for _, artifact, version, _ in JARS]


def classpath_conf(jars: list[Path]) -> dict[str, str]:
    """Driver and executor class path for jars on this host (no per-executor copy)."""
    path = os.pathsep.join(str(j) for j in jars)
    return {"spark.driver.extraClassPath": path, "spark.executor.extraClassPath": path}


def main() -> None:
    present = is_present()
    jars = hadoop_aws_jars()
    if present and "--quiet-if-present" in sys.argv[1:]:
        return
    size = sum(j.stat().st_size for j in jars)
    print(f"hadoop-aws {HADOOP_VERSION}: {len(jars)} jars, {size / 2**20:.0f} MiB in {jars_dir()}")


if __name__ == "__main__":
    main()
