#!/usr/bin/env bash
# Install everything the test suite needs (idempotent): the Python extras from pyproject.toml
# into the venv given as $1 (torch pinned to the CPU wheel, torch==2.13.0), and the Debian
# packages the end-to-end tests drive: chromium (browser test of the app, via playwright with
# executable_path=/usr/bin/chromium; never `playwright install`), slurm-wlm and munge (a real
# one-node Slurm on loopback for validate's sbatch path).
set -euo pipefail
VENV=${1:-.venv}
PYTHONWARNINGS=ignore::UserWarning "$VENV/bin/pip" install -q -e '.[test,torch,app]'

need=()
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v slurmctld >/dev/null 2>&1 || need+=(slurm-wlm)
command -v munged >/dev/null 2>&1 || need+=(munge)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null 2>&1 || true
    apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null 2>&1 \
      || echo "setup: could not install ${need[*]}; tests needing them will be skipped" >&2
  else
    echo "setup: not root or no apt-get; ${need[*]} missing, tests needing them will be skipped" >&2
  fi
fi
