#!/usr/bin/env bash
# Installs a STAND-IN for the NVIDIA container hook so that Docker starts
# containers that ask for GPUs on a machine that has none. FOR TESTS ONLY.
#
# Why it is needed: dockerd registers its "nvidia" device driver, the thing
# that turns `docker run --gpus device=GPU-…` (a DeviceRequest, which is how
# Mercator's agent launches GPU work) into a container, only when an
# executable named nvidia-container-runtime-hook is on dockerd's PATH when the
# daemon starts (docker 20.10, daemon/nvidia_linux.go). Without it every GPU
# launch fails with `could not select device driver "" with capabilities:
# [[gpu]]`. With it, dockerd sets NVIDIA_VISIBLE_DEVICES to the requested
# UUIDs and adds the hook as an OCI prestart hook. The real hook (package
# nvidia-container-toolkit) then mounts the devices and driver libraries; the
# stand-in reads the container state runc gives it and exits 0, so the
# container starts, sees NVIDIA_VISIBLE_DEVICES, and no GPU at all.
#
# What it does, idempotently:
#   1. asks the daemon whether the driver is registered, by starting a
#      container from an empty image with --gpus (nothing is pulled);
#   2. only if it is not: installs the stand-in as
#      /usr/local/bin/nvidia-container-runtime-hook (unless a real hook is
#      already on PATH) and restarts dockerd, the way scripts/ensure-docker.sh
#      started it (systemd when it manages docker, else nohup dockerd) --
#      but only when the daemon runs no container: this script starts none
#      that outlive it, so any running container is someone else's, and a
#      restart would kill it. Then it stops with an error saying what to do
#      instead (MERCATOR_GPU_HOOK_RESTART=1 allows the restart anyway);
#   3. checks that it worked: the probe again, and, when the go toolchain is
#      here, the test workload image run with --gpus device=GPU-abc must print
#      NVIDIA_VISIBLE_DEVICES=GPU-abc.
#
# When the driver is already registered it only says so (about a second), so
# a test suite can call it every time; `--verify` runs the workload check in
# that case too.
#
# Restarting dockerd would stop every running container on this machine, so
# the script refuses while any runs (see step 2). Needs root. Never run it on a machine with
# real GPUs: the stand-in would make every GPU container start without its
# devices, which is why it refuses to replace a hook it did not write.
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
  ""|--verify) ;;
  *) echo "usage: $0 [--verify]" >&2; exit 2 ;;
esac

export PATH="$PATH:/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
HOOK_NAME=nvidia-container-runtime-hook
HOOK=/usr/local/bin/$HOOK_NAME
MARKER="mercator-gpu-hook-standin"
PROBE_IMAGE=mercator-gpu-probe:empty
CHECK_IMAGE=mercator-gpu-standin-check:latest
DOCKERD_LOG=/var/log/mercator-dockerd.log

log() { echo "install-gpu-hook-standin: $*" >&2; }
banner() {
  cat >&2 <<'EOF'
########################################################################
##  TEST STAND-IN for nvidia-container-runtime-hook. FOR TESTS ONLY.  ##
##  GPU containers on this machine will START WITHOUT ANY GPU.        ##
##  Never install this on a machine with real NVIDIA GPUs.            ##
########################################################################
EOF
}

# registered: 0 when dockerd has an "nvidia" device driver, 1 when it
# refuses GPU requests, 2 when the answer could not be had.
registered() {
  if ! docker image inspect "$PROBE_IMAGE" >/dev/null 2>&1; then
    # An image with one empty layer: enough for the daemon to get as far as
    # choosing a device driver, and nothing to pull.
    tar -cf - -T /dev/null | docker import - "$PROBE_IMAGE" >/dev/null
  fi
  local out
  out=$(docker run --rm --gpus device=GPU-mercator-probe "$PROBE_IMAGE" /mercator-no-such-program 2>&1 || true)
  case "$out" in
    *"could not select device driver"*) return 1 ;;
    *"no such file or directory"*|*"not found"*|*"nvidia-container-cli"*) return 0 ;;
    *) log "unexpected answer from the probe container: $out"; return 2 ;;
  esac
}

wait_for_daemon() {
  for _ in $(seq 1 60); do
    if docker info >/dev/null 2>&1; then return 0; fi
    sleep 1
  done
  log "dockerd did not come back within 60s; see $DOCKERD_LOG"
  tail -n 30 "$DOCKERD_LOG" >&2 || true
  return 1
}

# refuse_restart_if_busy exits with an error when the daemon runs any
# container, unless MERCATOR_GPU_HOOK_RESTART=1: a test suite must not kill
# the containers of whoever else shares the machine's daemon.
refuse_restart_if_busy() {
  local running
  running=$(docker ps --format '{{.Names}} ({{.Image}})')
  if [ -z "$running" ] || [ "${MERCATOR_GPU_HOOK_RESTART:-}" = 1 ]; then
    return 0
  fi
  log "REFUSING to restart dockerd: it must restart to register the NVIDIA device driver, and that would stop these running containers, which this script did not start:"
  echo "$running" | sed 's/^/    /' >&2
  log "the stand-in hook is in place at $HOOK; do one of:"
  log "  - restart dockerd yourself when those containers may stop, then run this script again (it will then only check);"
  log "  - run it again with MERCATOR_GPU_HOOK_RESTART=1 to restart dockerd now and stop them."
  exit 1
}

