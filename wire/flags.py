"""Command lines generated from the config dataclasses, both ways.

A field is a flag: `field_name` is `--field-name`, the string literal right after the field in its class body (its
docstring) is the flag's help, and the flag's default is the field's, read from the dataclass, so that each default
is written once. The way back comes from the same table: config_from_args builds the config from the parsed flags,
config_argv writes the flags that rebuild a config in another process (what the launchers give the node and router
processes). A field added to a config is then a flag of every command line built from it, and reaches the child
processes, with no other line written.

How a field's type is spelled on a command line:
- int, float, str: `--name VALUE`; a Literal: one of its values;
- bool: `--name` / `--no-name`;
- tuple[T, ...]: one comma-separated value, 'none' for the empty tuple;
- T | None: as T; None, which must then be the default, is written by leaving the flag out;
- a nested config dataclass: no flag of its own, its fields' flags instead (with the prefix its field declares).

What the type does not say is declared next to the field, in its metadata: `field(default=..., metadata=flag(...))`
for another name, a parser, a unit, a repeated flag or an environment variable, NOT_A_FLAG for a field that the
program or the launcher sets.

Imports nothing of the project (wire.config imports it).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import inspect
import operator
import textwrap
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Union, get_args, get_origin

METADATA_KEY = "flag"
"""The key of a field's FlagSpec in its dataclass metadata."""


@dataclass(frozen=True)
class FlagSpec:
    """What a field's type does not say about its flag (the module docstring's rules give the rest)."""

    option: str | None = None
    """The flag's whole name, e.g. "--engine"; None: `--field-name`, after its section's prefix."""
    parse: Callable[[str], Any] | None = None
    """Text -> value, where the type's rule does not fit (e.g. 'default' for a list of sizes)."""
    format: Callable[[Any], str] | None = None
    """Value -> text, the inverse of parse."""
    scale: int = 1
    """The field's value is the flag's times this: a flag in MiB for a field in bytes."""
    metavar: str | None = None
    repeat: bool = False
    """A tuple given as the flag once per element (`--prefill-address A --prefill-address B`)."""
    required: bool | None = None
    """None: required when the field has no default (a repeated flag never is: given no times, it is ())."""
    environment: str | None = None
    """A variable that hands the value to a child process instead of its command line (which every user of the
    host sees in `ps`), and that the flag falls back to when not given."""
    is_flag: bool = True
    """False: no flag; the value comes from `environment` if it names one, else from the program (given)."""
    prefix: str = ""
    """A nested config's field: what the flags of its fields start with (`transfer`: "kv-", `--kv-ucx-devices`)."""


def flag(option: str | None = None, **settings: Any) -> dict[str, FlagSpec]:
    """A field's metadata: `field(default=..., metadata=flag("--engine"))`."""
    return {METADATA_KEY: FlagSpec(option, **settings)}


NOT_A_FLAG = flag(is_flag=False)
"""A field that the program or the launcher sets, not its user: config_from_args takes it as given."""

_UNSET = object()
"""No value for a field: the dataclass default applies."""


# NOTE: the spellings of values that several configs share; a config's own (a list of sizes) lives beside it.

def parse_switch(text: str) -> bool:
    if text not in ("on", "off"):
        raise ValueError(f"expected 'on' or 'off', got {text!r}")
    return text == "on"


def format_switch(value: bool) -> str:
    return "on" if value else "off"


PORTS = range(1, 65536)
"""The ports a flag may name. NOTE: not 0 ("any free port"): a process the kernel gave a port of its choosing could
not be found there by the launcher or the clients."""


def parse_port(text: str) -> int:
    """A port flag's value: argparse shows a number outside PORTS, or none, as the flag's one-line error."""
    port = int(text) if text.isascii() and text.isdigit() else None
    if port not in PORTS:
        raise argparse.ArgumentTypeError(f"must be a port number from {PORTS[0]} to {PORTS[-1]}, got {text!r}")
    return port


def parse_names(text: str) -> tuple[str, ...]:
    """A comma-separated list of names; 'none': the empty one."""
    return () if text == "none" else tuple(name for name in text.split(",") if name)


def format_list(values: Iterable) -> str:
    return ",".join(map(str, values)) or "none"


