#!/usr/bin/env python3
"""The built-in stage of pp-launch (docs/tests.md).

Modes (STUB_MODE):
  demo    a tiny deterministic model split across the stages generates MAX_TOKENS tokens around the ring
          0 -> 1 -> ... -> N-1 -> 0 over loopback TCP; stage 0 checks the tokens against a single-process
          run of the same model and prints `PP_DEMO_RESULT tokens=[...] match=true|false`.
          With STUB_WEIGHTS=PATH each stage reads the model from that file (a read-only mount), not its seed;
          the check still runs the seeded model, so match=true proves every stage read the right weights.
  write-weights  write the demo model's weights to STUB_WEIGHTS (its folder mounted writable), then exit 0.
  hold    announce, connect to the peers, run until signalled.
  worker  speak the worker-control wire (docs/worker-wire.md) on stdin/stdout.
  pp-worker  behave as swactor's pp-worker does at its boundary: STAGE/NUM_STAGES/SEED_ADDR checked with its
          messages and exit codes, announce first (after STUB_ANNOUNCE_DELAY, the cluster node's start), then
          "load" for STUB_LOAD_SECONDS, peers read once from PEER_*/FIRST_PEER_* only, then hold.

PP_HANDOFF=stdin (`pp-launch chain --handoff stdin`): stage k >= 1 announces first and reads its peers later
from stdin as `PP_PEER <node_id> <direct>` and `PP_FIRST_PEER <node_id> <direct>` lines.

Every mode first prints `PP_STAGE_GPUS <uuid,...|->`: the GPUs NVML lists inside the container (ctypes over
libnvidia-ml.so.1; stderr in worker mode, whose stdout is the wire).

Knobs: STUB_IGNORE_SIGTERM, STUB_ANNOUNCE_DELAY, STUB_NO_ANNOUNCE, STUB_ANNOUNCE_LINE, STUB_EXIT_AFTER,
STUB_EXIT_CODE, STUB_EXIT_ATTEMPTS, STUB_LOG_RATE (docs/tests.md); for tests of the no-orphan layers and of bad output also
STUB_IGNORE_LIFELINE=1 (behave like an image that never reads stdin) and STUB_FLOOD=endless|random with
STUB_FLOOD_MB (one endless line, or random bytes, after announcing), or STUB_FLOOD=lines (STUB_FLOOD_LINES lines
of STUB_FLOOD_WIDTH characters, then PP_FLOOD_DONE; STUB_FLOOD_EXIT=1 exits 0 after it). Across hosts: STUB_BIND (listen address,
default 127.0.0.1; 0.0.0.0 for every interface) and STUB_ADVERTISE (the address announced: an address, or `auto`
for this host's own; default the bound one, loopback for 0.0.0.0). With PP_LIFELINE=stdin the stage exits as soon as its stdin closes: the
engine closes it when the launcher that attached it dies, whatever signals the stage ignores.

Standard library plus numpy only: it runs on the Debian base image, which has nothing else.
"""

from __future__ import annotations

import hashlib
import os
import signal
import socket
import struct
import sys
import threading
import time
from typing import Any

ENV = os.environ


def _int_env(name: str, default: int) -> int:
    try:
        return int(ENV.get(name, default))
    except ValueError:
        return default


STAGE = _int_env("STAGE", 0)
NUM_STAGES = _int_env("NUM_STAGES", 1)
_stop = threading.Event()
_lines = threading.Lock()


def print(*args: object, sep: str = " ", end: str = "\n", file: Any = None, flush: bool = False) -> None:
    """The builtin's meaning, but one line is one write under a lock: a log line from the stdin thread (peers
    from stdin) can never be glued to the announcement the main thread prints at the same moment."""
    out = sys.stdout if file is None else file
    with _lines:
        out.write(sep.join(str(a) for a in args) + end)
        if flush:
            out.flush()


