"""How a chain tells people and programs what happens (docs/formats.md).

- JsonReporter (--json): one JSON event per line on stdout, nothing else there; stage lines on stderr.
- PlainReporter (not a terminal): stage lines on stdout as `[stage K] ...`; launcher notes on stderr.
- LiveReporter (a terminal): the same lines, under a live per-stage status table.
"""

from __future__ import annotations

import io
import json
import sys
import threading
import time
from datetime import datetime, timezone
from typing import Any, ClassVar, TextIO

from pp_launch.core import events
from pp_launch.core.lines import count


def rfc3339_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


STOP_WORDS = {
    events.StopReason.COMPLETED: "completed",
    events.StopReason.STAGE_FAILED: "a stage failed",
    events.StopReason.SIGNAL: "stopped by a signal",
    events.StopReason.ERROR: "an error in pp-launch",
    events.StopReason.DETACHED: "detached",
}


def stage_prefix(stage: int) -> str:
    return f"[stage {stage}] "


class JsonReporter:
    def __init__(self, run_id: str, out: TextIO | None = None, err: TextIO | None = None, verbosity: int = 0) -> None:
        self.run_id = run_id
        self.verbosity = verbosity  # -1 (-q): events only, no stage lines
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self._lock = threading.Lock()
        self.said = ""  # the cause of a failed chain, once said (before the teardown summary)
        self.attach: frozenset[int] = frozenset()  # --attach: only these stages' lines (none given: every stage's)

    def event(self, event: events.Event) -> None:
        doc = events.to_json(event, self.run_id, rfc3339_now())
        with self._lock:
            self.out.write(json.dumps(doc, separators=(",", ":")) + "\n")
            self.out.flush()

    def stage_line(self, stage: int, stream: str, text: str) -> None:
        if self.verbosity < 0 or (self.attach and stage not in self.attach):
            return
        with self._lock:
            self.err.write(stage_prefix(stage) + text + "\n")
            self.err.flush()

    def stage_state(self, stage: int, state: events.StageState, detail: str = "") -> None:
        pass

    def close(self) -> None:
        pass


class PlainReporter:
    """Line-oriented output for logs and pipes. verbosity: -1 quiet (no stage lines), 0 normal, 1 verbose."""

    def __init__(self, run_id: str, verbosity: int = 0, out: TextIO | None = None, err: TextIO | None = None) -> None:
        self.run_id = run_id
        self.verbosity = verbosity
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self._lock = threading.Lock()
        self.record = ""  # the run's record on its engine, kept on purpose: named in the final line (set by the CLI)
        self.attach: frozenset[int] = frozenset()  # --attach: only these stages' lines (none given: every stage's)

    def _say(self, text: str) -> None:
        with self._lock:
            self.err.write(f"pp-launch: {text}\n")
            self.err.flush()

    def event(self, event: events.Event) -> None:
        if self.verbosity < 0 and not isinstance(event, events.ChainStopped):
            return
        if isinstance(event, events.StageStarted):
            gpus = ",".join(event.gpus) or "no GPU"
            self._say(f"stage {event.stage} started: {event.container} ({event.image}, {gpus})")
        elif isinstance(event, events.StageAnnounced):
            self._say(f"stage {event.stage} announced {event.direct} after {event.elapsed_s:.2f} s")
        elif isinstance(event, events.StageRoster):
            roster = " ".join(f"{e.stage_index}:{e.node_id_short}" for e in event.stages)
            self._say(f"roster of run {self.run_id}: {roster}")
        elif isinstance(event, events.ChainStopping):
            second = "; Ctrl-C again to kill now" if event.reason is events.StopReason.SIGNAL else ""
            self._say(f"stopping {count(event.stages, 'stage')} (grace {event.grace:g} s){second}")
        elif isinstance(event, events.StageExited) and event.reason is events.ExitReason.STOPPED:
            self._say(f"stage {event.stage} gone (exit {event.exit_code})")
        elif isinstance(event, events.StageExited) and self.verbosity > 0:
            self._say(f"stage {event.stage} exited with code {event.exit_code} ({event.reason.value})")
        elif isinstance(event, events.ChainStopped):
            if event.message:  # the cause first, then what the teardown did
                self._say(f"error: {event.message}")
                self.said = event.message
            kept = f" but its record ({self.record}, for 'wait' and 'ps -a')" if self.record else ""
            tail = f"; LEFT BEHIND: {', '.join(event.orphans)}" if event.orphans else f"; nothing left behind{kept}"
            why = STOP_WORDS.get(event.reason, event.reason.value)
            self._say(f"chain stopped ({why}), {count(len(event.removed), 'container')} removed{tail}")

    def stage_line(self, stage: int, stream: str, text: str) -> None:
        if self.verbosity < 0 or (self.attach and stage not in self.attach):
            return
        with self._lock:
            self.out.write(stage_prefix(stage) + text + "\n")
            self.out.flush()

    def stage_state(self, stage: int, state: events.StageState, detail: str = "") -> None:
        if self.verbosity >= 2:  # -vv
            self._say(f"stage {stage}: {state.value}" + (f" ({detail})" if detail else ""))

    def close(self) -> None:
        pass


