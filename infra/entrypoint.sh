#!/usr/bin/env bash
# Entry point of the grpoflow images (infra/Dockerfile): run one stage, the flow, or any command.
#
#   docker run IMAGE stage data -S data.seed=7           # python -m components.data -S data.seed=7
#   docker run IMAGE stage grpo -S grpo.trainer.beta=0.0         # python -m components.grpo -S grpo.trainer.beta=0.0
#   docker run IMAGE grpoflow run -S grpo.trainer.beta=0.0       # the whole training flow
#   docker run IMAGE prefect worker start --pool grpoflow-process   # anything else runs as given
#
# Stage names are those of dvc.yaml; each runs the module its dvc.yaml `cmd` runs
# (`python -m components.<stage>`), with the arguments given here instead of DVC's. It works the
# same from a checkout: `infra/entrypoint.sh stage data --help`.
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
  module=$(python - "$stage" <<'PY'
import re, sys, yaml
stage = sys.argv[1]
stages = (yaml.safe_load(open("dvc.yaml")) or {}).get("stages") or {}
if stage not in stages:
    sys.exit(f"error: unknown stage {stage!r}; stages of dvc.yaml: {' '.join(stages)}")
cmd = stages[stage].get("cmd", "") if isinstance(stages[stage], dict) else ""
cmd = " ".join(cmd) if isinstance(cmd, list) else str(cmd)
found = re.search(r"-m\s+(components\.[A-Za-z_][A-Za-z0-9_]*)", cmd)
if not found:
    sys.exit(f"error: dvc.yaml stage {stage!r} does not run `python -m components.<module>` (cmd: {cmd})")
print(found.group(1))
PY
) || exit 2
  exec python -m "$module" "$@"
fi

exec "$@"
