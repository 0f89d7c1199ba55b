#!/usr/bin/env bash
# Build the grpoflow images from infra/Dockerfile and tag them with the git commit.
#
#   infra/build.sh                          # cpu and gpu: grpoflow:cpu-<sha>, grpoflow:gpu-<sha>
#   infra/build.sh cpu                      # one target (cpu | gpu | tracking)
#   infra/build.sh cpu -- --build-arg EXTRA_PACKAGES="dvc[s3]"    # after --: passed to docker build
#   GRPOFLOW_REGISTRY=registry.example.com/ml/ PUSH=1 infra/build.sh   # <registry>grpoflow:<target>-<sha>, pushed
#   infra/build.sh --print cpu              # print the commands instead of running them
#   infra/build.sh --sha                    # print the tag suffix only
#   infra/build.sh --image gpu              # print the image name the build would tag (infra/prefect.yaml uses it)
#
# <sha> is `git rev-parse --short HEAD`; a tree with uncommitted changes gets `-dirty` appended, so
# that an image tag never claims a commit whose code it does not hold. infra/prefect.yaml's docker and
# kubernetes deployments name the same tags.
set -euo pipefail
cd "$(dirname "$0")/.."

sha=$(git rev-parse --short HEAD)
if [ -n "$(git status --porcelain --untracked-files=no)" ]; then
  sha="$sha-dirty"
fi
registry="${GRPOFLOW_REGISTRY:-}"
if [ "${1:-}" = "--sha" ]; then
  echo "$sha"
  exit 0
fi
if [ "${1:-}" = "--image" ]; then
  case "${2:-}" in
    cpu|gpu|tracking) echo "${registry}grpoflow:${2}-${sha}"; exit 0 ;;
    *) echo "error: --image needs a target (cpu | gpu | tracking)" >&2; exit 2 ;;
  esac
fi

run() { "$@"; }
if [ "${1:-}" = "--print" ]; then
  run() { printf '%q ' "$@"; echo; }
  shift
fi

targets=()
while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do
  case "$1" in
    cpu|gpu|tracking) targets+=("$1") ;;
    *) echo "error: unknown target '$1' (cpu | gpu | tracking)" >&2; exit 2 ;;
  esac
  shift
done
[ "${1:-}" = "--" ] && shift
[ "${#targets[@]}" -gt 0 ] || targets=(cpu gpu)

for target in "${targets[@]}"; do
  image="${registry}grpoflow:${target}-${sha}"
  case "$target" in
    tracking) stage=(--target tracking) ;;
    *) stage=(--target pipeline --build-arg "VARIANT=$target") ;;
  esac
  run docker build -f infra/Dockerfile "${stage[@]}" --build-arg "GIT_COMMIT=$sha" -t "$image" "$@" .
  if [ "${PUSH:-0}" = 1 ]; then
    run docker push "$image"
  fi
done