def emit(data: bytes) -> None:
    """To stdout, every byte, in one piece among the threads' writes. Under `python3 -u` stdout is a raw file: a
    signal that lands amid a write to a full pipe cuts it short, and print() neither finishes it nor writes the
    newline with the line (a flood's block could land between them)."""
    with _lines:  # print's lock: its lines and these never interleave
        sys.stdout.flush()
        view = memoryview(data)
        while view:
            view = view[os.write(1, view) :]


def log(msg: str) -> None:
    emit(f"stub[{STAGE}/{NUM_STAGES}] {msg}\n".encode())


def fail(msg: str, code: int = 1) -> None:
    print(f"stub[{STAGE}/{NUM_STAGES}] error: {msg}", file=sys.stderr, flush=True)
    os._exit(code)


# ---------------------------------------------------------------------------------------------- model
VOCAB, DIM, LAYERS, SEED = 64, 32, 16, 20240611


WEIGHTS = ENV.get("STUB_WEIGHTS", "")  # the demo model's weights as a file (.npz), mounted into every stage


def seeded_weights():  # type: ignore[no-untyped-def]
    """The demo model, made from its seed: what the single-process check runs, whatever the stages load."""
    import numpy as np

    rng = np.random.default_rng(SEED)
    emb = rng.standard_normal((VOCAB, DIM))
    pos = rng.standard_normal((1024, DIM))
    layers = [(rng.standard_normal((DIM, DIM)) / np.sqrt(DIM), rng.standard_normal(DIM) * 0.1) for _ in range(LAYERS)]
    head = rng.standard_normal((VOCAB, DIM))
    return emb, pos, layers, head


def model_weights():  # type: ignore[no-untyped-def]
    """What a stage computes with: read from STUB_WEIGHTS when it is set (a real model's weights are a mounted
    file, never in the image), else made from the seed. A file that is missing or wrong fails the stage."""
    if not WEIGHTS:
        return seeded_weights()
    import numpy as np

    try:
        with np.load(WEIGHTS) as f:
            layers = [(f[f"w{i}"], f[f"b{i}"]) for i in range(LAYERS)]
            loaded = f["emb"], f["pos"], layers, f["head"]
    except (OSError, KeyError, ValueError) as exc:
        fail(f"cannot read the weights STUB_WEIGHTS={WEIGHTS}: {exc} (is the folder mounted? -v DIR:/weights:ro)")
    log(f"weights read from {WEIGHTS} ({os.path.getsize(WEIGHTS)} bytes)")
    return loaded


def run_write_weights() -> int:
    """STUB_MODE=write-weights: the demo model's weights written to STUB_WEIGHTS (its folder mounted writable),
    once, so that every stage of a demo can read them from a read-only mount."""
    import numpy as np

    if not WEIGHTS:
        fail("STUB_MODE=write-weights needs STUB_WEIGHTS=PATH (a .npz in a mounted folder)", 2)
    emb, pos, layers, head = seeded_weights()
    arrays = {"emb": emb, "pos": pos, "head": head}
    arrays.update({f"w{i}": w for i, (w, _) in enumerate(layers)})
    arrays.update({f"b{i}": b for i, (_, b) in enumerate(layers)})
    part = f"{WEIGHTS}.part{os.getpid()}.npz"
    try:
        np.savez(part, **arrays)
        os.replace(part, WEIGHTS)
    except OSError as exc:
        fail(f"cannot write the weights to {WEIGHTS}: {exc}")
    log(f"weights written to {WEIGHTS} ({os.path.getsize(WEIGHTS)} bytes)")
    return 0


def my_layers(stage: int, num_stages: int) -> list[int]:
    """Layers split as evenly as possible, earlier stages taking the remainder."""
    base, extra = divmod(LAYERS, num_stages)
    start = stage * base + min(stage, extra)
    return list(range(start, start + base + (1 if stage < extra else 0)))


def apply_layers(h, layers, indices):  # type: ignore[no-untyped-def]
    import numpy as np

    for i in indices:
        w, b = layers[i]
        h = np.tanh(w @ h + b) + h
    return h