class LiveReporter(PlainReporter):
    """A live table of stages above which stage lines scroll (only on a terminal): each stage's state, what it
    waits for (its predecessor's address, or its own announcement), the seconds it has waited against its
    --addr-timeout, its address once announced (kept to the last frame), and an N/M line. The result line is
    printed after the last frame."""

    STYLES: ClassVar[dict[str, str]] = {
        events.StageState.CREATING.value: "yellow",
        events.StageState.CREATED.value: "yellow",
        events.StageState.STARTING.value: "yellow",
        events.StageState.ANNOUNCED.value: "cyan",
        events.StageState.RUNNING.value: "green",
        events.StageState.STOPPING.value: "magenta",
        events.StageState.GONE.value: "dim",
        events.StageState.REMOVED.value: "dim",
    }

    def __init__(
        self,
        run_id: str,
        num_stages: int,
        verbosity: int = 0,
        console: Any = None,
        addr_timeout: float | None = None,
        handoff: str = "env",
        clock: Any = time.monotonic,
    ) -> None:
        super().__init__(run_id, verbosity)
        from rich.console import Console
        from rich.live import Live

        self.console = console or Console(highlight=False)
        self.clock = clock
        self.addr_timeout = addr_timeout
        self.handoff = handoff
        self.rows: dict[int, list[str]] = {k: ["waiting", ""] for k in range(num_stages)}
        self.since: dict[int, float] = {}  # when each stage began to wait for its announcement
        self.addresses: dict[int, str] = {}
        self.started = clock()
        self.held: list[str] = []  # the result, said after the last frame
        self.attempt = ""  # "2 of 4" once the run restarted (--max-restarts)
        self.live = Live(console=self.console, refresh_per_second=4, transient=False, get_renderable=self._table)
        self.live.start()

    def _waiting_for(self, k: int) -> str:
        if k in self.addresses or self.rows[k][0] not in ("waiting", "creating", "created", "starting"):
            return ""  # announced, or on its way out: it waits for nothing any more
        if self.handoff == "env" and k > 0 and (k - 1) not in self.addresses:
            return f"stage {k - 1}'s address"
        return "its announcement"

    def _elapsed(self, k: int) -> str:
        if k not in self.since or k in self.addresses or self.rows[k][0] not in ("starting", "created"):
            return ""
        waited = self.clock() - self.since[k]
        return f"{waited:.0f} s" + (f" / {self.addr_timeout:g} s" if self.addr_timeout else "")

    FRAME_LINES = 7  # what a frame has besides its rows: the summary, the title, the table's four rules, the fold

    def _rank(self, k: int, state: str) -> int:
        """Which rows a frame shows first: a stage on its way out (failed, stopping, gone), then one still
        awaited, then the announced (folded into a count when the terminal is too short for every row)."""
        if state in ("stopping", "gone", "removed"):
            return 0
        return 2 if k in self.addresses else 1

    def _table(self) -> Any:
        """The summary on top, then as many rows as the terminal has room for: what is waited for or failed
        first; the announced stages that do not fit are one line, counted."""
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        title = f"pp-launch run {self.run_id}" + (f", attempt {self.attempt}" if self.attempt else "")
        table = Table(title=title, title_justify="left", expand=False)
        for col in ("stage", "state", "waiting for", "waited", "address", "detail"):
            table.add_column(col)
        with self._lock:
            rows = sorted(self.rows.items(), key=lambda item: (self._rank(item[0], item[1][0]), item[0]))
            room = max(1, self.console.size.height - self.FRAME_LINES)
            shown, folded = rows[:room], rows[room:]
            for k, (state, detail) in shown:
                address = self.addresses.get(k, "")
                if address and detail.startswith(address):  # its column shows it: the detail says the rest
                    detail = detail[len(address) :].strip()
                # styled Text, never markup: a stage's address or a state is shown as it is
                table.add_row(
                    Text(str(k)),
                    Text(state, style=self.STYLES.get(state, "white")),
                    Text(self._waiting_for(k)),
                    Text(self._elapsed(k)),
                    Text(address),
                    Text(detail),
                )
            done = len(self.addresses)
            awaited = [k for k, (state, _) in rows if self._rank(k, state) == 1]
        summary = f"{done}/{len(rows)} stages announced"
        if awaited and done < len(rows):
            more = f" and {len(awaited) - 1} more" if len(awaited) > 1 else ""
            summary += f"; waiting for stage {awaited[0]}{more}"
        parts: list[Any] = [Text(summary), table]
        if folded:
            ks = [k for k, _ in folded]
            what = ", announced" if all(k in self.addresses for k in ks) else ""
            parts.append(Text(f"... and {count(len(ks), 'more stage')} ({_ranges(ks)}){what}"))
        return Group(*parts)

    def _print(self, text: str) -> None:
        """Whole, as it came: never wrapped at the terminal's width nor cut (soft wrap), never read as markup."""
        from rich.text import Text

        self.console.print(Text(text), soft_wrap=True, markup=False, highlight=False)

    def _say(self, text: str) -> None:
        self._print(f"pp-launch: {text}")

    def stage_line(self, stage: int, stream: str, text: str) -> None:
        if self.verbosity >= 0 and (not self.attach or stage in self.attach):
            self._print(stage_prefix(stage) + text)

    def stage_state(self, stage: int, state: events.StageState, detail: str = "") -> None:
        with self._lock:
            if state in (events.StageState.CREATED, events.StageState.STARTING) and stage not in self.since:
                self.since[stage] = self.clock()
            # a state without detail keeps the last one
            self.rows[stage] = [state.value, detail or self.rows.get(stage, ["", ""])[1]]
        self.live.refresh()

    def event(self, event: events.Event) -> None:
        if isinstance(event, events.StageStarted):
            self.stage_state(event.stage, events.StageState.STARTING, event.container)
            return
        if isinstance(event, events.StageAnnounced):
            with self._lock:
                self.addresses[event.stage] = event.direct
        if isinstance(event, events.ChainRestarting):  # a new attempt: a fresh table, what the last one said above it
            with self._lock:
                held, self.held = self.held, []
                self.attempt = f"{event.attempt} of {event.max}"
                self.rows = {k: ["waiting", ""] for k in self.rows}
                self.since.clear()
                self.addresses.clear()
            for text in held:
                for line in text.splitlines():
                    self._print(line)
            self.live.refresh()
            return
        if isinstance(event, events.ChainStopped):  # the result after the last frame, not above it
            said = io.StringIO()
            quiet = PlainReporter(self.run_id, self.verbosity, out=io.StringIO(), err=said)
            quiet.event(event)
            self.said = getattr(quiet, "said", "")
            with self._lock:
                self.held.append(said.getvalue())
            return
        super().event(event)

    def close(self) -> None:
        self.live.stop()
        for text in self.held:
            for line in text.splitlines():
                self._print(line)


def _ranges(stages: list[int]) -> str:
    """0, 2-5, 9: stage numbers as ranges."""
    out: list[str] = []
    for k in sorted(stages):
        if out and out[-1].split("-")[-1] == str(k - 1):
            out[-1] = f"{out[-1].split('-')[0]}-{k}"
        else:
            out.append(str(k))
    return ", ".join(out)
