"""grpoflow pipelines: Prefect flows and the `grpoflow` CLI. They wire components; no ML logic."""
