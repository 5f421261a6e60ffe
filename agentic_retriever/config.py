"""Typed configs: dataclasses filled from a YAML section, then from command-line flags.

Every dataclass field is both a YAML key and a flag: ``--out``, nested ``--encoder.model``,
``--dense.ef-search``; booleans get ``--flag/--no-flag``; mappings take a JSON object; ``none`` on the command line sets an optional
field to None. Unknown YAML keys are errors naming the file and the key (no silently ignored typo).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import types
import typing
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml

T = TypeVar("T")


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


def _json_mapping(text: str) -> dict:
    """A mapping flag's value, written as a JSON object (``--reward-options '{"lambda_f": 0.4}'``)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r} ({error})") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return value


def add_dataclass_arguments(parser: argparse.ArgumentParser, cls: type, prefix: str = "") -> None:
    """Add one flag per (nested) field of `cls`; defaults stay unset so only given flags override."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        hint, optional = _unwrap_optional(hints[f.name])
        dest = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(hint):
            add_dataclass_arguments(parser, hint, prefix=f"{dest}.")
            continue
        flag = "--" + dest.replace("_", "-")
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        help_text = f"{f.metadata.get('help', '')} (default: {default})"
        common = {"dest": dest, "default": argparse.SUPPRESS, "help": help_text}
        if hint is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, **common)
        elif typing.get_origin(hint) is Literal:
            choices = list(typing.get_args(hint)) + (["none"] if optional else [])
            parser.add_argument(flag, choices=choices, type=_scalar(str, optional), **common)
        elif typing.get_origin(hint) is dict:
            parser.add_argument(flag, type=_json_mapping, metavar="JSON", **common)
        elif typing.get_origin(hint) is list:
            (item,) = typing.get_args(hint)
            parser.add_argument(flag, nargs="+", type=item, metavar=item.__name__.upper(), **common)
        else:
            parser.add_argument(flag, type=_scalar(hint, optional), metavar=getattr(hint, "__name__", "X").upper(), **common)


def _apply(obj, values: dict, where: str) -> None:
    known = {f.name: f for f in dataclasses.fields(obj)}
    for key, value in values.items():
        if key not in known:
            raise ValueError(f"{where}: unknown field '{key}' (known: {', '.join(sorted(known))})")
        current = getattr(obj, key)
        if dataclasses.is_dataclass(current):
            if not isinstance(value, dict):
                raise ValueError(f"{where}.{key}: expected a mapping, got {type(value).__name__}")
            _apply(current, value, f"{where}.{key}")
        else:
            setattr(obj, key, value)


def load_yaml_section(path: str | Path, section: str) -> dict:
    data = yaml.safe_load(Path(path).read_text()) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of sections at the top level")
    value = data.get(section, {})
    if not isinstance(value, dict):
        raise ValueError(f"{path}: section '{section}' must be a mapping")
    return value


def build_config(cls: type[T], section: str, args: argparse.Namespace | None = None, config_file: str | None = None) -> T:
    """Defaults, then the YAML section (if a file is given), then the flags that were given."""
    config = cls()
    if config_file:
        _apply(config, load_yaml_section(config_file, section), f"{config_file}: {section}")
    nested: dict = {}
    for dest, value in vars(args or argparse.Namespace()).items():
        if dest in ("command", "subcommand", "config", "handler"):
            continue
        node = nested
        *parents, leaf = dest.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    _apply(config, nested, "command line")
    return config