class UnknownName(ValueError, argparse.ArgumentTypeError):
    """A name outside its vocabulary: a ValueError where a config is built, and argparse shows its message whole."""


def name_parser(what: str, names: tuple[str, ...], aliases: Mapping[str, str]) -> Callable[[str], str]:
    """A name of a vocabulary (names), or an alias of one (aliases: alias -> name), as the name; UnknownName,
    listing every valid name, otherwise."""
    def parse(text: str) -> str:
        name = aliases.get(text, text) if isinstance(text, str) else text
        if name not in names:
            old = ", ".join(f"{alias} = {aliases[alias]}" for alias in aliases)
            raise UnknownName(f"{what} must be one of {', '.join(names)}" + (f" (old names: {old})" if old else "")
                              + f", got {text!r}")
        return name
    parse.__name__ = what
    return parse


def list_parser(parse_item: Callable[[str], Any]) -> Callable[[str], tuple]:
    """A comma-separated list of parse_item's values ('none': the empty list)."""
    def parse(text: str) -> tuple:
        return tuple(parse_item(item) for item in parse_names(text))
    parse.__name__ = f"comma-separated {parse_item.__name__}"  # NOTE: argparse names it in "invalid ... value"
    return parse


@dataclass(frozen=True)
class Flag:
    """One field of a config (of a config nested in it, at any depth) as a command-line flag."""

    path: tuple[str, ...]
    """Field names from the config class down to the field: ("scheduler", "max_num_seqs")."""
    owner: type
    """The config class the field is a field of (at the end of path)."""
    option: str
    help: str
    default: Any
    """The field's default (dataclasses.MISSING: none)."""
    spec: FlagSpec
    parse: Callable[[str], Any] | None
    """None for a bool (`--name` / `--no-name`)."""
    format: Callable[[Any], str] | None
    choices: tuple | None = None
    group: str | None = None
    """The title of the nested config the field belongs to (the first line of its class docstring), if any."""

    @property
    def field(self) -> str:
        """'name', or 'section.name' for a nested config's field."""
        return ".".join(self.path)

    @property
    def dest(self) -> str:
        """Its attribute on the parsed namespace (argparse's own rule)."""
        return self.option.lstrip("-").replace("-", "_")

    @property
    def negative(self) -> str:
        """A bool's other flag (BooleanOptionalAction's spelling)."""
        return f"--no-{self.option[2:]}"

    @property
    def is_bool(self) -> bool:
        return self.parse is None

    @property
    def required(self) -> bool:
        if self.spec.required is not None:
            return self.spec.required
        return self.default is dataclasses.MISSING and not self.spec.repeat

    @property
    def flag_default(self) -> Any:
        """The default as the flag spells it (before its unit is applied)."""
        if self.default is dataclasses.MISSING:
            return None
        return self.default // self.spec.scale if self.spec.scale > 1 and self.default is not None else self.default

    def value_in(self, config: Any) -> Any:
        return functools.reduce(getattr, self.path, config)

    def text(self, value: Any) -> str:
        """A value of the field as the flag's argument."""
        if self.spec.scale > 1:
            if value % self.spec.scale:
                raise ValueError(f"{self.field} = {value} is not a whole number of {self.option} units "
                                 f"({self.spec.scale}): a command line cannot carry it")
            value //= self.spec.scale
        return self.format(value)


# -- reading the dataclasses --------------------------------------------------------------------------------------


@functools.cache
def _class_source(cls: type) -> ast.ClassDef | None:
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):  # NOTE: a class made at run time has no source: its flags get no help text
        return None
    node = ast.parse(source).body[0]
    return node if isinstance(node, ast.ClassDef) else None


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """Each field's docstring (the string literal right after the field in the class body), of cls and its bases,
    as one line."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        node = _class_source(klass) if dataclasses.is_dataclass(klass) else None
        if node is None:
            continue
        for statement, after in zip(node.body, node.body[1:]):
            if (isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)
                    and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                    and isinstance(after.value.value, str)):
                docs[statement.target.id] = " ".join(after.value.value.split())
    return docs


def class_title(cls: type) -> str | None:
    """The first line of a class' own docstring (not the signature @dataclass writes where there is none)."""
    node = _class_source(cls)
    doc = None if node is None else ast.get_docstring(node)
    return doc.split("\n", 1)[0].strip() if doc else None


