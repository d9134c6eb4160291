#!/usr/bin/env bash
# Mercator's main job on embedded defaults, start to finish:
#   builds the mercator binary, starts `mercator dev` (control plane on
#   SQLite + a local agent + an OCI registry on 127.0.0.1:5000), builds and
#   pushes the sample image, submits a Run, and shows its output and status;
#   pushes an Artifact and mounts it into a second Run; deploys and calls
#   the sample Function.
# Installs and starts Docker Engine first when it is missing.
#
# Leaves `mercator dev` running when MERCATOR_KEEP=1; stops it otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin"

bash scripts/ensure-docker.sh

echo "== building mercator"
mkdir -p bin
# Static (no C library): the agent mounts its own binary into function
# containers as their output relay (docs/functions.md).
CGO_ENABLED=0 go build -o bin/mercator ./cmd/mercator
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

# Content delivery: a file pushed as an immutable Artifact version, mounted
# read-only into a Run, which reads it.
echo "== an Artifact mounted into a Run"
GREETING="$DATA/greeting.txt"
echo "Artifact readers everywhere" >"$GREETING"
echo "\$ mercator artifact push greeting $GREETING"
REF=$("$M" artifact push greeting "$GREETING")
echo "$REF"
echo "\$ mercator run submit --image 127.0.0.1:5000/hello:1 --artifact $REF:/data/greeting.txt -- /hello @/data/greeting.txt"
RUN2=$("$M" run submit --image 127.0.0.1:5000/hello:1 --cpu 0.5 --memory 64MiB --artifact "$REF:/data/greeting.txt" -- /hello @/data/greeting.txt)
echo "$RUN2"
"$M" run wait "$RUN2" >/dev/null
echo "\$ mercator run logs $RUN2"
"$M" run logs "$RUN2"
"$M" artifact ls

# Functions: the sample function (examples/fn-hello, Fn's Go FDK, FROM
# scratch) deployed through the Fn-compatible API and called through the
# control plane into a hot container on the local agent.
echo "== building and pushing the sample function (FROM scratch, static Go, Fn's FDK)"
CGO_ENABLED=0 go build -o examples/fn-hello/fn-hello ./examples/fn-hello
docker build -q -t 127.0.0.1:5000/fn-hello:1 examples/fn-hello >/dev/null
docker push -q 127.0.0.1:5000/fn-hello:1 >/dev/null 2>&1 || docker push 127.0.0.1:5000/fn-hello:1
echo "\$ mercator fn deploy --app demo --create-app hello --image 127.0.0.1:5000/fn-hello:1 --trigger /hello"
"$M" fn deploy --app demo --create-app hello --image 127.0.0.1:5000/fn-hello:1 --trigger /hello
echo "\$ echo '{\"name\":\"Mercator\"}' | mercator fn invoke demo hello --content-type application/json"
echo '{"name":"Mercator"}' | "$M" fn invoke demo hello --content-type application/json
echo "\$ echo '{\"name\":\"again\"}' | mercator fn invoke demo hello   # the container is hot now"
echo '{"name":"again"}' | "$M" fn invoke demo hello --content-type application/json
echo "\$ CALL=\$(echo '{\"name\":\"later\"}' | mercator fn invoke demo hello --detached)"
CALL=$(echo '{"name":"later"}' | "$M" fn invoke demo hello --detached)
echo "$CALL"
echo "\$ mercator fn call demo hello $CALL --wait"
"$M" fn call demo hello "$CALL" --wait
echo "\$ mercator fn call demo hello $CALL --result"
"$M" fn call demo hello "$CALL" --result
echo "\$ mercator fn logs demo hello $CALL"
"$M" fn logs demo hello "$CALL"
echo "\$ mercator fn ls demo"
"$M" fn ls demo
echo "== the function answered through the control plane"
exit "$CODE"
