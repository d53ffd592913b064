"""One way to read and check our TOML files (config, policy, catalogues, signatures).

Each file's shape is a tree of :class:`msgspec.Struct` classes (``forbid_unknown_fields=True,
frozen=True, kw_only=True``); values with a domain rule (durations, paths, choices) are
:class:`Checked` types. :func:`convert` turns msgspec's first error into every problem of the
input, each as ``"file:line: dotted.key = value: what is wrong; how to fix it"``, so an admin
fixes a file in one pass and never has to guess which key was meant.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import tomllib
import types
import typing
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from typing import Any, ClassVar, NamedTuple, Self, TypeVar

import msgspec

from slurm_recovery.contract.durations import parse_duration
from slurm_recovery.contract.settings import duration_above_zero

#: A place in a file: table keys and array indices, outermost first (``("a", 0, "b")``).
KeyPath = tuple[str | int, ...]


class SchemaError(ValueError):
    """A file cannot be used. One line per problem, each naming file, key and fix."""

    def __init__(self, *problems: str) -> None:
        super().__init__("\n".join(problems))
        self.problems: tuple[str, ...] = problems


def suggestion(option: str | None) -> str:
    """`` (did you mean 'x'?)`` for ``option``, or nothing when there is none."""
    return f" (did you mean {option!r}?)" if option is not None else ""


def did_you_mean(name: str, options: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``options``, or nothing: every file of
    ours (config, policy, catalogues) suggests the same way."""
    close = difflib.get_close_matches(name, list(options), n=1)
    return suggestion(close[0] if close else None)


# --------------------------------------------------------------------------------- value types


class Checked:
    """Base of a domain value type: subclass a builtin too (``class Seconds(float, Checked)``).

    msgspec hands the raw TOML value to :meth:`check`, which returns an instance of the class
    or raises ``ValueError("problem; fix")``. ``LABEL`` says the type as docs name it. A type
    whose rule is one function shared with others (the contract's checks) names it as ``RULE``
    and needs no ``check`` of its own.
    """

    LABEL: ClassVar[str] = ""
    RULE: ClassVar[Callable[[Any], Any] | None] = None

    @classmethod
    def check(cls, value: Any) -> Self:
        if cls.RULE is None:
            raise NotImplementedError(f"{cls.__name__} has neither a RULE nor a check")
        return cls(cls.RULE(value))  # type: ignore[call-arg]


class Duration(float, Checked):
    """A duration of 0 seconds or more: ``90``, ``"90s"``, ``"1h30m"``."""

    LABEL = "duration"
    RULE = staticmethod(parse_duration)


class PositiveDuration(Duration):
    """A duration of more than 0 seconds."""

    LABEL = "duration, more than 0"
    RULE = staticmethod(duration_above_zero)


class Choice(str, Checked):
    """One of ``OPTIONS``, any case (a subclass names them); read as lower case."""

    OPTIONS: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.LABEL = "one of " + ", ".join(cls.OPTIONS)

    @classmethod
    def check(cls, value: Any) -> Self:
        listed = ", ".join(cls.OPTIONS)
        if not isinstance(value, str):
            raise ValueError(f"must be a string, one of {listed}")
        if value.lower() not in cls.OPTIONS:
            raise ValueError(f"must be one of {listed}{did_you_mean(value.lower(), cls.OPTIONS)}")
        return cls(value.lower())


def _dec_hook(kind: type, value: Any) -> Any:
    if isinstance(kind, type) and issubclass(kind, Checked):
        return kind.check(value)
    raise TypeError(f"no reader for values of type {kind!r}")


# --------------------------------------------------------------------------------- reading


