#!/usr/bin/env bash
# Entry point of the grpoflow images (infra/Dockerfile): run one stage, the flow, or any command.
#
#   docker run IMAGE stage prepare -S data.seed=7        # python -m components.data -S data.seed=7
#   docker run IMAGE stage grpo -S grpo.beta=0.0         # python -m components.grpo -S grpo.beta=0.0
#   docker run IMAGE grpoflow run -S grpo.beta=0.0       # the whole training flow
#   docker run IMAGE prefect worker start --pool grpoflow-process   # anything else runs as given
#
# Stage names are those of dvc.yaml; each runs its module `components.<module>` (prepare's module is
# components.data, every other stage's module has the stage's name). It works the same from a
# checkout: `infra/entrypoint.sh stage prepare --help`.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$#" -eq 0 ]; then
  set -- grpoflow --help
fi

if [ "$1" = "stage" ]; then
  if [ "$#" -lt 2 ]; then
    echo "usage: stage NAME [-S section.key=value ...]   (NAME: a stage of dvc.yaml)" >&2
    exit 2
  fi
  stage="$2"
  shift 2
  case "$stage" in
    prepare) module=data ;;
    *) module="$stage" ;;
  esac
  if [[ ! "$module" =~ ^[a-z_][a-z0-9_]*$ ]] || [ ! -f "components/$module.py" ]; then
    known=$(python -c 'import yaml; print(" ".join(yaml.safe_load(open("dvc.yaml"))["stages"]))' 2>/dev/null || echo "?")
    echo "error: unknown stage '$stage' (no components/$module.py); stages of dvc.yaml: $known" >&2
    exit 2
  fi
  exec python -m "components.$module" "$@"
fi

exec "$@"
