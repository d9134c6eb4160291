#!/usr/bin/env bash
# Hot function calls on Mercator beside the real Fn server, in one run
# (e2e TestFunctionFnPeerBench): builds Fn's fnserver from its repository,
# then runs the benchmark, which starts both and prints both with ratios.
# Not part of scripts/test.sh: it needs Fn's build and takes minutes.
#
#   bash scripts/fn-peer-bench.sh
#
# Environment (all optional):
#   FN_REPO   where to clone Fn from (default https://github.com/fnproject/fn.git;
#             a local clone or bare mirror works as well)
#   FN_REF    the Fn release to build (default v0.3.753, whose API Mercator's
#             /version names)
#   FN_SRC    an Fn checkout to build instead of cloning
#   FNSERVER  an fnserver binary to use instead of building one
#   MERCATOR_FN_PEER_ROUNDS, MERCATOR_FN_PEER_SECONDS  rounds (default 3) and
#             seconds per phase (default 10)
#   MERCATOR_FN_PEER_INPROC=1  the agent in the server's process, as
#             `mercator server --local-agent` runs it (Fn's own shape: one
#             process); without it, the agent in a process of its own
#   MERCATOR_FN_PEER_AGENT_FLAGS  extra flags for Mercator's agent process, e.g.
#             "--default-cpu 0" (no CPU quota, as on Fn) or "--fn-output-relay off"
#
# fnserver is built as Fn's own docs build it: `-mod=vendor -tags libsqlite3`
# against Debian's libsqlite3-dev, so the vendored SQLite amalgamation (which
# some copies of the repository lack) is not needed and is left out of the
# checkout. Debian's libsqlite3-dev and wrk (the load generator) are installed
# when absent (as root). Progress goes to stderr; the table to stdout.
set -euo pipefail

repo_root=$(cd "$(dirname "$0")/.." && pwd)
FN_REPO=${FN_REPO:-https://github.com/fnproject/fn.git}
FN_REF=${FN_REF:-v0.3.753}

need=()
command -v wrk >/dev/null || need+=(wrk)
[ -e /usr/include/sqlite3.h ] || need+=(libsqlite3-dev)
if [ ${#need[@]} -gt 0 ]; then
	echo "fn-peer-bench: installing ${need[*]}" >&2
	apt-get update -qq >&2
	apt-get install -y -qq "${need[@]}" >&2
fi

if [ -z "${FNSERVER:-}" ]; then
	work=$(mktemp -d /tmp/fn-peer-bench.XXXXXX)
	src=${FN_SRC:-}
	if [ -z "$src" ]; then
		src=$work/fn
		echo "fn-peer-bench: cloning $FN_REPO at $FN_REF" >&2
		git clone -q --no-checkout "$FN_REPO" "$src" >&2
		git -C "$src" sparse-checkout set --no-cone '/*' '!/vendor/github.com/mattn/go-sqlite3/sqlite3-binding.c' >&2
		git -C "$src" -c advice.detachedHead=false checkout -q "$FN_REF" >&2
	fi
	FNSERVER=$work/fnserver
	echo "fn-peer-bench: building fnserver from $src" >&2
	(cd "$src" && go build -mod=vendor -tags libsqlite3 -o "$FNSERVER" ./cmd/fnserver) >&2
fi

cd "$repo_root"
MERCATOR_FN_PEER_BENCH=$FNSERVER go test ./e2e -run '^TestFunctionFnPeerBench$' -v -count=1 -timeout 60m
