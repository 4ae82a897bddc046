"""The command reference as Markdown (docs/cli.md), made from the commands themselves when the site is built: each
command's text as `--help` shows it (its unwrapped blocks, the examples among them, as code blocks), its usage, and
every option as `--help` lists it (its defaults and ranges as `--help` says them). Everything taken from the
commands is escaped, so nothing in it is read as Markdown (`PEER_*` stays as written)."""

from __future__ import annotations

import html
import inspect
import re

import click

SPECIAL = re.compile(r"([\\`*_{}\[\]#!])")  # what Markdown reads as markup, escaped as Markdown escapes it


def escape(text: str) -> str:
    """Text as it is, on a Markdown page (a table cell's too: `|` and `<` become their HTML entities)."""
    return SPECIAL.sub(r"\\\1", html.escape(text, quote=False)).replace("|", "&#124;")


def code(text: str) -> str:
    """Inline code that a table cell can hold (a `|` in it would end the cell)."""
    return "<code>" + html.escape(text).replace("|", "&#124;") + "</code>"


def markdown(group: click.Group, prog: str = "pp-launch") -> str:
    """Every command of `group`, depth first, subcommands by name."""
    root = click.Context(group, info_name=prog)
    out: list[str] = []
    _command(group, root, out, 2)
    return "\n".join(out).rstrip() + "\n"


def _command(cmd: click.Command, ctx: click.Context, out: list[str], level: int) -> None:
    out += [f"{'#' * level} {ctx.command_path}", ""]
    out += _text(inspect.cleandoc(cmd.help or ""))
    usage = " ".join(cmd.collect_usage_pieces(ctx))
    out += ["```", f"{ctx.command_path} {usage}", "```", ""]
    rows = [r for p in cmd.get_params(ctx) if (r := p.get_help_record(ctx)) is not None]
    if rows:
        out += ["| option | what it does |", "|---|---|"]
        out += [f"| {code(opts)} | {escape(' '.join(help.split()))} |" for opts, help in rows]
        out.append("")
    if isinstance(cmd, click.Group):
        for name in sorted(cmd.list_commands(ctx)):
            sub = cmd.get_command(ctx, name)
            if sub is not None and not sub.hidden:
                _command(sub, click.Context(sub, info_name=name, parent=ctx), out, min(level + 1, 4))


def _text(help_text: str) -> list[str]:
    """A docstring as Click shows it: paragraphs (rewrapped), and a `\\b` paragraph kept line for line, here a code
    block (the examples)."""
    out: list[str] = []
    for paragraph in re.split(r"\n\s*\n", help_text.strip()):
        lines = paragraph.splitlines()
        if lines and lines[0].strip() == "\b":
            body = lines[1:]
            indent = min((len(line) - len(line.lstrip()) for line in body if line.strip()), default=0)
            head = body[0].strip() if body and body[0].strip().endswith(":") and not body[0].startswith("  ") else ""
            if head:
                out += [escape(head), ""]
                body = body[1:]
                indent = min((len(line) - len(line.lstrip()) for line in body if line.strip()), default=0)
            out += ["```", *(line[indent:] for line in body), "```", ""]
        else:
            out += [escape(" ".join(line.strip() for line in lines)), ""]
    return out
