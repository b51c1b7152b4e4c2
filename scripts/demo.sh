#!/usr/bin/env bash
# Sets up .venv (scripts/setup.sh) and runs the main job on built-in defaults.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m layers.demo "$@"
