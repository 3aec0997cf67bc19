"""The Kubernetes API client lagdoctor's evidence and actions share.

Credentials come from the settings' explicit host (tests, the demo's loopback API), else the
pod's service account, else the kubeconfig: never from lagdoctor's own config.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Iterator

from lagdoctor.remediation.config import KubernetesSettings


@contextlib.contextmanager
def api_client(settings: KubernetesSettings) -> Iterator[Any]:
    """configured_client(settings), closed afterwards."""
    api = configured_client(settings)
    try:
        yield api
    finally:
        api.close()


def configured_client(settings: KubernetesSettings, *, retries: int | None = None) -> Any:
    """A kubernetes ApiClient configured from `settings` (the caller closes it); `retries`:
    urllib3's per request (None: its default). Raises the client's ConfigException when no
    in-cluster account and no kubeconfig are found."""
    from kubernetes import client, config as kube_config

    configuration = client.Configuration()
    configuration.retries = retries
    if settings.host:
        configuration.host = settings.host
        configuration.verify_ssl = settings.verify_ssl
    else:
        loaded = False
        if settings.in_cluster is not False:
            try:
                kube_config.load_incluster_config(client_configuration=configuration)
                loaded = True
            except kube_config.ConfigException:
                if settings.in_cluster:
                    raise
        if not loaded:
            # The client reads KUBECONFIG once at import; read it now instead.
            kube_config.load_kube_config(config_file=os.environ.get("KUBECONFIG"), context=settings.context,
                                         client_configuration=configuration)
    return client.ApiClient(configuration)