def reference_tokens(max_tokens: int) -> list[int]:
    """The same model in one process: what the ring must produce."""
    import numpy as np

    emb, pos, layers, head = seeded_weights()
    tok, out = 1, []
    for t in range(max_tokens):
        h = apply_layers(emb[tok] + pos[t % len(pos)], layers, range(LAYERS))
        tok = int(np.argmax(head @ h))
        out.append(tok)
    return out


# ------------------------------------------------------------------------------------------ framing
HIDDEN, TOKEN, STOP = b"H", b"T", b"S"


def send(sock: socket.socket, kind: bytes, payload: bytes = b"") -> None:
    sock.sendall(struct.pack("!cI", kind, len(payload)) + payload)


def recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("peer closed the connection")
        buf += chunk
    return bytes(buf)


def recv(sock: socket.socket) -> tuple[bytes, bytes]:
    kind, size = struct.unpack("!cI", recv_exact(sock, 5))
    return kind, recv_exact(sock, size)


def first_addr(direct: str) -> tuple[str, int]:
    host, _, port = direct.split(",")[0].rpartition(":")
    return host.strip("[]"), int(port)


def dial(direct: str, hello: bytes) -> socket.socket:
    addr = first_addr(direct)
    deadline = time.monotonic() + 30
    while True:
        try:
            sock = socket.create_connection(addr, timeout=30)
            sock.settimeout(None)
            sock.sendall(hello)
            return sock
        except OSError as exc:
            if time.monotonic() > deadline:
                fail(f"cannot reach peer at {direct}: {exc}")
            time.sleep(0.05)