def parse_toml(
    text: str, source: str | os.PathLike[str], *, error: type[SchemaError] = SchemaError
) -> dict[str, Any]:
    """``text`` parsed as TOML; a syntax error (raised as ``error``, the file's own subclass)
    names ``source``, the line and shows it."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise error(_syntax_problem(source, text, exc)) from None


def read_toml(
    path: str | os.PathLike[str],
    *,
    check_stat: Callable[[str, os.stat_result], None] | None = None,
    error: type[SchemaError] = SchemaError,
) -> tuple[str, dict[str, Any]]:
    """The text of the TOML file ``path`` and its contents.

    ``check_stat(path, stat)`` may refuse the open file (e.g. world-writable). Raises
    :class:`FileNotFoundError` as is (the caller knows whether absent is fine) and ``error``
    (the file's own :class:`SchemaError` subclass) naming the file (and line) for anything else.
    """
    name = os.fspath(path)
    try:
        with open(name, "rb") as fh:
            if check_stat is not None:
                check_stat(name, os.fstat(fh.fileno()))
            raw = fh.read()
    except FileNotFoundError:
        raise
    except IsADirectoryError:
        raise error(f"{name}: is a directory; name the file itself") from None
    except PermissionError:
        raise error(
            f"{name}: permission denied; run as a user that can read it (root), or "
            f"chmod o+r {name} if it holds nothing secret"
        ) from None
    except OSError as exc:
        raise error(f"{name}: cannot read it: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise error(
            f"{name}:{line}: not UTF-8 text; TOML files must be UTF-8 (convert it with iconv)"
        ) from None
    return text, parse_toml(text, name, error=error)


_TOML_POSITION = re.compile(r"\s*\(at line (\d+), column (\d+)\)$")


#: ``key = word`` with the word unquoted: the usual "Invalid value".
_BARE_VALUE = re.compile(r"\s*([A-Za-z0-9_.-]+)\s*=\s*([^\s\"'\[{#][^#]*?)\s*(?:#.*)?")


def _syntax_problem(source: str | os.PathLike[str], text: str, exc: tomllib.TOMLDecodeError) -> str:
    message = str(exc)
    lineno = getattr(exc, "lineno", None)  # Python 3.14+
    found = _TOML_POSITION.search(message)
    if found:
        lineno = int(found.group(1))
        message = f"{message[: found.start()]} (column {found.group(2)})"
    if lineno is None:  # "(at end of document)"
        lineno = max(1, text.rstrip("\n").count("\n") + 1)
    problem = f"{os.fspath(source)}:{lineno}: invalid TOML: {message}"
    lines = text.split("\n")
    if message.startswith("Invalid value"):
        bare = 0 < lineno <= len(lines) and _BARE_VALUE.fullmatch(lines[lineno - 1])
        example = f'{bare.group(1)} = "{bare.group(2)}"' if bare else 'name = "value"'
        problem += f"; strings must be quoted, e.g. {example}"
    if 0 < lineno <= len(lines) and lines[lineno - 1].strip():
        problem += f"\n    {lines[lineno - 1].strip()}"
    return problem


# --------------------------------------------------------------------------------- key -> line

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_KEY_PART = re.compile(r"""\s*(?:([A-Za-z0-9_-]+)|"((?:[^"\\]|\\.)*)"|'([^']*)')\s*""")


def _split_key(text: str) -> tuple[list[str], str] | None:
    """A TOML dotted key at the start of ``text``: its parts and the rest; None if none."""
    parts: list[str] = []
    while True:
        found = _KEY_PART.match(text)
        if not found:
            return None
        bare, basic, literal = found.groups()
        if basic is not None:
            try:
                basic = json.loads(f'"{basic}"')
            except ValueError:
                return None
        parts.append(next(p for p in (bare, basic, literal) if p is not None))
        text = text[found.end() :]
        if not text.startswith("."):
            return parts, text
        text = text[1:]


def key_lines(text: str) -> dict[KeyPath, int]:
    """Where each table header and key of the TOML ``text`` is: key path -> line (from 1).

    Array-of-tables entries get their index (``[[job]]`` twice: ``("job", 1, ...)``). A light
    scan for messages, not a parser: a line inside a multi-line string may be misread.
    """
    lines: dict[KeyPath, int] = {}
    counts: dict[KeyPath, int] = {}
    table: KeyPath = ()
    in_string: str | None = None
    for number, line in enumerate(text.split("\n"), start=1):  # TOML ends lines at \n only
        stripped = line.strip()
        if in_string is not None:
            if stripped.count(in_string) % 2:
                in_string = None
            continue
        header = re.match(r"\[(\[?)\s*", stripped)
        if header:
            # the key first (a quoted name may hold "]" or "#"), then the closing bracket(s)
            split = _split_key(stripped[header.end() :])
            close = r"\s*\]\]\s*(?:#.*)?$" if header.group(1) else r"\s*\](?:\s*#.*)?\s*$"
            if split is None or not re.match(close, split[1]):
                continue
            resolved: list[str | int] = []
            for part in split[0]:
                resolved.append(part)
                if tuple(resolved) in counts:  # an array of tables: its latest entry
                    resolved.append(counts[tuple(resolved)] - 1)
            if header.group(1):  # [[name]]: a new entry
                if resolved and isinstance(resolved[-1], int):
                    resolved.pop()
                counts[tuple(resolved)] = counts.get(tuple(resolved), 0) + 1
                resolved.append(counts[tuple(resolved)] - 1)
            table = tuple(resolved)
            lines.setdefault(table, number)
            continue
        split = _split_key(stripped)
        if split is None or not split[1].startswith("="):
            continue
        path = table
        for part in split[0]:
            path = (*path, part)
            lines.setdefault(path, number)
        for quote in ('"""', "'''"):
            if split[1].count(quote) % 2:
                in_string = quote
    return lines


