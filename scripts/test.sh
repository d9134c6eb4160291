#!/usr/bin/env bash
# Runs Mercator's whole test suite: vet, formatting, unit tests, the race
# detector on the packages with concurrency, and the end-to-end tests against
# the real Docker daemon (installed and started first when missing).
#
#   scripts/test.sh          the suite as CI runs it (short mode of fault tests)
#   MERCATOR_LONG=1 scripts/test.sh   the long fault-injection mode, by hand
set -euo pipefail
cd "$(dirname "$0")/.."

export PATH="$PATH:/usr/local/go/bin"
bash scripts/ensure-docker.sh
# For the GPU tests only: a stand-in NVIDIA hook so containers with GPU device
# requests start on a machine without GPUs. It restarts dockerd once, when it
# is first installed, and only when the daemon runs no container (a fresh CI
# machine); on a daemon running others' containers it stops with an error
# saying what to do, rather than kill them. Never install it on a real GPU
# machine.
bash scripts/install-gpu-hook-standin.sh
# The web console's browser tests (e2e/console_test.go) drive Debian's
# chromium headless; install it once when missing.
if [ ! -x /usr/bin/chromium ]; then
  sudo=; [ "$(id -u)" -ne 0 ] && sudo=sudo
  $sudo apt-get install -y chromium chromium-driver >/dev/null || { $sudo apt-get update >/dev/null && $sudo apt-get install -y chromium chromium-driver >/dev/null; }
fi
MERCATOR_TEST_POSTGRES=$(bash scripts/ensure-postgres.sh)
export MERCATOR_TEST_POSTGRES
# A real S3-compatible server (SeaweedFS, built once from the Go module proxy
# into a cache; minutes the first time) for the S3 content store's
# end-to-end test, which starts and stops it itself.
MERCATOR_TEST_WEED=$(bash scripts/ensure-seaweedfs.sh)
export MERCATOR_TEST_WEED

# Each step's heading says how long the suite has run so far, so a slow
# step shows in CI's log.
step() { echo "== $* (at $((SECONDS / 60))m$((SECONDS % 60))s)"; }

step "go vet"
go vet ./...
step "gofmt"
unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
if [ -n "$unformatted" ]; then
  echo "gofmt would change:"; echo "$unformatted"; exit 1
fi

short=-short
[ -n "${MERCATOR_LONG:-}" ] && short=

step "unit and package tests with the race detector (every package but e2e and fleetsim)"
go test -race -count=1 $short $(go list ./... | grep -v -e '/e2e' -e '/fleetsim')

# Every fuzz target (Go's native fuzzing, testing.F) for a few seconds, from
# its committed corpus (testdata/fuzz) onwards: the decoders of outside
# input (API and node-protocol bodies, tar archives, image references,
# sizes, durations, the function container's answers, the session stream).
# The unit tests above already replay each corpus; this explores beyond it.
# By hand: MERCATOR_FUZZTIME=5m scripts/test.sh, or one target with
#   go test -run '^$' -fuzz '^FuzzExtractTar$' -fuzztime 10m ./artifactcache
fuzztime=${MERCATOR_FUZZTIME:-5s}
[ -n "${MERCATOR_LONG:-}" ] && fuzztime=${MERCATOR_FUZZTIME:-2m}
step "fuzz targets, $fuzztime each"
# Go's fuzzing coordinator can fail a run at the end of its -fuzztime with a
# bare "context deadline exceeded" and nothing found: a race between the
# deadline and its own cancellation (go.dev/issue/75804, fixed in Go 1.27;
# this is 1.26), seen here on the loaded machine. Such a run is tried again
# once. A real finding says "Failing input written to" and fails at once.
fuzz() {
  local out
  out=$(go test -run '^$' -fuzz "^$1\$" -fuzztime "$fuzztime" "$2" 2>&1) && { echo "$out" | tail -1; return 0; }
  echo "$out"
  echo "$out" | grep -q 'Failing input written to' && return 1
  echo "$out" | grep -q 'context deadline exceeded' || return 1
  echo "== $1: the coordinator timed out without a finding; once more"
  go test -run '^$' -fuzz "^$1\$" -fuzztime "$fuzztime" "$2"
}
for file in $(grep -rl --include='*_test.go' '^func Fuzz' .); do
  for target in $(grep -o '^func Fuzz[A-Za-z0-9_]*' "$file" | cut -d' ' -f2); do
    fuzz "$target" "./$(dirname "$file")"
  done
done

# The fleet simulator is a load test: hundreds of agents and a control plane
# in one process on two cores. Under the race detector it measures the
# detector; the code it drives is raced above.
step "fleet simulator, short mode"
go test -count=1 $short ./fleetsim/...

# The README's first command, as a new user runs it: it builds the binary,
# starts `mercator dev` on its default ports and walks the demo. Its data
# and the CLI's context file are its own, so a developer's are untouched.
# Its node's containers (a hot function's may outlive `mercator dev`) are
# removed afterwards: those that were not there before it ran. Removal is
# best-effort (`mercator dev` may be removing one as it stops).
step "scripts/demo.sh"
demo_dir=$(mktemp -d)
local_before=$(docker ps -aq --no-trunc --filter label=mercator.node=local | sort)
MERCATOR_DEV_DATA="$demo_dir/dev" MERCATOR_CONFIG="$demo_dir/context.json" bash scripts/demo.sh
demo_ctrs=$(comm -13 <(echo "$local_before") <(docker ps -aq --no-trunc --filter label=mercator.node=local | sort))
for ctr in $demo_ctrs; do
  docker rm -f "$ctr" >/dev/null 2>&1 || true
done
rm -rf "$demo_dir"

step "end-to-end tests (real control plane, real agents, real Docker)"
go test -p 1 -count=1 -timeout 40m $short $(go list ./e2e/... | grep -v /e2e/fault)

# The fault suite runs with the race detector: its harness then builds the
# mercator binary it starts as server and agents with -race too, and a race
# report in any of their logs fails the test (e2e/fault/race_test.go).
step "fault-injection suite, race-built binaries"
export MERCATOR_FAULT_SUMMARY="${MERCATOR_FAULT_SUMMARY:-$(mktemp)}"
go test -race -p 1 -count=1 -timeout 40m $short ./e2e/fault/...
# The fault suite's counts (trials per fault, every invariant).
cat "$MERCATOR_FAULT_SUMMARY"

# Every benchmark once, so none rots: figures printed, nothing gated (a
# shared CI machine's rates are not a correctness check).
step "every benchmark, once"
bench_pkgs=$(grep -rl --include='*_test.go' '^func Benchmark' . | xargs -n1 dirname | sort -u)
go test -p 1 -count=1 -run '^$' -bench . -benchtime 1x $bench_pkgs
step "done"
