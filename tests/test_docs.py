"""The docs site (mkdocs.yml, docs/) builds in strict mode, so a broken link or a page
left out of the navigation fails `make check`; the README's links reach real files."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def build(project: Path, site: Path) -> subprocess.CompletedProcess:
    # never -q: mkdocs counts the warnings strict mode fails on only when it logs them
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                          cwd=project, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})


def test_the_docs_site_builds_without_a_warning(tmp_path):
    done = build(ROOT, tmp_path / "site")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "WARNING" not in done.stderr, done.stderr[-3000:]
    for page in ("getting-started", "diagnosis", "slack", "runbooks", "deploying", "metrics", "failures",
                 "cli", "snapshot-store", "benchmarks", "development"):
        assert (tmp_path / "site" / page / "index.html").is_file(), page


def test_a_broken_link_or_anchor_fails_the_build(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(ROOT / "mkdocs.yml", project)
    shutil.copytree(ROOT / "docs", project / "docs")
    with open(project / "docs" / "cli.md", "a", encoding="utf-8") as fh:
        fh.write("\nSee [the old page](no-such-page.md) and [a heading](metrics.md#no-such-heading).\n")
    done = build(project, tmp_path / "site")
    assert done.returncode != 0
    assert "no-such-page.md" in done.stderr and "no-such-heading" in done.stderr


def test_the_readme_links_reach_files_in_the_repository():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    links = [target for target in re.findall(r"\]\(([^)\s]+)\)", text) if "://" not in target]
    assert any(link.startswith("docs/") for link in links)
    missing = [link for link in links if not (ROOT / link.split("#", 1)[0]).exists()]
    assert not missing, missing
