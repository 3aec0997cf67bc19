"""Airflow plugin: the Kafka lag page at /lagdoctor/ on the API server (contract 6).

Airflow's plugin loader imports this file in every component that loads
plugins (API server, scheduler, DAG processor), so it imports only FastAPI and
lagdoctor.web.app; pyarrow, fsspec and Airflow's security module load on the
first request. The package itself lives in plugins/lagdoctor/, which
plugins/.airflowignore hides from the loader.

The nav entry opens the page inside the Airflow UI (an iframe at
/plugin/kafka-lag). Its href is relative: the UI's <base href> is the API
server's base path, so it resolves to <base>/lagdoctor/ with or without an
[api] base_url prefix. The iframe is same-origin, so the browser sends the
UI's `_token` cookie and the page authenticates like the UI's own API calls.
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from lagdoctor.web import slack_actions
from lagdoctor.web.app import URL_PREFIX, create_app


class LagdoctorPlugin(AirflowPlugin):
    name = "lagdoctor"
    fastapi_apps = [{"app": create_app(), "url_prefix": URL_PREFIX, "name": "lagdoctor"},
                    # Slack's Interactivity request URL: signed by Slack, not behind Airflow's login.
                    {"app": slack_actions.create_app(), "url_prefix": slack_actions.URL_PREFIX,
                     "name": "lagdoctor-slack"}]
    external_views = [{
        "name": "Kafka lag",
        "href": URL_PREFIX.lstrip("/") + "/",
        "url_route": "kafka-lag",
        "category": "browse",
        "destination": "nav",
    }]
