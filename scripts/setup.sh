#!/usr/bin/env bash
# Creates .venv with Python >= 3.12 and installs foldax with its test extras.
# Usage: source-free; run `bash scripts/setup.sh`. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
find_python() {
  for cand in python3.13 python3.12 \
      "$HOME"/.pyenv/versions/3.12*/bin/python3.12 "$HOME"/.pyenv/versions/3.13*/bin/python3.13 \
      /usr/local/bin/python3.12 /usr/bin/python3.12 python3; do
    if command -v "$cand" >/dev/null 2>&1 && "$cand" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then
      command -v "$cand"; return 0
    fi
  done
  echo "foldax needs Python >= 3.12 (jax 0.12 / flax 0.12); none found. Install one (e.g. 'pyenv install 3.12')." >&2
  return 1
}
if [ ! -x .venv/bin/python ]; then
  "$(find_python)" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e ".[test]"
