"""The stage announcement (docs/formats.md): `PP_GPU_NODE_ADDR <node_id> <direct>`.

Pure: parses one line of a stage's stdout. Values that reach another stage's environment come only
from a `StageAnnouncement`, which is valid by construction.
"""

from __future__ import annotations

import ipaddress
import re
import shlex
from dataclasses import dataclass

from pp_launch.core.errors import PpLaunchError

PREFIX = "PP_GPU_NODE_ADDR"
_NODE_ID = re.compile(r"[0-9a-f]{64}")
_DNS_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")
_PORT = re.compile(r"[0-9]{1,5}")


class AnnouncementError(PpLaunchError, ValueError):
    """A line starts with the prefix but breaks the grammar. The message shows the text shell-escaped."""


def _valid_host(host: str) -> bool:
    if host.startswith("[") and host.endswith("]"):
        if "%" in host:
            return False  # no scope ids: they mean nothing to another container and invite escaping trouble
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            return False
        return True
    if re.fullmatch(r"[0-9.]+", host):
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            return False
        return True
    if len(host) > 253:
        return False
    return all(_DNS_LABEL.fullmatch(label) for label in host.rstrip(".").split("."))


def _valid_hostport(item: str) -> bool:
    host, sep, port = item.rpartition(":")
    if not sep or not host or not _PORT.fullmatch(port):
        return False
    return 1 <= int(port) <= 65535 and _valid_host(host)


@dataclass(frozen=True)
class StageAnnouncement:
    node_id_hex: str
    direct: str

    def __post_init__(self) -> None:
        if not _NODE_ID.fullmatch(self.node_id_hex):
            raise AnnouncementError(f"node id {escape(self.node_id_hex)} is not 64 lowercase hex digits")
        items = self.direct.split(",")
        if not all(_valid_hostport(item) for item in items):
            raise AnnouncementError(f"direct addresses {escape(self.direct)} are not host:port[,host:port...]")

    @property
    def node_id_short(self) -> str:
        return self.node_id_hex[:8]


def escape(text: str) -> str:
    """Shell-escape text for an error message, with control characters made visible."""
    visible = text.encode("unicode_escape", errors="backslashreplace").decode("ascii")
    return shlex.quote(visible)


def parse_line(line: str) -> StageAnnouncement | None:
    """None when the line is not an announcement; AnnouncementError when it starts with the prefix but
    breaks the grammar."""
    text = line.strip(" \t\r\n")
    if not text.startswith(PREFIX):
        return None
    parts = text.split(" ")
    if len(parts) != 3 or parts[0] != PREFIX:
        raise AnnouncementError(f"malformed announcement {escape(text)}: expected '{PREFIX} <node_id> <direct>'")
    try:
        return StageAnnouncement(node_id_hex=parts[1], direct=parts[2])
    except AnnouncementError as exc:
        raise AnnouncementError(f"malformed announcement {escape(text)}: {exc}") from None
