#!/usr/bin/env bash
# step.sh LABEL CMD [ARG...]: run one step of `make chaos` that comes
# before the chaos command exists (downloading modules, compiling), so a
# cold first run says what it is doing. It prints
#
#   step: LABEL…                       after the first 3 s
#     … LABEL (10 s)                   every 10 s while CMD runs
#   step: LABEL done in 42 s           (failed after 42 s, with CMD's output)
#
# A step done within 3 s (a warm one) prints its done line only. CMD's
# output is kept back and shown only when it fails; its exit status is
# step.sh's.
set -u
if [ $# -lt 2 ]; then
	echo "usage: step.sh LABEL CMD [ARG...]" >&2
	exit 2
fi
label=$1
shift
every=${STEP_HEARTBEAT:-10}

# now prints the time in tenths of a second.
now() { local t; t=$(date +%s%N); echo $((t / 100000000)); }
# took prints the tenths since $begin as "0.4 s" under 10 s, else "42 s".
took() {
	local d=$(($(now) - begin))
	if [ "$d" -lt 100 ]; then echo "$((d / 10)).$((d % 10)) s"; else echo "$(((d + 5) / 10)) s"; fi
}

out=$(mktemp "${TMPDIR:-/tmp}/step.XXXXXX")
begin=$(now)
# The heartbeat's sleeps write nowhere, so that none keeps a pipe
# (make chaos | tee) open once the step is over.
(
	sleep 3 >/dev/null 2>&1 </dev/null
	echo "step: $label…"
	while sleep "$every" >/dev/null 2>&1 </dev/null; do
		echo "  … $label ($(( ($(now) - begin + 5) / 10 )) s)"
	done
) &
beat=$!
trap 'kill "$beat" 2>/dev/null; rm -f "$out"' EXIT

rc=0
"$@" >"$out" 2>&1 || rc=$?
kill "$beat" 2>/dev/null
wait "$beat" 2>/dev/null
# With OPCUA_CHAOS_STEPS set (make chaos: reports/<run>/steps.tsv), the
# step's label, seconds, state and end (Unix seconds) are appended to it, tab-separated (the
# format of report.StepsFile), for the summary's time line.
if [ -n "${OPCUA_CHAOS_STEPS:-}" ]; then
	d=$(($(now) - begin))
	state=done
	[ "$rc" -eq 0 ] || state=failed
	mkdir -p "$(dirname "$OPCUA_CHAOS_STEPS")" &&
		printf '%s\t%d.%d\t%s\t%s\n' "$label" $((d / 10)) $((d % 10)) "$state" "$(date +%s.%3N)" >>"$OPCUA_CHAOS_STEPS" || true
fi
if [ "$rc" -eq 0 ]; then
	echo "step: $label done in $(took)"
else
	echo "step: $label failed after $(took) (exit status $rc):"
	cat "$out"
fi
exit "$rc"
