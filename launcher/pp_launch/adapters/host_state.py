"""Host-wide state shared by launches: the state directory, its lock, and the GPU reservations."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path

from pp_launch.core import labels
from pp_launch.core.gpu.allocator import Holding


def state_dir() -> Path:
    path = Path(os.environ.get("PP_LAUNCH_STATE_DIR", "/tmp/pp-launch-state"))
    path.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(OSError):
        path.chmod(0o1777)  # several users' launches share the host's GPUs
    return path


@contextlib.contextmanager
def host_lock(directory: Path) -> Iterator[None]:
    with open(directory / "gpu.lock", "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


class Reservations:
    """Live reservations under `state_dir()/reservations/<run>.json`, each with its owner."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory / "reservations"
        self.dir.mkdir(exist_ok=True)

    def live(self) -> dict[str, Holding]:
        out: dict[str, Holding] = {}
        for path in self.dir.glob("*.json"):
            try:
                doc = json.loads(path.read_text())
            except (OSError, json.JSONDecodeError):
                continue
            if labels.owner_is_gone(str(doc.get("owner", ""))):
                path.unlink(missing_ok=True)
                continue
            for k, gpus in enumerate(doc.get("stage_gpus", [])):
                for uuid in gpus:
                    out[uuid] = Holding(str(doc.get("run", path.stem)), k)
        return out

    def write(self, run_id: str, owner: str, stage_gpus: list[tuple[str, ...]]) -> None:
        doc = {"run": run_id, "owner": owner, "stage_gpus": [list(g) for g in stage_gpus]}
        (self.dir / f"{run_id}.json").write_text(json.dumps(doc))

    def release(self, run_id: str) -> None:
        (self.dir / f"{run_id}.json").unlink(missing_ok=True)


class RunHosts:
    """The hosts of each chain across hosts started here (`state_dir()/hosts/<run>.json`), so that `ps`, `down`
    and `gc` with --all-hosts know where to look. Written before anything starts; dropped once nothing of the
    run is left anywhere."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory / "hosts"
        self.dir.mkdir(exist_ok=True)

    def write(self, run_id: str, hosts: tuple[str, ...]) -> None:
        (self.dir / f"{run_id}.json").write_text(json.dumps({"run": run_id, "hosts": list(hosts)}))

    def of(self, run_id: str) -> tuple[str, ...]:
        try:
            doc = json.loads((self.dir / f"{run_id}.json").read_text())
        except (OSError, json.JSONDecodeError):
            return ()
        return tuple(str(h) for h in doc.get("hosts", []) if isinstance(h, str))

    def every(self) -> tuple[str, ...]:
        """Every host any recorded run uses, in the order first seen."""
        seen: dict[str, None] = {}
        for path in sorted(self.dir.glob("*.json")):
            seen.update(dict.fromkeys(self.of(path.stem)))
        return tuple(seen)

    def forget(self, run_id: str) -> None:
        (self.dir / f"{run_id}.json").unlink(missing_ok=True)

    def _matching(self, prefix: str) -> list[str]:
        return sorted(p.stem for p in self.dir.glob("*.json") if p.stem.startswith(prefix)) if prefix else []

    def of_prefix(self, prefix: str) -> tuple[str, ...]:
        """The hosts of the recorded runs whose id starts with `prefix` (a run id, or a unique prefix of one)."""
        seen: dict[str, None] = {}
        for run in self._matching(prefix):
            seen.update(dict.fromkeys(self.of(run)))
        return tuple(seen)

    def forget_prefix(self, prefix: str) -> None:
        matching = self._matching(prefix)
        if len(matching) == 1:
            self.forget(matching[0])
