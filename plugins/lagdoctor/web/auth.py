"""Who may see what: the Airflow API's own authentication and DAG-run authorization.

Plugin FastAPI apps get no authentication from Airflow, so every route here
depends on ``dag_run_reader``:

1. The caller is authenticated exactly as Airflow's REST API does it
   (``airflow.api_fastapi.core_api.security.get_user``): an
   ``Authorization: Bearer <JWT>`` header, or else the ``_token`` cookie the
   Airflow UI sets at login (path = the API server's base path, so a browser
   signed in to the Airflow UI sends it to /lagdoctor/ too). No credential:
   401; an invalid one: 403.
2. Each findings folder is shown only if the caller may read that DAG's runs,
   the check ``requires_access_dag("GET", DagAccessEntity.RUN)`` makes for
   ``GET /api/v2/dags/{dag_id}/dagRuns`` (auth manager, team of the DAG). A folder written
   outside Airflow (no dag_id in run.json) needs read access to all DAGs.

Airflow's security module is imported on first request, not when the plugin
loads: the scheduler and DAG processor import plugins too.
"""

from __future__ import annotations

import logging
from typing import Callable

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

log = logging.getLogger(__name__)

DagReadCheck = Callable[[str | None], bool]

_bearer = HTTPBearer(auto_error=False)


async def dag_run_reader(
    request: Request,
    bearer: HTTPAuthorizationCredentials | None = Depends(_bearer),
) -> DagReadCheck:
    """Authenticate the caller; return ``can_read(dag_id)`` for the findings they may see."""
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity, DagDetails
    from airflow.api_fastapi.core_api.security import get_user
    from airflow.models.dag import DagModel

    user = await get_user(request=request, _oauth_token=None, bearer_credentials=bearer)
    auth_manager = get_auth_manager()
    decided: dict[str | None, bool] = {}

    def can_read(dag_id: str | None) -> bool:
        # What requires_access_dag("GET", DagAccessEntity.RUN) checks, with the
        # dag id taken from run.json only: that dependency would fall back to a
        # ?dag_id= query parameter, which the caller controls.
        if dag_id not in decided:
            try:
                team = DagModel.get_team_name(dag_id) if dag_id else None
                decided[dag_id] = bool(auth_manager.is_authorized_dag(
                    method="GET", access_entity=DagAccessEntity.RUN,
                    details=DagDetails(id=dag_id, team_name=team), user=user,
                ))
            except Exception:  # fail closed: a broken lookup shows nothing rather than everything
                log.exception("authorization check for DAG %r failed; hiding its findings", dag_id)
                decided[dag_id] = False
        return decided[dag_id]

    return can_read
