"""`ps --format`: the subset of docker's Go templates that people type (docs/formats.md, "ps --format").

- `{{.Field}}`: a field of the row, by its `--json` name (`{{.run}}`, `{{.container}}`) or by docker's name for it
  (`{{.ID}}`, `{{.Names}}`, `{{.Image}}`, `{{.State}}`, `{{.Status}}`, `{{.RunningFor}}`, `{{.Run}}` ...), in any
  case; lists print comma-separated.
- `{{.Labels}}` (every label, `k=v` comma-separated) and `{{.Label "k"}}` (one), as docker's.
- `{{json .}}` (the whole row, with docker's field names and ours where docker has none), `{{json .Field}}`,
  `{{upper .Field}}`, `{{lower .Field}}`, `{{title .Field}}`.
- `table TEMPLATE`: a header row first, columns split at `\\t` and aligned as docker's tabwriter does.
- `json` alone: one JSON object per row, as `{{json .}}`.
- `\\t` and `\\n` in the template are a tab and a newline.

Anything else (an unknown field or function, a `{{` without its `}}`) is a TemplateError naming what and where
(exit 2, as every bad option of pp-launch): never printed as it is, never a blank row.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pp_launch.core import errors


class TemplateError(errors.PpLaunchError):
    """A --format template or a --filter pp-launch cannot apply: exit 1, as `docker ps` exits for a template it
    cannot run and a filter its engine refuses (docs/cli.md, "Exit codes")."""


# docker's field names for what a ps row has, and the header docker prints for each
DOCKER_NAMES = {
    "id": ("id", "CONTAINER ID"),
    "names": ("container", "NAMES"),
    "image": ("image", "IMAGE"),
    "state": ("state", "STATE"),
    "status": ("status", "STATUS"),
    "runningfor": ("age", "CREATED"),
    "createdat": ("created_at", "CREATED AT"),
    "labels": ("labels", "LABELS"),
}
# `{{json .}}` and `--format json`: docker ps's names for what a row has, then ours where docker has none
DOCKER_JSON = {"ID": "id", "Names": "container", "Image": "image", "Labels": "labels", "State": "state"}
DOCKER_VIEW_JSON = {"Status": "status", "RunningFor": "age", "CreatedAt": "created_at"}
NOT_OURS_IN_JSON = {"id", "container", "image", "labels", "state", "status"}
FUNCTIONS: dict[str, Callable[[str], str]] = {"upper": str.upper, "lower": str.lower, "title": str.title}
ACTION = re.compile(r"\{\{-?\s*(.*?)\s*-?\}\}", re.S)
TERM = re.compile(r'^(?:(json|upper|lower|title)\s+)?\.([A-Za-z_]\w*)?(?:\s+"([^"\\]*)")?$')


@dataclass(frozen=True)
class _Piece:
    text: str = ""  # literal text; else a field (key "" : the whole row)
    key: str | None = None
    func: str | None = None
    header: str = ""
    label: str | None = None  # {{.Label "k"}}: that label's value


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, dict):
        return labels_text(value)
    if isinstance(value, list | tuple):
        return ",".join(map(str, value))
    return str(value)


def labels_text(found: Mapping[str, Any]) -> str:
    """Labels as docker ps prints {{.Labels}}: k=v, comma-separated (here in key order)."""
    return ",".join(f"{k}={v}" for k, v in sorted(found.items()))


def docker_json(row: Mapping[str, Any]) -> dict[str, Any]:
    """A row as docker ps --format json prints a container (its names and values), then ours docker has no name for."""
    view = {**docker_view(row), **row}
    out: dict[str, Any] = {name: view.get(key) for name, key in DOCKER_JSON.items()}
    out["Labels"] = labels_text(row.get("labels") or {})
    out.update({name: view.get(key) for name, key in DOCKER_VIEW_JSON.items() if view.get(key) is not None})
    out.update({k: v for k, v in row.items() if k not in NOT_OURS_IN_JSON})
    return out


class Template:
    """A parsed --format: `render(rows)` gives the lines to print."""

    def __init__(self, source: str, fields: Sequence[str]) -> None:
        self.source = source
        self.fields = tuple(fields)
        text = source.strip() if source.strip() in ("json", "table") else source
        self.json = text == "json"
        self.table = text == "table" or text.startswith("table ")
        body = text[len("table") :].lstrip(" ") if self.table else text
        if self.table and not body:
            body = "\\t".join(f"{{{{.{f}}}}}" for f in self.fields)  # plain `table`: every field
        self.pieces = [] if self.json else self._parse(body.replace("\\t", "\t").replace("\\n", "\n"))

    def _field(self, name: str) -> tuple[str, str]:
        """(the row's key, its header) for a field name as typed."""
        if name in self.fields:
            return name, name.upper()
        low = name.lower()
        if low in DOCKER_NAMES:
            return DOCKER_NAMES[low]
        if low in self.fields:
            return low, low.upper()
        known = ", ".join(
            [*self.fields, "ID", "Names", "Image", "State", "Status", "RunningFor", "CreatedAt", "Labels", 'Label "k"']
        )
        raise TemplateError(f"--format {self.source!r}: no field {name!r} in a ps row; the fields: {known}")

    def _parse(self, body: str) -> list[_Piece]:
        pieces: list[_Piece] = []
        at = 0
        for m in ACTION.finditer(body):
            pieces.append(_Piece(text=body[at : m.start()]))
            term = TERM.match(m.group(1))
            if term is None:
                raise TemplateError(
                    f"--format {self.source!r}: {m.group(0)} at character {m.start() + 1} is not something ps can "
                    'print: use {{.Field}}, {{.Label "k"}}, {{json .}}, {{json .Field}}, {{upper .Field}}, '
                    "{{lower .Field}} or {{title .Field}}"
                )
            func, name, label = term.group(1), term.group(2), term.group(3)
            if label is not None:
                if name is None or name.lower() != "label":
                    raise TemplateError(
                        f"--format {self.source!r}: {m.group(0)}: only .Label takes an argument (a label's key)"
                    )
                pieces.append(_Piece(key="labels", func=func, header="LABEL", label=label))
            elif name is not None and name.lower() == "label":
                raise TemplateError(f'--format {self.source!r}: {m.group(0)}: .Label needs a key: {{{{.Label "k"}}}}')
            elif name is None:
                if func != "json":
                    raise TemplateError(
                        f"--format {self.source!r}: {{{{{m.group(1)}}}}}: the whole row prints only as {{{{json .}}}}"
                    )
                pieces.append(_Piece(key="", func="json", header="JSON"))
            else:
                key, header = self._field(name)
                pieces.append(_Piece(key=key, func=func, header=header))
            at = m.end()
        rest = body[at:]
        if "{{" in rest or "}}" in rest:
            where = body.find("{{", at) if "{{" in rest else body.find("}}", at)
            raise TemplateError(f"--format {self.source!r}: an unclosed action at character {where + 1}")
        pieces.append(_Piece(text=rest))
        return pieces

    def _line(self, shown: Mapping[str, Any]) -> str:
        row = {**docker_view(shown), **shown}
        out = []
        for p in self.pieces:
            if p.key is None:
                out.append(p.text)
            elif p.key == "":
                out.append(json.dumps(docker_json(shown)))
            else:
                value = row.get(p.key) if p.label is None else (row.get("labels") or {}).get(p.label)
                if p.func == "json":
                    out.append(json.dumps(value))
                elif p.func is not None:
                    out.append(FUNCTIONS[p.func](_cell(value)))
                else:
                    out.append(_cell(value))
        return "".join(out)

    def _header(self) -> str:
        return "".join(p.text if p.key is None else p.header for p in self.pieces)

    def render(self, rows: Sequence[Mapping[str, Any]]) -> list[str]:
        if self.json:
            return [json.dumps(docker_json(r)) for r in rows]
        lines = [self._line(r) for r in rows]
        if not self.table:
            return lines
        return _aligned([self._header(), *lines])


def human(seconds: float) -> str:
    """A duration as docker says it ("5 minutes")."""
    s = int(seconds)
    for unit, size in (("day", 86400 * 2), ("hour", 3600 * 2), ("minute", 60 * 2)):
        if s >= size:
            return f"{s // (size // 2)} {unit}s"
    return f"{s} seconds" if s != 1 else "1 second"


def docker_view(row: Mapping[str, Any]) -> dict[str, Any]:
    """What docker's names stand for in a ps row: its short id, a status and an age in docker's words."""
    out: dict[str, Any] = {}
    up = row.get("uptime_s")
    state = str(row.get("state") or "")
    out["status"] = f"Up {human(up)}" if state == "running" and up is not None else state.capitalize()
    if row.get("status"):
        out["status"] = row["status"]  # an ended stage's own: Exited (N)
    if row.get("age_s") is not None:
        out["age"] = f"{human(row['age_s'])} ago"
        created = time.gmtime(time.time() - row["age_s"])
        out["created_at"] = time.strftime("%Y-%m-%d %H:%M:%S +0000 UTC", created)
    return out


def _aligned(lines: Sequence[str], padding: int = 3) -> list[str]:
    """Tab-separated cells in columns, as docker's tabwriter (minimum width 0, padding 3, spaces)."""
    split = [line.split("\t") for line in lines]
    widths: dict[int, int] = {}
    for cells in split:
        for i, c in enumerate(cells[:-1]):
            widths[i] = max(widths.get(i, 0), len(c))
    return ["".join(c.ljust(widths[i] + padding) for i, c in enumerate(cells[:-1])) + cells[-1] for cells in split]
