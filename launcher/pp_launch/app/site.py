"""The port every kind of place implements, and the words its users pass (docs/architecture.md, "Sites").

A `Site` is one kind of place runs live on: one Docker engine or several (app/docker_site.py), or a Ray cluster
(app/on_ray.py). It owns a run's whole life there, in two halves:
- `Launching`: what `launch()` (app/launch.py) drives, the same steps in the same order for every site: reach the
  place, prepare it (images, the run's guards), and for each attempt reserve (the GPU lock, or Ray's placement
  group), hand its places (engines, nodes) to its planner (app/planning.py: the pipeline plans), start the stages'
  backend and what watches beside them, and end them;
- `Housekeeping`: what `ps`, `down`, `gc`, `logs` and `wait` ask (app/runs.py), findings as data, words to a
  `Voice`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from pp_launch.adapters.guard import RunGuard
    from pp_launch.app.planning import Planner
    from pp_launch.app.request import Hooks, Launched, LaunchRequest
    from pp_launch.app.rows import StageRow
    from pp_launch.core.chain.plan import ChainPlan
    from pp_launch.core.chain.ports import StageBackend
    from pp_launch.core.chain.scope import ChainOutcome, ChainScope


@dataclass(frozen=True)
class Voice:
    """Where a use case speaks: `answer` takes the command's own lines (stdout; one call may carry several),
    `note` its notes and errors (stderr)."""

    answer: Callable[[str], None]
    note: Callable[[str], None]


@dataclass(frozen=True)
class Where:
    """Where a command looks: `hosts` (Docker engines by name, none: this one), `all_hosts` (this engine and every
    host recorded for this machine's runs, or for the run named), or `ray` (a Ray cluster's address). `quiet_ray`:
    called before the first Ray call (Ray's own code writes to this process's stderr)."""

    hosts: tuple[str, ...] = ()
    all_hosts: bool = False
    ray: str | None = None
    quiet_ray: Callable[[], object] = field(default=lambda: None, compare=False)


@dataclass(frozen=True)
class LogView:
    """Which of a run's lines `logs` shows: stages (none: all), since (a Unix time), tail (each stage's last N),
    timestamps (each line with its time), follow (until every stage is gone), log_dir (where they were kept)."""

    stages: tuple[int, ...] = ()
    since: int | None = None
    tail: int | None = None
    timestamps: bool = False
    follow: bool = False
    log_dir: str | None = None


Confirm = Callable[[str], None]  # asked "stop N containers of M runs (...), whoever owns them?"; raises to refuse


class Housekeeping(Protocol):
    """A site as the housekeeping use cases ask it."""

    def stages(self, run: str | None, details: bool, ended_too: bool) -> list[StageRow]:
        """A row per stage (and lock) of every run, or of `run`; details: addresses and uptimes too."""
        ...

    def down(self, run: str | None, grace: float, confirm: Confirm | None) -> bool:
        """Stop `run` (None: every run, after `confirm`); False when something stays or failed."""
        ...

    def gc(self, dry_run: bool) -> bool:
        """Remove (or name) what runs left behind that nothing else will; False when something failed."""
        ...

    def logs(self, run: str, view: LogView) -> None: ...

    def wait(self, run: str, until: str, timeout: float | None) -> int:
        """Until every stage announced ("announced") or is gone ("exit"); the exit code."""
        ...

    def close(self) -> bool:
        """Every connection closed; False when a place did not answer on the way (the command exits 1)."""
        ...


class Held(Protocol):
    """What an attempt holds on its site while it places its stages: the engines' GPU locks, or Ray's grant."""

    def check(self) -> None:
        """Raise (LockLost) when what is held was taken away meanwhile: nothing of the attempt starts then."""
        ...

    def check_and_release(self) -> None:
        """Once every stage exists: checked a last time, then let go (the stages' labels now say what they hold)."""
        ...

    def made(self) -> list[str]:
        """What the attempt started on the site so far, in words ("the run's guard on gpu1"): said when a signal
        stops it before any stage, once all of it is removed."""
        ...


H = TypeVar("H", bound=Held)  # what a kind of site holds per attempt: its own type, never downcast
P = TypeVar("P")  # what a kind of site plans over: its engines (app/places.py), or a Ray cluster's nodes


class Staged(Protocol):
    """An attempt's stages on a site: their backend, what watches beside them, and their end."""

    @property
    def backend(self) -> StageBackend: ...

    def watch(self, scope: ChainScope) -> None:
        """Start what runs beside the scope (`down` told to a guard, GPU faults, a Ray head's loss)."""
        ...

    def end(self, outcome: ChainOutcome | None) -> tuple[ChainOutcome, bool, tuple[tuple[str, str], ...]] | None:
        """After the scope (outcome None: it raised): everything the watch started stopped, then the outcome as the
        site tells it (places lost named), whether another attempt may follow, and the GPUs that faulted."""
        ...


class Launching(Protocol[P, H]):
    """A site as `launch()` drives it (app/launch.py): the steps of one pipeline, in this order. `P`: the places it
    plans over, `H`: what it holds per attempt (the engines' GPU locks, Ray's grant), both handed back to the same
    site only. What runs where is not the site's: the pipeline asks the site's `planner` (app/planning.py) over
    the site's `places()`."""

    @property
    def planner(self) -> Planner[P, H]:
        """What runs at each attempt, and where (the allocator, a caller's stage, pp-gpu-node's, Ray's grant)."""
        ...

    def places(self) -> Sequence[P]:
        """What the planner plans over, as the site has it now: its engines, reached; a Ray cluster's nodes."""
        ...

    def prepare(self, request: LaunchRequest, say: Callable[[str], None]) -> None:
        """Before the first attempt: the stage image on every engine, the run's guards starting."""
        ...

    def guards(self) -> Mapping[str, RunGuard]:
        """The run's guards, by place (none on Ray): kept from the first attempt to the last."""
        ...

    def reserve(self, request: LaunchRequest, hooks: Hooks) -> AbstractContextManager[H]:
        """What one attempt holds while it places its stages, let go when the attempt is over."""
        ...

    def place_stages(self, request: LaunchRequest, plan: ChainPlan, held: H, say: Callable[[str], None]) -> Staged:
        """The attempt's backend, made once nothing of the plan can collide with what the place has."""
        ...

    def sweep_records(self) -> None:
        """At the end of a run that left nothing and lost no place (the pipeline's rule): this user's records on
        the site past the keep (PP_LAUNCH_RECORD_KEEP) whose runs are gone, removed as `gc` removes them; nothing
        asked while the user's state lists none that old, and a failure is no reason to fail the run."""
        ...

    def finish(self, final: Launched | None) -> None:
        """The run's end (after its last attempt, or an error): the place let go of, every connection closed."""
        ...


AnySite = Launching[Any, Any]  # a site of any kind, as the registry opens it (app/sites.py)
