#!/usr/bin/env bash
# Makes sure a Docker Engine is installed and running on this machine:
# installs Debian's docker.io package when dockerd is absent, starts dockerd
# when nothing answers on its socket, and waits until it does. Idempotent.
set -euo pipefail

log() { echo "ensure-docker: $*" >&2; }

if ! command -v dockerd >/dev/null 2>&1; then
  log "dockerd not found; installing Debian's docker.io package"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq docker.io >/dev/null
fi

if docker info >/dev/null 2>&1; then
  exit 0
fi

log "starting dockerd (log: /var/log/mercator-dockerd.log)"
if command -v systemctl >/dev/null 2>&1 && systemctl is-system-running >/dev/null 2>&1; then
  systemctl start docker || true
fi
if ! docker info >/dev/null 2>&1; then
  # In a session of its own (setsid): the daemon outlives the command that
  # started it, and a job control kill of that command's process group
  # (a timed-out test run) does not take every container down with it.
  setsid nohup dockerd >/var/log/mercator-dockerd.log 2>&1 < /dev/null &
fi
for _ in $(seq 1 60); do
  if docker info >/dev/null 2>&1; then
    log "dockerd is up ($(docker version --format '{{.Server.Version}}' 2>/dev/null))"
    exit 0
  fi
  sleep 1
done
log "dockerd did not come up within 60s; see /var/log/mercator-dockerd.log"
tail -n 30 /var/log/mercator-dockerd.log >&2 || true
exit 1
