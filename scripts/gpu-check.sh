#!/usr/bin/env bash
# The real-card check (issue #18, "Real cards"): run it once on a machine
# with a real NVIDIA GPU, its driver, Docker and the NVIDIA container
# toolkit. It needs no network: everything it runs is built here.
#
#   scripts/gpu-check.sh              # results under gpu-check-out/<UTC time>/
#   GPU_CHECK_OUT=DIR scripts/gpu-check.sh
#
# What it does, each step failing the script with what went wrong:
#   1. checks the machine: nvidia-smi on PATH lists a GPU, the NVIDIA kernel
#      module is loaded, Docker answers, a real NVIDIA container hook is
#      installed (the test stand-in, scripts/install-gpu-hook-standin.sh, is
#      refused: with it a container gets no device and this check would
#      prove nothing);
#   2. builds bin/mercator and starts `mercator dev` (control plane, the
#      local agent, a registry on loopback, on ports of its own and a data
#      directory under the output) with a recording nvidia-smi (and dcgmi,
#      where DCGM is installed) first on the agent's PATH: each call the
#      agent makes goes to the real tool, and its arguments, output and exit
#      status are kept;
#   3. compares the agent's GPU facts (`mercator node get local -o json`)
#      with `nvidia-smi -q -x`: the same UUIDs, and for each its model and
#      memory;
#   4. runs a GPU Run through the control plane and the agent that prints
#      `nvidia-smi -L` inside its container, and checks it lists exactly
#      the GPU the attempt was given;
#   5. runs a Run that loads the card for GPU_CHECK_LOAD_SECONDS (default
#      60), samples the health answer while it runs, and saves `mercator run
#      get` with its utilization summary. The load is a PyTorch matrix
#      multiply when a local image with torch is found (GPU_CHECK_TORCH_IMAGE
#      names one); otherwise no CUDA program can be built here without the
#      network, and the Run only holds the card (CUDA-free): its summary then
#      shows the idle card, and the script says so;
#   6. writes the tool's answers, as the agent asked for them, as fixtures in
#      testdata/gpu's layout: OUT/testdata/gpu/real/MACHINE/ with query.csv,
#      header.txt, health.csv, health-loaded.csv, query.xml (the file names
#      fake-nvidia-smi serves them under) and proc/driver/nvidia/version; the
#      dcgmi answers under dcgm/; every call in calls.log.
#
# On a machine without a GPU it stops at step 1 with exit status 1: it
# never passes without having seen a card.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin"
ROOT=$PWD

OUT="${GPU_CHECK_OUT:-$ROOT/gpu-check-out/$(date -u +%Y%m%dT%H%M%SZ)}"
LOAD_SECONDS="${GPU_CHECK_LOAD_SECONDS:-60}"
LISTEN=127.0.0.1:7171
REGISTRY=127.0.0.1:5171

fail() {
	echo "gpu-check: FAILED: $*" >&2
	exit 1
}
step() { echo "== $*"; }

mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
echo "gpu-check: results in $OUT"

step "1. the machine"
REAL_SMI=$(command -v nvidia-smi) || fail "no nvidia-smi on PATH: this check needs a machine with an NVIDIA GPU and its driver"
[ -r /proc/driver/nvidia/version ] || fail "the NVIDIA kernel module is not loaded (/proc/driver/nvidia/version is missing)"
if ! "$REAL_SMI" -L >"$OUT/host-nvidia-smi-L.txt" 2>&1; then
	fail "nvidia-smi -L failed: $(cat "$OUT/host-nvidia-smi-L.txt")"
