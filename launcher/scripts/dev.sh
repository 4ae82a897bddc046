#!/usr/bin/env bash
# The one entry point behind the README's commands, the Makefile and CI.
#   dev.sh setup   virtual environment (.venv), the package, a Docker engine, the images
#   dev.sh demo    setup, then a 4-stage demo chain
#   dev.sh test    setup, then the whole test suite (unit + real-engine integration), ruff and mypy
#   dev.sh bench   setup, then the benchmarks under bench/
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=${PP_VENV:-.venv}
PY="$VENV/bin/python"
say() { printf 'dev: %s\n' "$*" >&2; }

setup() {
  if [ ! -x "$PY" ]; then
    say "creating the virtual environment $VENV"
    if ! python3 -m venv "$VENV" 2>/dev/null; then
      if [ "$(id -u)" = 0 ] && [ -f /etc/debian_version ]; then
        say "python3-venv is missing: installing it"
        rm -rf "$VENV"
        DEBIAN_FRONTEND=noninteractive apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
        python3 -m venv "$VENV"
      else
        say "cannot create a virtual environment: install python3-venv (Debian/Ubuntu) and run this again"
        exit 1
      fi
    fi
  fi
  say "installing pp-launch and its test tools into $VENV"
  "$PY" -m pip install -q --disable-pip-version-check -e '.[test]'
  launcher/scripts/ensure-host-tools.sh
  launcher/scripts/ensure-docker.sh
  say "building the images (nothing is pulled; a second run rebuilds nothing)"
  "$VENV/bin/pp-launch" images build
}

run_tests() {
  export TESTCONTAINERS_RYUK_DISABLED=true
  set +e
  "$PY" -m pytest tests "$@"
  rc=$?
  set -e
  if [ "$rc" = 5 ]; then say "pytest collected no test: that is a failure"; exit 1; fi
  [ "$rc" = 0 ] || exit "$rc"
  say "ruff"; "$VENV/bin/ruff" check launcher tests bench examples
  say "mypy"; "$VENV/bin/mypy"
}

cmd=${1:-}
shift || true
case "$cmd" in
  setup) setup ;;
  demo) setup; exec "$VENV/bin/pp-launch" chain --stages "${STAGES:-4}" "$@" ;;
  test) setup; launcher/scripts/ensure-docker26.sh; run_tests "$@" ;;
  bench) setup; exec "$PY" bench/run_all.py "$@" ;;
  *) echo "usage: $0 setup|demo|test|bench [args...]" >&2; exit 2 ;;
esac