class Listener:
    """Accepts the successor (hello NEXT) and, on stage 0, the last stage's feedback edge (hello FEED)."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((ENV.get("STUB_BIND") or "127.0.0.1", int(ENV.get("STUB_PORT", "0"))))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.peers: dict[bytes, socket.socket] = {}
        self._ready = threading.Condition()
        threading.Thread(target=self._accept_loop, daemon=True).start()

    def _accept_loop(self) -> None:
        while True:
            conn, _ = self.sock.accept()
            hello = recv_exact(conn, 4)
            with self._ready:
                self.peers[hello] = conn
                self._ready.notify_all()

    def wait_for(self, hello: bytes) -> socket.socket:
        with self._ready:
            while hello not in self.peers:
                self._ready.wait(0.2)
            return self.peers[hello]


# ------------------------------------------------------------------------------------------- stages
def advertised() -> str:
    """The address peers on other hosts dial: STUB_ADVERTISE (an address, or `auto`: this host's name as it
    resolves), else the bound address, else loopback."""
    value = ENV.get("STUB_ADVERTISE", "")
    if value == "auto":
        return socket.gethostbyname(socket.gethostname())
    bound = ENV.get("STUB_BIND") or "127.0.0.1"
    return value or ("127.0.0.1" if bound in ("0.0.0.0", "") else bound)


def announce(listener: Listener, role: str = "") -> None:
    delay = float(ENV.get("STUB_ANNOUNCE_DELAY", "0") or 0)
    if delay:
        time.sleep(delay)
    if ENV.get("STUB_NO_ANNOUNCE") == "1":
        log("STUB_NO_ANNOUNCE=1: not announcing")
        return
    line = ENV.get("STUB_ANNOUNCE_LINE")
    if line is None:
        seed = f"{socket.gethostname()}-{STAGE}-{os.getpid()}-{time.time_ns()}-{os.urandom(8).hex()}"
        node_id = hashlib.sha256(seed.encode()).hexdigest()
        line = f"PP_GPU_NODE_ADDR {node_id} {advertised()}:{listener.port}"
        if role:
            print(f"pp-worker: stage {STAGE}/{NUM_STAGES} ({role}) started (node_id: {node_id})", file=sys.stderr)
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def connect_ring(listener: Listener) -> tuple[socket.socket | None, socket.socket | None]:
    """(from predecessor, feedback to stage 0): stage k dials k-1; the last stage also dials stage 0."""
    if ENV.get("PP_HANDOFF") == "stdin" and STAGE > 0:
        _peers.wait()  # announced already; the launcher sends the peers once it knows them
    peer, first = ENV.get("PEER_DIRECT"), ENV.get("FIRST_PEER_DIRECT")
    if STAGE > 0 and (peer is None or first is None):
        if ENV.get("STUB_MODE", "demo") in ("hold", "pp-worker"):
            log("no PEER_DIRECT/FIRST_PEER_DIRECT: holding without peers")
            return None, None
        fail(f"stage {STAGE} needs PEER_DIRECT and FIRST_PEER_DIRECT (set by pp-launch chain)", 2)
    upstream = dial(peer, b"NEXT") if STAGE > 0 and peer else None
    feedback_out = None
    if NUM_STAGES > 1 and STAGE == NUM_STAGES - 1 and first:
        feedback_out = dial(first, b"FEED")
    return upstream, feedback_out


def run_demo(listener: Listener) -> int:
    import numpy as np

    max_tokens = int(ENV.get("MAX_TOKENS", "16") or 16)
    emb, pos, layers, head = model_weights()
    mine = my_layers(STAGE, NUM_STAGES)
    upstream, feedback_out = connect_ring(listener)
    downstream = listener.wait_for(b"NEXT") if STAGE < NUM_STAGES - 1 else None
    feedback_in = listener.wait_for(b"FEED") if STAGE == 0 and NUM_STAGES > 1 else None
    log(f"ring connected; layers {mine[0] if mine else '-'}..{mine[-1] if mine else '-'} of {LAYERS}")

    if STAGE == 0:
        tok, tokens = 1, []
        for t in range(max_tokens):
            h = apply_layers(emb[tok] + pos[t % len(pos)], layers, mine)
            if downstream is None:  # a single stage holds the whole model
                tok = int(np.argmax(head @ h))
            else:
                send(downstream, HIDDEN, h.astype("<f8").tobytes())
                assert feedback_in is not None
                kind, payload = recv(feedback_in)
                if kind != TOKEN:
                    fail(f"expected a token from stage {NUM_STAGES - 1}, got {kind!r}")
                tok = struct.unpack("!q", payload)[0]
            tokens.append(tok)
        if downstream is not None:
            send(downstream, STOP)
            assert feedback_in is not None
            recv(feedback_in)  # the STOP coming back round the ring: every stage has finished
        match = tokens == reference_tokens(max_tokens)
        print(f"PP_DEMO_RESULT tokens={tokens} match={'true' if match else 'false'}", flush=True)
        return 0 if match else 1

    assert upstream is not None
    steps = 0
    while True:
        kind, payload = recv(upstream)
        if kind == STOP:
            if downstream is not None:
                send(downstream, STOP)
            elif feedback_out is not None:
                send(feedback_out, STOP)
            log(f"done after {steps} steps")
            return 0
        h = apply_layers(np.frombuffer(payload, dtype="<f8").copy(), layers, mine)
        steps += 1
        if downstream is not None:
            send(downstream, HIDDEN, h.astype("<f8").tobytes())
        else:
            assert feedback_out is not None
            send(feedback_out, TOKEN, struct.pack("!q", int(np.argmax(head @ h))))


def run_hold(listener: Listener) -> int:
    connect_ring(listener)
    log("holding; stop me with a signal")
    while not _stop.wait(0.5):
        pass
    log("stopping on request")
    if _flooding is not None and ENV.get("STUB_FLOOD") == "lines":  # it ends at its next block; how much it wrote
        _flooding.join()
        emit(f"PP_FLOOD_STOPPED lines={_flood_lines}\n".encode())
    return 0


# -------------------------------------------------------------------------------------------- knobs
def start_knobs() -> None:
    if ENV.get("STUB_IGNORE_SIGTERM") == "1":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, lambda *_: on_stop_signal())
    signal.signal(signal.SIGINT, lambda *_: on_stop_signal())

    exit_after = ENV.get("STUB_EXIT_AFTER")
    attempts = ENV.get("STUB_EXIT_ATTEMPTS")  # only the first N attempts of a run exit so (PP_ATTEMPT, --max-restarts)
    if attempts and int(ENV.get("PP_ATTEMPT", "1") or 1) > int(attempts):
        exit_after = None
    if exit_after:
        code = int(ENV.get("STUB_EXIT_CODE", "0") or 0)

        def exit_later() -> None:
            time.sleep(float(exit_after))
            log(f"STUB_EXIT_AFTER={exit_after}: exiting with {code}")
            sys.stdout.flush()
            os._exit(code)

        threading.Thread(target=exit_later, daemon=True).start()

    rate = float(ENV.get("STUB_LOG_RATE", "0") or 0)
    if rate > 0:

        def chatter() -> None:
            i, start = 0, time.monotonic()
            while True:
                i += 1
                sys.stdout.write(f"stub[{STAGE}/{NUM_STAGES}] log line {i}\n")
                if i % 50 == 0:
                    sys.stdout.flush()
                delay = start + i / rate - time.monotonic()
                if delay > 0:
                    sys.stdout.flush()
                    time.sleep(delay)

        threading.Thread(target=chatter, daemon=True).start()

    late = ENV.get("PP_HANDOFF") == "stdin"
    if (ENV.get("PP_LIFELINE") == "stdin" and ENV.get("STUB_IGNORE_LIFELINE") != "1") or late:

        def lifeline() -> None:
            """stdin: PP_PEER/PP_FIRST_PEER lines (PP_HANDOFF=stdin), PP_DETACHED, then its end (the launcher
            is gone)."""
            pending = b""
            while chunk := os.read(0, 4096):
                pending += chunk
                while b"\n" in pending:
                    line, _, pending = pending.partition(b"\n")
                    took = take_peer_line(line.decode("utf-8", "replace"))
                    if line == b"PP_DETACHED":  # a detached run is up: the launcher's exit no longer stops us
                        print(f"stub[{STAGE}/{NUM_STAGES}] detached: stdin is no longer a lifeline", file=sys.stderr)
                        if not (late and not _peers.is_set()):
                            return
                    elif not took and late:
                        log(f"ignoring stdin line {line[:80]!r}")
                pending = pending[-4096:]
            if ENV.get("PP_LIFELINE") == "stdin" and ENV.get("STUB_IGNORE_LIFELINE") != "1":
                print(f"stub[{STAGE}/{NUM_STAGES}] lifeline closed: launcher gone, exiting", file=sys.stderr,
                      flush=True)  # fmt: skip
                os._exit(137)

        threading.Thread(target=lifeline, daemon=True).start()


_peers = threading.Event()


def take_peer_line(line: str) -> bool:
    """`PP_PEER <node_id> <direct>` / `PP_FIRST_PEER <node_id> <direct>` (--handoff stdin): the peers, late."""
    parts = line.strip().split(" ")
    if len(parts) != 3 or parts[0] not in ("PP_PEER", "PP_FIRST_PEER"):
        return False
    prefix = "PEER" if parts[0] == "PP_PEER" else "FIRST_PEER"
    ENV[f"{prefix}_NODE_ID"], ENV[f"{prefix}_DIRECT"] = parts[1], parts[2]
    if "PEER_DIRECT" in ENV and "FIRST_PEER_DIRECT" in ENV:
        log(f"peers from stdin: {ENV['PEER_DIRECT']} and {ENV['FIRST_PEER_DIRECT']}")
        _peers.set()
    return True


_flooding: threading.Thread | None = None  # STUB_FLOOD's thread
_flood_lines = 0  # the lines STUB_FLOOD=lines has written


def run_flood(kind: str, megabytes: int) -> None:
    """STUB_FLOOD=endless: one line of STUB_FLOOD_MB MB with no newline; random: that many random bytes; lines:
    STUB_FLOOD_LINES lines (default a million) of STUB_FLOOD_WIDTH characters (default 0: empty lines), then
    `PP_FLOOD_DONE lines=N` as the last line, and with STUB_FLOOD_EXIT=1 exit 0 right after it. A hold's stop
    request ends a flood of lines after its block (1000 lines): the hold then says `PP_FLOOD_STOPPED lines=N`."""
    global _flood_lines
    if kind == "lines":
        count, width = int(ENV.get("STUB_FLOOD_LINES", "1000000")), int(ENV.get("STUB_FLOOD_WIDTH", "0"))
        block = (b"y" * width + b"\n") * 1000
        for _ in range(count // 1000):
            if _stop.is_set():
                return
            emit(block)
            _flood_lines += 1000
        emit((b"y" * width + b"\n") * (count % 1000))
        _flood_lines = count
        emit(f"PP_FLOOD_DONE lines={count}\n".encode())
        if ENV.get("STUB_FLOOD_EXIT") == "1":
            os._exit(0)
        return
    chunk = 1 << 20
    rng = __import__("random").Random(STAGE)
    for _ in range(megabytes):
        emit(b"x" * chunk if kind == "endless" else rng.randbytes(chunk))
    print(f"stub[{STAGE}/{NUM_STAGES}] flood of {megabytes} MB done", file=sys.stderr, flush=True)


def on_stop_signal() -> None:
    if _stop.is_set():
        return
    _stop.set()
    if ENV.get("STUB_MODE", "demo") != "hold":
        log("stop signal: exiting")
        sys.stdout.flush()
        os._exit(0)


def pp_worker_env() -> tuple[int, int, str]:
    """swactor's pp-worker start: its messages, its exit codes (2 usage; 101 a Rust panic), its order."""

    def require(name: str) -> str:
        if name not in ENV:
            print(f"pp-worker: env {name} is required", file=sys.stderr, flush=True)
            os._exit(2)
        return ENV[name].strip()

    def require_u32(name: str) -> int:
        raw = require(name)
        if not (raw.isascii() and raw.isdigit() and int(raw) < 2**32):
            quoted = '"' + raw.replace("\\", "\\\\").replace('"', '\\"') + '"'
            print(f"pp-worker: env {name}={quoted} must be a u32", file=sys.stderr, flush=True)
            os._exit(2)
        return int(raw)

    stage, num_stages = require_u32("STAGE"), require_u32("NUM_STAGES")
    if num_stages < 2 or stage >= num_stages:
        print(
            f"pp-worker: invalid STAGE={stage} for NUM_STAGES={num_stages} "
            "(need NUM_STAGES >= 2 and STAGE < NUM_STAGES; N=1 is not supported)",
            file=sys.stderr,
            flush=True,
        )
        os._exit(2)
    delay_stage, delay_secs = ENV.get("PP_BOOT_DELAY_STAGE", "").strip(), ENV.get("PP_BOOT_DELAY_SECS", "").strip()
    if delay_stage.isdigit() and delay_secs.isdigit() and int(delay_stage) == stage and int(delay_secs) > 0:
        print(f"pp-worker: simulated boot delay of {delay_secs}s on stage {stage}", file=sys.stderr, flush=True)
        time.sleep(int(delay_secs))
    return stage, num_stages, require("SEED_ADDR")