def find_line(text: str | None, path: KeyPath) -> int | None:
    """The line of ``path`` in ``text``, else of its nearest enclosing table; None if neither."""
    if not text:
        return None
    lines = key_lines(text)
    for end in range(len(path), 0, -1):
        if path[:end] in lines:
            return lines[path[:end]]
    return None


def dotted(path: KeyPath) -> str:
    """``("a", 0, "b c")`` -> ``a[0]."b c"``: the key as TOML would write it."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            name = part if _BARE_KEY.fullmatch(part) else json.dumps(part, ensure_ascii=False)
            out += f".{name}" if out else name
    return out


def parse_path(text: str) -> KeyPath:
    """msgspec's ``$.a.b[0].c`` (or ``a.b[0]``) -> ``("a", "b", 0, "c")``; stops at ``[...]``."""
    path: list[str | int] = []
    for name, index in re.findall(r"\.?([^.\[\]$]+)|\[(\d+|\.\.\.)\]", text.removeprefix("$")):
        if index == "...":
            break
        path.append(int(index) if index else name)
    return tuple(path)


# --------------------------------------------------------------------------------- converting

_T = TypeVar("_T")

#: Suggests a key for an unknown one: (path of its table, the unknown name) -> " (did you...)".
Suggest = Callable[[KeyPath, str, Sequence[str]], str]


class _Problem(NamedTuple):
    path: KeyPath
    message: str
    show_value: bool = True


def convert(
    data: Any,
    schema_type: type[_T],
    *,
    source: str | os.PathLike[str],
    text: str | None = None,
    prefix: str = "",
    suggest: Suggest | None = None,
) -> _T:
    """``data`` (parsed TOML) checked and built as ``schema_type``.

    Raises :class:`SchemaError` with every problem found, each naming ``source``, the line in
    ``text`` (when given), the dotted key (under ``prefix`` when ``data`` is a sub-table) and
    the value. ``suggest`` overrides how an unknown key is matched to a known one.
    """
    try:
        return msgspec.convert(data, schema_type, dec_hook=_dec_hook, strict=True)
    except msgspec.ValidationError as exc:
        base = parse_path(prefix)
        found = list(_problems(data, schema_type, (), suggest or _suggest_field))
        if not found:  # e.g. a Struct's own __post_init__ check
            found = [_native_problem(str(exc), schema_type, ())]
        raise SchemaError(
            *(_render(p, data, base, os.fspath(source), text) for p in found)
        ) from None


def _suggest_field(table: KeyPath, name: str, fields: Sequence[str]) -> str:
    return did_you_mean(name, fields)


def suggest_key(
    table: KeyPath,
    name: str,
    fields: Sequence[str],
    *,
    keys: Iterable[str],
    tables: Collection[str] = (),
) -> str:
    """The key an unknown ``name`` in ``table`` most likely meant, and where it belongs: a key
    of this table, any dotted key of the file (``keys``: one written under the wrong
    [section]) or a table (``tables``); this table first on a tie; nothing below a 0.6 match.
    The one key-guesser of our files (config, policy), so each says it the same way."""
    here = dotted(table)
    candidates = [(f"{here}.{n}" if here else n, n, True) for n in fields]
    candidates += [(key, key.rsplit(".", 1)[-1], False) for key in (*keys, *tables)]
    if not candidates:
        return ""
    ratio, _, guess = max(
        (difflib.SequenceMatcher(None, name, last).ratio(), same, full)
        for full, last, same in candidates
    )
    if ratio < 0.6:
        return ""
    if guess in tables:
        return suggestion(f"[{guess}]")
    home = guess.rsplit(".", 1)[0] if "." in guess else ""
    if home == here:
        return suggestion(guess)
    if not home:
        return f"{suggestion(guess)}: a top-level key, write it above the first [section]"
    return f"{suggestion(guess)}: write it under [{home}]"


