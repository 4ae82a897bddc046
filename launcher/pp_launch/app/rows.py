"""What `ps` shows of one container of a run, or of one stage end a run's record keeps: one typed row, whichever
site or record it comes from (an engine's containers, the runs kept here, an engine's records, a Ray cluster's
node agents). `as_json` is `ps --json`'s object (docs/formats.md): the same keys from every site. Rendering is
the CLI's."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class StageRow:
    run: str
    stage: int | None  # None: a lock, or a container whose stage label cannot be read
    container: str  # its name
    id: str  # 12 characters ("" when a kept end did not say it)
    image: str
    owner: str
    owner_status: str  # one word (housekeeping.OWNER_STATUS_SAID)
    state: str  # docker's (running, exited, ...)
    role: str = "stage"  # or "lock" (an engine's GPU lock), "watch" (a run's GPU watcher on a --host engine)
    attempt: int | None = None  # None: a lock, or an older container
    gpus: tuple[str, ...] = ()  # UUIDs
    age_s: int | None = None
    host: str | None = None  # the host or Ray node, where several places were asked
    address: str | None = None  # what a running stage announced (with details)
    uptime_s: int | None = None  # since a running stage started (with details)
    labels: Mapping[str, str] = field(default_factory=dict)
    status: str | None = None  # an ended stage's "Exited (N)", as docker ps says it
    exit_code: int | None = None  # an ended stage's, when it can be told
    gpu_index: tuple[int, ...] = ()  # each of `gpus` NVML told here: its index, memory used and utilisation
    gpu_memory_used_mib: tuple[int | None, ...] = ()
    gpu_utilization_pct: tuple[int | None, ...] = ()

    @classmethod
    def exited(
        cls,
        run: str,
        stage: int | None,
        container: str,
        ref: str,
        code: int | None,
        age: float | None,
        host: str | None = None,
        image: str = "-",
        oom: bool = False,
    ) -> StageRow:
        """A stage end kept after its container was gone (`ps -a`): docker ps's `Exited (N)` (`?`: not told)."""
        status = f"Exited ({'?' if code is None else code})" + (" (OOM)" if oom else "")
        age_s = None if age is None else max(0, int(age))
        return cls(run, stage, container, ref, image, "-", "ended", "exited", status=status, exit_code=code,
                   age_s=age_s, host=host)  # fmt: skip

    @property
    def ended(self) -> bool:
        """A stage end kept after its container was gone (`ps -a`)."""
        return self.status is not None

    def order(self) -> tuple[str, int, str]:
        """Live rows are shown by run, stage and host."""
        return self.run, -1 if self.stage is None else self.stage, self.host or ""

    def as_json(self) -> dict[str, Any]:
        """`ps --json`'s object: every key always, `host` where several places were asked, an ended stage's
        `status` and `exit_code`, each GPU's index, memory and utilisation where NVML told them."""
        doc: dict[str, Any] = {
            "run": self.run,
            "stage": self.stage,
            "attempt": self.attempt,
            "role": self.role,
            "container": self.container,
            "id": self.id,
            "image": self.image,
            "gpus": list(self.gpus),
            "owner": self.owner,
            "owner_status": self.owner_status,
            "state": self.state,
            "age_s": self.age_s,
            "address": self.address,
            "uptime_s": self.uptime_s,
            "labels": dict(self.labels),
        }
        if self.host is not None:
            doc["host"] = self.host
        if self.ended:
            doc.update(status=self.status, exit_code=self.exit_code)
        if self.gpu_index:
            doc.update(
                gpu_index=list(self.gpu_index),
                gpu_memory_used_mib=list(self.gpu_memory_used_mib),
                gpu_utilization_pct=list(self.gpu_utilization_pct),
            )
        return doc
