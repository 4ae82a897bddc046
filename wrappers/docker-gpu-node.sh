#!/usr/bin/env bash
# The old entry point, kept working: docker-gpu-node.sh now runs pp-gpu-node, which reads the same
# environment (STAGE, PP_IMAGE, PP_GPUS, ...) and, unlike `exec docker run`, cannot orphan its container.
# As the old script did, it runs the image's /usr/local/bin/pp-worker unless PP_ENTRYPOINT says otherwise.
export PP_ENTRYPOINT="${PP_ENTRYPOINT:-/usr/local/bin/pp-worker}"
if command -v pp-gpu-node >/dev/null 2>&1; then
  exec pp-gpu-node "$@"
fi
# not on PATH: the pp-gpu-node of the install this script came with (a checkout's .venv, or the venv whose
# site-packages carry this copy), found by walking up from where the script lies
dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
for _ in 1 2 3 4 5 6; do
  dir=$(dirname "$dir")
  for candidate in "$dir/.venv/bin/pp-gpu-node" "$dir/bin/pp-gpu-node"; do
    if [ -x "$candidate" ]; then
      exec "$candidate" "$@"
    fi
  done
done
echo "docker-gpu-node.sh: pp-gpu-node is not installed: 'pip install pp-launch' (or 'make setup' in a checkout)" >&2
exit 2
