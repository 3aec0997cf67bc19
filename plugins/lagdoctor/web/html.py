"""Jinja2 environment for the lag page and the incident report (autoescaped HTML)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

from lagdoctor.web.data import SEVERITY_RANK

TEMPLATES_DIR = Path(__file__).resolve().parent / "templates"

# Served with every page: no script, no outside resource, framed only by the
# Airflow UI itself (same origin). A name that slipped past escaping still runs nothing.
CONTENT_SECURITY_POLICY = ("default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; "
                           "form-action 'self'; base-uri 'none'; frame-ancestors 'self'")


@lru_cache(maxsize=1)
def environment():
    from jinja2 import Environment, FileSystemLoader

    # Lenient undefined on purpose: plans and evidence are open-ended JSON, and a
    # missing optional field must render as nothing, not fail the page.
    env = Environment(loader=FileSystemLoader(str(TEMPLATES_DIR)), autoescape=True)
    env.globals["severity_word"] = lambda s: {"ok": "healthy"}.get(str(s), str(s) or "unknown")
    env.filters["max_severity"] = lambda values: max(values, key=lambda s: SEVERITY_RANK.get(str(s), 0), default="ok")
    return env


def render(template: str, **context: Any) -> str:
    return environment().get_template(template).render(**context)