def _render(problem: _Problem, data: Any, base: KeyPath, source: str, text: str | None) -> str:
    full = base + problem.path
    line = find_line(text, full)
    where = f"{source}:{line}" if line is not None else source
    if not full:
        return f"{where}: {problem.message}"
    if problem.show_value:
        value = _value_at(data, problem.path)
        return f"{where}: {dotted(full)} = {value!r}: {problem.message}"
    return f"{where}: {dotted(full)}: {problem.message}"


def _value_at(data: Any, path: KeyPath) -> Any:
    for part in path:
        data = data[part]
    return data


def _struct_fields(kind: Any) -> tuple[msgspec.structs.FieldInfo, ...] | None:
    kind = _unwrap(kind)
    if isinstance(kind, type) and issubclass(kind, msgspec.Struct):
        return msgspec.structs.fields(kind)
    return None


def _unwrap(kind: Any) -> Any:
    while typing.get_origin(kind) is typing.Annotated:
        kind = kind.__origin__
    return kind


def _problems(data: Any, kind: Any, path: KeyPath, suggest: Suggest) -> Iterator[_Problem]:
    """Every problem of ``data`` against ``kind``: walks tables and arrays, checks leaves."""
    fields = _struct_fields(kind)
    origin = typing.get_origin(_unwrap(kind))
    args = typing.get_args(_unwrap(kind))
    if fields is not None and isinstance(data, dict):
        by_name = {f.encode_name: f for f in fields}
        for key, value in data.items():
            known = by_name.get(key)
            if known is None:
                names = list(by_name)
                what = "table" if isinstance(value, dict) else "key"
                of = f"of [{dotted(path)}]" if path else "at the top level"
                yield _Problem(
                    (*path, key),
                    f"unknown {what}{suggest(path, key, names)} (keys {of}: {', '.join(names)})",
                    show_value=False,
                )
            else:
                yield from _problems(value, known.type, (*path, key), suggest)
        for f in fields:
            if f.required and f.encode_name not in data:
                yield _Problem((*path, f.encode_name), "missing; this key is required", False)
        return
    homogeneous = (origin is list and len(args) == 1) or (origin is tuple and args[1:] == (...,))
    if homogeneous and isinstance(data, list):
        for index, item in enumerate(data):
            yield from _problems(item, args[0], (*path, index), suggest)
        return
    if origin is dict and isinstance(data, dict) and len(args) == 2:
        for key, value in data.items():
            yield from _problems(value, args[1], (*path, str(key)), suggest)
        return
    try:
        msgspec.convert(data, kind, dec_hook=_dec_hook, strict=True)
    except msgspec.ValidationError as exc:
        yield _native_problem(str(exc), kind, path)


_AT = re.compile(r"^(.*) - at `(\$[^`]*)`$", re.DOTALL)
_UNKNOWN = re.compile(r"Object contains unknown field `(.*)`$")
_MISSING = re.compile(r"Object missing required field `(.*)`$")
_EXPECTED = re.compile(
    r"Expected `(\w+)`(?:, got `(\w+)`)?(?: (of length )?(>=|<=|>|<) (\S+))?"
    r"(?: matching regex (.*))?$"
)
_NOUN = {
    "int": "a whole number",
    "float": "a number",
    "str": "a string",
    "bool": "true or false, lower case and without quotes",
    "object": "a table",
    "array": "a list",
    "null": "nothing",
}
_GOT = {**_NOUN, "float": "a decimal number", "bool": "a boolean"}
_BOUND = {">=": "at least", "<=": "at most", ">": "more than", "<": "less than"}


