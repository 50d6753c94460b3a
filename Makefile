# opcua-chaos: chaos and stress suites for OPC UA servers.
# `make chaos` runs the suites against TARGET; `make test` is what CI runs.
SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

TARGET        ?= reference
# PROFILE names the specs make chaos runs (package profile):
#   ci (default, what make test and CI run): the CI profile chosen by
#     evidence (fixtures/profile/ci.json, label profile:ci): every property
#     under every condition of the full profile at least once, and for
#     every fault switch a spec shorter than a soak catches one that
#     catches it (make profile regenerates it; make faults PROFILE=ci
#     proves it);
#   full: every spec but the soaks and the rows labelled nightly (the
#     properties' rows under SignAndEncrypt but for backpressure's, smoke's
#     and wakeups', which it breaks first).
# The nightly runs them all (LABEL_FILTER='ci || soak'). LABEL_FILTER
# replaces the profile's filter. Every row is labelled security:<mode>:
# LABEL_FILTER='security:sign-encrypt && condition:baseline' runs every
# property under SignAndEncrypt.
PROFILE       ?= ci
ifeq ($(PROFILE),ci)
PROFILE_FILTER := profile:ci
else ifeq ($(PROFILE),full)
PROFILE_FILTER := !soak && !nightly
else
$(error PROFILE=$(PROFILE) is not a profile (valid: ci, full))
endif
LABEL_FILTER  ?= $(PROFILE_FILTER)
# FOCUS narrows the run, beside LABEL_FILTER, to the specs whose full text
# matches the regular expression (Ginkgo's --focus); a row's reproduce
# command sets it when its run had a focus.
FOCUS         ?=
RUN           ?= $(shell date -u +%Y%m%d-%H%M%S)
# expanded once: every step of a run names the same folder
RUN           := $(RUN)
SEED          ?=
# SOAK is the run length of the soak specs (a Go duration, 1m to 24h;
# default 1m, so LABEL_FILTER=soak stays short). The suite timeout grows
# with it: 30 minutes plus twice the soak (a suite may hold more than one
# soak spec's worth of time: the spec, its drain and its judge).
SOAK          ?=
SUITE_TIMEOUT ?= $(shell awk -v s='$(SOAK)' 'BEGIN { t = 0; while (match(s, /^[0-9.]+(h|ms|m|s)/)) { u = substr(s, RSTART, RLENGTH); n = u + 0; sub(/^[0-9.]+/, "", u); t += n * (u == "h" ? 3600 : u == "m" ? 60 : u == "s" ? 1 : 0.001); s = substr(s, RLENGTH + 1) } printf "%ds", 1800 + 2 * t }')
# `make faults`: the fault switches to judge (default: every one).
FAULTS        ?=
# STRICT=1 fails the run when a selected spec was skipped (e.g. a capability
# the target lacks); the suites and `chaos table` read it.
STRICT        ?=
BIN           := .bin
CHAOS         := $(BIN)/chaos
REPORTS       := reports

export TARGET OPCUA_ENDPOINT STRICT SOAK FOCUS

# No --fail-on-empty: a label filter may select specs of some suites only.
# `chaos table` fails a run whose filter selected no spec in any suite.
# No --junit-report: `chaos table` writes reports/<run>/junit.xml (every
# suite, as Ginkgo merged it) from report.json, a spec not judged there
# skipped with its reason rather than failed.
# No --poll-progress-after: a spec's progress report (every goroutine's
# stack) comes only near its own deadline (spec.Timeout), never while it
# waits for the machine lock or a quiet host, which print one line each.
GINKGO_FLAGS := --randomize-all --keep-going \
	--timeout $(SUITE_TIMEOUT) \
	--output-dir $(REPORTS)/$(RUN) --json-report report.json
ifneq ($(LABEL_FILTER),)
GINKGO_FLAGS += --label-filter '$(LABEL_FILTER)'
endif
ifneq ($(SEED),)
GINKGO_FLAGS += --seed $(SEED)
endif
# from the environment (exported above), so that a regular expression
# needs no quoting for make
ifneq ($(FOCUS),)
GINKGO_FLAGS += --focus "$$FOCUS"
endif
ifeq ($(CI),true)
GINKGO_FLAGS += --no-color
endif

UNIT_PKGS = $$(go list ./... | grep -v '/suites/')

