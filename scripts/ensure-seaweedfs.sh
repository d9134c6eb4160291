#!/usr/bin/env bash
# Makes sure a SeaweedFS `weed` binary of the pinned version is built, and
# prints its path (and nothing else) on stdout:
#
#   MERCATOR_TEST_WEED=$(bash scripts/ensure-seaweedfs.sh) go test -run S3 ./e2e/
#
# The end-to-end tests start it as a real S3-compatible server (one that
# checks signatures and expiry) for the S3 content store. SeaweedFS is
# Apache-2.0; MinIO's server is AGPL and is not used.
#
# What it does, each step only when needed, so running it again is cheap:
#   1. reuses CACHE/seaweedfs-VERSION/weed when it is there;
#   2. otherwise downloads the module at exactly VERSION from the Go module
#      proxy (`go mod download`), copies it out of the read-only module
#      cache, and builds ./weed as the main module (`go install
#      module/weed@version` is refused: its go.mod has replace directives,
#      which only a main module may have), then moves the binary into place.
# CACHE is $MERCATOR_CACHE, else $XDG_CACHE_HOME/mercator, else
# ~/.cache/mercator. A lock keeps two concurrent runs from building twice.
# The first build compiles a large module (minutes; see docs/guide.md for
# the figures measured). Progress goes to stderr.
set -euo pipefail

module=github.com/seaweedfs/seaweedfs
version=v0.0.0-20261109003541-7506e5f91cd6

log() { echo "ensure-seaweedfs: $*" >&2; }

export PATH="$PATH:/usr/local/go/bin"
cache=${MERCATOR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mercator}
dir="$cache/seaweedfs-$version"
bin="$dir/weed"

if [ -x "$bin" ]; then
  echo "$bin"
  exit 0
fi

mkdir -p "$dir"
exec 9>"$dir/.lock"
flock 9
if [ -x "$bin" ]; then # built by the run that held the lock
  echo "$bin"
  exit 0
fi

# The source is copied to the same place every time (and removed after a
# build), so a rebuild compiles with the same paths and reuses the Go build
# cache.
work="$dir/build"
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT
rm -rf "$work"
mkdir -p "$work"

# Outside any module, so nothing here touches Mercator's go.mod or go.sum.
log "downloading $module@$version"
src=$(cd "$work" && GO111MODULE=on GOFLAGS=-mod=mod go mod download -json "$module@$version" |
  sed -n 's/^[[:space:]]*"Dir": "\(.*\)",*$/\1/p')
if [ -z "$src" ] || [ ! -f "$src/go.mod" ]; then
  log "go mod download gave no module directory for $module@$version"
  exit 1
fi
cp -r "$src" "$work/src"
chmod -R u+w "$work/src"

log "building weed (a large module: minutes the first time; log: $dir/build.log)"
start=$(date +%s)
if ! (cd "$work/src" && go build -o "$work/weed" ./weed) >"$dir/build.log" 2>&1; then
  tail -n 30 "$dir/build.log" >&2
  log "the build of weed failed"
  exit 1
fi
mv "$work/weed" "$bin"
log "built $bin in $(($(date +%s) - start))s"
echo "$bin"
