"""`ps --format`: docker's Go-template subset, through its own API (cli/go_template.py)."""

from __future__ import annotations

import json

import pytest

from pp_launch.cli.go_template import Template, TemplateError, human
from pp_launch.cli.housekeeping_cmd import PS_FIELDS

ROW = {
    "run": "3f2a9c1d0e4b",
    "stage": 1,
    "role": "stage",
    "container": "pp-3f2a9c1d0e4b-1",
    "id": "0123456789ab",
    "image": "pp-launch/stub-worker:latest",
    "gpus": ["GPU-a", "GPU-b"],
    "owner": "h:1:2",
    "owner_status": "alive",
    "state": "running",
    "age_s": 7300,
    "uptime_s": 125,
    "address": None,
    "labels": {"pp-launch.run": "3f2a9c1d0e4b", "team": "nlp"},
}


def show(template: str, rows: list[dict[str, object]] | None = None) -> list[str]:
    return Template(template, PS_FIELDS).render([ROW] if rows is None else rows)


@pytest.mark.parametrize(
    ("template", "line"),
    [
        ("{{.run}} {{.stage}}", "3f2a9c1d0e4b 1"),
        ("{{.Run}}|{{.Names}}|{{.ID}}|{{.State}}", "3f2a9c1d0e4b|pp-3f2a9c1d0e4b-1|0123456789ab|running"),
        ("{{.gpus}}", "GPU-a,GPU-b"),
        ("{{json .gpus}}", '["GPU-a", "GPU-b"]'),
        ("{{.address}}", ""),  # none yet: empty, as docker prints <no value> only for a missing key
        ("{{upper .state}} {{title .role}}", "RUNNING Stage"),
        ("{{.Status}}; {{.RunningFor}}", "Up 2 minutes; 2 hours ago"),
        ("{{ .run }}\\t{{.stage}}", "3f2a9c1d0e4b\t1"),
        ('{{.Label "team"}}|{{.Label "nope"}}|{{upper (.Label "team")}}', None),
        ("{{.Labels}}", "pp-launch.run=3f2a9c1d0e4b,team=nlp"),
        ('{{.Label "team"}} {{json .Label "pp-launch.run"}}', 'nlp "3f2a9c1d0e4b"'),
    ],
)
def test_fields_by_our_names_and_dockers(template: str, line: str | None) -> None:
    if line is None:  # a pipeline docker takes and we do not: said, never printed as it is
        with pytest.raises(TemplateError):
            show(template)
        return
    assert show(template) == [line]


def test_json_alone_and_the_whole_row_have_dockers_names_then_ours() -> None:
    whole = [json.loads(x) for x in show("json", [ROW, ROW])]
    assert whole[0] == whole[1] == json.loads(show("{{json .}}")[0])
    got = whole[0]
    assert list(got)[:5] == ["ID", "Names", "Image", "Labels", "State"]  # docker ps --format json's names first
    assert (got["ID"], got["Names"], got["Image"], got["State"]) == (
        ROW["id"],
        ROW["container"],
        ROW["image"],
        "running",
    )
    assert got["Labels"] == "pp-launch.run=3f2a9c1d0e4b,team=nlp" and got["Status"] == "Up 2 minutes"
    assert got["RunningFor"] == "2 hours ago" and got["CreatedAt"].endswith(" +0000 UTC")
    assert {k: got[k] for k in ("run", "stage", "gpus", "owner_status", "uptime_s")} == {
        k: ROW[k] for k in ("run", "stage", "gpus", "owner_status", "uptime_s")
    }
    assert not {"id", "container", "image", "state", "labels"} & set(got)  # docker has a name for these
    ended = {**ROW, "state": "exited", "status": "Exited (3)", "exit_code": 3, "uptime_s": None}
    assert json.loads(show("json", [ended])[0])["Status"] == "Exited (3)"
    assert show("{{.Status}} {{.exit_code}}", [ended]) == ["Exited (3) 3"]


def test_table_has_a_header_and_aligned_columns() -> None:
    other = {**ROW, "container": "x", "id": "fedcba987654", "state": "exited", "uptime_s": None}
    lines = show("table {{.ID}}\\t{{.Names}}\\t{{.State}}", [ROW, other])
    assert lines[0].split("   ")[0] == "CONTAINER ID"
    starts = {line.index(cell) for line, cell in zip(lines, ("NAMES", "pp-3f2a9c1d0e4b-1", "x"), strict=True)}
    assert len(starts) == 1  # one column, aligned
    assert show("table", [ROW])[0].split()[:3] == ["RUN", "STAGE", "ROLE"]  # plain `table`: every field


@pytest.mark.parametrize(
    ("template", "said"),
    [
        ("{{.Nope}}", "no field 'Nope' in a ps row"),
        ("{{.run", "an unclosed action at character 1"),
        ("a }} b", "an unclosed action at character 3"),
        ("{{index .gpus 0}}", "{{index .gpus 0}} at character 1 is not something ps can print"),
        ("{{upper .}}", "the whole row prints only as {{json .}}"),
        ("{{}}", "{{}} at character 1"),
        ('{{.Names "x"}}', "only .Label takes an argument"),
        ("{{.Label}}", ".Label needs a key"),
    ],
)
def test_what_cannot_run_is_an_error_never_printed_as_is(template: str, said: str) -> None:
    with pytest.raises(TemplateError, match=None) as caught:
        Template(template, PS_FIELDS)
    assert said in str(caught.value) and caught.value.exit_code == 1  # as docker ps, and as a bad --filter


def test_durations_in_dockers_words() -> None:
    assert [human(s) for s in (0, 1, 59, 120, 7199, 7200, 172800)] == [
        "0 seconds",
        "1 second",
        "59 seconds",
        "2 minutes",
        "119 minutes",
        "2 hours",
        "2 days",
    ]


def test_ps_filters_as_docker_ps_takes_them_exited_included_and_a_bad_one_is_exit_1() -> None:
    from pp_launch.cli import housekeeping_cmd as ps

    wanted = ps._filters(("exited=3",))
    ended = {**ROW, "state": "exited", "exit_code": 3}
    assert ps._kept(ended, wanted) and not ps._kept({**ended, "exit_code": 0}, wanted)
    assert not ps._kept({**ROW, "state": "running", "exit_code": None}, wanted)
    for bad, said in (("exited=x", "exited takes an exit code"), ("colour=red", "use KEY=VALUE")):
        with pytest.raises(TemplateError, match=said) as caught:
            ps._filters((bad,))
        assert caught.value.exit_code == 1