fi
GPUS=$(grep -c '^GPU [0-9]' "$OUT/host-nvidia-smi-L.txt" || true)
[ "$GPUS" -gt 0 ] || fail "nvidia-smi -L lists no GPU: $(cat "$OUT/host-nvidia-smi-L.txt")"
cat "$OUT/host-nvidia-smi-L.txt"
command -v docker >/dev/null || fail "docker is not installed"
docker info >/dev/null 2>&1 || fail "the Docker daemon does not answer (docker info failed)"
HOOK=$(command -v nvidia-container-runtime-hook || true)
[ -n "$HOOK" ] || fail "nvidia-container-runtime-hook is not on PATH: install the NVIDIA container toolkit, or no container can be given a GPU"
if grep -q "STAND-IN" "$HOOK" 2>/dev/null; then
	fail "$HOOK is the test stand-in (scripts/install-gpu-hook-standin.sh), which gives containers no device: install the real NVIDIA container toolkit"
fi
command -v go >/dev/null || fail "the Go toolchain is not on PATH (needed to build the agent)"

step "2. build, and start mercator dev with the agent's nvidia-smi recorded"
# Static (no C library): the agent mounts its own binary into function
# containers as their output relay (docs/functions.md).
CGO_ENABLED=0 go build -o bin/mercator ./cmd/mercator
M="$ROOT/bin/mercator"
REC="$OUT/calls"
WRAP="$OUT/wrap"
mkdir -p "$REC" "$WRAP"
# record TOOL writes a wrapper named after the tool that hands every call to
# the real one and keeps, per distinct argument list, the latest answer
# (KEY.args, .out, .err, .code) and a line in calls.log.
record() {
	local name=$1 real=$2
	cat >"$WRAP/$name" <<EOF
#!/bin/sh
key=\$(printf '%s' "$name \$*" | cksum | cut -d' ' -f1)
tmp="$REC/.\$key.\$\$"
"$real" "\$@" >"\$tmp.out" 2>"\$tmp.err"
code=\$?
printf '%s\n' "\$*" >"\$tmp.args"
echo "\$code" >"\$tmp.code"
for f in args out err code; do mv -f "\$tmp.\$f" "$REC/$name-\$key.\$f"; done
echo "\$(date -u +%Y-%m-%dT%H:%M:%S.%NZ) $name \$* -> exit \$code" >>"$REC/calls.log"
cat "$REC/$name-\$key.out"
cat "$REC/$name-\$key.err" >&2
exit "\$code"
EOF
	chmod +x "$WRAP/$name"
}
record nvidia-smi "$REAL_SMI"
REAL_DCGMI=$(command -v dcgmi || true)
if [ -n "$REAL_DCGMI" ]; then
	record dcgmi "$REAL_DCGMI"
else
	echo "(dcgmi is not installed: no DCGM answers will be recorded)"
fi

export MERCATOR_CONFIG="$OUT/context.json" # the user's CLI context is left alone
DATA="$OUT/dev"
mkdir -p "$DATA"
PATH="$WRAP:$PATH" "$M" dev --data-dir "$DATA" --listen "$LISTEN" --registry "$REGISTRY" --log-level info >"$OUT/dev.log" 2>&1 &
DEV_PID=$!
cleanup() {
	kill "$DEV_PID" 2>/dev/null || true
	wait "$DEV_PID" 2>/dev/null || true
}
trap cleanup EXIT
# wait_for WHAT TRIES COMMAND...: polls COMMAND every second.
wait_for() {
	local what=$1 tries=$2
	shift 2
	for _ in $(seq 1 "$tries"); do
		if "$@" >/dev/null 2>&1; then return 0; fi
		kill -0 "$DEV_PID" 2>/dev/null || fail "mercator dev exited while waiting for $what: $(tail -20 "$OUT/dev.log")"
		sleep 1
	done
	fail "gave up waiting for $what (log: $OUT/dev.log)"
}
has_gpus() { "$M" node get local -o json | grep -q '"accelerators"'; }
wait_for "the local node's GPU facts" 120 has_gpus

