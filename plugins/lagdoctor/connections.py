"""Airflow Connections: the one place secrets come from."""

from __future__ import annotations


def connection_exists(conn_id: str) -> bool:
    """Whether an Airflow connection is defined (metadata DB, AIRFLOW_CONN_*, a secrets backend).

    Only "not found" means no; any other error (a malformed AIRFLOW_CONN_* value,
    say) is raised rather than quietly falling back to a default.
    """
    from airflow.sdk.bases.hook import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        return False
    return True
