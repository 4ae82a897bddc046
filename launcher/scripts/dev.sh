#!/usr/bin/env bash
# The one entry point behind the README's commands, the Makefile and CI.
#   dev.sh setup   virtual environment (.venv), the package, a Docker engine, the images
#   dev.sh demo    setup, then a 4-stage demo chain
#   dev.sh test    setup, then the quick tier (unit tests and a representative real-engine set), ruff and mypy
#   dev.sh test-all  setup (with the Ray extra), then every test (what CI runs), ruff and mypy
#   dev.sh test-load setup, then the quick tier three times in a row beside a CPU hog on both cores (stress-ng)
#   dev.sh bench   setup, then the benchmarks under bench/
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=${PP_VENV:-.venv}
PY="$VENV/bin/python"
say() { printf 'dev: %s\n' "$*" >&2; }

setup() {
  local extras=${1:-test}
  shift || true  # the rest: host tool groups for ensure-host-tools.sh (docs, browser)
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
  say "installing pp-launch and its test tools ($extras) into $VENV"
  "$PY" -m pip install -q --disable-pip-version-check -e ".[$extras]"
  # the package's own bytecode, written now: an editable install compiles none of it, and a shell with
  # PYTHONDONTWRITEBYTECODE=1 would then compile every module in every pp-launch process (about 0.05 s each)
  "$PY" -m compileall -q launcher/pp_launch >/dev/null
  launcher/scripts/ensure-host-tools.sh "$@"
  launcher/scripts/ensure-docker.sh
  say "building the images (nothing is pulled; a second run rebuilds nothing)"
  "$VENV/bin/pp-launch" images build
}

# PP_TESTS_BESIDE_WORK=1 (CI sets it): the suite runs beside real work on the engine, a detached chain of another
# owner and an unlabelled container, and fails unless both are untouched at its end.
REAL_RUN=""
REAL_PLAIN=pp-tests-real-work-plain
start_real_work() {
  [ "${PP_TESTS_BESIDE_WORK:-}" = 1 ] || return 0
  docker rm -f "$REAL_PLAIN" >/dev/null 2>&1 || true
  docker run -d --name "$REAL_PLAIN" --network none -e STUB_MODE=hold pp-launch/stub-worker:latest >/dev/null
  REAL_STATE=$(mktemp -d)  # the other owner's own state, removed with its run
  REAL_RUN=$(PP_LAUNCH_STATE_DIR="$REAL_STATE" "$VENV/bin/pp-launch" chain --stages 2 --gpus none --detach \
    --name pp-tests-real-work --env STUB_MODE=hold 2>/dev/null)
  say "real work beside the suite: run $REAL_RUN (detached, another owner) and container $REAL_PLAIN (no labels)"
}
check_real_work() {
  [ "${PP_TESTS_BESIDE_WORK:-}" = 1 ] || return 0
  local bad=0
  [ "$(docker inspect -f '{{.State.Running}}' "$REAL_PLAIN" 2>/dev/null)" = true ] || { say "the unlabelled container was touched"; bad=1; }
  local roles
  roles=$(docker ps --filter "label=pp-launch.run=$REAL_RUN" --filter status=running --format '{{.Label "pp-launch.stage"}}' | sort | tr '\n' ' ')
  [ "$roles" = "0 1 guard " ] \
    || { say "the detached run $REAL_RUN of another owner was touched (running: ${roles:-nothing})"; bad=1; }
  "$VENV/bin/pp-launch" down "$REAL_RUN" --grace 1 >/dev/null 2>&1 || true
  docker rm -f "$REAL_PLAIN" >/dev/null 2>&1 || true
  # its record volume (kept by design, for wait and ps -a): the set-up's own run, so its own to remove
  docker volume ls -q --filter "label=pp-launch.run=$REAL_RUN" | xargs -r docker volume rm >/dev/null 2>&1 || true
  rm -rf "$REAL_STATE"
  [ "$bad" = 0 ] || exit 1
  say "real work beside the suite: untouched"
}

