"""JSON into typed dataclasses, strictly, and `section.key=value` overrides onto them.

Every value is checked against its field's type hint (int, float, str, bool, Optional, Literal,
list, dict, nested dataclass sections); a wrong key gets the nearest valid one, a wrong type
names the key, the type wanted and the value given. Override values are parsed with
`json.loads` (never eval); a bare word is a string where the field takes one. common.config
builds the case configs with it, common.cluster.remote the remote.json settings.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import types
import typing
from typing import Any, Literal, Sequence

from common.errors import UserError

__all__ = ["ConfigError", "apply_overrides", "build_dataclass", "parse_overrides"]


class ConfigError(UserError, ValueError):
    """A config that can't be used. The message names the file and the key."""


def parse_overrides(items: Sequence[str]) -> list[tuple[str, str]]:
    """Split `section.key=value` strings; the value is typed later, against the field."""
    out = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {item!r}: expected section.key=value, e.g. training.batch_size=16")
        out.append((key.strip(), value.strip()))
    return out


def apply_overrides(cfg: Any, overrides: Sequence[str], where: str) -> None:
    """Set each `section.key=value` of `overrides` on the dataclass `cfg`, typed and checked like
    its JSON; a ConfigError names the --set at fault."""
    for key, text in parse_overrides(overrides):
        target: Any = cfg
        parts = key.split(".")
        for depth, name in enumerate(parts):
            prefix = "".join(p + "." for p in parts[:depth])
            fields = {f.name: f for f in dataclasses.fields(target)}
            if name not in fields:
                raise ConfigError(f"--set {key}: {_unknown(name, fields, prefix)}")
            if depth < len(parts) - 1:
                target = getattr(target, name)
                if not dataclasses.is_dataclass(target):
                    raise ConfigError(f"--set {key}: '{'.'.join(parts[: depth + 1])}' is not a section")
        name = parts[-1]
        hint = typing.get_type_hints(type(target))[name]
        if dataclasses.is_dataclass(hint):
            raise ConfigError(f"--set {key}: '{key}' is a section; set one of its keys")
        setattr(target, name, _coerce(_parse_value(text, hint), hint, f"--set {key}", key))


def _parse_value(text: str, hint: Any) -> Any:
    # JSON literals (16, 3e-4, true, null, "x") are data, never code; a bare word is a string.
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return (
            text
            if str in _allowed_types(hint) or _literal_values(hint) or typing.get_origin(hint) is list
            else _Unparsed(text)
        )


class _Unparsed(str):
    """Override text that is not a JSON value, kept so the type error can quote it."""


def build_dataclass(cls: type, raw: dict, where: str, prefix: str) -> Any:
    """An instance of the dataclass `cls` (its nested sections too) from a JSON object, every value
    checked against its field's type; ConfigError names `where` and the key (`prefix`: '' or 'section.').
    Keys starting with "_" are comments."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for key, value in raw.items():
        if key.startswith("_"):  # "_comment" keys document a config file
            continue
        if key not in fields:
            raise ConfigError(f"{where}: {_unknown(key, fields, prefix)}")
        full = f"{prefix}{key}"
        hint = hints[key]
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):
            if not isinstance(value, dict):
                raise ConfigError(f"{where}: '{full}' must be an object (a section), got {_jtype(value)}")
            kwargs[key] = build_dataclass(hint, value, where, prefix=f"{full}.")
        else:
            kwargs[key] = _coerce(value, hint, where, full)
    return cls(**kwargs)


def _unknown(key: str, fields: dict, prefix: str) -> str:
    """`prefix` is '' or 'section.'; the message suggests the nearest valid key."""
    close = difflib.get_close_matches(key, list(fields), n=1, cutoff=0.5)
    hint = f" (did you mean '{prefix}{close[0]}'?)" if close else f" (valid keys: {', '.join(fields)})"
    return f"unknown key '{prefix}{key}'{hint}"


def _allowed_types(hint: Any) -> tuple:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return tuple(t for arg in typing.get_args(hint) for t in _allowed_types(arg))
    if origin is Literal:
        return tuple({type(v) for v in typing.get_args(hint)})
    return (hint,)


def _literal_values(hint: Any) -> tuple:
    origin = typing.get_origin(hint)
    if origin is Literal:
        return typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return tuple(v for arg in typing.get_args(hint) for v in _literal_values(arg))
    return ()


def _coerce(value: Any, hint: Any, where: str, key: str) -> Any:
    if hint is Any:  # a free-form value (data.synthetic's): its section's check types it
        return value
    if typing.get_origin(hint) is list:
        (item_t,) = typing.get_args(hint)
        if isinstance(value, str):  # --set data.categories=crypto,fx
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, list):
            raise ConfigError(f"{where}: '{key}' must be a list, got {_jtype(value)} {value!r}")
        return [_coerce(v, item_t, where, key) for v in value]
    if typing.get_origin(hint) is dict:
        key_t, val_t = typing.get_args(hint)
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: '{key}' must be an object, got {_jtype(value)} {value!r}")
        return {_coerce(k, key_t, where, key): _coerce(v, val_t, where, f"{key}.{k}") for k, v in value.items()}
    allowed = _allowed_types(hint)
    literals = _literal_values(hint)
    if value is None:
        if type(None) in allowed:
            return None
        raise ConfigError(f"{where}: '{key}' may not be null; expected {_describe(hint)}")
    if isinstance(value, _Unparsed):
        raise ConfigError(f"{where}: '{key}' = {str(value)!r} is not {_describe(hint)}")
    if literals:
        if value in literals and not isinstance(value, bool):
            return value
        raise ConfigError(f"{where}: '{key}' = {value!r} is not one of {', '.join(map(repr, literals))}")
    # bool is an int in Python; a config that says `"epochs": true` is still wrong.
    if isinstance(value, bool):
        if bool in allowed:
            return value
    elif isinstance(value, int) and int in allowed:
        return value
    elif isinstance(value, (int, float)) and float in allowed:
        return float(value)
    elif isinstance(value, float) and int in allowed and value.is_integer():
        return int(value)
    elif isinstance(value, str) and str in allowed:
        return value
    raise ConfigError(f"{where}: '{key}' must be {_describe(hint)}, got {_jtype(value)} {value!r}")


def _describe(hint: Any) -> str:
    lits = _literal_values(hint)
    names = {int: "an integer", float: "a number", str: "a string", bool: "true or false", type(None): "null"}
    parts = [f"one of {', '.join(map(repr, lits))}"] if lits else []
    parts += [
        names.get(t, getattr(t, "__name__", str(t)))
        for t in _allowed_types(hint)
        if not (lits and t in {type(v) for v in lits})
    ]
    return " or ".join(parts)


def _jtype(value: Any) -> str:
    if isinstance(value, _Unparsed):
        return "text that is not JSON"
    return {
        bool: "boolean",
        int: "integer",
        float: "number",
        str: "string",
        list: "list",
        dict: "object",
        type(None): "null",
    }.get(type(value), type(value).__name__)
