"""The config reference (docs/config_reference.md): every key, its type, default and meaning.

Rendered from the dataclasses of common/config/__init__.py, and each meaning is read from the comment
beside (or the comment lines just above) its field there, so a key is explained in one place
only. tests/test_config_reference.py fails when the committed page differs from `render()`.
"""

from __future__ import annotations

import ast
import dataclasses
import io
import json
import sys
import tokenize
import types
import typing
from pathlib import Path
from typing import Any, Iterator, Literal

from common import config
from common.config import Config

COMMAND = "python -m common.config.reference > docs/config_reference.md"


def field_comments(source: str) -> dict[tuple[str, str], str]:
    """(class name, field name) -> the comment lines just above the field and the one beside it,
    joined into one line, for every annotated field of every top-level class in `source`."""
    comments = {
        tok.start[0]: tok.string.lstrip("#").strip()
        for tok in tokenize.generate_tokens(io.StringIO(source).readline)
        if tok.type == tokenize.COMMENT
    }
    lines = source.splitlines()
    out = {}
    for cls in ast.parse(source).body:
        if not isinstance(cls, ast.ClassDef):
            continue
        for node in cls.body:
            if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
                continue
            above: list[str] = []
            line = node.lineno - 1  # the line above (ast and tokenize count from 1, hence lines[line - 1])
            while line in comments and lines[line - 1].lstrip().startswith("#"):
                above.insert(0, comments[line])
                line -= 1
            end = node.end_lineno or node.lineno  # set by ast.parse
            beside = [comments[n] for n in range(node.lineno, end + 1) if n in comments]
            out[(cls.name, node.target.id)] = " ".join(above + beside)
    return out


def type_name(hint: Any) -> str:
    """A field's type as a config file sees it: `int | null`, `"flat" | "factorized"`, `list[str]`."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is type(None):
        return "null"
    if hint is Any:
        return "any"
    if origin is Literal:
        return " | ".join(json.dumps(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(a) for a in args)
    if origin is list:
        return f"list[{type_name(args[0])}]"
    if origin is dict:
        return f"dict[{type_name(args[0])}, {type_name(args[1])}]"
    return hint.__name__


def _cell(text: str) -> str:
    """Text fit for a table cell: `|` would end the cell, and a `<name>` outside a code span would
    read as an HTML tag (and vanish)."""
    parts = text.split("`")
    parts[::2] = [p.replace("<", "&lt;") for p in parts[::2]]
    return "`".join(parts).replace("|", "\\|")


def _sections(
    cls: type, prefix: str = "", owner: tuple[str, str] | None = None
) -> Iterator[tuple[str, type, tuple[str, str] | None]]:
    """(dotted prefix of the keys, section class, the (class, field) that holds it, None at the top)
    for `cls` and every section nested in it, each after its parent."""
    yield prefix, cls, owner
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            yield from _sections(hints[f.name], f"{prefix}{f.name}.", (cls.__name__, f.name))


def render() -> str:
    """The Markdown page: one table per section, one row per key."""
    meaning = field_comments(Path(config.__file__).read_text(encoding="utf-8"))
    out = [
        "# Config reference",
        "",
        f"Generated from `common/config/__init__.py` by `{COMMAND}`; do not edit by hand.",
        "",
        "Every key a config file or `--set` takes: its type, its default (as JSON) and what it means.",
        "How configs load and are checked: [configs.md](configs.md).",
        "",
    ]
    for prefix, cls, owner in _sections(Config):
        out += [f"## `{prefix.rstrip('.')}`", "", _cell(meaning[owner]), ""] if owner else ["## Top level", ""]
        hints = typing.get_type_hints(cls)
        defaults = cls()
        out += ["| key | type | default | meaning |", "|---|---|---|---|"]
        out += [
            f"| `{prefix}{f.name}` | `{_cell(type_name(hints[f.name]))}` "
            f"| `{_cell(json.dumps(getattr(defaults, f.name)))}` | {_cell(meaning[(cls.__name__, f.name)])} |"
            for f in dataclasses.fields(cls)
            if not dataclasses.is_dataclass(hints[f.name])
        ]
        out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    sys.stdout.write(render())
