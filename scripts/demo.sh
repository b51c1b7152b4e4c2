#!/usr/bin/env bash
# The main job on built-in defaults: sets up .venv (scripts/setup.sh), trains configs/default.py on
# ArchiveII with the tRNA family held out (resuming the run if the workdir has one), then prints the
# held-out F1 next to RNAfold's (ViennaRNA, installed here if the registry allows; else skipped).
# Without ../shared/data/archiveii (or $FOLDAX_ARCHIVEII) it downloads ArchiveII once through the
# tensorflow-datasets builder (python -m foldax.data.archiveii fetch: checked, kept in ~/.cache/foldax/archiveii or
# $FOLDAX_DATA_DIR); offline, it says so and folds built-in sequences instead.
# Usage: bash scripts/demo.sh [--config.FIELD=VALUE ...]   (passed to foldax train; workdir:
# $FOLDAX_WORKDIR, default runs/default)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/python -c "import RNA" 2>/dev/null || .venv/bin/python -m pip install -q "viennarna>=2.6" \
  || echo "(ViennaRNA not installed: RNAfold comparison skipped)"
workdir="${FOLDAX_WORKDIR:-runs/default}"
if [ ! -d ../shared/data/archiveii ] && [ -z "${FOLDAX_ARCHIVEII:-}" ]; then
  echo "ArchiveII not found (../shared/data/archiveii or \$FOLDAX_ARCHIVEII): fetching it"
  if archive="$(.venv/bin/python -m foldax.data.archiveii fetch)"; then
    export FOLDAX_ARCHIVEII="$archive"
  else
    echo "ArchiveII could not be downloaded (see above): folding built-in sequences instead"
    exec .venv/bin/python -m foldax.layers.demo
  fi
fi
.venv/bin/foldax train --config configs/default.py --workdir "$workdir" "$@"
exec .venv/bin/python -m foldax.train.compare --workdir "$workdir"
