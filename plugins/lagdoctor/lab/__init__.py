"""Demo and simulation tools: the simulator, live workloads, `make demo` and
`make airflow`. Production code never imports from here."""
