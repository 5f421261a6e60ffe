"""Typed configs: dataclasses filled from a YAML file, then from command-line flags.

A config file holds one section per command, named after it (`agentic_retriever.app.commands`: ``index_build``
for ``agentic-retriever index build``), and three shared settings every command reads:

* ``workdir``: the run folder; a path setting left empty takes its default from it (the ``derive`` template in
  the field's metadata, e.g. ``{workdir}/data``), so a config names each path once;
* ``retrieval: {index, url}``: the retriever every command searches (``{index}`` in a template);
* ``agent: {model, precision, ...}``: the agent LLM wherever one is loaded.

A file may start from another: ``extends: agentic_r_loop.yaml`` (a path relative to the file) reads that file
first and merges this one over it, mapping by mapping (any other value replaces), so a variant states only what it
changes (`merged_sections`; chains are followed, a cycle is an error naming the files).

A command's own section may override a shared setting; flags override both. Every dataclass field is both a
YAML key and a flag: ``--out``, nested ``--encoder.model``, ``--dense.ef-search``; booleans get
``--flag/--no-flag``; mappings take a JSON object; ``none`` on the command line sets an optional field to None.
Field metadata: ``help``; ``required`` (an empty value is an error naming the setting, and ``--help`` says
"required"); ``derive`` (the default's template); ``alias`` (a second flag, e.g. ``--index``).

Every value is checked against its field's declared type when it is read, file and flags alike (pydantic's
validation: an error names the file, section, field and the type expected, before any work), and non-UTF-8
bytes in a config file are an error naming its line. Unknown sections and keys are errors naming the file and the
valid names. Names of the previous release (a
section ``mine``, a key ``llm``, ``dtype: float32``) are still read, with a deprecation warning: a class lists
its renamed keys in a ``RENAMED`` class attribute (old key -> new dotted key). A key that moved to another command's
section is refused, naming where it lives now: a class lists it in ``MOVED`` (old key -> the new place, in words).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import types
import typing
import warnings
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml

from agentic_retriever.base.jsonl import read_utf8_text
from agentic_retriever.base.precision import PRECISION_ALIASES

T = TypeVar("T")

#: Settings at the top of a config file that every command reads.
SHARED_SETTINGS = ("workdir", "retrieval", "agent")
DEFAULT_WORKDIR = "runs/quickstart"


def _unwrap_optional(hint) -> tuple[Any, bool]:
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return rest[0], True
    return hint, False


def _scalar(kind, optional: bool):
    def convert(text: str):
        if optional and text.lower() in ("none", "null"):
            return None
        return kind(text)

    convert.__name__ = getattr(kind, "__name__", "value")
    return convert


def _precision(text: str) -> str:
    return normalize_precision(text, "command line")


def normalize_precision(value: str, where: str) -> str:
    """`value` in the one spelling (fp32, fp16, bf16, auto); the previous release's float32 etc. warn."""
    if value in PRECISION_ALIASES:
        warnings.warn(f"{where}: precision '{value}' is deprecated, write '{PRECISION_ALIASES[value]}'",
                      FutureWarning, stacklevel=3)
        return PRECISION_ALIASES[value]
    return value