# Every suite is compiled before the first spec runs and Ginkgo runs the
# binaries: run with packages, Ginkgo compiles the next suite while one
# measures, and those compilers took up to 1.8 of 2 cores from specs
# measuring (their Quiet assumption then says "not judged").
SUITE_DIRS = $$(go list -f '{{.Dir}}' ./suites/...)
SUITE_BINS = $$(for d in $(SUITE_DIRS); do echo $$d/$$(basename $$d).test; done)
# The suites' names, for `chaos preflight` (an earlier run's time counts
# only if every one reported) and `chaos table` (one that never reported
# died).
SUITE_NAMES = $$(for d in $(SUITE_DIRS); do basename $$d; done)

.PHONY: help ab capacity chaos test fmt-check vet unit fuzz images clean faults profile recheck merge specificity report $(CHAOS)

help: ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-10s %s\n", $$1, $$2}'

# ci/step.sh prints each step before the chaos command exists (a cold
# first run downloads and compiles for minutes): its start, a heartbeat
# line every 10 s and its duration, or its output when it fails.
# make chaos appends each step's duration to reports/<run>/steps.tsv
# (the modules and the chaos command here, the images and the probe in
# chaos preflight, the suites' compilation), for the summary's time line.
# While the modules download (network: 11-14 s on a fresh machine) the
# standard library's heaviest packages compile, which everything after
# needs (a warm cache: 0.1 s). A failure there is not the run's: the
# compilers after it say what failed.
STD_WARM := net/http crypto/tls encoding/json text/template
chaos: export OPCUA_CHAOS_STEPS = $(abspath $(REPORTS)/$(RUN)/steps.tsv)
$(CHAOS):
	@mkdir -p $(BIN)
	@rm -f "$${OPCUA_CHAOS_STEPS:-/dev/null/none}"
	@ci/step.sh "downloading modules" go mod download & dl=$$!; \
	ci/step.sh "compiling the standard library" go build $(STD_WARM) || true; \
	wait $$dl
	@ci/step.sh "compiling the chaos command" go build -o $(CHAOS) ./fixtures/cmd/chaos

# `chaos table` decides the run's exit status from summary.json, Ginkgo's
# report.json and Ginkgo's own status (a failure no report explains is
# not lost): 0 passed, 1 a property failed (or the run cannot pass), 3
# nothing failed but rows were not judged. It writes it to
# reports/<run>/exit-code, since make itself exits 2 on any failure.
# The HTML page comes last and never changes the exit status.
chaos: $(CHAOS) ## run all suites against TARGET (LABEL_FILTER, FOCUS, SEED, STRICT) and print the summary
	@rm -f $(REPORTS)/$(RUN)/exit-code
# The suites compile while the images build (a cold start's compilers
# overlap the images' docker builds); the preflight's probe, which times
# the server, starts once both are done. The compiler runs in its own
# process group, stopped whole when the images fail or make is stopped.
	@c=0; i=0; setsid ci/step.sh "compiling the suites" go tool ginkgo build -r ./suites/... & comp=$$!; \
	trap 'kill -- -$$comp 2>/dev/null' INT TERM; \
	$(CHAOS) preflight -images || i=$$?; \
	if [ $$i -ne 0 ]; then kill -- -$$comp 2>/dev/null; wait $$comp 2>/dev/null; exit $$i; fi; \
	wait $$comp || c=$$?; exit $$c
	@OPCUA_CHAOS_RUN=$(RUN) OPCUA_CHAOS_LABEL_FILTER='$(LABEL_FILTER)' OPCUA_CHAOS_SUITES="$(SUITE_NAMES)" $(CHAOS) preflight
	@g=0; OPCUA_CHAOS_RUN=$(RUN) go tool ginkgo $(GINKGO_FLAGS) $(SUITE_BINS) || g=$$?; \
	rc=0; OPCUA_CHAOS_SUITES="$(SUITE_NAMES)" $(CHAOS) table -ginkgo-exit $$g $(REPORTS)/$(RUN) || rc=$$?; \
	$(CHAOS) report $(REPORTS)/$(RUN) || true; \
	case $$rc in 0) ;; 3) echo "make chaos: exit status 3: not judged (nothing failed; re-run once)" >&2 ;; \
	*) echo "make chaos: exit status $$rc: failed" >&2 ;; esac; \
	exit $$rc

test: fmt-check vet unit fuzz chaos ## gofmt check, go vet, unit tests with -race, a short fuzz run, then make chaos

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi

vet:
	go vet ./...

unit: ## unit tests (everything but the suites) with -race
	go test -race -count=1 $(UNIT_PKGS)

