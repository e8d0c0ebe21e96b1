"""Typed stage configs: dataclass defaults < YAML file < `key=value` overrides on the CLI.

Unknown keys fail with a did-you-mean, wrong types fail naming the key, an integer below the
least value its field declares (`at_least`, in the field's metadata) fails naming the bound, and a
value its field's own check refuses (`checked`: a range, a library's list of names, a folder name)
fails saying why; all exit with code 2, and name where the bad key came from (the YAML file or the
command line), before any stage's own code (or a library it hands the value to) sees it.
A YAML file may hold one stage's keys at top level, or a whole experiment with one section
per stage (`generate:`, `filter:`, ...): a stage reads its own section.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import difflib
import inspect
import io
import textwrap
import tokenize
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import yaml

from pipeline.core.errors import PipelineError, os_error_message

T = TypeVar("T")

AT_LEAST = "at_least"  # field metadata: the least value an int key takes (checked by build)
CHECK = "check"  # field metadata: a function of a given value saying why it is refused, or None (checked by build)
COMMAND_LINE = "the command line"


def at_least(minimum: int, why: str = "", **field_kwargs) -> Any:
    """A dataclass field (`default=` / `default_factory=` as for `dataclasses.field`) whose
    value, when an int, must be >= `minimum`; `build` refuses a lower one in one line, before
    any stage's own code sees it (a batch bound of 0 used to end in a traceback deep inside)."""
    metadata = {**field_kwargs.pop("metadata", {}), **bound(minimum, why)}
    return dataclasses.field(metadata=metadata, **field_kwargs)


def bound(minimum: int, why: str = "") -> dict[str, Any]:
    """The metadata `at_least` adds, for a field made by another helper (e.g. same_run's
    `metadata=`); `why`: the reason the error line gives, where the bound is not obvious."""
    return {AT_LEAST: minimum, "at_least_why": why}


def checked(test: Callable[[Any], str | None], **field_kwargs) -> Any:
    """A dataclass field (`default=` / `default_factory=` as for `dataclasses.field`) whose given
    value `build` refuses in one line when `test(value)` returns a reason (a str), before a stage
    or a library sees it: a typo in `optim` used to surface after the model had loaded."""
    metadata = {**field_kwargs.pop("metadata", {}), **check(test)}
    return dataclasses.field(metadata=metadata, **field_kwargs)


def check(test: Callable[[Any], str | None]) -> dict[str, Any]:
    """The metadata `checked` adds, for a field made by another helper (e.g. same_run's `metadata=`)."""
    return {CHECK: test}


def in_range(low: float | None = None, high: float | None = None, *, above: bool = False,
             below: bool = False) -> Callable[[Any], str | None]:
    """A `checked` test: low <= value <= high (`above`: value > low, `below`: value < high); None passes."""
    def test(value: Any) -> str | None:
        if value is None or isinstance(value, bool) or not isinstance(value, int | float):
            return None
        too_low = low is not None and (value <= low if above else value < low)
        too_high = high is not None and (value >= high if below else value > high)
        if too_low or too_high:
            return f"must be {range_text(low, high, above, below)}, got {value}"
        return None
    test.bounds = (low, high, above, below)  # what a test reads to try a value outside (tests/test_first_use.py)
    return test


def range_text(low: float | None, high: float | None, above: bool, below: bool) -> str:
    parts = []
    if low is not None:
        parts.append(f"{'>' if above else '>='} {low:g}")
    if high is not None:
        parts.append(f"{'<' if below else '<='} {high:g}")
    return " and ".join(parts)


