#!/usr/bin/env bash
# Docker 26 for the test suite's CDI engine (tests/gpu_host.py): Debian trixie's docker.io, fetched with apt using
# package lists of its own (this system's apt sources are left as they are) and unpacked into a private folder,
# never installed: the system's own engine is untouched. Idempotent. PP_DOCKER26_DIR overrides the folder.
set -euo pipefail
dest=${PP_DOCKER26_DIR:-/opt/pp-launch/docker26}
say() { printf 'ensure-docker26: %s\n' "$*" >&2; }
if [ -x "$dest/usr/sbin/dockerd" ]; then
  say "Docker $("$dest/usr/sbin/dockerd" --version | awk '{print $3}' | tr -d ,) already unpacked in $dest"
  exit 0
fi
if [ "$(id -u)" != 0 ] || [ ! -f /etc/debian_version ]; then
  say "needs root on Debian to fetch trixie's docker.io; the CDI tests need it at $dest"
  exit 1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/lists/partial" "$tmp/cache/archives/partial"
echo "deb http://deb.debian.org/debian trixie main" > "$tmp/sources.list"
o="-o Dir::Etc::SourceList=$tmp/sources.list -o Dir::Etc::SourceParts=/dev/null -o Dir::State::Lists=$tmp/lists -o Dir::Cache=$tmp/cache -o APT::Sandbox::User=root"
say "fetching Debian trixie's docker.io into $dest"
# shellcheck disable=SC2086
apt-get $o update -qq
# shellcheck disable=SC2086
(cd "$tmp" && apt-get $o download -qq docker.io)
mkdir -p "$dest.part"
dpkg-deb -x "$tmp"/docker.io_*.deb "$dest.part"
rm -rf "$dest" && mv "$dest.part" "$dest"
say "unpacked $("$dest/usr/sbin/dockerd" --version)"