def _json_mapping(text: str) -> dict:
    """A mapping flag's value, written as a JSON object (``--reward-options '{"lambda_f": 0.4}'``)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r} ({error})") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return value


def _default_text(f: dataclasses.Field) -> str:
    if f.metadata.get("required"):
        return "required"
    if f.metadata.get("derive"):
        return f"default: {f.metadata['derive']}"
    default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
    return f"default: {default}"


def add_dataclass_arguments(parser: argparse.ArgumentParser, cls: type, prefix: str = "") -> None:
    """Add one flag per (nested) field of `cls`; defaults stay unset so only given flags override."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if not prefix and f.name == "workdir":
            continue  # the shared --workdir flag sets it
        hint, optional = _unwrap_optional(hints[f.name])
        dest = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(hint):
            add_dataclass_arguments(parser, hint, prefix=f"{dest}.")
            continue
        flags = ["--" + dest.replace("_", "-")] + ([f.metadata["alias"]] if f.metadata.get("alias") else [])
        help_text = f"{f.metadata.get('help', '')} ({_default_text(f)})"
        common = {"dest": dest, "default": argparse.SUPPRESS, "help": help_text}
        if hint is bool:
            parser.add_argument(*flags, action=argparse.BooleanOptionalAction, **common)
        elif f.name == "precision" and typing.get_origin(hint) is Literal:
            parser.add_argument(*flags, choices=list(typing.get_args(hint)), type=_precision, **common)
        elif typing.get_origin(hint) is Literal:
            choices = list(typing.get_args(hint)) + (["none"] if optional else [])
            parser.add_argument(*flags, choices=choices, type=_scalar(str, optional), **common)
        elif typing.get_origin(hint) is dict:
            parser.add_argument(*flags, type=_json_mapping, metavar="JSON", **common)
        elif typing.get_origin(hint) is list:
            (item,) = typing.get_args(hint)
            parser.add_argument(*flags, nargs="+", type=item, metavar=item.__name__.upper(), **common)
        else:
            parser.add_argument(*flags, type=_scalar(hint, optional), metavar=getattr(hint, "__name__", "X").upper(),
                                **common)


def _set_dotted(obj, dotted: str, value, where: str) -> None:
    *parents, leaf = dotted.split(".")
    for part in parents:
        obj = getattr(obj, part)
    _apply(obj, {leaf: value}, where)


def _part_tables(cls: type, attribute: str, prefix: str = ""):
    """(flag prefix, class, its `attribute` table) for `cls` and every settings part nested in it."""
    yield prefix, cls, getattr(cls, attribute, {})
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        hint, _ = _unwrap_optional(hints[f.name])
        if dataclasses.is_dataclass(hint):
            yield from _part_tables(hint, attribute, f"{prefix}{f.name}.")


def _flag(prefix: str, key: str) -> str:
    return f"--{prefix}{key}".replace("_", "-")


def renamed_flags(cls: type) -> dict[str, str]:
    """Flags of the previous release -> their new spelling, from the ``RENAMED`` tables of `cls` and its parts."""
    return {_flag(prefix, old): _flag(prefix, new) for prefix, part, table in _part_tables(cls, "RENAMED")
            for old, new in table.items() if f"--{old}" != _alias_of(part, new)}


def moved_flags(cls: type) -> dict[str, str]:
    """Flags of keys that moved to another section (``MOVED`` of `cls` and its parts) -> where they live now."""
    return {_flag(prefix, old): where for prefix, _, table in _part_tables(cls, "MOVED") for old, where in table.items()}


def _alias_of(cls: type, dotted: str) -> str | None:
    """The second flag (``alias``) of the field at `dotted` in `cls`, if it has one."""
    *parents, leaf = dotted.split(".")
    for part in parents:
        cls = _unwrap_optional(typing.get_type_hints(cls)[part])[0]
    field = {f.name: f for f in dataclasses.fields(cls)}.get(leaf)
    return field.metadata.get("alias") if field is not None else None


def _move_renamed_nested(values: dict, renamed: dict[str, str]) -> dict:
    """`values` with renamed keys inside a part (``train.model``) lifted out under their dotted old name."""
    values = dict(values)
    for old in renamed:
        head, _, tail = old.partition(".")
        if tail and isinstance(values.get(head), dict) and tail in values[head]:
            values[head] = dict(values[head])
            values[old] = values[head].pop(tail)
    return values


def _apply(obj, values: dict, where: str) -> None:
    known = {f.name: f for f in dataclasses.fields(obj)}
    renamed = getattr(type(obj), "RENAMED", {})
    values = _move_renamed_nested(values, renamed)
    for key, value in values.items():
        if key not in known and key in getattr(type(obj), "MOVED", {}):
            raise ValueError(f"{where}: '{key}' is no longer set here: {type(obj).MOVED[key]}")
        if key not in known and key in renamed:
            warnings.warn(f"{where}: '{key}' is deprecated, write '{renamed[key]}'", FutureWarning, stacklevel=2)
            _set_dotted(obj, renamed[key], value, where)
            continue
        if key not in known:
            raise ValueError(f"{where}: unknown field '{key}' (known: {', '.join(sorted(known))})")
        current = getattr(obj, key)
        if dataclasses.is_dataclass(current):
            if not isinstance(value, dict):
                raise ValueError(f"{where}.{key}: expected a mapping, got {type(value).__name__}")
            _apply(current, value, f"{where}.{key}")
        elif key == "precision" and isinstance(value, str):
            setattr(obj, key, normalize_precision(value, f"{where}.{key}"))
        else:
            value = _checked_choice(type(obj), key, value, f"{where}.{key}")
            setattr(obj, key, _checked_type(type(obj), key, value, f"{where}.{key}"))


