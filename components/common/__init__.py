"""What every stage shares: errors, files, MLflow tracking, the entry point and the params schema,
loading and checks."""
