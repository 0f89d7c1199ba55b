"""Where and how a stage runs: `dvc` calls, the process-group watchdog, stage placement on work pools, the process
environment and Prefect's temporary server, one stage in a clean working copy, git."""
