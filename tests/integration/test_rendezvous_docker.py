"""--rendezvous torch (docs/chain.md, "torch.distributed, as torchrun runs it"): each stage gets torchrun's variables
and the stages meet at MASTER_ADDR:MASTER_PORT with no announcement, as an `env://` program does (here a small
TCP all-reduce in the standard library, the way torch's TCPStore rendezvous meets: rank 0 listens, the others
connect). The chain completes once every rank exited 0; a killed rank fails it. No stage runs under the hand-off
entry: each container's command is the program's own."""

from __future__ import annotations

import pytest

from ..helpers import Launcher

pytestmark = pytest.mark.docker
PROGRAM = """
import os, socket, sys, time
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
addr = (os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))
if os.environ.get("HANG_RANK") == str(rank):
    time.sleep(3600)
if rank == 0:
    server = socket.create_server(addr)
    peers = [server.accept()[0] for _ in range(world - 1)]
    total = rank + sum(int(p.makefile().readline()) for p in peers)
    for p in peers:
        p.sendall(f"{total}\\n".encode())
else:
    for _ in range(100):
        try:
            conn = socket.create_connection(addr)
            break
        except OSError:
            time.sleep(0.1)
    conn.sendall(f"{rank}\\n".encode())
    total = int(conn.makefile().readline())
init = open("/proc/1/cmdline").read().split("\\0")  # tini: docker-init -- PATH ARGS..., PATH as docker ps shows it
print(f"rank {rank}/{world} local {os.environ['LOCAL_RANK']} sum {total} as {init[init.index('--') + 1]}", flush=True)
"""


def test_an_env_rendezvous_program_runs_unmodified_as_a_chain(engine, stub_image) -> None:  # type: ignore[no-untyped-def]
    chain = Launcher("chain", "--stages", "4", "--gpus", "none", "--grace", "1", "--json", "--rendezvous", "torch",
                     "--entrypoint", "python3", "--", "-c", PROGRAM)  # fmt: skip
    assert chain.wait(90) == 0, chain.stderr_text()
    said = chain.stderr_text()
    for k in range(4):
        assert f"[stage {k}] rank {k}/4 local {k} sum 6 as python3" in said, said  # its own command: no hand-off entry
    assert chain.events_named("chain_stopped")[-1]["reason"] == "completed"


def test_a_rank_that_hangs_is_noticed_by_its_health_check_and_ends_the_chain(engine, stub_image) -> None:  # type: ignore[no-untyped-def]
    chain = Launcher("chain", "--stages", "3", "--gpus", "none", "--grace", "1", "--json", "--rendezvous", "torch",
                     "--stage-env", "2:HANG_RANK=2", "--health-cmd", "test ! -e /hung",
                     "--health-interval", "300ms", "--health-retries", "2", "--entrypoint", "sh", "--", "-c",
                     'if [ "$HANG_RANK" = "$RANK" ]; then touch /hung; fi; exec python3 -c "$0"', PROGRAM)  # fmt: skip
    assert chain.wait(90) == 1, chain.stderr_text()
    said = chain.stderr_text()
    assert "stage 2 (" in said and "unhealthy: its health check failed" in said, said