def _checked_choice(cls: type, name: str, value, where: str):
    """`value` for a field of `cls`, checked against the choices of a ``Literal`` field: YAML 1.1 reads a bare
    ``on`` / ``off`` as a boolean, which becomes the word again where the choices have it; any other value outside
    the choices is an error naming the field."""
    hint, optional = _unwrap_optional(typing.get_type_hints(cls)[name])
    if typing.get_origin(hint) is not Literal or (optional and value is None):
        return value
    choices = typing.get_args(hint)
    if isinstance(value, bool) and {"on", "off"} <= set(choices):
        value = "on" if value else "off"
    if value not in choices:
        raise ValueError(f"{where}: {value!r} is not one of {', '.join(map(str, choices))}")
    return value


@functools.cache
def _type_adapter(hint):
    """pydantic's validator of `hint` (lax: YAML's ``1e-5`` is a string that a float field takes as 1e-05, and a
    number where a string is expected is read as its text, ``shard: 0`` as "0")."""
    from pydantic import ConfigDict, TypeAdapter

    return TypeAdapter(hint, config=ConfigDict(coerce_numbers_to_str=True))


def _checked_type(cls: type, name: str, value, where: str):
    """`value` checked against the declared type of field `name` of `cls` (by pydantic), converted where the
    conversion is lossless; a value of another type is an error naming the setting and the type expected."""
    from pydantic import ValidationError

    hint = typing.get_type_hints(cls)[name]
    if hint is Any:
        return value
    try:
        return _type_adapter(hint).validate_python(value)
    except ValidationError as error:
        problem = error.errors()[0]
        at = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in problem["loc"])
        raise ValueError(f"{where}{at}: expected {_type_name(hint)}, got {value!r} ({problem['msg']})") from None


def _type_name(hint) -> str:
    return hint.__name__ if isinstance(hint, type) else str(hint).replace("typing.", "")


def merged_sections(base: dict, over: dict) -> dict:
    """`over` merged into `base` key by key: mappings recursively, any other value (lists included) replaces."""
    out = dict(base)
    for key, value in over.items():
        out[key] = merged_sections(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) \
            else value
    return out


#: The top-level key naming the file a config file starts from.
EXTENDS = "extends"


def load_config_file(path: str | Path, extra_sections: tuple[str, ...] = (), _chain: tuple[Path, ...] = ()) -> dict:
    """A config file's top-level mapping, with sections of the previous release renamed (and a warning), merged
    over the file its ``extends`` names (relative to it), and that over its own, and so on.

    Every top-level key must be a command's section, a shared setting or one of `extra_sections` (a script's own,
    e.g. a benchmark's); otherwise the error names the file and the valid names."""
    from .commands import DEPRECATED_SECTIONS, section_names

    data = yaml.safe_load(read_utf8_text(path)) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of sections at the top level")
    parent = data.pop(EXTENDS, None)
    if parent is not None and not isinstance(parent, str):
        raise ValueError(f"{path}: '{EXTENDS}' must be the path of a config file, got {type(parent).__name__}")
    valid = section_names() + list(extra_sections)
    result: dict = {}
    for key, value in data.items():
        name = key
        if key in DEPRECATED_SECTIONS:
            name = DEPRECATED_SECTIONS[key]
            warnings.warn(f"{path}: section '{key}' is deprecated, name it '{name}'", FutureWarning, stacklevel=2)
            if name in data:
                raise ValueError(f"{path}: both '{key}' and its new name '{name}' are given; keep '{name}'")
        elif key not in valid and key not in SHARED_SETTINGS:
            raise ValueError(f"{path}: unknown section '{key}' (valid: {', '.join(SHARED_SETTINGS)}, "
                             f"{', '.join(valid)})")
        if key == "workdir":
            if not isinstance(value, str):
                raise ValueError(f"{path}: 'workdir' must be a folder path, got {type(value).__name__}")
        elif not isinstance(value, dict):
            raise ValueError(f"{path}: section '{key}' must be a mapping")
        result[name] = value
    if parent is None:
        return result
    chain = (*_chain, Path(path).resolve())
    base = (Path(path).parent / parent).resolve()
    if base in chain:
        raise ValueError(f"{path}: '{EXTENDS}: {parent}' makes a cycle ({' -> '.join(map(str, (*chain, base)))})")
    if not base.is_file():
        raise FileNotFoundError(f"{path}: '{EXTENDS}: {parent}' names no file ({base})")
    return merged_sections(load_config_file(base, extra_sections, chain), result)


