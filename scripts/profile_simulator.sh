#!/usr/bin/env bash
# Profile one policy's simulated loop (cProfile, sorted by own time) on a window
# of the Twitter day mapped onto Bitcoin OTC, in one process so the profile sees it:
#   scripts/profile_simulator.sh [POLICY] [MINUTES] [START_MINUTE]
# e.g. scripts/profile_simulator.sh gnn_faas 30 420   (113,080 requests)
# The whole command, every policy on its own process, is timed with
#   /usr/bin/time -v .venv/bin/gnn-faas simulate twitter --day --policies all --json
set -euo pipefail
cd "$(dirname "$0")/.."
POLICY=${1:-gnn_faas}
MINUTES=${2:-30}
START=${3:-420}
OUT=${PROFILE_OUT:-var/simulator.prof}
mkdir -p "$(dirname "$OUT")"
.venv/bin/python -m cProfile -o "$OUT" -m gnn_faas simulate twitter --graph bitcoin-otc \
  --minutes "$MINUTES" --start-minute "$START" --policies "$POLICY" --workers 1 --json \
  --no-progress > /dev/null
.venv/bin/python -c "import pstats, sys; pstats.Stats(sys.argv[1]).sort_stats('tottime').print_stats(30)" "$OUT"
