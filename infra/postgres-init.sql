-- Runs once, when the postgres service of infra/compose.yaml starts on an empty volume (as
-- POSTGRES_USER, who owns both databases): MLflow uses POSTGRES_DB=mlflow, Prefect this one.
CREATE DATABASE prefect;