def one_of(choices: Callable[[], list[str]] | tuple[str, ...], what: str = "") -> Callable[[Any], str | None]:
    """A `checked` test: the value is one of `choices` (or what a function returns: a library's own
    list, read when a value is given, so that a config module imports no library); None passes."""
    def test(value: Any) -> str | None:
        names = list(choices() if callable(choices) else choices)
        if value is None or value in names:
            return None
        close = difflib.get_close_matches(str(value), names, n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        return f"must be one of {what + ': ' if what else ''}{', '.join(names)}; got {value!r}{hint}"
    return test


def folder_name(value: Any) -> str | None:
    """A `checked` test, the one check of every name a user gives that becomes a path (an
    experiment, a student's label, a run's output name, a figure's file stem, a published folder):
    one non-empty path part on one line, so what it names stays inside its output folder and is
    not hidden there (`plot name=` once wrote `.png`, `publish name=../x` wrote beside its folder)."""
    if value is None:
        return None
    text = str(value)
    if not text.strip():
        return "must not be empty (it names an output folder)"
    if not text.isprintable():  # a newline, a NUL, a control character
        return f"must be one line of printable characters (it names an output folder or file), got {text!r}"
    if "/" in text or "\\" in text or ".." in text or text.startswith("."):
        return (f"must be one folder name (no '/', no '..', no '\\', not starting with '.': it names a folder "
                f"or file inside the output folder), got {text!r}; e.g. smollm2-135m")
    return None


def http_url(value: Any) -> str | None:
    """A `checked` test: an http(s) URL with a host (a server the stage reaches later); None passes."""
    from urllib.parse import urlsplit

    if value is None:
        return None
    parts = urlsplit(str(value))
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"must be an http(s) URL with a host, e.g. http://gpu01:8000; got {value!r}"
    return None


def repeated_items(values: list) -> list[str]:
    """The items a list names more than once, sorted."""
    return sorted({str(v) for v in values if values.count(v) > 1})


def distinct(values: Any) -> str | None:
    """A `checked` test: a list names each item once (a repeated format would train or evaluate
    twice into one folder, or run twice for nothing)."""
    if not isinstance(values, list):
        return None
    repeated = repeated_items(values)
    return f"names {repeated[0]!r} more than once; name each once" if repeated else None


def listed(values: Any) -> str | None:
    """A `checked` test: a selection that is not empty (an empty one runs nothing without a word)
    and names each item once."""
    if isinstance(values, list) and not values:
        return "is empty; name at least one"
    return distinct(values)


def int_at_least(minimum: int, option: str) -> Callable[[str], int]:
    """An argparse `type=` for the int `option` with a least value, the `at_least` of options:
    `--num-processes 0` is refused in one line, exit 2 (a PipelineError passes through argparse),
    not read as "not given"."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise PipelineError(f"{option}: {text!r} is not an integer") from None
        if value < minimum:
            raise PipelineError(f"{option} must be >= {minimum}, got {value}")
        return value
    parse.__name__ = f"int >= {minimum}"
    return parse


def int_bound(f: dataclasses.Field) -> int | None:
    return f.metadata.get(AT_LEAST)


def add_config_arguments(parser: argparse.ArgumentParser, cls: type) -> None:
    """--config, key=value overrides and --print-config; `--help` then lists every key of `cls`
    (every stage's does, as the README says) and an override example of one of them."""
    parser.add_argument("--config", type=Path, help="YAML file (a stage's keys, or an experiment with a section per stage)")
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help=f"override a config key, e.g. {example_override(cls)}")
    parser.add_argument("--print-config", action="store_true",
                        help="print the effective config (defaults < YAML < overrides) as YAML and exit")
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = config_help(cls)


def stage_config(cls: type[T], args: argparse.Namespace, section: str | None = None,
                 finish: Callable[[T], T] | None = None, read: Callable[[Path], dict] | None = None) -> T:
    """The stage's config from `--config` and overrides (then `finish`, e.g. resolving defaults
    that depend on other keys); with `--print-config`, print it and exit without running."""
    cfg = load_config(cls, args.config, args.overrides, section=section, read=read)
    if finish is not None:
        cfg = finish(cfg)
    if getattr(args, "print_config", False):
        print(yaml.safe_dump(to_dict(cfg), sort_keys=False), end="")
        raise SystemExit(0)
    return cfg


def example_override(cls: type) -> str:
    """`key=value` of a key `cls` has (`--help` used to show `llm.temperature`, which no stage has)."""
    rows = {key: default for key, _, default, _ in config_keys(cls)}
    for key in ("limit", "max_steps"):
        if key in rows:
            return f"{key}=8"
    plain = [k for k, default in rows.items() if default not in ("null", "[]", "{}", "(required)")]
    key = next((k for k in ("experiment", "out_dir") if k in plain), plain[0] if plain else next(iter(rows)))
    return f"{key}={rows[key]}"


def config_help(cls: type) -> str:
    """Every key of `cls` (nested sections dotted) with its type, default and the comment that
    documents it in the dataclass source, for the end of `--help`."""
    rows = config_keys(cls)
    width = min(max(len(key) for key, *_ in rows), 32)
    lines = ["config keys (key=value on the command line, or in the YAML file):"]
    for key, kind, default, doc in rows:
        lines.append(f"  {key:<{width}}  {kind} = {default}" + (f"  # {doc}" if doc else ""))
    return "\n".join(lines)


def config_keys(cls: type, prefix: str = "") -> list[tuple[str, str, str, str]]:
    """(dotted key, type as written, default, comment) for each field, nested sections expanded."""
    hints, source = typing.get_type_hints(cls), field_source(cls)
    rows = []
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        nested = nested_dataclass(hints[f.name])
        kind, doc = source.get(f.name, (str(hints[f.name]), ""))
        if nested is not None and f.default is None:  # an optional section: not expanded
            rows.append((f"{prefix}{f.name}", kind, "null", doc))
        elif nested is not None:
            rows += config_keys(nested, prefix=f"{prefix}{f.name}.")
        else:
            rows.append((f"{prefix}{f.name}", kind, default_text(f), doc))
    return rows


def default_text(f: dataclasses.Field) -> str:
    if f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    elif f.default is dataclasses.MISSING:
        return "(required)"
    else:
        value = f.default
    value = str(value) if isinstance(value, Path) else value
    return yaml.safe_dump(value, default_flow_style=True, width=10_000).strip().removesuffix("\n...").strip()


def field_source(cls: type) -> dict[str, tuple[str, str]]:
    """{field: (annotation as written, its comment)} read from the class source: the comment at
    the end of the field's line, else the comment lines right above it. A subclass that changes
    some defaults keeps its bases' comments for the others."""
    out: dict[str, tuple[str, str]] = {}
    for klass in reversed(cls.__mro__):
        if dataclasses.is_dataclass(klass):
            out.update(own_field_source(klass))
    return out


def own_field_source(cls: type) -> dict[str, tuple[str, str]]:
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    comments = {tok.start[0]: tok.string.lstrip("#").strip()
                for tok in tokenize.generate_tokens(io.StringIO(source).readline) if tok.type == tokenize.COMMENT}
    lines = source.splitlines()
    out = {}
    for node in ast.parse(source).body[0].body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            doc = comments.get(node.end_lineno, "")
            above = node.lineno - 1
            while not doc and above >= 1 and lines[above - 1].strip().startswith("#"):
                above -= 1
            if not doc and above < node.lineno - 1:
                doc = " ".join(comments[n] for n in range(above + 1, node.lineno))
            out[node.target.id] = (ast.unparse(node.annotation), doc)
    return out


def load_config(cls: type[T], path: str | Path | None = None, overrides: list[str] | None = None,
                section: str | None = None, read: Callable[[Path], dict] | None = None) -> T:
    """`cls` from the YAML file at `path` (its `section`, or what `read` makes of the file), then
    the overrides."""
    read = read or (lambda p: read_section(p, section))
    data = read(path) if path is not None else {}
    given = set()
    for item in overrides or []:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise PipelineError(f"override '{item}' is not key=value (e.g. limit=8)")
        set_dotted(data, key.strip(), parse_value(key.strip(), raw))
        given.add(key.strip())
    return build(cls, data, where=str(path) if path else "config", given=frozenset(given))


# The sections of an experiment YAML (`run`'s): a file with `students:` or two of these is one
EXPERIMENT_SECTIONS = ("generate", "filter", "train", "grpo", "eval", "plot", "self_training")


def read_section(path: str | Path, section: str | None) -> dict[str, Any]:
    """A YAML file's keys for one stage: its `section` when it has one, else the whole file;
    an experiment without that section is refused by name (not by its first other key)."""
    data = read_yaml(path)
    if section and isinstance(data.get(section), dict):
        return data[section]
    if section and is_experiment(data):
        raise PipelineError(f"{path} is an experiment (a section per stage) with no `{section}:` section; "
                            f"add one, or give --config a YAML of {section}'s own keys")
    return data


def is_experiment(data: dict[str, Any]) -> bool:
    sections = [k for k in EXPERIMENT_SECTIONS if isinstance(data.get(k), dict)]
    return "students" in data or len(sections) >= 2


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
    if not path.is_file():
        raise PipelineError(f"config file {path} is a folder (or not a regular file); give a YAML file")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        raise PipelineError(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    except UnicodeDecodeError:
        raise PipelineError(f"config file {path} is not UTF-8 text; give a YAML file") from None
    except OSError as exc:
        raise PipelineError(f"config file {os_error_message(exc, path)}") from None
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


def build(cls: type[T], data: dict[str, Any], where: str = "config", prefix: str = "",
          given: frozenset[str] = frozenset()) -> T:
    """Instantiate dataclass `cls` from a mapping, checking every key, type and declared bound.
    `given`: the dotted keys set on the command line, whose errors name it instead of `where`."""
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    kwargs = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        # a key given on the command line, or a section one of its dotted keys opened (`llm.device=`)
        source = COMMAND_LINE if name in given or any(g.startswith(f"{name}.") for g in given) else where
        if key not in fields:
            raise PipelineError(f"{source}: unknown key '{name}'{unknown_key_hint(cls, key, prefix, fields)}")
        kwargs[key] = coerce(value, hints[key], name, source, given)
        check_bound(fields[key], kwargs[key], name, source)
        check_value(fields[key], kwargs[key], name, source)
    try:
        obj = cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise PipelineError(f"{where}: {exc}") from None
    return obj


def check_bound(f: dataclasses.Field, value: Any, name: str, where: str) -> None:
    least = int_bound(f)
    if least is not None and isinstance(value, int) and not isinstance(value, bool) and value < least:
        why = f.metadata.get("at_least_why")
        raise PipelineError(f"{where}: '{name}' must be >= {least}, got {value}" + (f" ({why})" if why else ""))


def check_value(f: dataclasses.Field, value: Any, name: str, where: str) -> None:
    test = f.metadata.get(CHECK)
    reason = test(value) if test is not None else None
    if reason:
        raise PipelineError(f"{where}: '{name}' {reason}")


def unknown_key_hint(cls: type, key: str, prefix: str, fields) -> str:
    """Name the new key of a renamed one, the reason of a removed one, our key for another
    library's name of it (`SYNONYMS`: TRL's `num_generations` is `group_size`, which string
    distance would not find: it says `num_iterations`), else the closest key."""
    renamed = getattr(cls, "RENAMED_KEYS", {})
    removed = getattr(cls, "REMOVED_KEYS", {})
    synonyms = getattr(cls, "SYNONYMS", {})
    if key in renamed:
        return f"; it was renamed: use '{prefix}{renamed[key]}'"
    if key in removed:
        return f"; it was removed ({removed[key]}): delete it"
    if key in synonyms:
        ours, whose = synonyms[key]
        return f"; did you mean '{prefix}{ours}'? ({whose} '{key}' is this project's '{prefix}{ours}')"
    close = difflib.get_close_matches(key, list(fields), n=1)
    return f"; did you mean '{prefix}{close[0]}'?" if close else f"; known keys: {', '.join(sorted(fields))}"


def upgrade_keys(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    """A mapping written with older key names (e.g. a manifest's config) in today's names:
    renamed keys moved (`RENAMED_KEYS` of each dataclass), removed ones dropped; a dataclass's
    `UPGRADE_OLD` (a function of the mapping) first moves what a rename cannot (e.g. generate's
    `teacher.backend: oracle` to its `oracle` key: pipeline.agent.answerers.upgrade_oracle)."""
    if not dataclasses.is_dataclass(cls) or not isinstance(data, dict):
        return data
    upgrade = getattr(cls, "UPGRADE_OLD", None)
    if upgrade is not None:
        data = upgrade(data)
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


def coerce(value: Any, annotation: Any, name: str, where: str, given: frozenset[str] = frozenset()) -> Any:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return coerce(value, arg, name, where, given)
            except PipelineError as exc:
                errors.append(str(exc))
        raise PipelineError(errors[0] if errors else f"{where}: '{name}' must not be null")
    if dataclasses.is_dataclass(annotation):
        if not isinstance(value, dict):
            raise PipelineError(f"{where}: '{name}' must be a mapping")
        return build(annotation, value, where, prefix=f"{name}.", given=given)
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


def merged(*layers: dict) -> dict[str, Any]:
    """Deep-merge config mappings, later layers winning."""
    out: dict[str, Any] = {}
    for layer in layers:
        for key, value in (layer or {}).items():
            if isinstance(value, dict) and isinstance(out.get(key), dict):
                out[key] = merged(out[key], value)
            else:
                out[key] = value
    return out


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
