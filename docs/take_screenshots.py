"""Screenshots of the lag page, a group view and a report, rendered by the plugin's own app
over a live data root (e.g. the one `make airflow` fills), in Debian's headless Chromium.

    .venv/bin/python docs/take_screenshots.py .demo/lagdoctor docs/
"""
from __future__ import annotations

import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import quote

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars", "--force-device-scale-factor=1"]


def main(data_root: str, out_dir: str, group: str = "payments-ledger", cluster: str = "kafka_default") -> int:
    import uvicorn

    from lagdoctor.settings import Settings
    from lagdoctor.web.app import create_app
    from lagdoctor.web.auth import dag_run_reader

    app = create_app(lambda: Settings(data_root=data_root))
    # read-only pictures of a local data root: every DAG readable, as an admin sees it
    app.dependency_overrides[dag_run_reader] = lambda: (lambda dag_id=None: True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.1)
    base = f"http://127.0.0.1:{port}"
    reports = sorted(Path(data_root, "reports").rglob(f"{group}__*.html"))
    pages = {"lag-page.png": f"{base}/", "group-view.png": f"{base}/group/{quote(cluster)}/{quote(group)}"}
    if reports:
        rel = reports[-1].relative_to(Path(data_root, "reports"))
        pages["incident-report.png"] = f"{base}/reports/{quote(str(rel.parent))}/{quote(rel.name)}"
    backtests = sorted(p.parent.name for p in Path(data_root, "backtests").glob("*/report.html"))
    if backtests:
        pages["backtest-report.png"] = f"{base}/backtests/{quote(backtests[-1])}"
    for name, url in pages.items():
        with tempfile.TemporaryDirectory() as profile:
            subprocess.run(["/usr/bin/chromium", *FLAGS, f"--user-data-dir={profile}",
                            f"--screenshot={Path(out_dir, name)}", "--window-size=1280,1600", url],
                           check=True, capture_output=True, timeout=120)
        print(f"{name}: {url}")
    server.should_exit = True
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
