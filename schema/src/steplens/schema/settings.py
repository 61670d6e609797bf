"""Declared settings shared by every part: a value given explicitly, then ``STEPLENS_*``
environment, then the declared default.

A part declares its settings once, as a dataclass whose setting fields are annotated with
their constraint and help (``Annotated[PositiveFloat, about("worker wake-up period")]``) and
carry their default. From that declaration come the environment reading (``resolve``), the
command line options (``add_options`` / ``given``) and the settings tables of the docs
(``markdown_table``, kept current by ``sync_markdown``).

Precedence, the same for every part: a keyword argument in Python or a flag on the command
line (the command line's explicit values are its keywords), then the environment variable,
then the default. A bad keyword raises ``ValueError`` (a bad flag: argparse's usage error);
a bad environment value logs one warning and the default is used, since a typo in a training
job's environment must not stop the job. Float settings are always finite.

A field is a setting when its annotation carries ``about(...)``; a field annotated with
``nested(...)`` holds another settings dataclass whose settings are flattened into this
one's (their names prefixed); other fields are plain dataclass fields the mechanism leaves
alone. A setting's variable is the class's ``ENV_PREFIX`` plus its flat name in capitals
(``STEPLENS_`` when the class declares none), its flag ``--`` plus the flat name with
dashes, unless ``about`` names others.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import logging
import math
import os
import re
import sys
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any, Protocol, TypeVar, cast

import msgspec
from msgspec import Meta

log = logging.getLogger("steplens")
T = TypeVar("T")

DEFAULT_KAFKA_BOOTSTRAP = "127.0.0.1:19092"

PositiveFloat = Annotated[float, Meta(gt=0)]
NonNegativeFloat = Annotated[float, Meta(ge=0)]
PositiveInt = Annotated[int, Meta(ge=1)]
NonNegativeInt = Annotated[int, Meta(ge=0)]
Port = Annotated[int, Meta(ge=0, le=65535)]
NonEmptyStr = Annotated[str, Meta(min_length=1)]

_ABOUT = "steplens.setting"
_NESTED = "steplens.nested"


def about(
    help: str,
    *,
    env: str | None = None,
    flag: str | None = None,
    aliases: Iterable[str] = (),
    name: str | None = None,
    default_doc: str | None = None,
    env_doc: str | None = None,
) -> Meta:
    """A setting's help and, where they differ from the derived ones, its environment
    variable (``""``: none), its flag (``""``: no command line option), further flags that
    mean the same (kept for scripts written against older names), its flat name, and the
    default or variables as the docs should state them (a computed default)."""
    extra = {
        "env": env,
        "flag": flag,
        "aliases": tuple(aliases),
        "name": name,
        "default_doc": default_doc,
        "env_doc": env_doc,
    }
    return Meta(description=help, extra={_ABOUT: extra})


def nested(prefix: str | None = None) -> Meta:
    """A field holding another settings dataclass, its settings flattened with ``prefix``
    (default: the field's name and ``_``)."""
    return Meta(extra={_NESTED: prefix})


@dataclasses.dataclass(frozen=True)
class Spec:
    """One declared setting, flattened: ``path`` the attributes that lead to it."""

    name: str
    path: tuple[str, ...]
    hint: Any
    default: Any
    factory: Callable[[], Any] | None
    help: str
    env: str | None
    flag: str | None
    aliases: tuple[str, ...]
    default_doc: str | None
    env_doc: str | None

    def default_value(self) -> Any:
        return self.factory() if self.factory is not None else self.default

    def check(self, value: Any) -> Any:
        """``value`` as this setting holds it; ``ValueError`` when it breaks the declaration."""
        try:
            out = msgspec.convert(value, self.hint)
        except msgspec.ValidationError as exc:
            raise ValueError(str(exc)) from None
        if isinstance(out, float) and not math.isfinite(out):
            raise ValueError("expected a finite number")
        return out

    def parse(self, raw: str) -> Any:
        """A value from text (a variable or a flag); ``ValueError`` when it is not one."""
        base = _base(self.hint)
        if base is bool:
            value: Any = parse_bool(raw)
        elif base in (dict, list):
            value = json.loads(raw)
        else:
            try:
                value = msgspec.convert(raw, self.hint, strict=False)
            except msgspec.ValidationError as exc:
                raise ValueError(str(exc)) from None
        return self.check(value)


def _meta_extra(metas: Iterable[Any], key: str) -> Any:
    for m in metas:
        if isinstance(m, Meta) and m.extra and key in m.extra:
            return m.extra[key]
    return _MISSING


_MISSING = object()


def _metadata(hint: Any) -> tuple[Any, ...]:
    return tuple(getattr(hint, "__metadata__", ()))


def _base(hint: Any) -> Any:
    """The type under ``Annotated`` and ``| None``: ``float``, ``dict``, ``str``..."""
    while typing.get_origin(hint) is Annotated:
        hint = typing.get_args(hint)[0]
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return _base(args[0]) if len(args) == 1 else hint
    return typing.get_origin(hint) or hint


def _description(hint: Any) -> str:
    for m in reversed(_metadata(hint)):
        if isinstance(m, Meta) and m.description:
            return m.description
    return ""


@functools.cache
def specs(cls: type) -> tuple[Spec, ...]:
    """The settings ``cls`` declares, nested ones flattened, in declaration order."""
    return tuple(_specs(cls, (), "", getattr(cls, "ENV_PREFIX", "STEPLENS_")))


def _specs(cls: type, path: tuple[str, ...], prefix: str, env_prefix: str) -> list[Spec]:
    hints = typing.get_type_hints(cls, include_extras=True)
    out: list[Spec] = []
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        metas = _metadata(hint)
        inner = _meta_extra(metas, _NESTED)
        if inner is not _MISSING:
            sub = f.name + "_" if inner is None else inner
            out += _specs(_base(hint), (*path, f.name), prefix + sub, env_prefix)
            continue
        info = _meta_extra(metas, _ABOUT)
        if info is _MISSING:
            continue
        name = prefix + (info["name"] or f.name)
        factory = None if f.default_factory is dataclasses.MISSING else f.default_factory
        if f.default is dataclasses.MISSING and factory is None:
            raise TypeError(f"{cls.__name__}.{f.name}: a setting needs a default")
        env = info["env"] if info["env"] is not None else env_prefix + name.upper()
        flag = info["flag"] if info["flag"] is not None else "--" + name.replace("_", "-")
        out.append(
            Spec(
                name=name,
                path=(*path, f.name),
                hint=hint,
                default=f.default,
                factory=factory,
                help=_description(hint),
                env=env or None,
                flag=flag or None,
                aliases=info["aliases"],
                default_doc=info["default_doc"],
                env_doc=info["env_doc"],
            )
        )
    return out


def resolve(cls: type[T], given: Mapping[str, Any] | None = None, **fields: Any) -> T:
    """``cls`` with every setting resolved: ``given`` (flat names; ``None``: not given), then
    its variable, then its default. ``fields`` are ``cls``'s other (non-setting) fields."""
    given = dict(given or {})
    table = {s.name: s for s in specs(cast(type, cls))}
    unknown = set(given) - set(table)
    if unknown:
        raise ValueError(f"steplens: unknown setting(s) {sorted(unknown)}")
    values: dict[tuple[str, ...], Any] = {}
    for s in table.values():
        value = given.get(s.name)
        if value is not None:
            try:
                values[s.path] = s.check(value)
            except ValueError as exc:
                raise ValueError(f"steplens: invalid {s.name}={value!r} ({exc})") from None
        else:
            values[s.path] = from_env(s)
    return _build(cls, (), values, fields)


def from_env(s: Spec) -> Any:
    """The setting's variable, parsed; its default when unset, empty, or bad (one warning)."""
    raw = os.environ.get(s.env) if s.env else None
    if raw is None or raw == "":
        return s.default_value()
    try:
        return s.parse(raw)
    except (TypeError, ValueError) as exc:
        default = s.default_value()
        log.warning("steplens: ignoring %s=%r (%s); using %r", s.env, raw, exc, default)
        return default


def _build(cls: type[T], path: tuple[str, ...], values: dict, fields: Mapping[str, Any]) -> T:
    """``cls`` from the resolved ``values`` (by attribute path), nested settings built first."""
    kwargs = dict(fields)
    hints = typing.get_type_hints(cls, include_extras=True)
    for f in dataclasses.fields(cast(Any, cls)):
        here = (*path, f.name)
        is_nested = _meta_extra(_metadata(hints[f.name]), _NESTED) is not _MISSING
        if here in values:
            kwargs[f.name] = values[here]
        elif is_nested and f.name not in kwargs:
            kwargs[f.name] = _build(_base(hints[f.name]), here, values, {})
    return cls(**kwargs)


# --- the command line ----------------------------------------------------------------------


class _Options(Protocol):
    """An ``argparse`` parser or argument group."""

    def add_argument(self, *args: Any, **kwargs: Any) -> Any: ...


def add_options(
    parser: _Options,
    cls: type,
    *,
    exclude: Iterable[str] = (),
) -> None:
    """One option per setting of ``cls`` that has a flag, its help stating the default and
    the variable; an option not given leaves no attribute (``given`` tells them apart)."""
    skip = set(exclude)
    for s in specs(cls):
        if s.flag is None or s.name in skip:
            continue
        flags = [s.flag, *s.aliases]
        is_switch = _base(s.hint) is bool
        notes = [] if is_switch else [f"default: {_shown_default(s).replace('`', '')}"]
        notes += [f"env {s.env}"] if s.env else []
        help_text = f"{s.help} ({'; '.join(notes)})" if notes else s.help
        help_text = help_text.replace("%", "%%")
        if is_switch:
            const = not s.default_value()
            parser.add_argument(
                *flags,
                dest=s.name,
                action="store_const",
                const=const,
                default=argparse.SUPPRESS,
                help=help_text,
            )
        else:
            parser.add_argument(
                *flags,
                dest=s.name,
                type=_argument_type(s),
                default=argparse.SUPPRESS,
                metavar=_metavar(s),
                help=help_text,
            )


def given(cls: type, args: argparse.Namespace) -> dict[str, Any]:
    """The settings of ``cls`` given on the command line, by flat name."""
    ns = vars(args)
    return {s.name: ns[s.name] for s in specs(cls) if s.name in ns}


def _argument_type(s: Spec) -> Callable[[str], Any]:
    def convert(raw: str) -> Any:
        try:
            return s.parse(raw)
        except (TypeError, ValueError) as exc:
            raise argparse.ArgumentTypeError(f"{raw!r}: {exc}") from None

    convert.__name__ = s.name  # argparse names the option's type in its error
    return convert


def _strip(hint: Any) -> Any:
    while typing.get_origin(hint) is Annotated:
        hint = typing.get_args(hint)[0]
    return hint


def _metavar(s: Spec) -> str:
    return "S" if s.name.endswith("_s") else s.name.rsplit("_", 1)[-1].upper()


# --- the docs --------------------------------------------------------------------------------


def _shown_default(s: Spec) -> str:
    if s.default_doc is not None:
        return s.default_doc
    value = s.default_value()
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _constraint(s: Spec) -> str:
    parts = []
    for m in _metadata(s.hint) + _metadata(_base_annotated(s.hint)):
        if not isinstance(m, Meta):
            continue
        for attr, sign in (("gt", ">"), ("ge", "≥"), ("lt", "<"), ("le", "≤")):
            bound = getattr(m, attr)
            if bound is not None:  # :g: typing may hand back an equal Meta of ints (0 == 0.0)
                parts.append(f"{sign} {bound:g}")
        if m.min_length:
            parts.append("not empty")
    return ", ".join(dict.fromkeys(parts))


def _base_annotated(hint: Any) -> Any:
    """The ``Annotated`` inside ``X | None``, where a constraint of an optional setting is."""
    hint = _strip(hint)
    for arg in typing.get_args(hint):
        if typing.get_origin(arg) is Annotated:
            return arg
    return hint


def markdown_table(cls: type, *, keyword: bool = True, flag: bool = True) -> str:
    """The settings of ``cls`` as a markdown table: keyword, flag, variable, default,
    allowed values and meaning."""
    head = []
    if keyword:
        head.append("keyword")
    if flag:
        head.append("flag")
    head += ["environment", "default", "allowed", "meaning"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in specs(cls):
        cells = []
        if keyword:
            cells.append(f"`{s.name}`")
        if flag:
            cells.append(", ".join(f"`{f}`" for f in (s.flag, *s.aliases) if f) or "")
        cells.append(s.env_doc or (f"`{s.env}`" if s.env else ""))
        cells.append(f"`{_shown_default(s)}`" if s.default_doc is None else s.default_doc)
        cells.append(_constraint(s))
        cells.append(s.help.replace("|", "\\|"))
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


_BLOCK = re.compile(
    r"(<!-- settings: (?P<target>[\w.]+:\w+)(?P<opts>[^>]*?) -->\n)"
    r"(?P<body>.*?)(<!-- /settings -->)",
    re.DOTALL,
)


def sync_markdown(path: Path, *, check: bool = False) -> bool:
    """Rewrite each settings table of ``path`` between ``<!-- settings: module:Class -->``
    and ``<!-- /settings -->`` (options after the class: ``no-keyword``, ``no-flag``).
    Returns whether the file was (``check``: would be) changed."""
    import importlib

    text = path.read_text()

    def render(m: re.Match[str]) -> str:
        module, name = m["target"].split(":")
        cls = getattr(importlib.import_module(module), name)
        opts = m["opts"].split()
        table = markdown_table(cls, keyword="no-keyword" not in opts, flag="no-flag" not in opts)
        return m.group(1) + table + m.group(5)

    new = _BLOCK.sub(render, text)
    if new != text and not check:
        path.write_text(new)
    return new != text


def main(argv: list[str] | None = None) -> int:
    """``python -m steplens.schema.settings [--check] FILE...``: regenerate the settings
    tables of the docs (``--check``: exit 1 when one is out of date)."""
    ap = argparse.ArgumentParser(prog="python -m steplens.schema.settings")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("files", nargs="+", type=Path)
    args = ap.parse_args(argv)
    stale = [str(p) for p in args.files if sync_markdown(p, check=args.check)]
    for p in stale:
        print(("out of date: " if args.check else "updated: ") + p)
    return 1 if stale and args.check else 0


# --- shared settings -------------------------------------------------------------------------


def env_value(name: str, parse: Callable[[str], T], default: T) -> T:
    """Read ``name`` from the environment, parse it, or warn and fall back to ``default``
    (for settings outside a declared class)."""
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return parse(raw)
    except (TypeError, ValueError) as exc:
        log.warning("steplens: ignoring %s=%r (%s); using %r", name, raw, exc, default)
        return default


def parse_bool(raw: str) -> bool:
    low = raw.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise ValueError("expected a boolean (1/0, true/false)")


def kafka_bootstrap(value: str | None = None) -> str:
    """The Kafka bootstrap: ``value``, else ``STEPLENS_KAFKA_BOOTSTRAP``, else the default."""
    if value is not None and (not isinstance(value, str) or not value):
        raise ValueError(f"steplens: invalid kafka_bootstrap={value!r}")
    return value or env_value("STEPLENS_KAFKA_BOOTSTRAP", str, DEFAULT_KAFKA_BOOTSTRAP)


def kafka_security_config() -> dict[str, str]:
    """librdkafka security settings from ``STEPLENS_KAFKA_<PROPERTY>`` variables.

    ``STEPLENS_KAFKA_SECURITY_PROTOCOL=SASL_SSL`` becomes ``security.protocol``, and so on for
    ``sasl.*`` and ``ssl.*`` properties. Values are never logged.
    """
    out: dict[str, str] = {}
    for key, value in os.environ.items():
        if not key.startswith("STEPLENS_KAFKA_") or key == "STEPLENS_KAFKA_BOOTSTRAP":
            continue
        prop = key[len("STEPLENS_KAFKA_") :].lower().replace("_", ".")
        if prop.startswith(("security.", "sasl.", "ssl.")):
            out[prop] = value
    return out


if __name__ == "__main__":
    sys.exit(main())