# Each phase's time, said when it ends (CI prints them all): setup is timed apart from the tests.
phase_start=$(date +%s)
phase() {
  local now; now=$(date +%s)
  say "phase ${1}: $((now - phase_start)) s"
  phase_start=$now
}

# pytest-xdist workers: one more than the cores (one test at a time keeps 0.8 of the 2 cores here busy: the tests
# wait on containers and engines, and the engine's own work is CPU); more only adds contention (measured: 3 workers
# 690 s for the full tier, 4 workers slower). The tests of each costly shared fixture (a second engine, the GPU
# engines, the hosts testbed, the Ray cluster, the browser) run on one worker (tests/conftest.py, MADE_ONCE), as do
# the GPU tests of the suite's engine. PP_TESTS_WORKERS=0 runs everything in this one process.
WORKERS=${PP_TESTS_WORKERS:-$(( $(nproc) + 1 ))}

run_tests() {
  export TESTCONTAINERS_RYUK_DISABLED=true
  start_real_work
  local parallel=()
  [ "$WORKERS" = 0 ] || parallel=(-n "$WORKERS" --dist loadgroup)
  set +e
  "$PY" -m pytest tests --durations="${PP_TESTS_DURATIONS:-15}" "${parallel[@]}" "$@"
  rc=$?
  set -e
  check_real_work
  phase tests
  if [ "$rc" = 5 ]; then say "pytest collected no test: that is a failure"; exit 1; fi
  [ "$rc" = 0 ] || exit "$rc"
  say "ruff"; "$VENV/bin/ruff" check launcher tests bench examples
  say "mypy"; "$VENV/bin/mypy"
  phase "ruff and mypy"
}

cmd=${1:-}
shift || true
case "$cmd" in
  setup) setup ;;
  demo)
    setup; code=0
    # The demo model's weights live on the host, written once, and every stage reads them from a read-only mount
    # (-v), as a real model's do: the demo's match=true proves the mount end to end.
    weights=${PP_DEMO_WEIGHTS:-${XDG_CACHE_HOME:-$HOME/.cache}/pp-launch/demo-weights}
    if [ ! -s "$weights/demo.npz" ]; then
      mkdir -p "$weights"
      say "writing the demo model's weights to $weights (once)"
      "$VENV/bin/pp-launch" chain --stages 1 --gpus none -q --user "$(id -u):$(id -g)" -v "$weights:/weights" \
        --env STUB_MODE=write-weights --env STUB_WEIGHTS=/weights/demo.npz
    fi
    "$VENV/bin/pp-launch" chain --stages "${STAGES:-4}" -v "$weights:/weights:ro" --env STUB_WEIGHTS=/weights/demo.npz \
      "$@" || code=$?
    say "pp-launch and pp-gpu-node are in $VENV/bin: '. $VENV/bin/activate' puts them on PATH in a shell"
    exit "$code" ;;
  test) setup test docs; launcher/scripts/ensure-docker26.sh; phase setup; run_tests -m "not full" "$@" ;;
  test-all)  # the Ray tests need the extra
    setup test,ray docs browser; launcher/scripts/ensure-docker26.sh; phase setup; run_tests "$@" ;;
  test-load)
    setup test docs; launcher/scripts/ensure-docker26.sh
    if ! command -v stress-ng >/dev/null 2>&1; then
      say "installing stress-ng (Debian's package) for the CPU hog"
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq stress-ng >/dev/null
    fi
    stress-ng --cpu "$(nproc)" --timeout 3h --quiet & hog=$!
    trap 'kill "$hog" 2>/dev/null || true' EXIT
    phase setup
    for round in 1 2 3; do say "quick tier under load, round $round of 3"; run_tests -m "not full" "$@"; done ;;
  bench) setup test,ray; exec "$PY" bench/run_all.py "$@" ;;
  docs) setup test docs; "$VENV/bin/pip" install -q -e ".[docs]"; exec "$VENV/bin/mkdocs" serve -a "${DOCS_ADDR:-127.0.0.1:8000}" "$@" ;;
  *) echo "usage: $0 setup|demo|test|test-all|test-load|bench|docs [args...]" >&2; exit 2 ;;
esac
