#!/usr/bin/env bash
# Install PostgreSQL's server binaries from Debian's packages, for the Postgres-backed MLflow
# integration test (`make test-postgres`, tests/test_infra_postgres.py). Does nothing when an
# `initdb` is already installed.
#
#   infra/install-postgres.sh        # as root (CI), or through sudo
#
# No service is left running: the package's own `main` cluster is kept from starting (a
# temporary /usr/sbin/policy-rc.d answers "not now" to the package scripts), because the test
# starts a cluster of its own in a temporary folder on a free port and removes it afterwards.
set -euo pipefail

if ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null 2>&1; then
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "error: PostgreSQL is not installed and this is not a Debian/Ubuntu system;" \
       "install the PostgreSQL server (initdb, pg_ctl) with your package manager" >&2
  exit 1
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
    echo "error: PostgreSQL is not installed; run as root: apt-get install -y postgresql" >&2
    exit 1
  fi
fi

policy=/usr/sbin/policy-rc.d
added_policy=""
if [ ! -e "$policy" ]; then
  # invoke-rc.d consults this file: exit status 101 means "action forbidden", so the package
  # installs without starting its cluster.
  printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$policy" >/dev/null
  $SUDO chmod 755 "$policy"
  added_policy=1
fi
cleanup() { if [ -n "$added_policy" ]; then $SUDO rm -f "$policy"; fi; }
trap cleanup EXIT

echo "installing PostgreSQL from Debian packages (apt-get install postgresql)"
$SUDO apt-get update -qq
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql >/dev/null
ls -d /usr/lib/postgresql/*/bin
