"""Chains on a Ray cluster: the only module that imports `ray`.

Ray does the cluster's part: membership, GPU accounting across nodes (one placement group per run holds the
run's GPUs: Ray grants them to no other job while it lives), failure detection, and the end of every actor of a
driver that dies. pp-launch keeps what only it does, on each node's own Docker engine:

- a node agent (`NodeAgent`, an actor) per node per run, placed in its block's bundle with the block's GPUs,
  owns the run's stage containers on its node's engine (the node's `pp-launch.docker-host` label, else its
  DOCKER_HOST, else the default socket): each created with its share of the GPUs Ray granted the agent (UUIDs
  from the node's NVML or PP_LAUNCH_GPU_INVENTORY, shared out round the closest ring by our allocator), `--init`,
  auto-remove, our labels with the agent as the owner, its stdin lifeline held by the agent. The agent also
  holds the run's guard on that engine (adapters/guard.py), which records every id it creates: when the agent
  ends (the launcher died and Ray ended its actors, `ray.kill`, its worker killed, its raylet gone) the stages'
  stdin closes and the guard tears down what it recorded; the agent's watchdog on the node is the second layer;
- the launcher (the driver) drives the agents through the same StageBackend port as the Docker backends:
  `RayStageBackend` sends each stage's calls to its node's agent and pulls its output and exit back.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import queue
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from pp_launch.adapters.runtime import Nursery
from pp_launch.core import errors, labels
from pp_launch.core.chain.plan import StageSpec
from pp_launch.core.chain.ports import ChainEvent, PlaceLost, Sink, StageGone, StageOutput
from pp_launch.core.gpu.inventory import GpuInventory
from pp_launch.core.lines import count

try:
    import ray
    import ray.exceptions
    from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy
except ImportError:  # an optional extra: pip install 'pp-launch[ray]'
    ray = None

NAMESPACE = "pp-launch"  # every actor and placement group of ours lives here (detached runs are found by name)
NODE_LABEL = "pp-launch.node"  # a node's name in messages and labels (ray start --labels '{"pp-launch.node": "a"}')
ENGINE_LABEL = "pp-launch.docker-host"  # the node's Docker engine, when not its DOCKER_HOST
RAY_NODE = "pp-launch.ray-node"  # container labels: the Ray node and job of a stage
RAY_JOB = "pp-launch.ray-job"
NODE_ID = "ray.io/node-id"
CPU_SHARE = 0.01  # what a CPU stage's actor takes of its node's CPUs (a bundle needs something to hold)
POLL = 1.0  # how long one pull of a stage's events waits on its agent
HEAD_RESOURCE = "node:__internal_head__"  # what Ray gives the head's own node alone
SILENCE = 4.0  # a pull not answered within this is an agent lost (frozen, its node cut off): our own liveness check
TAIL = 2000  # lines of each stage an actor keeps for `logs --ray`
MISSING = "--ray needs Ray on this machine and on every node: pip install 'pp-launch[ray]'"


# ------------------------------------------------------------------------------------------------ the cluster
@dataclass(frozen=True)
class GpuXid:
    """An Xid a node agent's watch saw on one of the GPUs Ray granted it: handed to the backend's `on_xid`, never
    to the chain (app/gpu_faults.py decides what it means)."""

    uuid: str
    index: int
    code: int
    node: str


class GrantPassedOver(Exception):
    """Ray granted GPUs this attempt must not use (faulted in the run, or unhealthy), and too few others: `bad`,
    per block, UUID -> why. The agents and the group are released; the caller asks again for that many more."""

    def __init__(self, bad: list[dict[str, str]]) -> None:
        super().__init__("granted GPUs passed over")
        self.bad = bad


@dataclass(frozen=True)
class RayNode:
    node_id: str
    name: str  # its pp-launch.node label, else its address and the start of its id
    gpus: int  # in all
    free_gpus: int  # not granted to anyone now
    cpus: float
    engine: str  # its pp-launch.docker-host label ("" : its DOCKER_HOST)
    head: bool = False  # the head's own node: it goes with the head
    address: str = ""  # its IP address as Ray knows it (NodeManagerAddress)
    inventory: GpuInventory | None = None  # its GPUs as its NVML (or file) says, where asked (a dry run): health


GRANT_POLL = 0.5  # s: how often a wait for Ray's grant looks for a stop signal


def connect(address: str) -> Cluster:
    """The cluster at `address` (HOST:PORT of its GCS, ray://HOST:PORT, or auto: RAY_ADDRESS or this machine's);
    EngineUnavailable (exit 2) when it does not answer."""
    if ray is None:
        raise errors.ConfigError(MISSING)
    target = os.environ.get("RAY_ADDRESS", "") if address == "auto" else address
    if target and target != "auto" and (why := _unreachable(target)):
        raise errors.EngineUnavailable(
            f"the Ray cluster at {target} does not answer ({why}); start it ('ray start --head') or name its "
            "address (--ray HOST:PORT, or RAY_ADDRESS with --ray auto)"
        )
    saved = _stop_handlers()
    try:
        _init(address)
    except ray.exceptions.AuthenticationError:
        raise errors.ConfigError(
            f"the Ray cluster at {target or address}: token authentication is on (RAY_AUTH_MODE=token) but this "
            f"machine has no token; {TOKEN_FIX}"
        ) from None
    except (ConnectionError, RuntimeError, ValueError, TimeoutError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if target and target != "auto":  # its port answered (the probe above): the connection itself was refused
            raise errors.ConfigError(
                f"the Ray cluster at {target} answers on its port but refused this launcher ({first}): with token "
                f"authentication on, a missing or wrong token looks like this; {TOKEN_FIX}"
            ) from None
        raise errors.EngineUnavailable(
            f"the Ray cluster at {address} does not answer ({first}); start it ('ray start --head') or name its "
            "address (--ray HOST:PORT, or RAY_ADDRESS with --ray auto)"
        ) from None
    finally:
        _restore(saved)  # ray.init installs its own SIGTERM handler (sys.exit): the chain's teardown must run
    return Cluster(address)


TOKEN_FIX = (
    "give the cluster's token the way Ray's own tools take it: RAY_AUTH_MODE=token with RAY_AUTH_TOKEN, "
    "RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token ('ray get-auth-token' on the head prints it)"
)
CLIENT_TRIES = 4  # a Ray Client server under load may refuse an Init it would take a moment later


def _init(address: str) -> None:
    """ray.init; a Ray Client's Init refused by a server that answers (its per-client server not up in time, seen
    under load: "Initialization failure from server") is tried again, a bounded number of times."""

    for attempt in range(1, CLIENT_TRIES + 1):
        try:
            ray.init(
                address=address,
                namespace=NAMESPACE,
                logging_level="ERROR",
                log_to_driver=False,
                configure_logging=False,
            )
            return
        except ConnectionError:
            if not address.startswith("ray://") or attempt == CLIENT_TRIES:
                raise
            with contextlib.suppress(Exception):
                ray.shutdown()
            time.sleep(attempt)


def _stop_handlers() -> dict[int, Any]:
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return {}
    return {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}


def _restore(saved: Mapping[int, Any]) -> None:
    import signal

    for signum, handler in saved.items():
        if handler is not None:
            signal.signal(signum, handler)


def _unreachable(address: str, timeout: float = 5.0) -> str:
    """Why nothing answers at HOST:PORT (or ray://HOST:PORT), "" when something does: Ray's own client waits for
    an absent cluster without end."""
    import socket

    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit():
        return f"{address!r} is not HOST:PORT"
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            return ""
    except OSError as exc:
        return exc.strerror or str(exc)


class Cluster:
    def __init__(self, address: str) -> None:
        self.address = address
        self.head = _head(address)

    def watch_head(self, on_lost: Callable[[str], None]) -> HeadWatch:
        """Our own look at the head, started: `on_lost(why)` once when it stops answering."""
        return HeadWatch(self.head, on_lost)

    def close(self) -> None:
        ray.shutdown()

    def abandon(self, exit_code: int) -> None:
        """The head is lost: this driver asks it nothing more (Ray's own shutdown would wait for it, then end the
        process). The run's actors and placement group are the lost head's; nothing here holds them. Ray's core
        worker cannot be finalised without its GCS (it crashes at interpreter exit), so the process ends right
        after its own exit handlers, with `exit_code`, its output flushed."""
        import atexit

        atexit.unregister(ray.shutdown)  # ray.init registered it: at exit it would wait for the head too

        def end_here() -> None:
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):
                    stream.flush()
            os._exit(exit_code)

        atexit.register(end_here)  # the first to run at exit (last registered): nothing of Ray's is finalised

    def with_inventories(self, nodes: Sequence[RayNode], timeout: float = 30.0) -> list[RayNode]:
        """Each node with GPUs, with its inventory read on it (a task pinned there, no resources): the GPUs' health
        a dry run plans with, as each agent reads it at a launch. A node that does not answer in `timeout` is left
        without (its GPUs are then taken as healthy, as Ray counts them)."""
        tasks = {
            n.node_id: ray.remote(_node_inventory)
            .options(num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(n.node_id, soft=False))
            .remote()
            for n in nodes
            if n.gpus
        }
        ready, _ = ray.wait(list(tasks.values()), num_returns=len(tasks), timeout=timeout) if tasks else ([], [])
        found: dict[str, GpuInventory] = {}
        for node_id, ref in tasks.items():
            if ref in ready:
                with contextlib.suppress(Exception):
                    found[node_id] = GpuInventory.from_json(ray.get(ref), f"node {node_id[:8]}")
        return [replace(n, inventory=found.get(n.node_id)) for n in nodes]

    def nodes(self) -> list[RayNode]:
        """Every live node, by name."""
        free = _free_per_node()
        out = []
        for n in ray.nodes():
            if not n.get("Alive"):
                continue
            node_id, res, lab = n["NodeID"], n.get("Resources", {}), n.get("Labels") or {}
            name = lab.get(NODE_LABEL) or f"{n.get('NodeManagerAddress', '?')}/{node_id[:8]}"
            gpus = int(res.get("GPU", 0))
            left = int(free[node_id].get("GPU", 0)) if node_id in free else gpus  # none left: Ray omits the key
            cpus, engine, head = float(res.get("CPU", 0)), lab.get(ENGINE_LABEL, ""), HEAD_RESOURCE in res
            address = str(n.get("NodeManagerAddress", ""))
            out.append(RayNode(node_id, name, gpus, left, cpus, engine, head, address))
        return sorted(out, key=lambda n: n.name)

    def reserve(
        self,
        run_id: str,
        blocks: Sequence[tuple[RayNode, int]],
        per_stage: int,
        detached: bool,
        timeout: float,
        extra: Sequence[int] = (),
        stop: Callable[[], int | None] = lambda: None,
    ) -> PlacementGroup:
        """One placement group for the run: a bundle per block, pinned to its node, with `extra[b]` GPUs more than
        its stages need (to pass over GPUs it must not use). NotEnoughGpus (exit 2) when Ray cannot grant it within
        `timeout` seconds (others hold the GPUs, or a node left); Interrupted, the group removed, as soon as `stop`
        names a signal while it waits."""
        more = list(extra) or [0] * len(blocks)
        bundles = [
            {"GPU": float(per_stage * k + more[b])} if per_stage else {"CPU": CPU_SHARE * k}
            for b, (_, k) in enumerate(blocks)
        ]
        pg = placement_group(
            bundles,
            strategy="PACK",
            name=f"pp-launch-{run_id}",
            lifetime="detached" if detached else None,
            bundle_label_selector=[{NODE_ID: node.node_id} for node, _ in blocks],
        )
        deadline = time.monotonic() + max(timeout, 0.1)
        while not pg.wait(timeout_seconds=max(min(GRANT_POLL, deadline - time.monotonic()), 0.01)):
            if (signum := stop()) is not None:
                remove_placement_group(pg)
                raise errors.Interrupted(signum)
            if time.monotonic() >= deadline:
                break
        else:
            return pg
        remove_placement_group(pg)
        want = "; ".join(f"{node.name}: {count(per_stage * k, 'GPU')}" for node, k in blocks) if per_stage else ""
        have = "; ".join(f"{n.name}: {n.free_gpus} of {n.gpus} free" for n in self.nodes()) or "no live node"
        raise errors.NotEnoughGpus(
            f"the Ray cluster did not grant this run's GPUs within {timeout:g} s (--ray-timeout): it needs {want}; "
            f"the cluster has {have}. Wait for other jobs to end, add nodes, or use fewer GPUs per stage"
            if per_stage
            else f"the Ray cluster did not place this run's stages within {timeout:g} s (--ray-timeout); nodes: {have}"
        )

    def node_agents(
        self,
        pg: PlacementGroup,
        blocks: Sequence[tuple[RayNode, int]],
        per_stage: int,
        run_id: str,
        grace: float,
        image: str,
        detached: bool,
        extra: Sequence[int] = (),
        passed_over: Callable[[GpuInventory, Sequence[str]], dict[str, str]] = lambda inventory, granted: {},
    ) -> list[list[StageHandle]]:
        """One agent per block (per node), placed in its bundle with the block's GPUs (`extra[b]` more); each stage
        of the block gets its share of what Ray granted the agent that `passed_over` does not name (UUID -> why),
        the closest ring over the node's topology (our allocator). ConfigError names the node when its engine does
        not answer, lacks the image, or the guard cannot start; GrantPassedOver when too few granted GPUs are left."""
        from pp_launch.core.gpu.allocator import split_granted

        more = list(extra) or [0] * len(blocks)

        if detached:  # the run's record first: the agents report to it when their stages end by themselves
            ray.remote(RunRecord).options(name=record_name(run_id), lifetime="detached", num_cpus=0).remote(
                run_id, len(blocks)
            )
        remote = ray.remote(NodeAgent)
        agents = []
        for b, (node, k) in enumerate(blocks):
            options: dict[str, Any] = {
                "scheduling_strategy": PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=b),
                "num_cpus": 0 if per_stage else CPU_SHARE * k,
                "num_gpus": per_stage * k + more[b],
                "max_concurrency": 16 + 2 * k,  # each stage's pull waits in a call of its own
                "max_restarts": 0,
            }
            if detached:
                options.update(lifetime="detached", name=f"{run_id}-{b}")
            agents.append(remote.options(**options).remote(run_id, grace, node.engine, node.name))
        try:
            facts = ray.get([a.describe.remote(image) for a in agents])
            rows, bad, short = [], [], False
            for agent, (node, k), said in zip(agents, blocks, facts, strict=True):
                if said.get("problem"):
                    raise errors.ConfigError(f"Ray node {node.name}: {said['problem']}")
                inventory = GpuInventory.from_json(said.get("inventory") or {"gpus": []}, f"node {node.name}")
                granted = list(said.get("gpus", []))
                bad.append(passed_over(inventory, granted) if per_stage else {})
                usable = [g for g in granted if g not in bad[-1]]
                short = short or len(usable) < per_stage * k
                shares = split_granted(inventory, usable, k, per_stage)
                rows.append([StageHandle(agent, node, {**said, "gpus": list(g)}) for g in shares])
            if short:
                raise GrantPassedOver(bad)
        except BaseException:
            self.release(None, [StageHandle(a, node) for a, (node, _) in zip(agents, blocks, strict=True)], run_id)
            raise
        return rows

    def release(self, pg: PlacementGroup | None, handles: Sequence[StageHandle], run_id: str = "") -> None:
        for agent in _agents(handles):
            with contextlib.suppress(Exception):
                ray.kill(agent, no_restart=True)
        if run_id:
            with contextlib.suppress(Exception):  # a detached run's record, when it has one
                ray.kill(ray.get_actor(record_name(run_id), namespace=NAMESPACE), no_restart=True)
        if pg is not None:
            with contextlib.suppress(Exception):
                remove_placement_group(pg)


def _head(address: str) -> str:
    """HOST:PORT of what the driver depends on: a Ray Client's server, else the cluster's GCS."""
    if address.startswith("ray://"):
        return address.removeprefix("ray://")
    try:
        return str(ray.get_runtime_context().gcs_address)
    except Exception:
        return os.environ.get("RAY_ADDRESS", address) if address == "auto" else address


class HeadWatch:
    """The launcher's own liveness check on the cluster's head (its GCS, or a Ray Client's server): a TCP connect
    every EVERY seconds; MISSES in a row and the head is lost. Ray's driver notices a lost GCS only after its
    reconnect timeout (60 s by default), then ends the process at once, before any teardown of ours could run:
    this look comes first, so the chain is torn down while the node agents still answer. Owned by the caller,
    which closes it (its thread joined)."""

    EVERY = 1.0
    MISSES = 3

    def __init__(self, head: str, on_lost: Callable[[str], None]) -> None:
        self.head, self.on_lost = head, on_lost
        self._stop = threading.Event()
        self._threads = Nursery(f"the watch of the Ray head at {head}")
        self._threads.start(self._watch, name="ray-head-watch")

    def _watch(self) -> None:
        missed = 0
        while not self._stop.wait(self.EVERY):
            why = _unreachable(self.head, timeout=self.EVERY)
            missed = missed + 1 if why else 0
            if missed >= self.MISSES:
                silent = self.MISSES * self.EVERY
                self.on_lost(f"the Ray head at {self.head} stopped answering ({why}) for {silent:g} s")
                return

    def close(self) -> None:
        self._stop.set()
        self._threads.join(None)  # a look is bounded (EVERY seconds)


def _free_per_node() -> Mapping[str, Mapping[str, float]]:
    """What each node has not granted now (Ray's own accounting); {} when this Ray cannot say."""
    try:
        from ray._private.state import available_resources_per_node

        return available_resources_per_node()  # type: ignore[no-any-return]
    except Exception:
        return {}


@dataclass
class StageHandle:
    actor: Any
    node: RayNode
    facts: dict[str, Any] = field(default_factory=dict)

    @property
    def gpus(self) -> tuple[str, ...]:
        return tuple(self.facts.get("gpus", ()))

    @property
    def inventory(self) -> GpuInventory:
        return GpuInventory.from_json(self.facts.get("inventory") or {"gpus": []}, f"node {self.node.name}")


# ------------------------------------------------------------------------------------------------ on a node
class NodeAgent:
    """A run's stages on one node (one agent per node per run, in that node's bundle): their containers on the
    node's engine through one backend, each stage's output queue and last lines, and the run's guard on that
    engine (adapters/guard.py), whose lifeline is this actor: when it ends (the launcher died and Ray ended its
    actors, `ray.kill`, its worker killed, its raylet gone) the guard tears down every container it recorded."""

    def __init__(self, run_id: str, grace: float, engine: str, node: str) -> None:
        from pp_launch.adapters import identity
        from pp_launch.adapters.docker_engine import connect
        from pp_launch.adapters.guard import RunGuard

        self.run_id, self.node = run_id, node
        self.problem = ""
        self.queues: dict[int, queue.Queue[ChainEvent | None]] = {}  # a full queue holds that stage's reader back
        self.tails: dict[int, deque[tuple[int, StageOutput]]] = {}  # each stage's last lines, numbered: `logs --ray`
        self.seq = itertools.count(1)  # one numbering over the node's stages: `logs -f --ray` asks for what is new
        self.names: dict[int, str] = {}  # each stage's container name
        self.exits: dict[int, int | None] = {}  # each stage's exit code, once it is gone (`wait --ray`)
        self._done_lock = threading.Lock()
        self._winding = False  # a detached run's stages here all ended: handing over to the run's record
        self._threads = Nursery(f"run {run_id}'s agent on Ray node {node}")
        self.handed_over = threading.Event()  # a detached run is up: nobody reads the queues any more
        self._stopping = threading.Event()  # the run's teardown began: a full queue holds no stage back
        self.owner = identity.current_owner().label()
        self.guard: Any = None
        self.backend: Any = None
        self.gpu_watch: Any = None  # the granted GPUs watched for Xid errors (adapters/gpu_watch.py) while it lives
        self.xids: queue.Queue[GpuXid] = queue.Queue()  # what the watch saw, for the launcher's next pull
        try:
            self.engine = connect(timeout=30, host=engine or None)
            self.guard = RunGuard.start(self.engine, run_id, self.owner, grace, engine or None, orphan=True)
        except errors.PpLaunchError as exc:
            self.problem = str(exc)
            return
        self.backend = self.guard.stage_backend()

    def describe(self, image: str) -> dict[str, Any]:
        """What Ray granted this agent (the block's GPUs, as UUIDs from the node's NVML), or the node's problem."""
        from pp_launch.adapters import inventory_file

        if self.problem:
            return {"problem": f"its Docker engine: {self.problem}"}
        if self.engine.image_config(image) is None:
            return {
                "problem": f"image {image} is not on its Docker engine ({self.engine.address}); pp-launch "
                "never pulls: load it there ('docker load -i FILE')"
            }
        granted = [str(g) for g in ray.get_gpu_ids()]
        inventory = inventory_file.this_host() if granted else GpuInventory()  # the node's file, else its NVML
        uuids = []
        for g in granted:
            match = [x.uuid for x in inventory.gpus if str(x.index) == g or x.uuid == g]
            if not match:
                why = inventory.note or "no match"
                return {"problem": f"Ray granted GPU {g}, which its NVML does not list ({why})"}
            uuids.append(match[0])
        if uuids:  # watched from the grant on, as the launcher watches its own engine's GPUs
            from pp_launch.adapters.gpu_watch import GpuWatch

            self.gpu_watch = GpuWatch(uuids, self._on_xid).start()
        node_id = ray.get_runtime_context().get_node_id()
        from pp_launch.adapters.local import free_port

        return {
            "port": free_port(),  # a port free on this node now: a rendezvous's MASTER_PORT when its stage 0 is here
            "gpus": uuids,
            "watch": self.gpu_watch.note if self.gpu_watch is not None else "",  # why some GPUs are not watched
            "inventory": inventory.to_json(),
            "node_id": node_id,
            "engine": self.engine.address,
            "pid": os.getpid(),
        }

    def _on_xid(self, uuid: str, index: int, code: int) -> None:
        self.xids.put(GpuXid(uuid, index, code, self.node))

    def _labelled(self, spec: StageSpec) -> StageSpec:
        extra = {labels.OWNER: self.owner, RAY_NODE: self.node, RAY_JOB: ray.get_runtime_context().get_job_id()}
        kept = {k: v for k, v in spec.labels.items() if k != labels.LAUNCHER}
        return replace(spec, labels={**kept, **extra})

    def create(self, spec: StageSpec, env: Mapping[str, str], waiting: bool) -> str:
        self.queues.setdefault(spec.index, queue.Queue(maxsize=20000))
        self.tails.setdefault(spec.index, deque(maxlen=TAIL))
        self.names[spec.index] = spec.name
        made = self.backend.create_waiting if waiting else self.backend.create
        return str(made(self._labelled(spec), env))

    def _sink(self, stage: int) -> Sink:
        events, tail = self.queues[stage], self.tails[stage]

        def put(event: ChainEvent) -> None:
            """The launcher pulls the events (a full queue holds the stage's reader back, as a local chain does);
            once a detached run is handed over only the last lines are kept, and nothing holds the stage back."""
            if isinstance(event, StageOutput):
                tail.append((next(self.seq), event))
            elif isinstance(event, StageGone):
                self.exits[stage] = event.exit_code
                self._maybe_done()
                if not self._stopping.is_set() and (lost := self._engine_lost()):
                    event = PlaceLost(lost)  # the node's engine stopped its stages: the place is lost, not done
                    self.exits[stage] = None
            while not self.handed_over.is_set():
                try:
                    events.put(event, timeout=0.5)
                    return
                except queue.Full:
                    if self._stopping.is_set():
                        return  # stopping: nothing holds the stage back; its last lines are in the tail

        return put

    def _engine_lost(self) -> str:
        """Why this node's engine is gone ("" when it answers a connection made now): a stage that ends as its engine
        stops (`systemctl stop docker` stops every container first) has not ended its work."""
        why = self.engine.answers_anew(timeout=5.0)
        return f"its Docker engine ({self.engine.address}) stopped: {why}" if why else ""

    def start(self, ref: str, stage: int) -> None:
        self.backend.start(ref, stage, self._sink(stage))

    def watch(self, ref: str, stage: int) -> None:
        self.backend.watch(ref, stage, self._sink(stage))

    def hand_over(self) -> None:
        self.handed_over.set()
        for events in self.queues.values():
            with contextlib.suppress(queue.Empty):
                while True:
                    events.get_nowait()
            with contextlib.suppress(queue.Full):
                events.put_nowait(None)  # a waiting pull answers now: the pumps end at once
        self._maybe_done()

    def _maybe_done(self) -> None:
        """A detached run's stages on this node have all ended: wind up, once, on a thread of its own."""
        with self._done_lock:
            if self._winding or not self.handed_over.is_set() or len(self.exits) < len(self.names):
                return
            self._winding = True
        self._threads.start(self._wind_up, name="agent-wind-up")

    def _wind_up(self) -> None:
        """The node's part of a detached run that ended by itself: the guard goes (nothing is left), the exit codes
        and last lines go to the run's record, and the last agent to finish gives the run's GPUs back (removing
        the placement group ends every agent of the run, this one included)."""
        if self.guard is not None:
            self.guard.close(wait=10.0)
        exits = {k: (self.names.get(k, "?"), code) for k, code in self.exits.items()}
        with contextlib.suppress(Exception):  # `down --ray` may be ending the run (and its record) meanwhile
            record = ray.get_actor(record_name(self.run_id), namespace=NAMESPACE)
            if ray.get(record.done.remote(self.node, exits, self.logs(0)), timeout=60):
                release_group(self.run_id)

    def logs(self, lines: int, after: Mapping[str, int] | None = None) -> list[tuple[str, int, int, str, str]]:
        """`logs --ray`: each stage's last `lines` lines (0: all kept), numbered on this node, after the number
        `after[node]` (`-f` asks for what came since): (node, number, stage, stream, text), in stage order."""
        since = (after or {}).get(self.node, 0)
        out: list[tuple[str, int, int, str, str]] = []
        for stage, tail in sorted(self.tails.items()):
            kept = [(n, e) for n, e in list(tail) if n > since]
            kept = kept[-lines:] if lines else kept
            out += [(self.node, n, stage, e.stream, e.data.decode("utf-8", "replace").rstrip("\n")) for n, e in kept]
        return out

    def poll(self, stage: int, timeout: float) -> list[ChainEvent | GpuXid]:
        """The stage's next events: waits up to `timeout` for the first, then takes what is there. An Xid the GPU
        watch saw comes with the first pull of any of the node's stages (the launcher's pumps: within a pull)."""
        out: list[ChainEvent | GpuXid | None] = []
        with contextlib.suppress(queue.Empty):
            while True:
                out.append(self.xids.get_nowait())
        try:
            events = self.queues[stage]
            if not out:
                out.append(events.get(timeout=timeout))
            while len(out) < 2000:
                out.append(events.get_nowait())
        except (queue.Empty, KeyError):
            pass
        return [e for e in out if e is not None]  # None: handed over (see hand_over)

    def deliver(self, ref: str, data: bytes) -> None:
        self.backend.deliver(ref, data)

    def signal(self, ref: str, signum: int) -> None:
        self.backend.signal(ref, signum)

    def kill(self, ref: str) -> None:
        self.backend.kill(ref)

    def remove(self, ref: str) -> None:
        self.backend.remove(ref)

    def tearing_down(self) -> None:
        self._stopping.set()
        if self.backend is not None:
            self.backend.tearing_down()

    def leftovers(self, run_id: str) -> list[str]:
        return list(self.backend.leftovers(run_id))

    def status(self) -> dict[str, Any]:
        """For `ps --ray`: this node's containers of the run, asked by the ids its guard recorded."""
        owned = set(self.guard.owned) if self.guard is not None else set()
        found = [c for c in self.engine.containers(labels.run_selector(self.run_id)) if c.id in owned]
        return {
            "node": self.node,
            "containers": [(c.id, c.name, c.state, dict(c.labels)) for c in found],
            "exits": {k: (self.names.get(k, "?"), code) for k, code in self.exits.items()},
        }

    def sweep(self, grace: float) -> list[str]:
        """`down --ray`: the run's containers on this node (the ids its guard recorded) stopped (TERM, grace,
        KILL) and confirmed gone."""
        from pp_launch.adapters import watchdog

        owned = list(self.guard.owned) if self.guard is not None else []
        return watchdog.sweep(self.run_id, grace, host=self.engine.host, ids=owned)

    def close(self) -> None:
        """A clean end: every thread joined; the guard let go (it finds nothing left and goes), waited for."""
        if self.gpu_watch is not None:
            self.gpu_watch.stop()
        if self.backend is not None:
            self.backend.close(5.0)
        if self.guard is not None:
            self.guard.close(wait=10.0)
        self._threads.join(5.0)


def record_name(run_id: str) -> str:
    return f"{run_id}-record"


class RunRecord:
    """A detached run's record on the cluster (a detached actor holding no resources, outside the run's placement
    group): what its agents saw once their stages ended (exit codes, last lines). The last agent to report gives
    the run's GPUs back; the record stays, answering `wait`, `logs` and `ps`, until `gc --ray` or `down`."""

    def __init__(self, run_id: str, agents: int) -> None:
        self.run_id, self.agents = run_id, agents
        self.reported: set[str] = set()
        self.exits: dict[int, tuple[str, int | None]] = {}
        self.lines: list[tuple[str, int, int, str, str]] = []  # (node, number there, stage, stream, text)

    def done(
        self, node: str, exits: Mapping[int, tuple[str, int | None]], lines: list[tuple[str, int, int, str, str]]
    ) -> bool:
        """A node's agent reports its stages ended; True for the last of them (it releases the run's GPUs)."""
        self.reported.add(node)
        self.exits.update(exits)
        self.lines += lines
        return len(self.reported) >= self.agents

    def status(self) -> dict[str, Any]:
        return {"node": "", "containers": [], "exits": dict(self.exits)}

    def logs(self, lines: int, after: Mapping[str, int] | None = None) -> list[tuple[str, int, int, str, str]]:
        """As an agent's, for every node that reported (the same numbers: nothing is shown twice)."""
        out: list[tuple[str, int, int, str, str]] = []
        for node, stage in sorted({(row[0], row[2]) for row in self.lines}):
            kept = [r for r in self.lines if r[0] == node and r[2] == stage and r[1] > (after or {}).get(node, 0)]
            out += kept[-lines:] if lines else kept
        return out

    def sweep(self, grace: float) -> list[str]:
        return []  # nothing of the run is left on any node


# ------------------------------------------------------------------------------------------------ the launcher's side
class RayStageBackend:
    """The StageBackend port over node agents: each stage's calls go to its node's agent."""

    def __init__(self, handles: Sequence[StageHandle], detached: bool = False) -> None:
        self.handles = list(handles)  # in stage order
        self.detached = detached
        self.lost: dict[str, str] = {}  # node name -> why: what was there may be left
        self.head_gone = ""  # why the head is lost: the cluster itself is asked nothing more, only live agents
        self._stage_of: dict[str, int] = {}
        self._gone: set[str] = set()
        self._sinks: dict[str, Sink] = {}  # where each started stage's output and end go
        self._handed: set[str] = set()
        self._stopping = threading.Event()
        self._pumps: dict[str, Nursery] = {}  # each node's stages' pumps
        self._lock = threading.Lock()
        # what the agents' GPU watches saw, handed on as it comes: (UUID, index, code, where)
        self.on_xid: Callable[[str, int, int, str], None] | None = None

    def lose_head(self, why: str) -> None:
        """The head is lost: nothing more is asked of the cluster itself (its state is the head's), nor of the agents
        on the head's own node (they went with it: Ray would wait for them); the agents on the other nodes still
        answer, directly. Their stages' ends follow with `end_head_stages`."""
        with self._lock:
            self.head_gone = why
            for h in self.handles:
                if h.node.head:
                    self.lost.setdefault(h.node.name, "the head's own node")

    def end_head_stages(self) -> None:
        """The stages on the lost head's own node are gone with it, each said once."""
        for ref, stage in list(self._stage_of.items()):
            sink = self._sinks.get(ref)
            if sink is not None and self.handles[stage].node.head:
                self._ended(ref, sink, StageGone(stage, None, "its agent went with the lost head's own node"))

    # ----------------------------------------------------------------------------------------- calls
    def _ask(self, stage: int, what: str, method: str, *args: Any, timeout: float | None = 60.0) -> Any:
        h = self.handles[stage]
        if h.node.name in self.lost:
            raise errors.HostLost(f"Ray node {h.node.name} is lost ({self.lost[h.node.name]}); not asked to {what}")
        try:
            return ray.get(getattr(h.actor, method).remote(*args), timeout=timeout)
        except ray.exceptions.RayTaskError as exc:
            cause = getattr(exc, "cause", None)
            if isinstance(cause, errors.PpLaunchError):
                raise cause from None
            raise errors.EngineError(f"stage {stage} on Ray node {h.node.name}: {what} failed: {cause}") from None
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as exc:
            why = _why(exc)
            if isinstance(exc, ray.exceptions.GetTimeoutError) or self.head_gone or not _node_alive(h.node.node_id):
                self._lose(h.node.name, why)  # the node, not only this actor: its other stages are not asked again
            raise errors.HostLost(f"the agent of Ray node {h.node.name} (stage {stage}) is gone ({why})") from None

    def _quietly(self, stage: int, what: str, method: str, *args: Any) -> None:
        """A call whose target may be gone already: a dead actor's container ends through its lifeline."""
        with contextlib.suppress(errors.HostLost):
            self._ask(stage, what, method, *args)

    def create(self, spec: StageSpec, env: Mapping[str, str]) -> str:
        return self._made(spec, self._ask(spec.index, "create", "create", spec, dict(env), False))

    def create_waiting(self, spec: StageSpec, env: Mapping[str, str]) -> str:
        return self._made(spec, self._ask(spec.index, "create", "create", spec, dict(env), True))

    def _made(self, spec: StageSpec, ref: str) -> str:
        self._stage_of[ref] = spec.index
        return ref

    def start(self, ref: str, stage: int, sink: Sink) -> None:
        self._ask(stage, "start", "start", ref, stage)
        self._pull(ref, stage, sink)

    def watch(self, ref: str, stage: int, sink: Sink) -> None:
        self._ask(stage, "watch", "watch", ref, stage)
        self._pull(ref, stage, sink)

    def _pull(self, ref: str, stage: int, sink: Sink) -> None:
        self._sinks[ref] = sink
        node = self.handles[stage].node.name
        pumps = self._pumps.setdefault(node, Nursery(f"the stages on Ray node {node}"))
        pumps.start(self._pump, ref, stage, sink, name=f"ray-stage-{stage}")

    def _pump(self, ref: str, stage: int, sink: Sink) -> None:
        h = self.handles[stage]
        while ref not in self._handed and ref not in self._gone:
            try:
                batch = ray.get(h.actor.poll.remote(stage, POLL), timeout=SILENCE)
            except ray.exceptions.GetTimeoutError:  # frozen, or its node cut off: Ray alone would wait without end
                why = f"its agent did not answer for {SILENCE:g} s"
                self._lose(h.node.name, why)
                if not self.head_gone:  # without the head Ray cannot end an actor (and would wait for it)
                    with contextlib.suppress(Exception):
                        ray.kill(h.actor, no_restart=True)  # its end closes its stages' lifelines and its guard's
                said = f"the agent of Ray node {h.node.name} did not answer for {SILENCE:g} s"
                self._ended(ref, sink, StageGone(stage, None, f"{said} (frozen, or its node cut off); it was ended"))
                return
            except Exception as exc:  # the actor died (killed, its worker or node gone): its container ends with it
                why = _why(exc)
                gone = StageGone(stage, None, f"its node's agent on Ray node {h.node.name} ended ({why})")
                if not self._stopping.is_set() and (self.head_gone or not _node_alive(h.node.node_id)):
                    self._lose(h.node.name, why)
                self._ended(ref, sink, gone)
                return
            for event in batch:
                if isinstance(event, GpuXid):
                    if self.on_xid is not None:
                        self.on_xid(event.uuid, event.index, event.code, f"Ray node {event.node}")
                    continue
                if isinstance(event, StageGone):
                    self._ended(ref, sink, event)
                    return
                if isinstance(event, PlaceLost):  # the node's engine stopped under the stage: the node is lost
                    self._lose(h.node.name, event.message)
                    self._ended(ref, sink, StageGone(stage, None, f"ended as {event.message}"))
                    return
                sink(event)

    def _ended(self, ref: str, sink: Sink, gone: StageGone) -> None:
        """A stage's end, told once (its agent's word, its agent lost, or its node gone with the head)."""
        with self._lock:
            if ref in self._gone:
                return
            self._gone.add(ref)
        sink(gone)

    def deliver(self, ref: str, data: bytes) -> None:
        self._ask(self._stage_of[ref], "hand off", "deliver", ref, data)

    def signal(self, ref: str, signum: int) -> None:
        self._quietly(self._stage_of[ref], "signal", "signal", ref, signum)

    def kill(self, ref: str) -> None:
        self._quietly(self._stage_of[ref], "kill", "kill", ref)

    def remove(self, ref: str) -> None:
        if ref in self._stage_of:
            self._quietly(self._stage_of[ref], "remove", "remove", ref)

    def tearing_down(self) -> None:
        self._stopping.set()
        for h in _agent_handles(self.handles):
            if h.node.name not in self.lost:
                h.actor.tearing_down.remote()  # no answer awaited: a dead agent has nothing to tear down

    def hand_over(self, ref: str) -> None:
        """A detached run on Ray keeps its lifeline: the detached actor holds it, and `down --ray` ends it. The
        actor stops queueing the stage's output for us (it keeps the last lines for `logs --ray`)."""
        self._handed.add(ref)
        self._quietly(self._stage_of[ref], "hand over", "hand_over")

    def leftovers(self, run_id: str) -> list[str]:
        """Asked of each node's agent; a node whose agent is gone is swept by a task of ours placed
        there (the watchdog's own teardown), and a node that is lost keeps what was created there unconfirmed."""
        found: list[str] = []
        for stages in _by_node(self.handles).values():
            refs = self._leftovers_on(self.handles[stages[0]].node, stages, run_id)
            if refs is None:  # the node is lost: what was created there and not seen gone may be left
                refs = [ref for ref, k in self._stage_of.items() if k in stages and ref not in self._gone]
            found += refs
        return found

    def _leftovers_on(self, node: RayNode, stages: list[int], run_id: str) -> list[str] | None:
        for k in stages:
            try:
                return list(self._ask(k, "list", "leftovers", run_id, timeout=30.0))
            except (errors.HostLost, errors.EngineError):
                continue
        if self.head_gone:  # no task can be placed without the head: what was created there may be left
            self.lost.setdefault(node.name, f"its agent does not answer and the head is lost ({self.head_gone})")
            return None
        if not _node_alive(node.node_id):
            self._lose(node.name, "the node left the cluster")
            return None
        try:
            task = ray.remote(_sweep_node).options(
                num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(node.node_id, soft=False)
            )
            return list(ray.get(task.remote(run_id, node.engine), timeout=60.0))
        except Exception as exc:
            self._lose(node.name, _why(exc))
            return None

    def _lose(self, node: str, why: str) -> None:
        """The node is lost (the first reason stands): its other stages are asked nothing more, and the chain is told
        once, as PlaceLost through a sink of that node's stages (a lost head's own loss is said as the head's)."""
        with self._lock:
            if node in self.lost:
                return
            self.lost[node] = why
            sinks = [
                self._sinks[r]
                for r, k in self._stage_of.items()
                if r in self._sinks and self.handles[k].node.name == node
            ]
        if sinks and not self.head_gone:
            sinks[0](PlaceLost(lost_node(node, why)))

    def where(self, ref: str) -> str:
        k = self._stage_of.get(ref)
        return "?" if k is None else self.handles[k].node.name

    def close(self, timeout: float = 5.0) -> None:
        self._stopping.set()
        deadline = time.monotonic() + timeout
        for node, pumps in self._pumps.items():
            # a lost node's pumps may wait on its agent (SILENCE at most, or Ray's own wait): not waited for
            pumps.join(0.0 if node in self.lost else max(0.0, deadline - time.monotonic()))
        if self.detached:
            return
        calls = [h.actor.close.remote() for h in _agent_handles(self.handles) if h.node.name not in self.lost]
        with contextlib.suppress(Exception):
            ray.wait(calls, num_returns=len(calls), timeout=max(0.1, deadline - time.monotonic()))

    def settle(self, timeout: float) -> list[str]:
        """Each pump given up to `timeout` seconds in all to end (a lost node's may wait SILENCE on its agent); the
        names of those still inside a call to Ray. Ray's shutdown under such a thread ends the process (its core
        worker "has already been shutdown": exit 1, nothing said), so the cluster is closed only once this is empty
        (else the process ends as after a lost head, with its own code)."""
        deadline = time.monotonic() + timeout
        return [name for pumps in self._pumps.values() for name in pumps.join(max(0.0, deadline - time.monotonic()))]


def lost_node(node: str, why: str) -> str:
    """How a lost node is first said, by the chain's end (PlaceLost) or after it (app/on_ray.py): one wording."""
    return f"Ray node {node} was lost ({why})"


def _node_inventory() -> dict[str, Any]:
    """The GPUs of the node this task runs on, as its agent would read them (its file, else its NVML)."""
    from pp_launch.adapters import inventory_file

    return inventory_file.this_host().to_json()


def _sweep_node(run_id: str, engine: str) -> list[str]:
    """On a node whose agent is gone: the ids the run's guard there recorded (read back from the engine) are
    stopped and removed, once the guard has had its own go at them; what is left of them. Nothing else there is
    the run's (no guard: nothing can be shown to be ours)."""
    from pp_launch.adapters import guard, watchdog
    from pp_launch.adapters.docker_engine import connect

    eng = connect(timeout=10, host=engine or None)
    try:
        found = guard.records(eng, run_id)
        owned = sorted({ref for record in found for ref in record.owned})
        deadline = time.monotonic() + 2 * watchdog.MAX_GRACE + 5
        while any(eng.inspect(r.id) is not None for r in found) and time.monotonic() < deadline:
            time.sleep(0.1)  # the guard is tearing the run down: its lifeline (the agent) ended
        with contextlib.suppress(Exception):
            watchdog.sweep(run_id, watchdog.MAX_GRACE, host=engine or None, ids=owned)
        return [ref for ref in owned if eng.inspect(ref) is not None]
    finally:
        eng.close()


def _agent_handles(handles: Sequence[StageHandle]) -> list[StageHandle]:
    """One handle per node agent (its stages share it), in stage order."""
    seen: dict[int, StageHandle] = {}
    for h in handles:
        seen.setdefault(id(h.actor), h)
    return list(seen.values())


def _agents(handles: Sequence[StageHandle]) -> list[Any]:
    return [h.actor for h in _agent_handles(handles)]


def _by_node(handles: Sequence[StageHandle]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for k, h in enumerate(handles):
        out.setdefault(h.node.node_id, []).append(k)
    return out


def _node_alive(node_id: str) -> bool:
    try:
        return any(n["NodeID"] == node_id and n.get("Alive") for n in ray.nodes())
    except Exception:
        return False


def _why(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    for line in text:
        if "died" in line or "killed" in line or "exited" in line or "lost" in line.lower():
            return line.strip()[:200]
    return text[0][:200] if text else type(exc).__name__


# ------------------------------------------------------------------------------------------------ detached runs
def detached_runs() -> dict[str, list[Any]]:
    """Every detached run of ours on the cluster: its node agents by name (RUN-BLOCK)."""
    out: dict[str, list[Any]] = {}
    for entry in ray.util.list_named_actors(all_namespaces=False):
        name = entry if isinstance(entry, str) else entry.get("name", "")
        run, sep, _ = name.partition("-")
        if sep:
            with contextlib.suppress(ValueError):
                out.setdefault(run, []).append(ray.get_actor(name, namespace=NAMESPACE))
    return out


def run_status(actors: Sequence[Any]) -> list[dict[str, Any]]:
    """One answer per node of the run (the first live actor there)."""
    seen: set[str] = set()
    out = []
    for answer in _each(actors, "status"):
        if isinstance(answer, dict) and answer.get("node") not in seen:
            seen.add(answer["node"])
            out.append(answer)
    return out


def run_logs(actors: Sequence[Any], lines: int, after: dict[str, int] | None = None) -> list[tuple[int, str, str]]:
    """Every stage's last lines, in stage order (each stage's own lines in their order), from the run's agents
    and its record. after: for each node, the number of the last line already shown there; updated with what
    is returned (a line the agent and the record both answer is shown once)."""
    seen = dict(after or {})
    refs = [a.logs.remote(lines, seen) for a in actors]
    rows: dict[tuple[str, int], tuple[int, str, str]] = {}
    for ref in refs:
        with contextlib.suppress(Exception):  # an agent gone: its lines are the record's
            for node, n, stage, stream, text in ray.get(ref, timeout=60):
                rows[(str(node), int(n))] = (int(stage), str(stream), str(text))
    if after is not None:
        for node, n in rows:
            after[node] = max(after.get(node, 0), n)
    ordered = sorted(rows.items(), key=lambda item: (item[1][0], item[0][0], item[0][1]))
    return [row for _, row in ordered]


def all_ended(actors: Sequence[Any]) -> bool:
    """Every stage of the run has ended: its nodes answer, none with a container left."""
    answers = run_status(actors)
    return bool(answers) and not any(a["containers"] for a in answers)


def sweep_records(runs: Sequence[str]) -> list[str]:
    """Of these detached runs: each whose every stage ended released as `gc --ray` releases it (its record, any
    actor and group left), and each the cluster no longer has (`down` or `gc` ended it); the runs so done."""
    found, done = detached_runs(), []
    for run in runs:
        actors = found.get(run)
        if actors is not None:
            if not all_ended(actors):
                continue  # still running, or not answering now: another time
            end_run(run, actors, 0.0)
        done.append(run)
    return done


def end_run(run_id: str, actors: Sequence[Any], grace: float) -> list[str]:
    """`down --ray RUN`: on every node the run's containers stopped and confirmed gone, then its actors and its
    placement group released. Returns the names removed."""
    removed: set[str] = set()  # the actors of one node each sweep it: a container counted once
    for answer in _each(actors, "sweep", grace):
        if isinstance(answer, list):
            removed.update(answer)
    for a in actors:
        with contextlib.suppress(Exception):
            ray.kill(a, no_restart=True)
    release_group(run_id)
    return sorted(removed)


def stray_groups(live_runs: Sequence[str]) -> list[str]:
    """Placement groups of ours whose run has no actor left (they hold GPUs for nothing)."""
    from ray.util import placement_group_table

    out = []
    for entry in placement_group_table().values():
        name = str(entry.get("name", ""))
        run = name.removeprefix("pp-launch-")
        if name.startswith("pp-launch-") and entry.get("state") != "REMOVED" and run not in live_runs:
            out.append(run)
    return sorted(out)


def release_group(run_id: str) -> None:
    from ray.util import get_placement_group

    with contextlib.suppress(Exception):
        remove_placement_group(get_placement_group(f"pp-launch-{run_id}"))


def _each(actors: Sequence[Any], method: str, *args: Any) -> list[Any]:
    refs = [getattr(a, method).remote(*args) for a in actors]
    out: list[Any] = []
    for ref in refs:
        try:
            out.append(ray.get(ref, timeout=60))
        except Exception as exc:
            out.append(exc)
    return out