def _without_none(annotation: Any) -> tuple[Any, bool]:
    """(T, True) for T | None, (annotation, False) otherwise."""
    if get_origin(annotation) in (Union, types.UnionType):
        members = [member for member in get_args(annotation) if member is not type(None)]
        if len(members) < len(get_args(annotation)):
            return functools.reduce(operator.or_, members), True
    return annotation, False


def _type_rule(annotation: Any, spec: FlagSpec, where: str) -> tuple[Callable | None, Callable | None, tuple | None]:
    """(parse, format, choices) of a field's type; parse None: a bool."""
    if spec.parse is not None:
        # NOTE: a Literal's values stay the choices (argparse checks them after parse: a parse may map aliases)
        return spec.parse, spec.format or str, get_args(annotation) if get_origin(annotation) is Literal else None
    if annotation is bool:
        return None, None, None
    if get_origin(annotation) is Literal:
        choices = get_args(annotation)
        return type(choices[0]), str, choices
    if get_origin(annotation) is tuple and get_args(annotation)[1:] == (...,):
        parse_item, _, _ = _type_rule(get_args(annotation)[0], FlagSpec(), where)
        return (parse_item, str, None) if spec.repeat else (list_parser(parse_item), format_list, None)
    if annotation in (int, float, str):
        return annotation, str, None
    raise TypeError(f"{where}: no command-line spelling for {annotation}; give parse and format in its metadata")


def _field_default(field: dataclasses.Field) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return dataclasses.MISSING


@functools.cache
def config_flags(config_class: type, prefix: str = "") -> tuple[Flag, ...]:
    """Every field of config_class as a Flag, in field order, a nested config's fields in its place; prefix:
    what every derived flag name starts with (after '--')."""
    return tuple(_flags(config_class, (), prefix, None))


def _flags(cls: type, path: tuple[str, ...], prefix: str, group: str | None) -> Iterable[Flag]:
    annotations = typing.get_type_hints(cls)
    docs = field_docs(cls)
    own = cls.__dict__.get("__annotations__", {})
    # NOTE: a class' own fields first, then those it inherits (settings shared with other configs), so that --help
    # starts with what is particular to the program (the router's --model and addresses)
    for field in sorted(dataclasses.fields(cls), key=lambda field: field.name not in own):
        spec = field.metadata.get(METADATA_KEY, FlagSpec())
        annotation, optional = _without_none(annotations[field.name])
        if dataclasses.is_dataclass(annotation):
            yield from _flags(annotation, (*path, field.name), prefix + spec.prefix,
                              class_title(annotation) or group)
            continue
        where = f"{cls.__name__}.{field.name}"
        default = _field_default(field)
        if optional and default not in (None, dataclasses.MISSING):
            raise TypeError(f"{where}: an optional field's default must be None (a command line spells None by "
                            f"leaving the flag out)")
        parse, format_, choices = _type_rule(annotation, spec, where)
        option = spec.option or f"--{prefix}{field.name.replace('_', '-')}"
        yield Flag((*path, field.name), cls, option, docs.get(field.name, ""), default, spec, parse, format_,
                   choices, group)


# -- argparse and back ----------------------------------------------------------------------------------------------


def _help(flag: Flag) -> str:
    hint = ""
    if flag.spec.environment:
        hint = f" (default: ${flag.spec.environment})"
    elif not flag.required and flag.default not in (None, "", dataclasses.MISSING):
        shown = format_switch(flag.default) if flag.is_bool else flag.format(flag.flag_default)
        hint = f" (default: {shown})"
    return (flag.help + hint).replace("%", "%%")  # NOTE: argparse %-formats help text


