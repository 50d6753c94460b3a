#!/usr/bin/env bash
# Nightly soak: fuzz the server's request path (FUZZTIME per target,
# default 5m), run the suites REPEATS times (default 3, each round with a
# new seed) with the soak-labelled specs (SOAK each, default 5m) and the
# rows the CI profile leaves out (labelled nightly: every property under
# SignAndEncrypt), then the fault matrix (make faults: every
# fault switch must be caught). Every round runs even after a failure, so
# the night reports a pass rate per spec and the seeds of its failures
# (make chaos SEED=<seed> replays one). The rounds' report goes to
# reports/<night>-rounds/rounds.md (and its page rounds.html) and one
# line per night is appended to reports/trend.jsonl (date, commit, pass
# rates, median figures, fault matrix totals), so a slow regression shows
# across nights. The script
# fails when any round failed or broke, or the fault matrix did not
# catch every fault. With AB_BASE set (e.g. image:myserver:1.4, the
# last release) the night also compares AB_CAND (default reference: this
# checkout's server; image:IMAGE for yours) against it (make ab,
# 5 rounds; a regression fails the night) and, with CAPACITY=1, climbs
# the capacity ladders (make capacity); both append their figures to the
# trend file.
set -uo pipefail
cd "$(dirname "$0")/.."
export CI=true OPCUA_CHAOS_PROFILE=soak
REPEATS="${REPEATS:-3}"
case "$REPEATS" in ''|*[!0-9]*|0) echo "error: REPEATS must be a positive integer, got '$REPEATS'" >&2; exit 2 ;; esac
# The soak specs (six, one per property but smoke and robustness) run
# SOAK each in every round: 5 minutes by default, so that a round takes
# about 45 minutes and the night, with the fuzzing and the fault matrix,
# under three hours. The fault matrix keeps make's default soak (1m): a
# fault aimed at a soak spec is caught within it (slow-leak: the trend).
SOAK="${SOAK:-5m}"
NIGHT="nightly-$(date -u +%Y%m%d-%H%M%S)"
rc=0
runs=()
# Fuzz the server's request path for minutes (make test does seconds).
echo "nightly: fuzzing ${FUZZTIME:-5m} per target"
make fuzz FUZZTIME="${FUZZTIME:-5m}" || { echo "nightly: fuzzing found a crasher (in server/**/testdata/fuzz)"; rc=1; }
for i in $(seq 1 "$REPEATS"); do
	echo "nightly: round $i of $REPEATS"
	run="$NIGHT-r$i"
	runs+=("reports/$run")
	# 'ci || soak': every spec (each suite is labelled ci), the soak
	# specs and the rows labelled nightly included.
	make chaos RUN="$run" SOAK="$SOAK" LABEL_FILTER="${LABEL_FILTER:-ci || soak}" || { echo "nightly: round $i failed (carrying on)"; rc=1; }
done

echo "nightly: fault matrix"
before=$(ls reports/faults-*.json 2>/dev/null | sort | tail -1 || true)
SOAK= make faults || { echo "nightly: fault matrix not clean"; rc=1; }
matrix=$(ls reports/faults-*.json 2>/dev/null | sort | tail -1 || true)
matrix_flag=()
if [ -n "$matrix" ] && [ "$matrix" != "$before" ]; then
	matrix_flag=(-matrix "$matrix")
else
	echo "nightly: the fault matrix wrote no report"
	rc=1
fi

if [ -n "${AB_BASE:-}" ]; then
	echo "nightly: A/B against $AB_BASE"
	make ab RUN="$NIGHT" BASE="$AB_BASE" CAND="${AB_CAND:-reference}" TREND=reports/trend.jsonl || { echo "nightly: A/B found a regression (or could not judge)"; rc=1; }
fi
if [ "${CAPACITY:-}" = 1 ]; then
	echo "nightly: capacity"
	make capacity RUN="$NIGHT" TREND=reports/trend.jsonl || echo "nightly: a capacity ladder ended without a verdict (carrying on)"
fi

make .bin/chaos >/dev/null
.bin/chaos rounds -title "nightly $NIGHT" -out "reports/$NIGHT-rounds" -trend reports/trend.jsonl \
	-commit "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)" "${matrix_flag[@]}" "${runs[@]}" || rc=1
exit $rc
