#!/usr/bin/env bash
# The stacking models of benchmarks/familyfold_stacking_mixture.py (configs/default.py, ~1 min each):
#   fold_F:   data.fold = F (trained without F; best checkpoint by the others' validation rows), every family;
#   pair_F_G: data.fold = F, data.valid_families = G (trained without F and G; latest checkpoint), for the
#             families with training rows (up to 200 nt: 5S, SRP, tRNA, 16S, tmRNA, RNase P).
# Usage: bash benchmarks/train_nested_stacking.sh OUT_DIR   (resumes: finished models are skipped)
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:?usage: bash benchmarks/train_nested_stacking.sh OUT_DIR}"
mkdir -p "$out"
all="5s srp tRNA tmRNA RNaseP grp1 16s telomerase 23s"  # grp2: none up to 512 nt (the test split)
trained="5s srp tRNA 16s tmRNA RNaseP"
train() {  # checkpoint workdir overrides...
  local checkpoint=$1 workdir=$2; shift 2
  [ -f "$workdir/params.npz" ] && return
  if .venv/bin/foldax train --config configs/default.py --workdir "$workdir" "$@" > "$workdir.log" 2>&1 &&
     .venv/bin/foldax export-params --workdir "$workdir" --out "$workdir/params.npz" --checkpoint "$checkpoint" \
       >> "$workdir.log" 2>&1; then
    echo "done $workdir $(date +%T)"
  else
    echo "FAILED $workdir (see $workdir.log)"
  fi
}
for f in $all; do train best "$out/fold_$f" --config.data.fold="$f"; done
for f in $trained; do
  for g in $trained; do
    if [[ "$f" < "$g" ]]; then train latest "$out/pair_${f}_$g" --config.data.fold="$f" --config.data.valid_families="$g"; fi
  done
done
