#!/usr/bin/env bash
# The example's image, built once on the engine DOCKER_HOST names and reused while its inputs are unchanged:
#   bash examples/torch-pipeline/build.sh        (after 'pp-launch images build': it makes the Debian base)
# Prints the image's name. Nothing is pulled from a registry; Debian's python3-torch comes from its mirror.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
image=pp-launch-example/torch-pipeline:latest
hash=$(cat "$here/Dockerfile" "$here/pipeline.py" | sha256sum | cut -c1-16)
have=$(docker image inspect -f '{{index .Config.Labels "pp-launch.example-hash"}}' "$image" 2>/dev/null || true)
if [ "$have" != "$hash" ]; then
  docker image inspect pp-launch/base:bookworm >/dev/null 2>&1 \
    || { echo "build.sh: pp-launch/base:bookworm is missing: run 'pp-launch images build' first" >&2; exit 1; }
  old=$(docker image inspect -f '{{.Id}}' "$image" 2>/dev/null || true)
  docker build -q --label "pp-launch.example-hash=$hash" -t "$image" "$here" >/dev/null
  if [ -n "$old" ]; then docker image rm "$old" >/dev/null 2>&1 || true; fi  # the one it replaced, unless in use
fi
echo "$image"
