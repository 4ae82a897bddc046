"""Labels read strictly (docs/formats.md): malformed values are "not ours to judge", never a crash, and an owner in
another PID namespace or boot is never judged gone from here."""

from __future__ import annotations

import os
import socket

import pytest

from pp_launch.adapters import identity
from pp_launch.adapters.docker_engine import ContainerInfo
from pp_launch.app import housekeeping
from pp_launch.core import labels

HOST = socket.gethostname()


@pytest.mark.parametrize("text", ["²", "1²", "١٢", "", " 1", "-1", "1e3", "9" * 19])
def test_ascii_int_refuses_everything_but_ascii_digits(text: str) -> None:
    assert labels.ascii_int(text) is None


def test_ascii_int_reads_ascii_digits() -> None:
    assert labels.ascii_int("0") == 0 and labels.ascii_int("42") == 42


@pytest.mark.parametrize(
    "value",
    [
        f"{HOST}:²:1",
        f"{HOST}:1:²",
        f"{HOST}:1",
        f"{HOST}:1:1:pidns",
        f"{HOST}:1:1:color-red",
        f"{HOST}:1:1:pidns-1:pidns-2",
        f"{HOST}:1:1\x1b[31m",
        f"{HOST}\u202e:1:1",
        ":1:1",
        "detached",
        "compose:proj",
    ],
)
def test_a_malformed_or_non_process_owner_is_never_gone(value: str) -> None:
    assert labels.Owner.parse(value) is None
    assert not identity.owner_is_gone(value)


def test_the_current_owner_round_trips_with_its_namespace_and_boot() -> None:
    me = identity.current_owner()
    assert me.pidns == identity.pid_namespace() and me.boot == identity.boot_id()
    assert labels.Owner.parse(me.label()) == me
    assert identity.judge_here(me) is None and identity.is_alive(me)


def test_an_owner_in_another_pid_namespace_is_not_judged_even_with_a_dead_pid() -> None:
    me = identity.current_owner()
    dead_pid = 2**22 + 17  # above pid_max's default: no process has it
    elsewhere = labels.Owner(HOST, dead_pid, "1", pidns="1", boot=me.boot)
    assert identity.judge_here(elsewhere) == "other-pidns"
    assert not identity.owner_is_gone(elsewhere.label())
    here = labels.Owner(HOST, dead_pid, "1", pidns=me.pidns, boot=me.boot)
    assert identity.owner_is_gone(here.label())


def test_an_owner_of_another_boot_or_host_is_not_judged() -> None:
    assert identity.judge_here(labels.Owner(HOST, 1, "1", boot="0" * 32)) == "other-boot"
    assert identity.judge_here(labels.Owner("elsewhere", 1, "1")) == "other-host"


def test_labels_are_escaped_before_display() -> None:
    info = ContainerInfo(
        id="f" * 64,
        name="?",
        image="i",
        state="dead",
        created=0,
        labels={labels.RUN: "r\x1b[2J", labels.OWNER: "h\x07:1:1"},
    )
    shown = housekeeping.describe(info)
    assert "\x1b" not in shown and "\x07" not in shown
    assert shown == "(unnamed, id ffffffffffff) (run r\\x1b[2J, owner h\\x07:1:1)"


def test_a_pid_namespace_is_read_from_proc() -> None:
    ns = identity.pid_namespace(os.getpid())
    assert ns is not None and ns.isdigit()


def test_the_core_judges_an_owner_from_the_facts_it_is_given() -> None:
    """core.labels does no I/O: where it stands and each pid's start time come in as parameters."""
    here = labels.Here("h", boot="b1", pidns="7")
    started = {10: "500"}.get
    assert labels.owner_is_gone("h:11:500:pidns-7:boot-b1", here, started)  # no such pid
    assert labels.owner_is_gone("h:10:499:pidns-7:boot-b1", here, started)  # the pid was reused
    assert not labels.owner_is_gone("h:10:500:pidns-7:boot-b1", here, started)  # alive
    assert not labels.owner_is_gone("h:11:500:pidns-8:boot-b1", here, started)  # another namespace
    assert not labels.owner_is_gone("h:11:500:boot-b2", here, started)  # another boot
    assert not labels.owner_is_gone("g:11:500", here, started)  # another host
    assert not labels.owner_is_gone("detached", here, started)