restart_dockerd() {
  local running
  running=$(docker ps -q | wc -l)
  log "RESTARTING dockerd so it registers the NVIDIA device driver; $running running container(s) will be stopped"
  if command -v systemctl >/dev/null 2>&1 && systemctl is-system-running >/dev/null 2>&1 \
      && systemctl is-active --quiet docker 2>/dev/null; then
    systemctl restart docker
  else
    local pids
    pids=$(cat /var/run/docker.pid 2>/dev/null || true)  # the shared daemon only, never a test's private one
    if [ -n "$pids" ]; then
      kill -TERM $pids
      for _ in $(seq 1 60); do
        alive=
        for p in $pids; do kill -0 "$p" 2>/dev/null && alive=1; done
        [ -z "$alive" ] && break
        sleep 1
      done
      for p in $pids; do
        if kill -0 "$p" 2>/dev/null; then log "dockerd $p did not stop within 60s"; exit 1; fi
      done
    fi
    setsid nohup dockerd >"$DOCKERD_LOG" 2>&1 < /dev/null & # its own session, as ensure-docker.sh starts it
  fi
  wait_for_daemon
}

# check_workload runs the test workload image with one GPU requested and
# checks it saw exactly that UUID.
check_workload() {
  if ! command -v go >/dev/null 2>&1; then
    log "go toolchain not found: skipping the workload-image check (the probe passed)"
    return 0
  fi
  local ctx seen
  ctx=$(mktemp -d)
  cp testdata/images/workload/Dockerfile "$ctx/"
  (cd testdata/images/workload && CGO_ENABLED=0 GOOS=linux go build -trimpath -buildvcs=false -ldflags='-s -w' -o "$ctx/workload" .)
  local built=0 out
  out=$(docker build -q -t "$CHECK_IMAGE" "$ctx" 2>&1) || built=$?
  rm -rf "$ctx"
  if [ "$built" -ne 0 ]; then
    log "FAILED to build the workload image for the check: $out"
    return 1
  fi
  seen=$(docker run --rm --gpus device=GPU-abc "$CHECK_IMAGE" env NVIDIA_VISIBLE_DEVICES 2>&1 || true)
  docker rmi "$CHECK_IMAGE" >/dev/null 2>&1 || true
  if [ "$seen" != "GPU-abc" ]; then
    log "FAILED: a container given --gpus device=GPU-abc saw NVIDIA_VISIBLE_DEVICES=\"$seen\""
    return 1
  fi
  log "checked: a container given --gpus device=GPU-abc starts and sees NVIDIA_VISIBLE_DEVICES=GPU-abc"
}

bash scripts/ensure-docker.sh

status=0
registered || status=$?
if [ "$status" -eq 2 ]; then exit 1; fi
if [ "$status" -eq 0 ]; then
  log "dockerd already has its NVIDIA device driver registered; nothing to install or restart"
  if grep -qs "$MARKER" "$(command -v $HOOK_NAME 2>/dev/null || echo /nonexistent)"; then
    log "(the registered hook is Mercator's test stand-in: GPU containers here start without GPUs)"
  fi
  if [ "${1:-}" = "--verify" ]; then check_workload; fi
  exit 0
fi

banner
existing=$(command -v $HOOK_NAME 2>/dev/null || true)
if [ -n "$existing" ] && ! grep -qs "$MARKER" "$existing"; then
  log "a real $HOOK_NAME is installed at $existing; not replacing it, only restarting dockerd"
else
  tmp=$(mktemp /usr/local/bin/.$HOOK_NAME.XXXXXX)
  cat >"$tmp" <<EOF
#!/bin/sh
# $MARKER: a stand-in for NVIDIA's $HOOK_NAME, FOR TESTS ONLY.
# Installed by Mercator's scripts/install-gpu-hook-standin.sh so dockerd
# registers its NVIDIA device driver on a machine without GPUs. runc runs it
# as an OCI prestart hook with the container's state on standard input; it
# reads that and succeeds, so the container starts with
# NVIDIA_VISIBLE_DEVICES set and no device. Remove it with:
#   rm $HOOK && restart dockerd
cat >/dev/null
exit 0
EOF
  chmod 0755 "$tmp"
  mv -f "$tmp" "$HOOK"
  log "installed the stand-in at $HOOK"
fi

refuse_restart_if_busy
restart_dockerd
status=0
registered || status=$?
if [ "$status" -ne 0 ]; then
  log "FAILED: dockerd still has no NVIDIA device driver after the restart (is $HOOK on dockerd's PATH?)"
  exit 1
fi
log "dockerd registered its NVIDIA device driver"
check_workload