def _flag_values(args: argparse.Namespace | None) -> dict:
    nested: dict = {}
    for dest, value in vars(args or argparse.Namespace()).items():
        if dest in ("command", "verb", "command_spec", "config", "workdir") or dest.startswith("_"):
            continue  # the command's own options (dest "_name": how to run it, not a setting)
        node = nested
        *parents, leaf = dest.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return nested


def _walk(obj, prefix: str = ""):
    """(owner, field, dotted name) of every field, nested dataclasses included."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            yield from _walk(value, f"{prefix}{f.name}.")
        else:
            yield obj, f, f"{prefix}{f.name}"


def _empty(value) -> bool:
    return value is None or value == "" or value == []


def has_section(config_file: str | None, section: str) -> bool:
    """Whether `config_file` has a (non-empty) section for `section` (by its current or its deprecated name)."""
    return bool(config_file) and bool(load_config_file(config_file).get(section))


def build_config(cls: type[T], section: str, args: argparse.Namespace | None = None,
                 config_file: str | None = None, extra_sections: tuple[str, ...] = (),
                 set_by_caller: tuple[str, ...] = ()) -> T:
    """Defaults, then the shared settings, then the command's section, then the given flags; then the paths
    derived from the work folder, then the check of required settings (except the dotted names in `set_by_caller`:
    an orchestrator fills them, e.g. the loop sets each rollout's questions)."""
    data = load_config_file(config_file, extra_sections) if config_file else {}
    config = cls()
    names = {f.name for f in dataclasses.fields(cls)}
    for shared in ("retrieval", "agent"):
        if shared in names and shared in data:
            _apply(getattr(config, shared), data[shared], f"{config_file}: {shared}")
    _apply(config, data.get(section, {}), f"{config_file}: {section}")
    _apply(config, _flag_values(args), "command line")
    workdir = getattr(args, "workdir", None) or data.get("workdir") or DEFAULT_WORKDIR
    index = config.retrieval.index if "retrieval" in names else (data.get("retrieval") or {}).get("index", "")
    for owner, f, dotted in _walk(config):
        template = f.metadata.get("derive")
        if template and _empty(getattr(owner, f.name)):
            if "{index}" in template and not index:
                continue
            setattr(owner, f.name, template.format(workdir=workdir, index=index))
    missing = [dotted for owner, f, dotted in _walk(config) if f.metadata.get("required") and dotted not in set_by_caller
               and _empty(getattr(owner, f.name))]
    if missing:
        where = f"the '{section}' section of {config_file} or " if config_file else ""
        raise ValueError(f"{section.replace('_', ' ', 1)}: required setting{'s' * (len(missing) > 1)} "
                         f"{', '.join(missing)} missing (set {where}"
                         f"{', '.join('--' + m.replace('_', '-') for m in missing)})")
    validate_settings(config)
    return config


def validate_settings(config) -> None:
    """Run every (nested) settings dataclass's own checks (`__post_init__`) on its final values: at construction
    they saw only the defaults, before the file and the flags were applied."""
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            validate_settings(value)
    check = getattr(config, "__post_init__", None)
    if check is not None:
        check()
