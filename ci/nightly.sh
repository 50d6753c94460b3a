#!/usr/bin/env bash
# Nightly soak, a night-long profile that fits in 8 hours on 2 cores:
#   1. fuzz the server's request path (FUZZTIME per target, default 5m:
#      two targets, 10 minutes);
#   2. REPEATS rounds (default 2, each with a new seed) of every spec but
#      the soaks (LABEL_FILTER 'ci && !soak': the CI profile and the rows
#      labelled nightly, every property under SignAndEncrypt; about 17
#      minutes a round), so that the night reports their pass rates;
#   3. one round of the soak specs (seven, one per property but smoke),
#      SOAK each (default 50m: about 55 minutes each with start-up,
#      settling and judging, 6.4 hours);
#   4. the fault matrix (make faults at its default 1-minute soak: every
#      fault switch must be caught; about 15 minutes; trickle-leak, which
#      only a soak of an hour catches, is listed as skipped there and is
#      what the night's own soaks are for when SOAK is 1h or more).
# That is about 7.4 hours. Every round runs even after a failure, so the
# night reports a pass rate per spec and the seeds of its failures
# (make chaos SEED=<seed> replays one). The rounds' report goes to
# reports/<night>-rounds/rounds.md (and its page rounds.html) and one
# line per night is appended to reports/trend.jsonl (date, commit, pass
# rates, median figures, the soaks' per-hour trends, fault matrix
# totals), so a slow regression shows across nights. The script fails
# when any round failed or broke, or the fault matrix did not catch every
# fault. With AB_BASE set (e.g. image:myserver:1.4, the last release) the
# night also compares AB_CAND (default reference: this checkout's server;
# image:IMAGE for yours) against it (make ab, 6 rounds; a regression
# fails the night) and, with CAPACITY=1, climbs the capacity ladders
# (make capacity); both append their figures to the trend file and add
# to the night's length (about 15 and 6 minutes).
set -uo pipefail
cd "$(dirname "$0")/.."
export CI=true OPCUA_CHAOS_PROFILE=soak
REPEATS="${REPEATS:-2}"
case "$REPEATS" in ''|*[!0-9]*) echo "error: REPEATS must be a non-negative integer, got '$REPEATS'" >&2; exit 2 ;; esac
# SOAK is each soak spec's length in the soak round (a Go duration; the
# suites check it: 1m to 24h). SOAK=0 leaves the soak round out.
SOAK="${SOAK:-50m}"
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
	# 'ci && !soak': every spec (each suite is labelled ci) but the
	# soaks, the rows labelled nightly included.
	make chaos RUN="$run" LABEL_FILTER="${LABEL_FILTER:-ci && !soak}" || { echo "nightly: round $i failed (carrying on)"; rc=1; }
done
if [ "$SOAK" != 0 ]; then
	echo "nightly: soak round, SOAK=$SOAK each"
	run="$NIGHT-soak"
	runs+=("reports/$run")
	make chaos RUN="$run" SOAK="$SOAK" LABEL_FILTER=soak || { echo "nightly: the soak round failed (carrying on)"; rc=1; }
fi

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
