"""The training pipeline flow and what only it uses: the `grpoflow run` command, its MLflow parent run and lineage,
the run summary and figures, the per-checkout run lock, schedules and deployments, the MLflow UI."""
