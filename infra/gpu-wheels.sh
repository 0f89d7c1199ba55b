#!/usr/bin/env bash
# The wheels benchmarks/gpu_check.py needs on a CUDA machine whose Python (3.12, x86-64) has torch,
# transformers, peft and accelerate but no package index: the versions requirements/cuda.lock
# pins, downloaded here into .whl/ (gitignored), about 18 MB. transformers and peft travel too, so
# that the check runs the versions the tests here run (the machine has others); regex at the pin
# transformers checks when imported; math-verify and its parser for the rewards (antlr4's runtime
# is published as source only: built here into a pure-Python wheel). accelerate, tokenizers,
# safetensors, huggingface_hub, pyarrow and the rest are the machine's own.
#
#   infra/gpu-wheels.sh              # .whl/ with those wheels (replaced if this script made it); prints the total
#   infra/gpu-wheels.sh pyarrow      # the same, and the pinned versions of the names given
#
# On the machine they install without an index (docs/development.md shows the whole command):
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(trl datasets dill multiprocess transformers peft regex math-verify latex2sympy2_extended "$@")
BUILT=(antlr4-python3-runtime)   # source only on PyPI: pip builds its wheel here
MARKER=.whl/.grpoflow-wheels     # what says .whl/ is this script's to replace
PIP=("${PYTHON:-python3}" -m pip)
PLATFORMS=(--python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
           --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
           --platform manylinux2014_x86_64 --platform manylinux1_x86_64)

pin() {
  grep -i -E "^$(echo "$1" | sed 's/[-_]/[-_]/g')==" requirements/cuda.lock \
    || { echo "error: $1 is not pinned in requirements/cuda.lock" >&2; exit 1; }
}

pins=() built=()
for name in "${PACKAGES[@]}"; do pins+=("$(pin "$name")"); done
for name in "${BUILT[@]}"; do built+=("$(pin "$name")"); done
if [ -e .whl ] && [ ! -f "$MARKER" ]; then
  echo "error: .whl/ exists and this script did not make it (no $MARKER); move it away first" >&2
  exit 1
fi
rm -rf .whl
mkdir .whl
touch "$MARKER"
"${PIP[@]}" download -q --no-deps --only-binary=:all: "${PLATFORMS[@]}" -d .whl "${pins[@]}"
"${PIP[@]}" wheel -q --no-deps -w .whl "${built[@]}"
ls .whl/*.whl
du -ch .whl/*.whl | tail -1
