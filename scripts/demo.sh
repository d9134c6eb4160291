#!/usr/bin/env bash
# Mercator's main job on embedded defaults, start to finish:
#   builds the mercator binary, starts `mercator dev` (control plane on
#   SQLite + a local agent + an OCI registry on 127.0.0.1:5000), builds and
#   pushes the sample image, submits a Run, and shows its output and status.
# Installs and starts Docker Engine first when it is missing.
#
# Leaves `mercator dev` running when MERCATOR_KEEP=1; stops it otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin"

bash scripts/ensure-docker.sh

echo "== building mercator"
mkdir -p bin
go build -o bin/mercator ./cmd/mercator
M="$PWD/bin/mercator"

DATA="${MERCATOR_DEV_DATA:-$PWD/.mercator/dev}"
mkdir -p "$DATA"
echo "== starting mercator dev (data in $DATA, log in $DATA/dev.log)"
"$M" dev --data-dir "$DATA" >"$DATA/dev.log" 2>&1 &
DEV_PID=$!
cleanup() {
  if [ -z "${MERCATOR_KEEP:-}" ]; then
    kill "$DEV_PID" 2>/dev/null || true
    wait "$DEV_PID" 2>/dev/null || true
  else
    echo "mercator dev keeps running (pid $DEV_PID); stop it with: kill $DEV_PID"
  fi
}
trap cleanup EXIT

for _ in $(seq 1 100); do
  if grep -q "mercator dev is up" "$DATA/dev.log" 2>/dev/null && "$M" node ls >/dev/null 2>&1; then break; fi
  if ! kill -0 "$DEV_PID" 2>/dev/null; then echo "mercator dev exited:"; cat "$DATA/dev.log"; exit 1; fi
  sleep 0.2
done
cat "$DATA/dev.log"
for _ in $(seq 1 100); do
  "$M" node ls 2>/dev/null | grep -q ' ready ' && break
  sleep 0.2
done
"$M" node ls

echo "== building and pushing the sample image (FROM scratch, static Go)"
CGO_ENABLED=0 go build -o examples/hello/hello ./examples/hello
docker build -q -t 127.0.0.1:5000/hello:1 examples/hello >/dev/null
docker push -q 127.0.0.1:5000/hello:1 >/dev/null 2>&1 || docker push 127.0.0.1:5000/hello:1

echo "== submitting a Run"
echo "\$ mercator run submit --image 127.0.0.1:5000/hello:1 --cpu 0.5 --memory 64MiB -- /hello world"
RUN=$("$M" run submit --image 127.0.0.1:5000/hello:1 --cpu 0.5 --memory 64MiB -- /hello world)
echo "$RUN"
echo "\$ mercator run wait $RUN"
set +e
"$M" run wait "$RUN"
CODE=$?
set -e
echo "\$ mercator run logs $RUN"
"$M" run logs "$RUN"
echo "\$ mercator run get $RUN"
"$M" run get "$RUN"
echo "== the Run exited with status $CODE"
exit "$CODE"