def add_flags(parser: argparse.ArgumentParser | argparse._ArgumentGroup, config_class: type, *,
              exclude: Iterable[str] = (), prefix: str = "", only_given: bool = False) -> tuple[Flag, ...]:
    """Add to parser a flag for every field of config_class (a nested config's fields in a group titled by its
    class docstring) but the top-level fields named in exclude; -> the flags added.

    only_given: a flag not given leaves its attribute off the parsed namespace (so that the caller can tell a
    given value from a default); config_from_args then takes the dataclass default."""
    excluded = set(exclude)
    flags = tuple(flag for flag in config_flags(config_class, prefix)
                  if flag.path[0] not in excluded and flag.spec.is_flag)
    groups: dict[str | None, Any] = {None: parser}
    for flag in flags:
        if flag.group not in groups:
            groups[flag.group] = parser.add_argument_group(flag.group)
        options: dict[str, Any] = {"dest": flag.dest, "help": _help(flag)}
        options["default"] = argparse.SUPPRESS if only_given else None if flag.spec.repeat else flag.flag_default
        if flag.is_bool:
            groups[flag.group].add_argument(flag.option, action=argparse.BooleanOptionalAction, **options)
            continue
        if flag.spec.repeat:
            options["action"] = "append"
        else:
            options["required"] = flag.required
        groups[flag.group].add_argument(flag.option, type=flag.parse, choices=flag.choices,
                                        metavar=flag.spec.metavar, **options)
    return flags


def _parsed_value(flag: Flag, args: argparse.Namespace, environ: Mapping[str, str]) -> Any:
    """A field's value from the parsed flags, else from its environment variable; _UNSET: the dataclass default."""
    value = getattr(args, flag.dest, None) if flag.spec.is_flag else None
    if value is None and flag.spec.environment:
        # NOTE: as vLLM reads VLLM_API_KEY: an empty variable counts as unset
        value = environ.get(flag.spec.environment) or None
    if value is None:
        return () if flag.spec.repeat and flag.default is dataclasses.MISSING else _UNSET
    if isinstance(value, list):
        return tuple(value)
    return value * flag.spec.scale if flag.spec.scale > 1 else value


def config_from_args(config_class: type, args: argparse.Namespace, environ: Mapping[str, str] | None = None, *,
                     prefix: str = "", **given: Any) -> Any:
    """The config that parsed flags (add_flags' with this prefix) describe.

    environ: where fields with an environment variable fall back to (the caller reads os.environ, at its
    boundary); given: top-level fields the program sets (NOT_A_FLAG ones, or a whole nested config)."""
    values: dict[str, Any] = {}
    for flag in config_flags(config_class, prefix):
        if flag.path[0] in given or not (flag.spec.is_flag or flag.spec.environment):
            continue
        value = _parsed_value(flag, args, environ or {})
        if value is not _UNSET:
            section = values
            for name in flag.path[:-1]:
                section = section.setdefault(name, {})
            section[flag.path[-1]] = value
    return _build(config_class, {**values, **given}, set(given))


def _build(cls: type, values: dict[str, Any], given: set[str]) -> Any:
    annotations = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        annotation, _ = _without_none(annotations[field.name])
        if dataclasses.is_dataclass(annotation) and field.name not in given:
            values[field.name] = _build(annotation, values.get(field.name, {}), set())
    return cls(**values)


def config_argv(config: Any, *, exclude: Iterable[str] = (), prefix: str = "") -> list[str]:
    """The flags that rebuild config in another process (every field but the top-level ones in exclude, those
    without a flag and those that travel in the environment: config_environment)."""
    excluded = set(exclude)
    argv: list[str] = []
    for flag in config_flags(type(config), prefix):
        if flag.path[0] in excluded or not flag.spec.is_flag or flag.spec.environment:
            continue
        value = flag.value_in(config)
        if value is None:
            continue
        if flag.is_bool:
            argv.append(flag.option if value else flag.negative)
        elif flag.spec.repeat:
            for item in value:
                argv += [flag.option, flag.format(item)]
        else:
            argv += [flag.option, flag.text(value)]
    return argv


def environment_variables(config_class: type) -> tuple[str, ...]:
    """The variables through which fields of config_class reach a child process."""
    return tuple(flag.spec.environment for flag in config_flags(config_class) if flag.spec.environment)


def config_environment(config: Any) -> dict[str, str]:
    """The variables that hand a child process the fields of config that travel in its environment."""
    return {flag.spec.environment: str(value) for flag in config_flags(type(config))
            if flag.spec.environment and (value := flag.value_in(config)) is not None}