# Go native fuzzing of the reference server's request path, FUZZTIME per
# target: the whole handling of a message on a live session (a Read must
# still be answered after it) and the guarded decoding of a request body.
# make test fuzzes briefly, the nightly for minutes; a crasher lands in
# the package's testdata/fuzz and is then a regression test of go test.
# ci/fuzz.sh tells a crasher from Go 1.26's coordinator race at the end of
# a duration (golang/go#75804): only a crasher, or another failure, fails.
FUZZTIME ?= 10s
fuzz: ## fuzz the server's request handling and decoding for FUZZTIME per target
	ci/fuzz.sh FuzzHandleMessage ./server $(FUZZTIME)
	ci/fuzz.sh FuzzDecodeService ./server/internal/uabin $(FUZZTIME)

images: $(CHAOS) ## build (or reuse) the server and toxiproxy images
	@$(CHAOS) images

# Specificity: N runs of the clean reference server with fresh seeds (every
# run goes on after a failure), judged together: per spec its pass rate and
# the seeds of false alarms, every figure's spread and, with MATRIX=<a
# faults-<time>.json>, the same figures under the faults; written to
# reports/specificity-<run>/rounds.md, .json and the page rounds.html.
# Fails on any false alarm.
N      ?= 5
MATRIX ?=
TIMES  ?=
specificity: $(CHAOS) ## N clean runs judged together: false alarms, figure spreads (N, LABEL_FILTER, MATRIX)
	@rc=0; for i in $$(seq 1 $(N)); do \
		echo "specificity: run $$i of $(N)"; \
		$(MAKE) --no-print-directory chaos RUN=specificity-$(RUN)-$$i SEED= OPCUA_FAULTS= || rc=1; \
	done; \
	$(CHAOS) rounds -title "specificity $(RUN) ($(LABEL_FILTER))" -out $(REPORTS)/specificity-$(RUN) \
		$(if $(MATRIX),-matrix $(MATRIX)) $$(seq -f '$(REPORTS)/specificity-$(RUN)-%g' 1 $(N)) || rc=1; \
	exit $$rc

# Paired A/B of two targets (package ab): the same scenarios against
# BASE and CAND (reference, reference:faults=NAME, gopcua, dotnet,
# image:IMAGE, external:URL) in ROUNDS alternating rounds, each figure
# judged by the interval of its paired rounds' median change: worse or
# better only when it lies on that side of zero and the median change
# reaches AB_THRESHOLD (default 5%, per figure e.g. 5%,p99_ms=20%) at
# AB_CONFIDENCE (default 95%: 6 rounds). Writes reports/<run>/ab.md,
# .json and .html. Fails on a regression: a property failing on CAND
# only, or a worse figure.
BASE          ?= reference
CAND          ?=
ROUNDS        ?= 6
AB_SCENARIOS  ?=
CONDITION     ?=
AB_DURATION   ?=
AB_THRESHOLD  ?=
AB_CONFIDENCE ?=
# TREND=reports/trend.jsonl appends the run's figures to the trend file
# (make ab and make capacity; the nightly's).
TREND        ?=
ab: $(CHAOS) ## compare two targets in alternating rounds (BASE, CAND, ROUNDS, CONDITION, AB_SCENARIOS, AB_THRESHOLD)
	@OPCUA_CHAOS_RUN=ab-$(RUN) BASE='$(BASE)' CAND='$(CAND)' ROUNDS='$(ROUNDS)' AB_SCENARIOS='$(AB_SCENARIOS)' \
		CONDITION='$(CONDITION)' AB_DURATION='$(AB_DURATION)' AB_THRESHOLD='$(AB_THRESHOLD)' AB_CONFIDENCE='$(AB_CONFIDENCE)' \
		AB_MAX_WORSE='$(AB_MAX_WORSE)' AB_NOISE='$(AB_NOISE)' \
		SEED='$(SEED)' TREND='$(TREND)' $(CHAOS) ab

# The capacity ladders (package capacity): one dimension at a time
# (sessions, outstanding, items at 100 Hz, publish), each level a fresh
# TARGET, until a level breaks an o6 rule. Writes
# reports/capacity-<run>/capacity.md, .json and .html.
CAPACITY_DIMENSIONS ?=
CAPACITY_DURATION   ?=
capacity: $(CHAOS) ## climb the capacity ladders against TARGET (CAPACITY_DIMENSIONS, CONDITION, CAPACITY_DURATION)
	@OPCUA_CHAOS_RUN=capacity-$(RUN) CAPACITY_DIMENSIONS='$(CAPACITY_DIMENSIONS)' CONDITION='$(CONDITION)' \
		CAPACITY_DURATION='$(CAPACITY_DURATION)' SEED='$(SEED)' TREND='$(TREND)' $(CHAOS) capacity

