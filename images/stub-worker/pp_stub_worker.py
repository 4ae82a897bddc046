"""STUB_MODE=worker: the worker end of the worker-control wire (contract §8). Not built yet."""

import sys


def serve() -> int:
    print("stub: STUB_MODE=worker is not implemented in this image yet", file=sys.stderr, flush=True)
    return 2
