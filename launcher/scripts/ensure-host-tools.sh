#!/usr/bin/env bash
# Make sure the host tools the set-up calls are installed: for each missing command, install the Debian
# package that provides it (as root on Debian), else say what to install and fail. An installed tool is
# left alone. Arguments add groups: `docs` (Graphviz, which draws the site's pictures while it builds) and
# `browser` (Chromium, which the full tier opens the built site in). PP_APT_GET replaces apt-get (tests run this against a PATH without the tools and a
# recording stand-in, so nothing is installed by them).
set -euo pipefail
say() { printf 'ensure-host-tools: %s\n' "$*" >&2; }
APT=${PP_APT_GET:-apt-get}

# command -> Debian package. docker.io and Compose are ensure-docker.sh's; python3-venv is dev.sh's.
TOOLS=(
  "debootstrap:debootstrap"
  "gcc:gcc"
  "tar:tar"
  "setsid:util-linux"
  "pgrep:procps"
  "sshd:openssh-server"  # the test suite reaches one engine the way remote hosts are: over ssh://
)
for group in "$@"; do
  case "$group" in
    docs) TOOLS+=("dot:graphviz") ;;
    browser) TOOLS+=("chromium:chromium") ;;
    *) say "unknown group '$group' (docs, browser)"; exit 2 ;;
  esac
done

missing=()
for pair in "${TOOLS[@]}"; do
  cmd=${pair%%:*} pkg=${pair#*:}
  command -v "$cmd" >/dev/null 2>&1 || missing+=("$pkg")
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" != 0 ] || [ ! -f /etc/debian_version ]; then
  say "missing host tools: install the packages ${missing[*]} (Debian/Ubuntu names), then run this again"
  exit 1
fi
say "installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"$APT" update -qq
"$APT" install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