def run_pp_worker() -> int:
    stage, num_stages, seed = pp_worker_env()
    start_knobs()
    listener = Listener()
    role = "First" if stage == 0 else ("Last" if stage == num_stages - 1 else "Middle")
    announce(listener, role=role)
    if len(seed) != 64 or not all(ch in "0123456789abcdefABCDEF" for ch in seed):
        print("thread 'main' panicked: SEED_ADDR must be 64 hex characters (32 bytes)", file=sys.stderr, flush=True)
        os._exit(101)
    for hex_var, direct_var, label in (
        ("PEER_NODE_ID", "PEER_DIRECT", "peer"),
        ("FIRST_PEER_NODE_ID", "FIRST_PEER_DIRECT", "first-stage peer"),
    ):
        peer_hex, peer_direct = ENV.get(hex_var, "").strip(), ENV.get(direct_var, "").strip()
        if peer_hex and peer_direct:
            print(f"pp-worker: also joining {label} {peer_hex}", file=sys.stderr, flush=True)
    print(f"pp-worker: joining seed {seed}", file=sys.stderr, flush=True)
    load = float(ENV.get("STUB_LOAD_SECONDS", "0") or 0)
    if load > 0:
        log(f"loading the model slice ({load:g} s)")
        if _stop.wait(load):
            return 0
    log("model loaded; worker ready")
    return run_hold(listener)


