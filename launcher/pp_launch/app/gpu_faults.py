"""What an Xid on one of a run's GPUs means for its stages, on every site (docs/recovery.md). Each site only says
where its watch runs and feeds `on_xid` from it: this machine's NVML (one engine), a watcher container on each
`--host` engine (app/hosts.py), each Ray node's agent (adapters/ray_cluster.py). A fatal Xid fails every stage on
that GPU, naming it, and the run's next attempt passes the GPU over (`faults`); any other is said."""

from __future__ import annotations

import threading
from collections.abc import Callable

from pp_launch.core.chain.plan import ChainPlan
from pp_launch.core.chain.scope import ChainScope
from pp_launch.core.gpu import xid


class GpuFaults:
    def __init__(self, plan: ChainPlan, say: Callable[[str], None]) -> None:
        self.plan, self.say = plan, say
        self.faults: dict[str, str] = {}  # UUID -> what it reported
        self.scope: ChainScope | None = None
        self._lock = threading.Lock()  # several watches (one per host or node) may report at once

    def watching(self, scope: ChainScope) -> None:
        """From here on a fatal Xid fails the stages on its GPU (before: none runs yet, nothing to fail)."""
        self.scope = scope

    def on_xid(self, uuid: str, index: int, code: int, where: str = "") -> None:
        """An Xid a watch saw on GPU `uuid` (`index` on its machine, -1 unknown; `where`: the host or node)."""
        stages = [s for s in self.plan.stages if uuid in s.gpus]
        gpu = f"GPU {index} ({uuid})" if index >= 0 else uuid
        which = ", ".join(f"stage {s.index} ({s.where()})" for s in stages)
        which = which or ("no stage of this run" + (f", on {where}" if where else ""))
        if not xid.fails_stage(code):
            self.say(f"warning: {gpu}, under {which}, reported {xid.describe(code)}; the stage runs on")
            return
        with self._lock:
            self.faults[uuid] = f"{gpu} reported {xid.describe(code)} on attempt {self.plan.attempt}"
        if not stages:
            self.say(f"warning: {gpu}, under {which}, reported {xid.describe(code)}; it is not used again in this run")
        if self.scope is None:
            return
        for s in stages:
            self.scope.fail_stage(
                s.index,
                f"stage {s.index} ({s.where()}) failed: its {gpu} reported "
                f"{xid.describe(code)}; that GPU is not used again in this run",
            )

    def seen(self) -> tuple[tuple[str, str], ...]:
        with self._lock:
            return tuple(self.faults.items())