def _native_problem(message: str, kind: Any, path: KeyPath) -> _Problem:
    """msgspec's message for ``kind`` at ``path``, reworded as "what is wrong; how to fix"."""
    at = _AT.match(message)
    if at:
        message, inner = at.group(1), parse_path(at.group(2))
        path = path + inner
        if inner:
            kind = None  # the leaf's own type is not known: no bounds to quote
    if unknown := _UNKNOWN.match(message):
        return _Problem((*path, unknown.group(1)), "unknown key", False)
    if missing := _MISSING.match(message):
        return _Problem((*path, missing.group(1)), "missing; this key is required", False)
    if message.startswith("Invalid enum value"):
        options = [str(o) for o in typing.get_args(_unwrap(kind))]
        return _Problem(path, f"must be one of {', '.join(options)}" if options else message)
    expected = _EXPECTED.match(message)
    if expected:
        return _Problem(path, _expected(kind, path, *expected.groups()))
    return _Problem(path, message)


def _expected(
    kind: Any,
    path: KeyPath,
    want: str,
    got: str | None,
    of_length: str | None,
    op: str | None,
    bound: str | None,
    pattern: str | None,
) -> str:
    if pattern is not None:
        return f"must match the pattern {pattern}"
    if op is not None and bound is not None:
        if of_length:
            unit = "characters" if want == "str" else "items"
            return f"must have {_BOUND[op]} {bound} {unit}"
        span = _range(kind, one_bound=True)
        return f"must be {span}" if span else f"must be {_BOUND[op]} {bound}"
    noun = _NOUN.get(want, f"`{want}`")
    span = _range(kind)
    if span:
        noun += f" {span}"
    if want in ("int", "float"):
        noun += ", without quotes"
    if want == "bool" and got == "str":
        return f"must be {noun}; a quoted string is not a boolean"
    if want == "object" and path:
        return f"must be a table: write [{dotted(path)}] on a line of its own and its keys below it"
    return f"must be {noun}" + (f", not {_GOT.get(got, got)}" if got else "")


def _number(value: float) -> str:
    """A bound as an admin writes it: ``100``, not msgspec's ``100.0``."""
    return str(int(value)) if float(value).is_integer() else str(value)


def _range(kind: Any, *, one_bound: bool = False) -> str:
    """``from 1 to 64``, ``more than 0 and at most 100`` for a number type with both bounds;
    with ``one_bound``, also ``at least 1`` for one with one; else ``""``."""
    if typing.get_origin(kind) is not typing.Annotated:
        return ""
    bounds: dict[str, float] = {}
    for meta in kind.__metadata__:
        if isinstance(meta, msgspec.Meta):
            for name in ("ge", "gt", "le", "lt"):
                if getattr(meta, name) is not None:
                    bounds[name] = getattr(meta, name)
    low = (
        f"at least {_number(bounds['ge'])}"
        if "ge" in bounds
        else f"more than {_number(bounds['gt'])}"
        if "gt" in bounds
        else ""
    )
    high = (
        f"at most {_number(bounds['le'])}"
        if "le" in bounds
        else f"less than {_number(bounds['lt'])}"
        if "lt" in bounds
        else ""
    )
    if "ge" in bounds and "le" in bounds:
        return f"from {_number(bounds['ge'])} to {_number(bounds['le'])}"
    if low and high:
        return f"{low} and {high}"
    return (low or high) if one_bound else ""


def field_docs(struct: type[msgspec.Struct]) -> Mapping[str, tuple[str, str]]:
    """Field name -> (type as docs name it, description) of ``struct``'s annotated fields."""
    hints = typing.get_type_hints(struct, include_extras=True)
    docs: dict[str, tuple[str, str]] = {}
    for f in msgspec.structs.fields(struct):
        kind = hints[f.name]
        description = ""
        if typing.get_origin(kind) is typing.Annotated:
            for meta in kind.__metadata__:
                if isinstance(meta, msgspec.Meta) and meta.description:
                    description = meta.description
        docs[f.encode_name] = (type_label(kind), description)
    return docs


def type_label(kind: Any) -> str:
    """How docs name a field's type: ``"integer, 1 to 64"``, ``"duration, more than 0"``."""
    span = _range(kind)
    base = _unwrap(kind)
    if isinstance(base, type) and issubclass(base, Checked):
        return base.LABEL
    if base is bool:
        return "boolean"
    if base is int:
        return f"integer, {span.removeprefix('from ')}" if span else "integer"
    if base is str:
        return "string"
    if isinstance(base, types.UnionType):
        return " or ".join(type_label(arg) for arg in typing.get_args(base))
    return getattr(base, "__name__", str(base))
