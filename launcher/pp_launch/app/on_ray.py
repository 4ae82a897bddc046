"""The chain use case on a Ray cluster (`pp-launch chain --ray ADDRESS`): the same request, plan, scope and
teardown as on Docker engines; Ray places the stages, grants their GPUs and watches the nodes.

1. the cluster's live nodes, and the stages in blocks of consecutive stages per node (`--placement`,
   `--stages-per-host` as across Docker hosts: the ring crosses each node boundary once);
2. one placement group for the run, a bundle per block pinned to its node, granted within `--ray-timeout` or
   refused (exit 2, saying what the cluster has and what is missing) before any container exists;
3. an agent per node in its block's bundle; it reports the GPUs Ray granted it (UUIDs, from its node's NVML)
   and our allocator shares them out to the block's stages (the closest ring);
4. the chain scope over `RayStageBackend`, driven by the same pipeline as on Docker engines (app/launch.py).

Steps 1 and 3's planning is app/planning.py's (`Granted`, a planner as the Docker site's are); what is Ray's alone
is here: the grant (`_Placed`), the stages' backend and our watch on the head, and the detached runs' housekeeping.

`RaySite` is the cluster as a site (app/site.py): that launch, and the housekeeping of the detached runs on it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pp_launch.adapters import host_state, ray_cluster
from pp_launch.app import chain as steps
from pp_launch.app import housekeeping
from pp_launch.app.gpu_faults import GpuFaults
from pp_launch.app.planning import Granted, Planner
from pp_launch.app.request import Hooks, Launched, LaunchRequest
from pp_launch.app.rows import StageRow
from pp_launch.app.site import Confirm, LogView, Voice, Where
from pp_launch.core import errors, labels
from pp_launch.core.chain.plan import ChainPlan
from pp_launch.core.chain.restarts import may_restart
from pp_launch.core.chain.scope import ChainOutcome, ChainScope
from pp_launch.core.gpu.allocator import passed_over
from pp_launch.core.lines import count

if TYPE_CHECKING:
    from pp_launch.adapters.guard import RunGuard


SETTLE = 1.0  # seconds the run's pumps may take to end at its end (a handed-over run's are woken: at once)


class RaySite:
    """A Ray cluster as a site (app/site.py). A launch: one connection for the run; per attempt the placement group
    (the attempt's hold on its GPUs, granted or refused before any container exists) and its node agents, the
    scope over them with our own watch on the head, the run's places lost named. Housekeeping: the detached runs on
    the cluster, as their node agents answer for them (a foreground chain on Ray is its launcher's alone: it is not
    listed)."""

    planner: Planner[ray_cluster.RayNode, _Placed] = Granted()  # over its nodes: the grant, the closest ring

    def __init__(self, where: Where, voice: Voice) -> None:
        assert where.ray is not None
        self.address, self.voice = where.ray, voice
        where.quiet_ray()
        self.cluster: ray_cluster.Cluster | None = None  # a launch's connection
        self.attempts: list[_Stages] = []  # each attempt's stages: their pumps are settled before Ray closes
        self.dry = False  # opened for a dry run: the nodes come with their GPUs' health (each agent reads it at launch)

    @classmethod
    def for_runs(cls, where: Where, run: str | None, voice: Voice) -> RaySite:
        """The cluster `where` names, for the detached runs on it (any run: a cluster keeps no per-run hosts)."""
        return cls(where, voice)

    @classmethod
    def to_launch(cls, request: LaunchRequest, dry_run: bool = False, strict: bool = False) -> RaySite:
        """The cluster the request names, connected (a dry run too: it asks the cluster what is free)."""
        assert request.ray is not None
        place = cls(Where(ray=request.ray), Voice(lambda text: None, lambda text: None))
        place.cluster = ray_cluster.connect(request.ray)
        place.dry = dry_run
        return place

    def close(self) -> bool:
        return True

    # ------------------------------------------------------------------------------------------------ a launch
    def prepare(self, request: LaunchRequest, say: Callable[[str], None]) -> None:
        """Nothing before the first attempt: each node's agent checks the image on its node."""

    def guards(self) -> Mapping[str, RunGuard]:
        return {}  # the node agents are the run's guards, one attempt's each

    @contextlib.contextmanager
    def reserve(self, request: LaunchRequest, hooks: Hooks) -> Iterator[_Placed]:
        """The attempt's placement group and node agents (made by `plan`), released when the attempt is over unless
        the run was handed over (detached) or the head was lost (nothing to ask: they went with it)."""
        placed = _Placed(self._cluster(), hooks.say, hooks.stop_pending)
        try:
            yield placed
        finally:
            if not placed.keep and not self._head_lost():
                placed.release()

    def places(self) -> list[ray_cluster.RayNode]:
        nodes = self._cluster().nodes()
        return self._cluster().with_inventories(nodes) if self.dry else nodes

    def place_stages(
        self, request: LaunchRequest, plan: ChainPlan, held: _Placed, say: Callable[[str], None]
    ) -> _Stages:
        staged = _Stages(self._cluster(), request, plan, held, say)
        self.attempts.append(staged)
        return staged

    def finish(self, final: Launched | None) -> None:
        if self.cluster is None:
            return
        head_lost = self._head_lost()
        straggling = [] if head_lost else [n for a in self.attempts for n in a.backend.settle(SETTLE)]
        if head_lost or straggling:
            # nothing to ask a lost head (Ray would wait): the run's actors and group went with it; and a pump still
            # inside a call to Ray would end this process at Ray's shutdown (exit 1, nothing said)
            told = final.outcome if final is not None else None
            self.cluster.abandon(told.exit_code if told is not None else errors.EXIT_FAILURE)
        else:
            self.cluster.close()

    def sweep_records(self) -> None:
        """The detached runs this user launched on this cluster whose keep is over, released once every stage of
        theirs ended (as `gc --ray` does): daily use piles up no record actor."""
        if self.cluster is None or self._head_lost():
            return
        listed = host_state.RunRecords(folder=host_state.RunRecords.RAY)
        with contextlib.suppress(Exception):  # a sweep that fails is no reason to fail a run that ended
            old = listed.every(older_than=host_state.record_keep(), note=self._cluster().head)
            for run in ray_cluster.sweep_records(old) if old else []:
                listed.forget(run)

    def _head_lost(self) -> str:
        """Why the head was lost under an attempt's stages; "" while it answers."""
        return next((a.head[0] for a in self.attempts if a.head), "")

    def _cluster(self) -> ray_cluster.Cluster:
        assert self.cluster is not None  # opened by to_launch
        return self.cluster

    # -------------------------------------------------------------------------------------------- housekeeping
    @contextlib.contextmanager
    def _detached(self, run: str | None) -> Iterator[tuple[str, dict[str, Any]]]:
        """Connected for one question: (the run named, resolved from its prefix, or ""; every detached run's node
        agents, by run)."""
        cluster = ray_cluster.connect(self.address)
        try:
            found = ray_cluster.detached_runs()
            yield (housekeeping.resolve_run(run, set(found)) if run is not None else ""), found
        finally:
            cluster.close()

    def stages(self, run: str | None, details: bool, ended_too: bool) -> list[StageRow]:
        """`ps --ray`: a row per stage container of the detached runs (or of `run`), its node as the host; the agent
        that owns it answers for its node."""
        rows: list[StageRow] = []
        with self._detached(run) as (named, found):
            for run_id in [named] if named else sorted(found):
                for answer in ray_cluster.run_status(found[run_id]):
                    rows += [_row(run_id, answer["node"], *c) for c in answer["containers"]]
        return rows

    def down(self, run: str | None, grace: float, confirm: Confirm | None) -> bool:
        """The run's containers stopped and confirmed gone on every node, then its actors and placement group
        released."""
        if run is None:
            raise errors.UsageError("name the runs to stop on a Ray cluster ('pp-launch ps --ray ADDRESS -q')")
        with self._detached(run) as (run_id, found):
            removed = ray_cluster.end_run(run_id, found[run_id], grace)
        self.voice.note(
            f"pp-launch: run {run_id} on the Ray cluster: {count(len(removed), 'container')} removed, its "
            "actors and GPUs released"
        )
        return True

    def gc(self, dry_run: bool) -> bool:
        """The detached runs that ended by themselves (no container left on any node) have their actors and GPUs
        released, and placement groups of ours with no actor left are removed."""
        said = []
        with self._detached(None) as (_, found):
            for run_id, actors in sorted(found.items()):
                if ray_cluster.all_ended(actors):
                    said.append(f"run {run_id}: every stage has ended; its actors and GPUs released")
                    if not dry_run:
                        ray_cluster.end_run(run_id, actors, 0.0)
            for run_id in ray_cluster.stray_groups(list(found)):
                said.append(f"run {run_id}: no node agent left; its placement group (GPUs) released")
                if not dry_run:
                    ray_cluster.release_group(run_id)
        for line in said:
            self.voice.answer(f"{'would release' if dry_run else 'released'} {line}")
        if not said:
            self.voice.note("nothing to collect")
        return True

    def logs(self, run: str, view: LogView, every: float = 0.5) -> None:
        """Each stage's last lines as its node's agent kept them (up to 2000 a stage); with follow, then each new
        line (every `every` s) until every stage is gone: the agents number their lines, so none is shown twice
        (timestamps and since are the engines' alone)."""

        def show(lines: list[tuple[int, str, str]]) -> None:
            for stage, stream, text in lines:
                if not view.stages or stage in view.stages:
                    (self.voice.note if stream == "stderr" else self.voice.answer)(f"[stage {stage}] {text}")

        with self._detached(run) as (run_id, found):
            agents, shown = found[run_id], dict[str, int]()  # each agent's lines shown so far
            show(ray_cluster.run_logs(agents, view.tail or 0, shown))
            while view.follow:
                left = sum(len(a["containers"]) for a in ray_cluster.run_status(agents))
                show(ray_cluster.run_logs(agents, 0, shown))
                if left == 0:
                    return
                time.sleep(every)

    def wait(self, run: str, until: str, timeout: float | None, every: float = 1.0) -> int:
        """A detached run on Ray is up once every stage announced, so "announced" holds at once; "exit" waits until
        no container of the run is left on any node, and says each stage's exit code as its node's agent saw it."""
        with self._detached(run) as (name, found):
            if until == "announced":
                self.voice.answer(f"run {name}: up (a detached run on Ray is handed over once every stage announced)")
                return 0
            deadline = None if timeout is None else time.monotonic() + timeout
            while True:
                answers = ray_cluster.run_status(found[name])
                left = sum(len(a["containers"]) for a in answers)
                if left == 0 or (deadline is not None and time.monotonic() >= deadline):
                    break
                time.sleep(every)
        if left:
            self.voice.note(f"pp-launch: error: run {name}: {count(left, 'container')} still there after {timeout:g} s")
            return errors.EXIT_FAILURE
        exits = sorted((int(k), str(v[0]), v[1]) for a in answers for k, v in a.get("exits", {}).items())
        for stage, container, code in exits:
            self.voice.answer(f"stage {stage} {container} exited {'with an unknown code' if code is None else code}")
        self.voice.answer(f"run {name}: every stage is gone ('pp-launch gc --ray' releases its GPUs)")
        return errors.EXIT_FAILURE if any(code != 0 for _, _, code in exits) else 0


def _row(run_id: str, node: str, ref: str, name: str, state: str, tags: dict[str, str]) -> StageRow:
    """A `ps` row for one stage container on a node."""
    return StageRow(
        run=run_id,
        stage=labels.ascii_int(tags.get(labels.STAGE, "")),
        attempt=labels.ascii_int(tags.get(labels.ATTEMPT, "")),
        container=name,
        id=ref[:12],
        image="-",
        gpus=tuple(g for g in tags.get(labels.GPUS, "").split(",") if g),
        owner=tags.get(labels.OWNER, ""),
        owner_status="detached",
        state=state,
        host=node,
        labels=dict(tags),
    )


class _Stages:
    """An attempt's stages on the cluster: the scope over the node agents, with our own watch on the head. When the
    head is lost the chain is stopped (and torn down through the agents, which answer without it) before Ray ends
    this process."""

    def __init__(
        self,
        cluster: ray_cluster.Cluster,
        request: LaunchRequest,
        plan: ChainPlan,
        placed: _Placed,
        say: Callable[[str], None],
    ) -> None:
        self.cluster, self.plan, self.placed = cluster, plan, placed
        self.backend = ray_cluster.RayStageBackend(placed.handles, detached=request.detach)
        self.head: list[str] = []  # why the head was lost, once it was
        self.watching: ray_cluster.HeadWatch | None = None
        self.faults = GpuFaults(plan, say)  # each node agent watches the GPUs Ray granted it

    def watch(self, scope: ChainScope) -> None:
        self.faults.watching(scope)
        self.backend.on_xid = self.faults.on_xid

        def lost(why: str) -> None:
            self.head.append(why)
            self.backend.lose_head(why)  # before the teardown could ask what went with the head
            scope.lose_place(why)  # a failure (exit 1, chain_stopped says so), as any place lost on any site
            self.backend.end_head_stages()  # after it: the chain ends as the head's loss, not as a stage's

        self.watching = self.cluster.watch_head(lost)

    def end(self, outcome: ChainOutcome | None) -> tuple[ChainOutcome, bool, tuple[tuple[str, str], ...]] | None:
        if self.watching is not None:
            self.watching.close()
        head = self.head[0] if self.head else ""
        self.placed.keep = outcome is not None and outcome.reason == "detached"
        if self.placed.keep:
            self.backend.close()  # this process lets the stages go: their pumps end (handed over) and are joined
        if outcome is None:
            return None
        lost = self.backend.lost
        restartable = may_restart(outcome.reason, bool(outcome.orphans), bool(lost) or bool(head))
        outcome = _with_lost_head(_with_lost_nodes(outcome, self.plan.run_id, lost), head)
        return outcome, restartable, self.faults.seen()


class _Placed:
    """An attempt's placement group and node agents (its hold on the cluster's GPUs), held until released: what a
    `Held` is on Ray. Nothing else can take what Ray granted, so there is nothing to check."""

    def __init__(
        self, cluster: ray_cluster.Cluster, say: Callable[[str], None], stop: Callable[[], int | None] = lambda: None
    ) -> None:
        self.cluster, self.say, self.stop = cluster, say, stop
        self.pg: Any = None  # Ray's PlacementGroup
        self.asked = False  # a placement group was asked for (made, and removed again if the grant never came)
        self.handles: list[ray_cluster.StageHandle] = []
        self.run_id = ""
        self.keep = False  # a detached run's: its node agents hold it now

    def check(self) -> None:
        """Ray's grant cannot be taken away by another client."""

    def check_and_release(self) -> None:
        """Nothing to let go of early: the group is the run's until it ends."""

    def made(self) -> list[str]:
        """The attempt's placement group and node agents, in words, once made."""
        agents = sorted({h.node.name for h in self.handles})
        made = ["its placement group on the Ray cluster"] if self.asked else []
        return made + ([f"its node agents on {', '.join(agents)}"] if agents else [])

    def grant(
        self, request: LaunchRequest, blocks: list[tuple[ray_cluster.RayNode, int]], per_stage: int
    ) -> list[list[ray_cluster.StageHandle]]:
        """Each block's node agents, with the GPUs Ray granted them (app/planning.py shares them out)."""
        self.run_id = run_id = request.run_id or ""
        asked = [count(k * per_stage, "GPU") if per_stage else count(k, "CPU stage") for _, k in blocks]
        self.say(
            f"run {run_id}: asking the Ray cluster at {request.ray} for "
            + "; ".join(f"{node.name}: {a}" for (node, _), a in zip(blocks, asked, strict=True))
        )
        rows = self._granted(request, blocks, per_stage)
        for row in rows:
            if row and (note := str(row[0].facts.get("watch", ""))):
                self.say(f"warning: on Ray node {row[0].node.name}, {note}")
        return rows

    def serve(self, handles: list[ray_cluster.StageHandle]) -> None:
        """Each stage's agent, in the plan's order."""
        self.handles = handles

    def _granted(
        self, request: LaunchRequest, blocks: list[tuple[ray_cluster.RayNode, int]], per_stage: int
    ) -> list[list[ray_cluster.StageHandle]]:
        """The attempt's group and agents, each stage's GPUs shared out of what Ray granted. Ray chooses which GPUs
        it grants: those this attempt must not use (faulted in the run, or unhealthy: the allocator's rule) are passed
        over, and when too few are left the group is asked again with as many more on that node, until the node has
        no more to give (NotEnoughGpus, naming each GPU passed over and why)."""
        run_id, avoid, allowed = request.run_id or "", request.avoid_gpus, request.gpu.allow_unhealthy
        extra = [0] * len(blocks)
        while True:
            self.asked = True
            self.pg = self.cluster.reserve(
                run_id, blocks, per_stage, request.detach, request.ray_timeout, extra, stop=self.stop
            )
            try:
                handles = self.cluster.node_agents(
                    self.pg, blocks, per_stage, run_id, request.chain.grace, request.chain.image, request.detach,
                    extra, lambda inventory, granted: passed_over(inventory, granted, avoid, allowed),
                )  # fmt: skip
                if request.detach:  # its record stays on the cluster: a later run's end releases it (sweep_records)
                    with contextlib.suppress(errors.PpLaunchError):
                        host_state.RunRecords(folder=host_state.RunRecords.RAY).add(run_id, self.cluster.head)
                return handles
            except ray_cluster.GrantPassedOver as exc:
                self.cluster.release(self.pg, [])  # its agents are gone (node_agents ended them): the group too
                self.pg = None
                extra = _more(blocks, per_stage, extra, exc.bad)
                self.say(f"run {run_id}: asking again, passing over {_passed(blocks, exc.bad)}")

    def release(self) -> None:
        """The group and its agents, removed."""
        self.cluster.release(self.pg, self.handles, self.run_id)


def _passed(blocks: Sequence[tuple[ray_cluster.RayNode, int]], bad: Sequence[Mapping[str, str]]) -> str:
    """`GPU-… on node b (unhealthy: …)`, each GPU passed over."""
    pairs = zip(blocks, bad, strict=True)
    return "; ".join(f"{u} on node {node.name} ({why})" for (node, _), no in pairs for u, why in no.items())


def _more(
    blocks: Sequence[tuple[ray_cluster.RayNode, int]],
    per_stage: int,
    extra: Sequence[int],
    bad: Sequence[Mapping[str, str]],
) -> list[int]:
    """The extra GPUs to ask of each node next: as many more as were passed over there; NotEnoughGpus when a node
    has no more to give."""
    more = [e + len(no) for e, no in zip(extra, bad, strict=True)]
    short = [(node, k, m) for (node, k), m in zip(blocks, more, strict=True) if per_stage * k + m > node.gpus]
    if more == list(extra):  # nothing passed over, yet too few granted: not to be asked again
        short = [(node, k, m) for (node, k), m in zip(blocks, more, strict=True)][:1]
    if short:
        node, k, m = short[0]
        raise errors.NotEnoughGpus(
            f"not enough GPUs on Ray node {node.name}: {count(k, 'stage')} x {per_stage} need "
            f"{per_stage * k}, and of its {node.gpus} the run must pass over {m}: {_passed(blocks, bad)}. "
            + ("Use unhealthy GPUs anyway (--allow-unhealthy; docs/recovery.md), " if "unhealthy:" in str(bad) else "")
            + "ask for fewer (--stages, --gpus-per-stage), or add nodes"
        )
    return more


def _with_lost_nodes(outcome: ChainOutcome, run: str, lost: Mapping[str, str]) -> ChainOutcome:
    """A node lost on the way is named, with what to run there when it is back."""
    said = [ray_cluster.lost_node(node, why) for node, why in lost.items()]
    said = [line for line in said if line not in outcome.message]  # the chain's end said it already (PlaceLost)
    after = (
        f"its stages' lifelines ended with their actors; if that node comes back with containers of run {run}, "
        "'pp-launch gc' there removes them"
    )
    if said:
        said[-1] += f": {after}"
    elif lost:
        outcome = dataclasses.replace(outcome, message=f"{outcome.message}; {after}")
    return steps.with_places_lost(outcome, said)


def _with_lost_head(outcome: ChainOutcome, why: str) -> ChainOutcome:
    """A chain stopped because the head was lost is a failure, and says what was done and what may remain."""
    if not why or outcome.reason != "place_lost":
        return outcome
    rest = outcome.message.removeprefix(why).lstrip("; ")  # what the teardown had to say beyond the head's loss
    left = f" ({rest})" if rest else ""
    message = (
        f"{why}: the chain was stopped and torn down through its node agents{left}; if the head comes back, "
        "'pp-launch gc --ray' releases what Ray still holds for the run"
    )
    return dataclasses.replace(outcome, exit_code=errors.EXIT_FAILURE, message=message)
