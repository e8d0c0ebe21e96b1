"""Typed stage configs: dataclass defaults < YAML file < `key=value` overrides on the CLI.

Unknown keys fail with a did-you-mean, wrong types fail naming the key; both exit with code 2.
A YAML file may hold one stage's keys at top level, or a whole experiment with one section
per stage (`generate:`, `filter:`, ...): a stage reads its own section.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml

from pipeline.errors import PipelineError

T = TypeVar("T")


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, help="YAML file (a stage's keys, or an experiment with a section per stage)")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="override a config key, e.g. limit=8 llm.temperature=0.7")


def load_config(cls: type[T], path: str | Path | None = None, overrides: list[str] | None = None,
                section: str | None = None) -> T:
    data = read_section(path, section) if path is not None else {}
    for item in overrides or []:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise PipelineError(f"override '{item}' is not key=value (e.g. limit=8)")
        set_dotted(data, key.strip(), parse_value(key.strip(), raw))
    return build(cls, data, where=str(path) if path else "config")


def read_section(path: str | Path, section: str | None) -> dict[str, Any]:
    """A YAML file's keys for one stage: its `section` when it has one, else the whole file."""
    data = read_yaml(path)
    if section and isinstance(data.get(section), dict):
        return data[section]
    return data


def parse_value(key: str, raw: str):
    """A `key=value` override's value, read as (safe) YAML: `8`, `0.7`, `true`, `[react, act]`."""
    if not raw.strip():
        return ""
    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        reason = str(exc).splitlines()[0]
        raise PipelineError(f"override '{key}': value {raw!r} is not valid YAML ({reason})") from None


def read_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.exists():
        raise PipelineError(f"config file not found: {path}")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        raise PipelineError(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise PipelineError(f"{path}: expected a mapping of config keys at the top level")
    return data


def set_dotted(data: dict, key: str, value: Any) -> None:
    parts = key.split(".")
    for part in parts[:-1]:
        data = data.setdefault(part, {})
        if not isinstance(data, dict):
            raise PipelineError(f"override '{key}': '{part}' is not a section")
    data[parts[-1]] = value


def build(cls: type[T], data: dict[str, Any], where: str = "config", prefix: str = "") -> T:
    """Instantiate dataclass `cls` from a mapping, checking every key and type."""
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    kwargs = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if key not in fields:
            raise PipelineError(f"{where}: unknown key '{name}'{unknown_key_hint(cls, key, prefix, fields)}")
        kwargs[key] = coerce(value, hints[key], name, where)
    try:
        obj = cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise PipelineError(f"{where}: {exc}") from None
    return obj


def unknown_key_hint(cls: type, key: str, prefix: str, fields) -> str:
    """Name the new key of a renamed one, the reason of a removed one, else the closest key."""
    renamed = getattr(cls, "RENAMED_KEYS", {})
    removed = getattr(cls, "REMOVED_KEYS", {})
    if key in renamed:
        return f"; it was renamed: use '{prefix}{renamed[key]}'"
    if key in removed:
        return f"; it was removed ({removed[key]}): delete it"
    close = difflib.get_close_matches(key, list(fields), n=1)
    return f"; did you mean '{prefix}{close[0]}'?" if close else f"; known keys: {', '.join(sorted(fields))}"


def upgrade_keys(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    """A mapping written with older key names (e.g. a manifest's config) in today's names:
    renamed keys moved (`RENAMED_KEYS` of each dataclass), removed ones dropped."""
    if not dataclasses.is_dataclass(cls) or not isinstance(data, dict):
        return data
    renamed, removed = getattr(cls, "RENAMED_KEYS", {}), getattr(cls, "REMOVED_KEYS", {})
    out = {renamed.get(k, k): v for k, v in data.items() if k not in removed}
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name in out:
            out[f.name] = upgrade_keys(nested_dataclass(hints[f.name]), out[f.name])
    return out


def nested_dataclass(annotation: Any) -> Any:
    """The dataclass inside `X` or `X | None`, else None."""
    for candidate in (annotation, *typing.get_args(annotation)):
        if dataclasses.is_dataclass(candidate):
            return candidate
    return None


def coerce(value: Any, annotation: Any, name: str, where: str) -> Any:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return coerce(value, arg, name, where)
            except PipelineError as exc:
                errors.append(str(exc))
        raise PipelineError(errors[0] if errors else f"{where}: '{name}' must not be null")
    if dataclasses.is_dataclass(annotation):
        if not isinstance(value, dict):
            raise PipelineError(f"{where}: '{name}' must be a mapping")
        return build(annotation, value, where, prefix=f"{name}.")
    if origin in (list, tuple):
        if isinstance(value, str | int | float):
            value = [value]  # `methods=react` on the command line means a one-item list
        if not isinstance(value, list | tuple):
            raise PipelineError(f"{where}: '{name}' must be a list, got {type(value).__name__}")
        item_type = args[0] if args else Any
        return [coerce(v, item_type, f"{name}[{i}]", where) for i, v in enumerate(value)]
    if origin is dict or annotation is dict:
        if not isinstance(value, dict):
            raise PipelineError(f"{where}: '{name}' must be a mapping, got {type(value).__name__}")
        return value
    if annotation is Any:
        return value
    if typing.get_origin(annotation) is typing.Literal:
        if value not in args:
            raise PipelineError(f"{where}: '{name}' must be one of {list(args)}, got {value!r}")
        return value
    if annotation is bool:
        if isinstance(value, bool):
            return value
        raise PipelineError(f"{where}: '{name}' must be true or false, got {value!r}")
    if annotation is float and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if annotation is float and isinstance(value, str):
        try:
            return float(value)  # YAML 1.1 reads `1e-4` (no dot) as a string
        except ValueError:
            pass
    if annotation is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if annotation is str and isinstance(value, str | int | float) and not isinstance(value, bool):
        return str(value)
    if annotation is Path and isinstance(value, str | Path):
        return Path(value)
    raise PipelineError(f"{where}: '{name}' must be {getattr(annotation, '__name__', annotation)}, got {value!r}")


def to_dict(cfg: Any) -> dict[str, Any]:
    """A JSON-friendly copy for manifests (paths as strings)."""
    def convert(v):
        if isinstance(v, Path):
            return str(v)
        if isinstance(v, dict):
            return {k: convert(x) for k, x in v.items()}
        if isinstance(v, list | tuple):
            return [convert(x) for x in v]
        return v
    return convert(dataclasses.asdict(cfg))
