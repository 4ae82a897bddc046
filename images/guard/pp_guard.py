"""The guard of one run on one engine (docs/chain.md, "The guard").

It runs as a container of the run on the engine it guards (tini as init, auto-remove, the host's network with no
listener, no stdin), reaching that engine through its socket, mounted at PP_GUARD_SOCKET. Two programs of this file:

- `serve` (the container's own process): checks that its socket reaches the engine the launcher means
  (PP_GUARD_ENGINE), then listens on a unix socket inside the container for the run's one session. It holds the
  ids of the run's containers there and the launcher's lifeline: the session. Nothing outside the container can
  reach that socket, and only the first session is taken: a `docker attach` (the container has no stdin) or a
  `docker logs` reaches nothing of it.
- `session` (what the launcher runs in the guard with `docker exec -i`, holding the exec's stdin and stdout): a relay
  between the exec's stdio and serve's socket. When the launcher ends, however it ends, the engine closes the
  exec's stdin; the session closes its connection; serve sees the lifeline end. No other client can reach an exec
  session the launcher started.

Session lines, launcher -> guard: `own <id>` (a container the launcher created: checked to be of this run and
made after this guard started, answered `owned <id>` on stderr, so the engine's log of this container is the run's
record of what is its own; else `refused <id> <why>` to the launcher), `detach` (the run is up and detached: the
guard is its owner from now on, answered `detached`), `beat` (the launcher lives: with PP_GUARD_HEARTBEAT=S, S
seconds without a line count as the end of the lifeline, for a link that was cut). Guard -> launcher: `ready` (or
why not, then the session ends), `alive` four times a second (a guard that is paused or frozen falls silent), `down`
(SIGUSR1: `pp-launch down`), `stopping` (SIGTERM: `docker stop`).

The end of the lifeline (not detached), or SIGUSR1, tears down every owned container (SIGTERM, PP_GUARD_GRACE
seconds, SIGKILL, removal confirmed by the engine), then the guard exits. SIGTERM (`docker stop` of the guard by
someone else, an engine that stops) ends the guard and touches nothing (SIGINT, SIGHUP and SIGQUIT, which `docker
attach` passes on from its terminal, change nothing): its launcher, which notices within a
second, puts a new guard in its place (or, if it cannot, ends the run). A detached run's guard also exits once none
of its containers is left, and ends the whole run when one of its stages fails (exits non-zero: a pipeline ends as
one, as in the foreground): `run ended by stage K (NAME), which exited CODE`, then the teardown.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import sys
import threading
import time

if sys.argv[1:] != ["session"]:  # the session is a relay, started for every run that takes this guard: it needs none
    import datetime  # of the engine's API, and each import is time a bring-up waits
    import http.client
    import json
    import urllib.parse
    from collections.abc import Callable, Iterator

SOCKET = os.environ.get("PP_GUARD_SOCKET", "/var/run/docker.sock")
GRACE = float(os.environ.get("PP_GUARD_GRACE", "5"))
# > 0: the launcher writes a line at least this often; silence that long means its machine or link is lost
HEARTBEAT = float(os.environ.get("PP_GUARD_HEARTBEAT", "0"))
PATIENCE = float(os.environ.get("PP_GUARD_PATIENCE", "60"))  # how long a teardown retries a silent engine
RUN = os.environ.get("PP_GUARD_RUN", "")  # the run's id: an id to own must be of a container of this run
LISTEN = "/run/pp-guard/session.sock"  # inside the container: reached only by a process in it (the session)
VERDICT = "/run/pp-guard/verdict"  # why serve could not start, for the session to say
ALIVE = 0.25  # seconds between two `alive` lines to the launcher
# seconds a new guard waits for its launcher's session; less for a guard put in another's place (its launcher opens
# the session the moment the guard starts, and nothing else tears the run down if that launcher was killed meanwhile)
SESSION_PATIENCE = float(os.environ.get("PP_GUARD_SESSION_PATIENCE") or 30)
POLL = 0.1
ID = re.compile(r"[0-9a-f]{64}")


def _unix(timeout: float | None) -> http.client.HTTPConnection:
    """An HTTP connection to the engine through its socket."""

    class Unix(http.client.HTTPConnection):
        def connect(self) -> None:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.settimeout(self.timeout)
            self.sock.connect(SOCKET)

    return Unix("localhost", timeout=timeout)


def request(method: str, path: str) -> tuple[int, bytes]:
    """One Engine API request; its HTTP status and body."""
    conn = _unix(30)
    try:
        conn.request(method, path, headers={"Content-Length": "0"})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def call(method: str, path: str) -> int:
    return request(method, path)[0]


def inspect(ref: str) -> dict | None:
    status, body = request("GET", f"/containers/{ref}/json")
    return json.loads(body) if status == 200 else None


def identity() -> str:
    """What the launcher calls this engine (its id, name and data root): the socket must reach that one."""
    _, body = request("GET", "/info")
    info = json.loads(body)
    return "|".join(str(info.get(k, "")) for k in ("ID", "Name", "DockerRootDir"))


def exists(ref: str) -> bool:
    return call("GET", f"/containers/{ref}/json") != 404


RECORD = os.environ.get("PP_GUARD_RECORD", "")  # the run's record on its volume: outlives this container


FAULTS: list[str] = []  # why the record could not be appended to (the first time): told to the launcher once
TELL: list = []  # the guard's way to its launcher's session, once it has one (serve sets it)


def say(text: str) -> None:
    """The record, on stderr (the engine's log of this container; stdout stays empty), and appended to the run's
    record volume, which the run's stages mount too: no prune removes it while any of them is there, and it is
    there to read once this container is gone (a guard that someone else removed, an ended run). A record that
    cannot be appended to is said in the log (`record-fault: WHY`, read by `ps`, `wait` and `logs` while this
    guard lives) and to the launcher, once: a record that fails is never silent."""
    sys.stderr.write(text + "\n")
    sys.stderr.flush()
    if RECORD:
        why = append_record(text)
        if why and not FAULTS:
            FAULTS.append(why)
            sys.stderr.write(f"record-fault: {why}\n")
            sys.stderr.flush()
            for tell in TELL:
                tell(f"record-fault {why}")


def append_record(text: str) -> str:
    """"" once `text` is in the record, else why not (a full disk, a volume made read-only)."""
    try:
        with open(RECORD, "a", encoding="ascii", errors="replace") as record:
            record.write(text + "\n")
            record.flush()
            os.fsync(record.fileno())
    except OSError as exc:
        return f"cannot append to the run's record {RECORD}: {exc.strerror or exc}"
    return ""


def when(text: str) -> float:
    """An engine time (RFC 3339, nanoseconds) as seconds since the epoch; 0 when unreadable."""
    head, _, frac = text.rstrip("Z").partition(".")
    try:
        at = datetime.datetime.fromisoformat(head).replace(tzinfo=datetime.timezone.utc)
        return at.timestamp() + float(f"0.{frac.split('+')[0].split('-')[0] or '0'}")
    except ValueError:
        return 0.0


class Guard:
    def __init__(self) -> None:
        self.owned: list[str] = []
        self.detached = False
        self.ended = threading.Event()  # the lifeline ended (not detached), `down`, or the guard is told to go
        self.teardown_wanted = True  # False: SIGTERM, the guard goes and touches nothing
        self.lock = threading.Lock()
        self.heard = time.monotonic()
        self.session: socket.socket | None = None
        self.session_lock = threading.Lock()
        self.started = 0.0  # when this guard started, on the engine's clock
        self.keepers: list[threading.Thread] = []  # a detached run's: each stage's lines into the record

    def kept(self, patience: float = 5.0) -> None:
        """Each stage's last lines written to the record (its log ends once the stage is gone) before this guard
        exits, for at most `patience` seconds."""
        deadline = time.monotonic() + patience
        for keeper in list(self.keepers):
            keeper.join(max(0.0, deadline - time.monotonic()))

    # ------------------------------------------------------------------------------------------ the session
    def tell(self, line: str) -> None:
        """A line to the launcher, if its session is there."""
        with self.session_lock:
            if self.session is not None:
                with contextlib.suppress(OSError):
                    self.session.sendall(line.encode() + b"\n")

    def serve_session(self, server: socket.socket) -> None:
        """The first connection is the run's session: its lines, until it ends. Any later one is refused. None within
        SESSION_PATIENCE: the launcher died before it came (the guard ends as if its lifeline had)."""
        server.settimeout(SESSION_PATIENCE)
        try:
            conn, _ = server.accept()
        except OSError:
            say(f"no session within {SESSION_PATIENCE:g} s: the launcher is gone")
            self.ended.set()
            return
        say("session: the launcher holds this guard's lifeline")
        conn.settimeout(None)
        server.settimeout(None)
        with self.session_lock:
            self.session = conn
        threading.Thread(target=self.refuse_others, args=(server,), daemon=True).start()
        threading.Thread(target=self.beats, daemon=True).start()
        self.tell("ready")
        for why in FAULTS:  # the record failed before this session came: its launcher hears it now
            self.tell(f"record-fault {why}")
        pending = b""
        while True:
            try:
                data = conn.recv(65536)
            except OSError:
                data = b""
            if not data:
                break
            self.heard = time.monotonic()
            pending += data
            *lines, pending = pending.split(b"\n")
            for raw in lines:
                self.on_line(raw.decode("ascii", "replace").split())
        with self.session_lock:
            self.session = None
        if not self.detached:
            say("the launcher's lifeline ended")
            self.ended.set()

    def refuse_others(self, server: socket.socket) -> None:
        while True:
            try:
                other, _ = server.accept()
            except OSError:
                return
            with contextlib.suppress(OSError):
                other.sendall(b"taken: this guard has its session\n")
                other.close()

    def beats(self) -> None:
        while not self.ended.wait(ALIVE):
            self.tell("alive")

    def on_line(self, words: list[str]) -> None:
        if len(words) == 2 and words[0] == "own" and ID.fullmatch(words[1]):
            why = self.not_ours(words[1])
            with self.lock:
                if why:
                    self.tell(f"refused {words[1]} {why}")
                elif words[1] not in self.owned:
                    self.owned.append(words[1])
                    say(f"owned {words[1]}")
        elif words == ["detach"] and not self.detached:
            self.detached = True
            say("detached")
            if RECORD:  # its launcher leaves now: the stages' lines are kept here, from now on
                keep_stage_lines(self)

    def not_ours(self, ref: str) -> str:
        """Why an id the session names is not a container of this run made after this guard started ("" when it
        is): what the guard will ever stop must be its launcher's own."""
        try:
            info = inspect(ref)
        except (OSError, ValueError):
            return "the engine did not answer"
        if info is None:
            return "no such container"
        labels = (info.get("Config") or {}).get("Labels") or {}
        if RUN and labels.get("pp-launch.run") != RUN:
            return f"not of run {RUN}"
        if when(str(info.get("Created", ""))) + 1.0 < self.started:
            return "made before this guard started"
        return ""

    def on_event(self, event: dict) -> None:
        actor = event.get("Actor") or {}
        ref, attrs = str(actor.get("ID", "")), actor.get("Attributes") or {}
        with self.lock:
            if ref not in self.owned:
                return  # only what this run created: a neighbour's container carrying its labels says nothing
        if event.get("Action") == "oom":
            say(f"oom {ref}")
            return
        if str(event.get("Action", "")).startswith("health_status"):
            if self.detached and str(event.get("Action")).endswith("unhealthy") and not self.ended.is_set():
                # its launcher has left: a stage that turned unhealthy ends the run as one that exited would
                say(f"unhealthy {ref}: its health check failed; it is stopped, and the run with it")
                call("POST", f"/containers/{ref}/kill?signal=SIGKILL")
            return
        stage, attempt = attrs.get("pp-launch.stage", "?"), attrs.get("pp-launch.attempt", "1")
        code, name = attrs.get("exitCode", "?"), attrs.get("name", "?")
        say(f"ended {ref} {stage} {attempt} {code} {event.get('time', 0)} {name}")
        if self.detached and stage.isdigit() and code != "0" and not self.ended.is_set():
            # a pipeline is only as alive as its weakest stage: a detached run whose stage failed ends as one, as a
            # foreground chain does (a stage that exits 0 after announcing is done, and the others go on)
            say(f"run ended by stage {stage} ({name}), which exited {code}: its other containers are stopped")
            self.ended.set()

    # ------------------------------------------------------------------------------------------ the teardown
    def left(self) -> list[str]:
        with self.lock:
            owned = list(self.owned)
        return [ref for ref in owned if exists(ref)]

    def teardown(self) -> None:
        deadline = time.monotonic() + PATIENCE
        while True:
            try:
                self._stop(self.left())
                if not self.left():
                    return
            except OSError:
                pass  # the engine is restarting or frozen: try again while it may come back
            if time.monotonic() > deadline:
                return
            time.sleep(1.0)

    def _stop(self, refs: list[str]) -> None:
        for ref in refs:
            call("POST", f"/containers/{ref}/kill?signal=SIGTERM")
        end = time.monotonic() + GRACE
        while refs and time.monotonic() < end:
            time.sleep(POLL)
            refs = [r for r in refs if exists(r)]
        for ref in refs:
            call("POST", f"/containers/{ref}/kill?signal=SIGKILL")
            call("DELETE", f"/containers/{ref}?force=1&v=1")
        for ref in refs:
            say(f"removed {ref}")


def watch_ends(guard: Guard) -> None:
    """Every end of a container it owns, as the engine says it (exit code, OOM, time), into the record: `ended <id>
    <stage> <attempt> <exit code> <time> <name>` (`oom <id>` first when the kernel killed it for memory). `wait` and
    `ps` read them while the run lives, however early a stage ended and was removed."""
    filters = json.dumps(
        {"type": ["container"], "event": ["die", "oom", "health_status"], "label": [f"pp-launch.run={RUN}"]}
    )
    path = "/events?filters=" + urllib.parse.quote(filters)
    while not guard.ended.is_set():
        conn = _unix(None)
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            while line := resp.readline():
                guard.on_event(json.loads(line))
        except (OSError, ValueError, http.client.HTTPException):
            pass  # the engine restarting: ask again
        finally:
            conn.close()
        guard.ended.wait(1.0)


def keep_stage_lines(guard: Guard) -> None:
    """A detached run's stages' lines (its launcher, which kept them, is gone), each stage's kept in the run's
    record, bounded, for `pp-launch logs RUN` once the stages are gone (auto-remove takes the engine's log with
    them): each stage's last LINES_BEFORE lines, then each line as it comes, until the stage ends."""
    with guard.lock:
        owned = list(guard.owned)
    for ref in owned:
        try:
            info = inspect(ref) or {}
        except (OSError, ValueError):
            continue
        stage = ((info.get("Config") or {}).get("Labels") or {}).get("pp-launch.stage", "")
        if stage.isascii() and stage.isdigit() and not (info.get("Config") or {}).get("Tty"):
            keeper = threading.Thread(target=keep_lines, args=(ref, int(stage)), daemon=True)
            keeper.start()
            guard.keepers.append(keeper)


LINES_KEPT = 128 * 1024  # bytes of a stage's last lines in the record: its file, and the one before it (.1)
LINES_BEFORE = 1000  # lines of a stage's log before the hand-over that are kept too (its launcher kept them all)


def frames(read: Callable[[], bytes]) -> Iterator[bytes]:
    """The engine's log frames (a stream byte, 3 zero bytes, the size, the data) as kept lines, `<time> <stdout|
    stderr> <text>\n`, joined: as many as each read brings (b"": the stream ended)."""
    buf = b""
    while chunk := read():
        buf += chunk
        at, lines = 0, []
        while len(buf) - at >= 8 and len(buf) - at - 8 >= (size := int.from_bytes(buf[at + 4 : at + 8], "big")):
            stream = b"stderr" if buf[at] == 2 else b"stdout"
            for line in buf[at + 8 : at + 8 + size].splitlines():
                when, _, text = line.partition(b" ")
                lines.append(b"%s %s %s\n" % (when, stream, text))
            at += 8 + size
        buf = buf[at:]
        if lines:
            yield b"".join(lines)


def follow_log(ref: str) -> Callable[[], bytes] | None:
    """The stage's log as the engine streams it (the last LINES_BEFORE lines, then each as it comes, timed), read
    a batch at a time: HTTP/1.0, so the stream is the frames themselves, not cut in chunks; after a small read the
    next waits BATCH seconds for more lines (a chatty stage costs the guard a parse and a write per batch, not per
    line). None when the engine has no such container."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(SOCKET)
    query = f"follow=1&stdout=1&stderr=1&timestamps=1&tail={LINES_BEFORE}"
    sock.sendall(f"GET /containers/{ref}/logs?{query} HTTP/1.0\r\nHost: engine\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        got = sock.recv(4096)
        if not got:
            break
        head += got
    head, _, early = head.partition(b"\r\n\r\n")
    if head.split(b" ", 2)[1:2] != [b"200"]:
        sock.close()
        return None
    pending = [early]

    def read() -> bytes:
        if pending:
            return pending.pop() or read()
        data = sock.recv(65536)
        if not data:
            sock.close()
        elif len(data) < 16384:
            time.sleep(BATCH)
        return data

    return read


BATCH = 0.2


def keep_lines(ref: str, stage: int) -> None:
    """`stage-K.log` beside the record (its last LINES_BEFORE lines, then each as it comes); at LINES_KEPT bytes
    it becomes `stage-K.log.1` (the one before it dropped). A write that fails stops the keeping and is said."""
    path = os.path.join(os.path.dirname(RECORD), f"stage-{stage}.log")
    out = -1
    try:
        read = follow_log(ref)
        if read is None:
            return
        out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o644)
        size = os.fstat(out).st_size
        for data in frames(read):
            if size + len(data) > LINES_KEPT and size:
                os.close(out)
                os.replace(path, path + ".1")
                out, size = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644), 0
            os.write(out, data)
            size += len(data)
    except OSError as exc:
        say(f"the lines of stage {stage} are no longer kept in the record: {exc}")
    finally:
        if out >= 0:
            os.close(out)


def ready() -> str:
    """"" when the socket reaches the engine the launcher means, else why not."""
    expected = os.environ.get("PP_GUARD_ENGINE", "")
    try:
        found = identity()
    except (OSError, ValueError) as exc:
        return f"cannot reach the engine through {SOCKET}: {exc}"
    if expected and found != expected:
        return (f"{SOCKET} is another engine ({found}, not {expected}): set PP_LAUNCH_GUARD_SOCKET to the engine's "
                "own socket on its machine")  # fmt: skip
    if RECORD:  # before any stage exists: a record that cannot be written is the launch's error, nothing started
        why = append_record(f"guard: keeping run {RUN}'s record")
        if why:
            return f"record: {why}"
    return ""


def serve() -> int:
    os.makedirs(os.path.dirname(LISTEN), mode=0o700, exist_ok=True)
    why = ready()
    if why:  # said to the session when it comes (this container must still run then), and in the log
        say(why)
        with open(VERDICT + ".part", "w") as f:  # whole, or not there: a session may look for it at any moment
            f.write(why + "\n")
        os.replace(VERDICT + ".part", VERDICT)
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(LISTEN)
        server.listen(1)
        server.settimeout(SESSION_PATIENCE)
        with contextlib.suppress(OSError):
            conn, _ = server.accept()
            conn.sendall(why.encode() + b"\n")
            conn.shutdown(socket.SHUT_WR)
            # this container ends with this process, and every process in it with it: the session must have passed
            # the line on first (it ends, closing its end, once it has written it out), or the launcher hears nothing
            conn.settimeout(5.0)
            while conn.recv(65536):
                pass
            conn.close()
        return 3
    guard = Guard()
    TELL.append(guard.tell)
    me = inspect(socket.gethostname()) or {}
    # what this guard may own: the run's containers made since its first guard started (a guard put in the place
    # of one another client ended takes over the ids its launcher holds, made before it)
    since = float(os.environ.get("PP_GUARD_SINCE") or 0)
    guard.started = since or when(str((me.get("State") or {}).get("StartedAt", "")))

    def down(*_: object) -> None:  # `pp-launch down`: the launcher, if it is there, hears it on its session
        guard.tell("down")
        say("told to stop ('pp-launch down')")
        guard.ended.set()

    def stop(*_: object) -> None:  # `docker stop` of this guard, an engine that stops: go, touch nothing
        guard.tell("stopping")  # its launcher puts a new guard in its place
        guard.teardown_wanted = False
        say("stopped by SIGTERM: the run's containers are left to its launcher (or, detached, to 'pp-launch down')")
        guard.ended.set()

    signal.signal(signal.SIGUSR1, down)
    signal.signal(signal.SIGTERM, stop)
    for passed_on in (signal.SIGINT, signal.SIGHUP, signal.SIGQUIT):  # what `docker attach` passes on from a terminal
        signal.signal(passed_on, signal.SIG_IGN)  # (^C, a closed terminal): someone looking, not stopping anything
    for ref in filter(None, os.environ.get("PP_GUARD_OWN", "").split(",")):  # a guard put in another's place: its
        guard.on_line(["own", ref])  # ids come with it, so that its launcher killed right now still leaves nothing
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(LISTEN)
    os.chmod(LISTEN, 0o600)
    server.listen(4)
    threading.Thread(target=guard.serve_session, args=(server,), daemon=True).start()
    threading.Thread(target=watch_ends, args=(guard,), daemon=True).start()
    while not guard.ended.wait(1.0):
        if HEARTBEAT > 0 and not guard.detached and time.monotonic() - guard.heard > HEARTBEAT:
            say("the launcher is silent: its lifeline is lost")
            break
        if guard.detached:
            try:
                if not guard.left():
                    say("every container of the run is gone")
                    guard.kept()
                    return 0
            except OSError:
                pass
    if guard.teardown_wanted:
        guard.teardown()
        say("torn down")
        guard.kept()
    return 0


SESSION_HOLD = 5.0  # seconds a session outlives what serve said, for the launcher to read it and let go


def session() -> int:
    """The relay between this exec's stdio (the launcher) and serve's socket. Its first line out is `ready`, or why
    not (then it ends)."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    deadline = time.monotonic() + 15
    while True:
        try:
            conn.connect(LISTEN)
            break
        except OSError:
            if os.path.exists(VERDICT) or time.monotonic() > deadline:
                try:
                    with open(VERDICT) as f:
                        why = f.read().strip()
                except OSError:
                    why = "its guard did not listen within 15 s"
                sys.stdout.write(why + "\n")
                sys.stdout.flush()
                return 3
            time.sleep(0.02)

    def upstream() -> None:  # the launcher's lines to serve; the end of stdin is the end of the lifeline
        with contextlib.suppress(OSError):
            while data := os.read(0, 65536):
                conn.sendall(data)
        with contextlib.suppress(OSError):
            conn.shutdown(socket.SHUT_WR)

    up = threading.Thread(target=upstream, daemon=True)
    up.start()
    with contextlib.suppress(OSError):
        while data := conn.recv(65536):
            os.write(1, data)
    # serve said all it will (a guard that refused ends once this relay lets go of it, and its container with it):
    # held until the launcher ends its side, which it does once it has read the line, so the engine's copy of this
    # exec's output is not cut by the container's end (under load the launcher heard nothing); serve waits 5 s at most
    up.join(SESSION_HOLD)
    return 0


if __name__ == "__main__":
    sys.exit(session() if sys.argv[1:] == ["session"] else serve())
