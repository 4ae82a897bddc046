#!/usr/bin/env bash
# Make sure a Docker engine answers. Leaves a running engine alone; as root on Debian with none
# running, installs Debian's docker.io and starts dockerd in the background; anywhere else it stops
# with a message saying what to install. It never pulls an image.
set -euo pipefail

log=${PP_DOCKERD_LOG:-/var/log/pp-launch-dockerd.log}
say() { printf 'ensure-docker: %s\n' "$*" >&2; }

engine_answers() { command -v docker >/dev/null 2>&1 && timeout 10 docker info >/dev/null 2>&1; }

# Compose v2 (the `docker compose` plugin). Bookworm ships only v1, so on Debian we take the plugin binary
# from Debian trixie's docker-compose package (a Go binary needing libc >= 2.34), fetched with apt using
# its own package lists: this system's apt sources are left as they are.
ensure_compose() {
  if docker compose version >/dev/null 2>&1; then
    return 0
  fi
  if [ "$(id -u)" != 0 ] || [ ! -f /etc/debian_version ]; then
    say "Compose v2 is missing ('docker compose version' fails): install the docker-compose-plugin package."
    say "(only 'pp-launch compose' and its tests need it)"
    return 1
  fi
  say "installing Compose v2 (Debian trixie's docker-compose) as /usr/libexec/docker/cli-plugins/docker-compose"
  local tmp o deb
  tmp=$(mktemp -d)
  mkdir -p "$tmp/lists/partial" "$tmp/cache/archives/partial"
  echo "deb http://deb.debian.org/debian trixie main" > "$tmp/sources.list"
  o="-o Dir::Etc::SourceList=$tmp/sources.list -o Dir::Etc::SourceParts=/dev/null -o Dir::State::Lists=$tmp/lists -o Dir::Cache=$tmp/cache -o APT::Sandbox::User=root"
  # shellcheck disable=SC2086
  apt-get $o update -qq && (cd "$tmp" && apt-get $o download -qq docker-compose)
  deb=$(ls "$tmp"/docker-compose_*.deb)
  dpkg-deb -x "$deb" "$tmp/root"
  install -D -m 0755 "$tmp/root/usr/libexec/docker/cli-plugins/docker-compose" /usr/libexec/docker/cli-plugins/docker-compose
  rm -rf "$tmp"
  docker compose version >&2
}

if engine_answers; then
  say "Docker engine already running ($(docker info --format '{{.ServerVersion}}' 2>/dev/null)); leaving it alone."
  ensure_compose || true
  exit 0
fi

# The user named an engine (DOCKER_HOST, DOCKER_CONTEXT, or a docker context in use): that one, or none. It is never
# waited on, and no dockerd is started in its place (it would listen elsewhere, on the default socket).
named=""
if [ -n "${DOCKER_HOST:-}" ] && [ "$DOCKER_HOST" != unix:///var/run/docker.sock ]; then
  named="DOCKER_HOST ($DOCKER_HOST)"; unset_hint="unset DOCKER_HOST"
elif [ -n "${DOCKER_CONTEXT:-}" ] && [ "$DOCKER_CONTEXT" != default ]; then
  named="DOCKER_CONTEXT ($DOCKER_CONTEXT)"; unset_hint="unset DOCKER_CONTEXT"
elif command -v docker >/dev/null 2>&1 && ctx=$(docker context show 2>/dev/null) && [ -n "$ctx" ] && [ "$ctx" != default ]; then
  named="the docker context '$ctx'"; unset_hint="run 'docker context use default'"
fi
if [ -n "$named" ]; then
  say "the engine $named names is not answering: start it, or $unset_hint to use this machine's own; nothing was started."
  exit 1
fi

if [ "$(id -u)" != 0 ] || [ ! -f /etc/debian_version ]; then
  say "no Docker engine answers on unix:///var/run/docker.sock."
  say "Install and start Docker (Debian/Ubuntu: 'sudo apt-get install docker.io && sudo systemctl start docker'),"
  say "make sure your user may use it ('docker info' must work), then run this again."
  exit 1
fi

if ! command -v dockerd >/dev/null 2>&1 || ! command -v docker-init >/dev/null 2>&1; then
  say "installing Debian's docker.io (engine, CLI, tini as docker-init)..."
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq docker.io >/dev/null
fi

# Only the default engine's own dockerd (its pid file) is waited for: another dockerd on this machine (a test's
# second engine, another user's) listens elsewhere and is no reason to wait.
own_pid=$(cat /var/run/docker.pid 2>/dev/null || true)
started=""
if [ -n "$own_pid" ] && kill -0 "$own_pid" 2>/dev/null && [ "$(cat "/proc/$own_pid/comm" 2>/dev/null)" = dockerd ]; then
  say "dockerd (pid $own_pid) is running but does not answer yet; waiting for it."
else
  started=1
  say "starting dockerd in the background; its log is $log"
  # setsid: the engine must outlive this script and the shell that called it.
  setsid nohup dockerd >>"$log" 2>&1 </dev/null &
fi

for _ in $(seq 1 120); do
  if engine_answers; then
    say "Docker engine is up ($(docker info --format '{{.ServerVersion}}'))${started:+; log: $log}"
    ensure_compose || true
    exit 0
  fi
  sleep 0.5
done
if [ -n "$started" ]; then
  say "dockerd did not answer within 60 s; see $log"
  tail -n 20 "$log" >&2 || true
else
  say "dockerd (pid $own_pid) did not answer within 60 s on unix:///var/run/docker.sock; see its log (journalctl -u docker, or where it was started)"
fi
exit 1