step "3. the agent's GPU facts against nvidia-smi -q -x"
"$M" node get local -o json >"$OUT/node.json"
"$REAL_SMI" -q -x >"$OUT/host-nvidia-smi-q-x.xml" || fail "nvidia-smi -q -x failed"
if ! go run "$ROOT/scripts/gpucheck/compare.go" "$OUT/node.json" "$OUT/host-nvidia-smi-q-x.xml" >"$OUT/facts-compare.txt" 2>&1; then
	cat "$OUT/facts-compare.txt"
	fail "the agent's facts differ from nvidia-smi -q -x (above; $OUT/facts-compare.txt)"
fi
cat "$OUT/facts-compare.txt"

step "4. a GPU Run printing nvidia-smi -L in its container"
# An image of this machine's C library and loader, nothing else: the NVIDIA
# hook mounts nvidia-smi and the driver's libraries into the container, and
# they need the libc they were built against.
CTX="$OUT/image"
mkdir -p "$CTX"
NVML=$(ldconfig -p | awk '/libnvidia-ml\.so\.1 / { print $NF; exit }')
[ -n "$NVML" ] || fail "libnvidia-ml.so.1 is not in the loader's cache (ldconfig -p): the driver's libraries are not installed"
for lib in $( (ldd "$REAL_SMI"; ldd "$NVML") | grep -o '/[^ ]*' | sort -u); do cp --parents -L "$lib" "$CTX/"; done
printf 'FROM scratch\nCOPY . /\n' >"$CTX/Dockerfile"
IMG="$REGISTRY/gpu-check:1"
docker build -q -t "$IMG" "$CTX" >/dev/null
docker push -q "$IMG" >/dev/null
RUN=$("$M" run submit --image "$IMG" --gpus 1 --env NVIDIA_DRIVER_CAPABILITIES=compute,utility -- nvidia-smi -L)
"$M" run wait "$RUN" || fail "the GPU Run $RUN did not succeed: $("$M" run get "$RUN")"
"$M" run logs "$RUN" | tee "$OUT/run-nvidia-smi-L.txt"
"$M" run get "$RUN" -o json >"$OUT/run-nvidia-smi-L.json"
GIVEN=$(grep -o 'GPU-[0-9a-f-]*' "$OUT/run-nvidia-smi-L.json" | sort -u)
SEEN=$(grep -o 'GPU-[0-9a-f-]*' "$OUT/run-nvidia-smi-L.txt" | sort -u)
[ -n "$SEEN" ] || fail "nvidia-smi -L in the container listed no GPU"
[ "$GIVEN" = "$SEEN" ] || fail "the container saw $SEEN, the attempt was given $GIVEN"
echo "the container saw exactly its GPU: $SEEN"

