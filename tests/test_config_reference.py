"""docs/config_reference.md is what common/config/reference.py renders now: every key of every
config dataclass once, its default the dataclass's, and a meaning for each (a comment in
common/config/__init__.py)."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
import typing
from collections import Counter
from typing import Any, Dict, List, Literal, Optional

from common.config import Config
from common.config.reference import COMMAND, field_comments, render, type_name
from common.paths import REPO_ROOT

PAGE = REPO_ROOT / "docs" / "config_reference.md"
STALE = f"docs/config_reference.md is out of date with common/config/__init__.py: run `{COMMAND}`"


def _keys(cls: type = Config, prefix: str = "") -> tuple[dict[str, Any], list[str]]:
    """Every key's dataclass default by dotted name, and the dotted names of the nested sections."""
    defaults, sections = {}, []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            sections.append(prefix + f.name)
            inner, nested = _keys(hints[f.name], f"{prefix}{f.name}.")
            defaults.update(inner)
            sections += nested
        else:
            defaults[prefix + f.name] = f.default if f.default is not dataclasses.MISSING else f.default_factory()
    return defaults, sections


def _classes(cls: type = Config) -> list[type]:
    """`cls` and the dataclasses of its sections, nested ones too."""
    hints = typing.get_type_hints(cls)
    return [cls] + [
        c for f in dataclasses.fields(cls) if dataclasses.is_dataclass(hints[f.name]) for c in _classes(hints[f.name])
    ]


def _rows(page: str) -> list[list[str]]:
    """The cells of every table row that names a key: key, type, default, meaning."""
    rows = []
    for line in page.splitlines():
        if line.startswith("| `"):
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
            rows.append([c.replace("\\|", "|") for c in cells])
    return rows


def test_the_committed_page_is_what_the_generator_renders():
    assert PAGE.read_text(encoding="utf-8") == render(), STALE


def test_the_stated_command_prints_the_page():
    out = subprocess.run(
        [sys.executable, "-m", "common.config.reference"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    assert out == render()
    assert f"`{COMMAND}`; do not edit by hand" in out


def test_every_key_and_section_appears_exactly_once():
    page = PAGE.read_text(encoding="utf-8")
    defaults, sections = _keys()
    assert Counter(row[0].strip("`") for row in _rows(page)) == Counter(list(defaults))
    assert re.findall(r"^## `(.+)`$", page, re.M) == sections
    assert "data.exchange_universe" in sections  # the nested section has its own table


def test_every_default_in_the_table_is_the_dataclass_default():
    defaults, _ = _keys()
    for key, _type, default, _meaning in _rows(PAGE.read_text(encoding="utf-8")):
        shown = json.loads(default.strip("`"))
        expected = defaults[key.strip("`")]
        assert (shown, type(shown)) == (expected, type(expected)), f"{key}: {STALE}"


def test_every_field_has_a_meaning_beside_it():
    meanings = field_comments((REPO_ROOT / "common" / "config" / "__init__.py").read_text(encoding="utf-8"))
    missing = [
        f"{c.__name__}.{f.name}"
        for c in _classes()
        for f in dataclasses.fields(c)
        if not meanings.get((c.__name__, f.name))
    ]
    assert missing == [], "write what these fields mean as a comment beside them in common/config/__init__.py"


def test_comments_beside_and_just_above_a_field_are_its_meaning():
    source = '''
class A:
    """A docstring is not a field's meaning."""
    x: int = 1  # beside
    # unrelated, then a blank line

    # above, first line
    # above, second line
    y: str = "a"  # and beside
    z: bool = True
    def f(self) -> None:  # not a field
        pass
'''
    assert field_comments(source) == {
        ("A", "x"): "beside",
        ("A", "y"): "above, first line above, second line and beside",
        ("A", "z"): "",
    }


def test_type_names_read_as_json():
    assert type_name(int) == "int"
    assert type_name(Optional[int]) == "int | null"
    assert type_name(Literal["flat", "factorized"]) == '"flat" | "factorized"'
    assert type_name(Optional[Literal["auto"]]) == '"auto" | null'
    assert type_name(List[str]) == "list[str]"
    assert type_name(Dict[str, Any]) == "dict[str, any]"