# ------------------------------------------------------------------------------------ GPUs it sees
def nvml_gpus() -> str:
    """What NVML inside this container lists, through its C ABI with ctypes (no package needed): a comma list
    of GPU UUIDs (a MIG-enabled GPU's MIG devices as GPU-...:MIG-...), "-" for none, or "- (why)"."""
    import ctypes

    try:
        lib = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return "- (no libnvidia-ml.so.1: no NVIDIA driver or toolkit in this container)"
    init = getattr(lib, "nvmlInit_v2", None) or lib.nvmlInit
    rc = init()
    if rc != 0:
        lib.nvmlErrorString.restype = ctypes.c_char_p
        return f"- (nvmlInit: {lib.nvmlErrorString(rc).decode()})"
    try:
        count = ctypes.c_uint(0)
        if lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) != 0:
            return "- (nvmlDeviceGetCount failed)"
        seen = []
        for i in range(count.value):
            handle = ctypes.c_void_p()
            buf = ctypes.create_string_buffer(96)
            if lib.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(handle)) != 0:
                continue
            if lib.nvmlDeviceGetUUID(handle, buf, 96) != 0:
                continue
            uuid = buf.value.decode()
            mode, pending, migs = ctypes.c_uint(0), ctypes.c_uint(0), []
            if lib.nvmlDeviceGetMigMode(handle, ctypes.byref(mode), ctypes.byref(pending)) == 0 and mode.value == 1:
                for m in range(8):
                    mig = ctypes.c_void_p()
                    if lib.nvmlDeviceGetMigDeviceHandleByIndex(handle, m, ctypes.byref(mig)) == 0 and (
                        lib.nvmlDeviceGetUUID(mig, buf, 96) == 0
                    ):
                        migs.append(f"{uuid}:{buf.value.decode()}")
            seen += migs or [uuid]
        return ",".join(seen) or "-"
    finally:
        lib.nvmlShutdown()