step "5. a Run loading the card, and its utilization summary"
TORCH="${GPU_CHECK_TORCH_IMAGE:-$(docker image ls --format '{{.Repository}}:{{.Tag}}' | grep -i -m1 -E 'pytorch|torch' || true)}"
if [ -n "$TORCH" ]; then
	LOADIMG="$REGISTRY/gpu-check-torch:1"
	docker tag "$TORCH" "$LOADIMG"
	docker push -q "$LOADIMG" >/dev/null
	LOAD=$("$M" run submit --image "$LOADIMG" --gpus 1 -- python3 -c \
		"import time, torch
x = torch.randn(8192, 8192, device='cuda')
end = time.time() + $LOAD_SECONDS
while time.time() < end:
    y = x @ x
    torch.cuda.synchronize()
print('loaded the card for $LOAD_SECONDS s')")
	echo "load: PyTorch matrix multiply in $TORCH"
else
	# nvidia-smi -lms keeps the device open and queries it: CUDA-free, so
	# the card is held, not loaded.
	LOAD=$("$M" run submit --image "$IMG" --gpus 1 --timeout "${LOAD_SECONDS}s" --env NVIDIA_DRIVER_CAPABILITIES=compute,utility -- \
		nvidia-smi --query-gpu=utilization.gpu,memory.used,power.draw --format=csv -lms 1000)
	echo "load: NONE (no image with torch here and no network to build a CUDA program): the Run holds the card for $LOAD_SECONDS s without loading it"
	echo "held, not loaded (no CUDA image offline)" >"$OUT/load-kind.txt"
fi
running() { "$M" run get "$LOAD" -o json | grep -q '"status": *"running"'; }
wait_for "the load Run running" 300 running
sleep $((LOAD_SECONDS / 2)) # sample the health answer halfway through the load (a fixture, not a synchronization)
for f in "$REC"/nvidia-smi-*.args; do
	if grep -q '^--query-gpu=uuid,pci.bus_id,utilization.gpu' "$f"; then cp "${f%.args}.out" "$OUT/health-loaded.csv"; fi
done
"$M" run wait "$LOAD" || true
"$M" run get "$LOAD" | tee "$OUT/run-load.txt"
"$M" run get "$LOAD" -o json >"$OUT/run-load.json"
grep -q 'UTIL AVG/PEAK' "$OUT/run-load.txt" || fail "run get shows no utilization summary for the load Run $LOAD"

step "6. fixtures"
MACHINE=$(tr '[:upper:] ' '[:lower:]-' <<<"$("$REAL_SMI" --query-gpu=name --format=csv,noheader | head -1)" | tr -cd 'a-z0-9-')-x$GPUS
FIX="$OUT/testdata/gpu/real/$MACHINE"
mkdir -p "$FIX/proc/driver/nvidia" "$FIX/dcgm"
cp /proc/driver/nvidia/version "$FIX/proc/driver/nvidia/version"
# The file each argument list is served from, as fake-nvidia-smi maps them.
awk '/^"[^"]*"\)$/ { args = substr($0, 2, length($0) - 3); next }
	args != "" || /out="\$dir\// { if (match($0, /out="\$dir\/[^"]*"/)) { print substr($0, RSTART + 10, RLENGTH - 11) "\t" args; args = "" } }' \
	"$ROOT/testdata/gpu/fake-nvidia-smi" >"$OUT/fixture-names.tsv"
for f in "$REC"/nvidia-smi-*.args; do
	args=$(cat "$f")
	name=$(awk -F'\t' -v a="$args" '$2 == a { print $1 }' "$OUT/fixture-names.tsv")
	if [ -z "$name" ]; then
		echo "note: the agent asked nvidia-smi '$args', which no fixture covers (kept in $f)"
		continue
	fi
	cp "${f%.args}.out" "$FIX/$name"
	if [ "$(cat "${f%.args}.code")" != 0 ]; then cp "${f%.args}.code" "$FIX/exit-code"; fi
done
[ -f "$OUT/health-loaded.csv" ] && cp "$OUT/health-loaded.csv" "$FIX/health-loaded.csv"
for f in "$REC"/dcgmi-*.args; do
	[ -e "$f" ] || continue
	cp "${f%.args}.out" "$FIX/dcgm/$(tr -c 'a-z0-9-' '_' <"$f").txt"
done
{
	echo "Recorded by scripts/gpu-check.sh on $(hostname) at $(date -u +%Y-%m-%dT%H:%M:%SZ)."
	echo "Driver: $(head -1 /proc/driver/nvidia/version)"
	echo "Load: $(cat "$OUT/load-kind.txt" 2>/dev/null || echo "PyTorch matrix multiply ($TORCH)")"
	echo "Calls the agent made: see calls.log beside it."
} >"$FIX/README.txt"
cp "$REC/calls.log" "$FIX/calls.log"
ls -l "$FIX"
for want in query.csv header.txt health.csv query.xml; do
	[ -s "$FIX/$want" ] || fail "the agent never asked for $want's answer (no fixture recorded): see $REC/calls.log"
done
echo "gpu-check: PASSED. Fixtures in $FIX; copy them to testdata/gpu/real/ and record what you saw in docs/gpus.md."
