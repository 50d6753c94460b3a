#!/usr/bin/env bash
# Nightly soak: run the suites REPEATS times (each with a new seed) and the
# soak-labelled specs, then the fault matrix (make faults: every fault
# switch must be caught); stops at the first failure, whose seed is in the
# report (make chaos SEED=<seed> or make faults SEED=<seed> replays it).
set -euo pipefail
cd "$(dirname "$0")/.."
export CI=true OPCUA_CHAOS_PROFILE=soak
REPEATS="${REPEATS:-5}"
case "$REPEATS" in ''|*[!0-9]*) echo "error: REPEATS must be a positive integer, got '$REPEATS'" >&2; exit 2 ;; esac
for i in $(seq 1 "$REPEATS"); do
	echo "nightly: round $i of $REPEATS"
	make chaos RUN="nightly-$(date -u +%Y%m%d-%H%M%S)-r$i" LABEL_FILTER="${LABEL_FILTER:-ci || soak}"
done
echo "nightly: fault matrix"
make faults
