#!/usr/bin/env bash
# The old entry point, kept working: docker-gpu-node.sh now runs pp-gpu-node, which reads the same
# environment (STAGE, PP_IMAGE, PP_GPUS, ...) and, unlike `exec docker run`, cannot orphan its container.
# As the old script did, it runs the image's /usr/local/bin/pp-worker unless PP_ENTRYPOINT says otherwise.
export PP_ENTRYPOINT="${PP_ENTRYPOINT:-/usr/local/bin/pp-worker}"
if command -v pp-gpu-node >/dev/null 2>&1; then
  exec pp-gpu-node "$@"
fi
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [ -x "$here/.venv/bin/pp-gpu-node" ]; then
  exec "$here/.venv/bin/pp-gpu-node" "$@"
fi
echo "docker-gpu-node.sh: pp-gpu-node is not installed; run 'make setup' in $here or 'pip install -e $here'" >&2
exit 2