# A run spread over machines (ci/github/ci.yml): each shard runs
# `make chaos` with the same SEED and its own LABEL_FILTER; merge makes one
# summary and table of their report folders.
OUT  ?= $(REPORTS)/merged
DIRS ?=
merge: $(CHAOS) ## merge shards' report folders into one summary (OUT, DIRS="a b")
	@$(CHAOS) merge $(OUT) $(DIRS)

clean: $(CHAOS) ## remove containers, networks, images of ended runs of this project (chaos clean -all: live ones too)
	@$(CHAOS) clean

# The fault matrix: the specs labelled fault:<name> run with no fault (one
# control run), then with each fault on; FAULTS="a b" narrows it, SEED
# replays it. PROFILE=ci, given on the command line or in the environment,
# prints the CI profile and its coverage and runs only its specs (the
# soak-only faults listed with the nightly's soak spec that catches
# them); without it, or with PROFILE=full, every spec aimed at a fault
# runs. Writes reports/faults-<time>.md and .json.
faults: $(CHAOS) ## prove each server fault is caught: its specs pass without it, fail with it (FAULTS, SEED, PROFILE)
	@$(CHAOS) faults $(if $(SEED),-seed $(SEED)) $(if $(filter command line environment,$(origin PROFILE)),-profile $(PROFILE)) $(FAULTS)

# The CI profile (package profile): a dry run lists the suites' specs into
# fixtures/profile/specs.json, the fault matrices MATRIX="reports/faults-….json …"
# add their evidence to fixtures/profile/evidence.json, and the profile
# fixtures/profile/ci.json is generated from the two; TIMES="reports/<run> …"
# adds the run times of make chaos runs' specs (the shorter spec of a row
# is preferred, and the profile's time estimated); commit the three.
# go test ./fixtures/profile fails while ci.json is not what they generate;
# a suite whose specs differ from specs.json fails a run that selects by
# profile:ci, saying make profile.
profile: $(CHAOS) ## regenerate the CI profile from a dry run of the suites and the evidence of fault matrices (MATRIX="a.json b.json", TIMES)
	@ci/step.sh "compiling the suites" go tool ginkgo build -r ./suites/...
	@rm -rf $(REPORTS)/profile-$(RUN) && mkdir -p $(REPORTS)/profile-$(RUN)
	@OPCUA_CHAOS_REPORTS=$(abspath $(REPORTS)/profile-$(RUN)) OPCUA_CHAOS_RUN=dry-run go tool ginkgo --dry-run --no-color \
		--output-dir $(REPORTS)/profile-$(RUN) --json-report report.json $(SUITE_BINS) > $(REPORTS)/profile-$(RUN)/ginkgo.log
	@$(CHAOS) profile -specs $(REPORTS)/profile-$(RUN)/report.json $(if $(TIMES),-times '$(TIMES)') $(MATRIX)

# `make quirks`: the baseline rows of every suite against the reference
# server with each quirk (a conformant variation: catalog.AllQuirks) on,
# then with the combinations of quirks (quirks.Combinations: as-shipped,
# a server with no test nodes, 20 sessions and a trust list) on together;
# QUIRKS="a b" narrows it (QUIRKS=as-shipped). Fails on a false alarm (a
# spec that fails a property under a quirk) or a skip that does not name
# a quirk's cause.
# Writes reports/quirks-<time>.md and .json.
QUIRKS        ?=
.PHONY: quirks
quirks: $(CHAOS) ## prove the suites judge by the specification: no spec fails under a conformant quirk of the server (QUIRKS, SEED)
	@$(CHAOS) quirks $(if $(SEED),-seed $(SEED)) $(QUIRKS)

# The HTML pages, offline from saved reports: a run folder's
# report.html, a fault matrix's faults-<time>.html (DIR=reports/faults-….json)
# or the trend page (DIR=reports/trend.jsonl).
report: $(CHAOS) ## write the HTML page of a run folder: make report DIR=reports/<run> (default reports/latest)
	@$(CHAOS) report $(DIR)

recheck: ## re-run the checkers on a saved report: make recheck DIR=reports/<run>/... (or an A/B or capacity run folder)
	@test -n "$(DIR)" || { echo "error: make recheck needs DIR=<saved report folder>"; exit 2; }
	go run ./fixtures/cmd/recheck $(DIR)
