"""What the DAG tasks do, one module per stage, so DAG files only wire.

params -> collect -> diagnose -> plan -> notify -> remediate, and housekeeping
(retention, compaction) beside them; `common` holds what several share and
imports no stage. A stage imports only stages before it.

Every function is keyed by the run (`run_key`) and safe to retry: a retried
snapshot task finds its samples already written, the diagnosis overwrites its
own run's output, Slack threads and remediation are deduplicated by their
stores. XCom carries paths and small summaries, never snapshot data.

Nothing heavy is imported at module level: DAG files import these modules.
"""
