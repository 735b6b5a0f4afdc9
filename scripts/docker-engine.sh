#!/usr/bin/env bash
# A Docker engine for `make images` and the container tests, private to this checkout.
#
#   docker-engine.sh start DIR   print a DOCKER_HOST that answers: $DOCKER_HOST (or the default
#                                socket) when an engine answers there; otherwise install docker.io
#                                and debootstrap (apt-get) if missing and start a dockerd whose
#                                socket, data and exec roots live under DIR (DIR/docker.pid marks
#                                it as ours)
#   docker-engine.sh stop DIR    stop the dockerd that `start DIR` started (its containers go with
#                                it); nothing when it started none
#   docker-engine.sh running DIR succeed when the dockerd that `start DIR` started still answers
#   docker-engine.sh docker      print the path of a docker client that builds with BuildKit
#
# The engine never touches the machine's network configuration: no iptables rules, no NAT, no
# bridge, no IP forwarding. Containers must run with --network host (the images and the docker
# platform do). Every message goes to stderr; stdout carries only the answer.
set -euo pipefail
log() { echo "docker-engine.sh: $*" >&2; }

# Docker's CLI >= 23 builds with BuildKit only through the buildx plugin; Debian's docker.io
# client (20.10) has BuildKit built in (DOCKER_BUILDKIT=1: --secret, RUN --mount). Prefer a
# client with buildx, else Debian's.
client() {
  local c
  for c in "$(command -v docker 2>/dev/null || true)" /usr/bin/docker; do
    [ -n "$c" ] && [ -x "$c" ] || continue
    if "$c" buildx version >/dev/null 2>&1; then echo "$c"; return; fi
  done
  for c in /usr/bin/docker "$(command -v docker 2>/dev/null || true)"; do
    [ -n "$c" ] && [ -x "$c" ] || continue
    local v; v=$("$c" version --format '{{.Client.Version}}' 2>/dev/null || true)
    case "$v" in 1[0-9].*|20.*|21.*|22.*) echo "$c"; return;; esac
  done
  return 1
}

answers() { # $1: a DOCKER_HOST
  local c; c=$(client 2>/dev/null) || c=$(command -v docker 2>/dev/null) || return 1
  DOCKER_HOST="$1" timeout 10 "$c" version --format '{{.Server.Version}}' >/dev/null 2>&1
}

install_deps() {
  local missing=()
  command -v dockerd >/dev/null 2>&1 || [ -x /usr/sbin/dockerd ] || missing+=(docker.io)
  command -v debootstrap >/dev/null 2>&1 || [ -x /usr/sbin/debootstrap ] || missing+=(debootstrap)
  [ -x /usr/bin/docker ] || client >/dev/null 2>&1 || missing+=(docker.io)
  if [ ${#missing[@]} -gt 0 ]; then
    log "installing ${missing[*]} (apt-get)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get -o DPkg::Lock::Timeout=600 update -q >&2 || true
    apt-get -o DPkg::Lock::Timeout=600 install -y -q --no-install-recommends \
      "${missing[@]}" iptables >&2
  fi
}

cmd_start() {
  local dir; dir=$(mkdir -p "$1" && cd "$1" && pwd)
  if [ -n "${DOCKER_HOST:-}" ] && answers "$DOCKER_HOST"; then
    log "using the engine at DOCKER_HOST=$DOCKER_HOST"; echo "$DOCKER_HOST"; return
  fi
  local own="unix://$dir/docker.sock"
  if [ -f "$dir/docker.pid" ] && kill -0 "$(cat "$dir/docker.pid")" 2>/dev/null && answers "$own"; then
    echo "$own"; return
  fi
  if [ -z "${DOCKER_HOST:-}" ] && answers unix:///var/run/docker.sock; then
    log "using the engine at /var/run/docker.sock"; echo unix:///var/run/docker.sock; return
  fi
  install_deps
  local dockerd; dockerd=$(command -v dockerd || echo /usr/sbin/dockerd)
  mkdir -p "$dir/data" "$dir/exec"
  rm -f "$dir/docker.sock" "$dir/docker.pid"
  log "starting dockerd (state under $dir, log $dir/dockerd.log)"
  # setsid: the engine outlives this script, and a ^C to make does not take it down half-way
  setsid "$dockerd" --host "$own" --data-root "$dir/data" --exec-root "$dir/exec" \
    --pidfile "$dir/docker.pid" --iptables=false --ip-masq=false --bridge=none \
    --ip-forward=false --ip6tables=false --userland-proxy=false \
    >"$dir/dockerd.log" 2>&1 </dev/null &
  local i
  for i in $(seq 1 120); do
    if answers "$own"; then echo "$own"; return; fi
    if ! kill -0 $! 2>/dev/null; then break; fi
    sleep 0.5
  done
  log "dockerd did not answer; its log:"; tail -n 30 "$dir/dockerd.log" >&2 || true
  exit 1
}

cmd_stop() {
  local dir=$1 pid=""
  [ -d "$dir" ] || return 0
  [ -f "$dir/docker.pid" ] && pid=$(cat "$dir/docker.pid")
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    log "stopping dockerd (pid $pid)"
    kill -TERM "$pid"
    for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
  fi
  rm -f "$dir/docker.pid" "$dir/docker.sock"
  # dockerd leaves its default network namespace bind-mounted under the exec root:
  # unmount what it left under DIR so `rm -rf build` (make clean) can remove it
  local abs m
  abs=$(cd "$dir" && pwd)
  for m in $(awk -v d="$abs/" 'index($2, d) == 1 {print $2}' /proc/self/mounts | sort -r); do
    umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
  done
}

cmd_running() {
  local dir=$1
  [ -f "$dir/docker.pid" ] && kill -0 "$(cat "$dir/docker.pid")" 2>/dev/null \
    && answers "unix://$(cd "$dir" && pwd)/docker.sock"
}

case "${1:-}" in
  running) cmd_running "${2:?usage: docker-engine.sh running DIR}" ;;
  start) cmd_start "${2:?usage: docker-engine.sh start DIR}" ;;
  stop) cmd_stop "${2:?usage: docker-engine.sh stop DIR}" ;;
  docker) install_deps; client ;;
  *) echo "usage: docker-engine.sh start DIR | stop DIR | running DIR | docker" >&2; exit 2 ;;
esac