def report_gpus(to_stderr: bool = False) -> None:
    """`PP_STAGE_GPUS <list>` before anything else (on stderr where stdout is a wire)."""
    print(f"PP_STAGE_GPUS {nvml_gpus()}", file=sys.stderr if to_stderr else sys.stdout, flush=True)


def main() -> int:
    mode = ENV.get("STUB_MODE", "demo")
    report_gpus(to_stderr=mode == "worker")
    if mode == "worker":
        from pp_stub_worker import serve  # type: ignore[import-not-found]

        return int(serve())
    if mode == "pp-worker":
        return run_pp_worker()
    if mode == "write-weights":  # a stage of a chain like any: it announces, then does its work and exits
        announce(Listener())
        return run_write_weights()
    if mode not in ("demo", "hold"):
        fail(f"unknown STUB_MODE {mode!r}; use demo, hold, worker, pp-worker or write-weights", 2)
    start_knobs()
    listener = Listener()
    announce(listener)
    if flood := ENV.get("STUB_FLOOD"):
        megabytes = int(ENV.get("STUB_FLOOD_MB", "100") or 100)
        global _flooding
        _flooding = threading.Thread(target=run_flood, args=(flood, megabytes), daemon=True)
        _flooding.start()
    return run_demo(listener) if mode == "demo" else run_hold(listener)


if __name__ == "__main__":
    sys.exit(main())
