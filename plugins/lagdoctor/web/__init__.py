"""The lag page and the incident reports (contract 6).

    data.py     latest run per (cluster, group, topic) from findings_root; offset history from the store
    views.py    what a group's card and a report show (in lagdoctor.notify's words: formatting, lag_text, provisional)
    charts.py   line charts as inline SVG, pure Python: the page works offline
    html.py     the Jinja2 environment (templates/), autoescaped
    auth.py     Airflow's own JWT authentication and DAG-run read authorization
    app.py      create_app(): the FastAPI app the plugin mounts at /lagdoctor
    report.py   write_incident_report(run_dir): one HTML file per non-healthy finding; report_url()

Importing this package is cheap (no pyarrow, no Airflow security module);
the heavy parts load when a request or a report needs them.
"""
