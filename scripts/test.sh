#!/usr/bin/env bash
# Sets up .venv (scripts/setup.sh) and runs the test suite; extra args go to pytest.
# The tests run in FOLDAX_TEST_WORKERS processes (pytest-xdist; default: the CPU count, at most 2),
# each test file in one process so that its compiled programs are shared. 1 runs them in this process.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cpus="$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 1)"
workers="${FOLDAX_TEST_WORKERS:-$(( cpus < 2 ? cpus : 2 ))}"
if ! [[ "$workers" =~ ^[1-9][0-9]*$ ]]; then
  echo "scripts/test.sh: FOLDAX_TEST_WORKERS must be a positive integer, got '$workers'" >&2
  exit 2
fi
if [ "$workers" -gt 1 ]; then
  exec .venv/bin/python -m pytest -q -n "$workers" --dist loadfile "$@"
fi
exec .venv/bin/python -m pytest -q "$@"
