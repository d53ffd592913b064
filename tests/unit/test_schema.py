"""The shared schema reader: messages name file, line, key and fix; every problem at once."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Annotated, Literal

import msgspec
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from slurm_recovery import schema
from slurm_recovery.schema import (
    Choice,
    PositiveDuration,
    SchemaError,
    convert,
    did_you_mean,
    dotted,
    find_line,
    key_lines,
    parse_path,
    parse_toml,
    read_toml,
)


class Level(Choice):
    OPTIONS = ("debug", "info", "warning")


class Log(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    level: Annotated[Level, msgspec.Meta(description="least severe message")] = Level("info")
    every: PositiveDuration = PositiveDuration.check("5s")


class Entry(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    pattern: str
    count: Annotated[int, msgspec.Meta(ge=1, le=64)] = 1
    mode: Literal["a", "b"] = "a"


class File(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    log: Log = Log()
    entry: list[Entry] = []


class Absolute(type(Path()), schema.Checked):
    @classmethod
    def check(cls, value: object) -> Absolute:
        if not isinstance(value, str) or not value.startswith("/"):
            raise ValueError("must be an absolute path")
        return cls(value)


class PathHolder(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    path: Absolute = Absolute("/x")


TEXT = """\
[log]
level = "warn"
evry = 3
every = 0

[[entry]]
pattern = "a"

[[entry]]
count = 99

[[entry]]
pattern = "x"
count = "3"
mode = "c"
"""


def problems_of(data: object, text: str | None = None) -> list[str]:
    with pytest.raises(SchemaError) as excinfo:
        convert(data, File, source="f.toml", text=text)
    assert str(excinfo.value) == "\n".join(excinfo.value.problems)
    assert isinstance(excinfo.value, ValueError)
    return list(excinfo.value.problems)


# --------------------------------------------------------------------------------- converting


def test_valid_input_converts_with_checked_values():
    loaded = convert({"log": {"level": "DEBUG", "every": "1m"}}, File, source="f.toml")
    assert loaded == File(log=Log(level=Level("debug"), every=PositiveDuration(60)))
    assert type(loaded.log.every) is PositiveDuration
    assert convert({}, File, source="f.toml") == File()


def test_every_problem_names_file_line_key_value_and_fix():
    assert problems_of(parse_toml(TEXT, "f.toml"), TEXT) == [
        "f.toml:2: log.level = 'warn': must be one of debug, info, warning "
        "(did you mean 'warning'?)",
        "f.toml:3: log.evry: unknown key (did you mean 'every'?) (keys of [log]: level, every)",
        "f.toml:4: log.every = 0: must be more than 0 seconds; write a number of seconds (90) "
        'or a string with a unit ("90s", "5m", "1h30m"; units: ms, s, m, h, d)',
        "f.toml:10: entry[1].count = 99: must be from 1 to 64",
        "f.toml:9: entry[1].pattern: missing; this key is required",
        "f.toml:14: entry[2].count = '3': must be a whole number from 1 to 64, without quotes, "
        "not a string",
        "f.toml:15: entry[2].mode = 'c': must be one of a, b",
    ]


def test_without_text_the_line_is_left_out():
    assert problems_of({"log": {"level": 3}}) == [
        "f.toml: log.level = 3: must be a string, one of debug, info, warning"
    ]


def test_a_table_written_as_a_value_says_how_to_write_a_table():
    assert problems_of({"log": "debug"}) == [
        "f.toml: log = 'debug': must be a table: write [log] on a line of its own and its keys "
        "below it"
    ]


def test_prefix_places_a_sub_table_in_the_file():
    text = '[server]\n[server.log]\nlevel = "loud"\n'
    with pytest.raises(SchemaError) as excinfo:
        convert({"level": "loud"}, Log, source="f.toml", text=text, prefix="server.log")
    assert excinfo.value.problems == (
        "f.toml:3: server.log.level = 'loud': must be one of debug, info, warning",
    )


def test_a_custom_suggestion_replaces_the_nearest_field():
    def suggest(table, name, fields):
        assert (table, name, list(fields)) == (("log",), "lvl", ["level", "every"])
        return " (did you mean 'log.level'?)"

    with pytest.raises(SchemaError, match=r"log\.lvl: unknown key \(did you mean 'log\.level'"):
        convert({"log": {"lvl": 1}}, File, source="f", suggest=suggest)


def test_struct_check_after_fields_is_reported():
    class Pair(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
        low: int = 0
        high: int = 0

        def __post_init__(self) -> None:
            if self.low > self.high:
                raise ValueError("low must not exceed high; swap them")

    with pytest.raises(SchemaError) as excinfo:
        convert({"low": 2, "high": 1}, Pair, source="f")
    assert excinfo.value.problems == ("f: low must not exceed high; swap them",)


def test_choice_and_duration_types():
    assert Level.check("INFO") == "info" and type(Level.check("INFO")) is Level
    assert Level.LABEL == "one of debug, info, warning"
    with pytest.raises(ValueError, match=r"must be one of .* \(did you mean 'debug'\?\)"):
        Level.check("debgu")
    with pytest.raises(ValueError, match="more than 0 seconds"):
        PositiveDuration.check("0s")
    assert schema.Duration.check(0) == 0.0


def test_field_docs_give_type_label_and_description():
    assert schema.field_docs(Log) == {
        "level": ("one of debug, info, warning", "least severe message"),
        "every": ("duration, more than 0", ""),
    }
    assert schema.field_docs(Entry)["count"] == ("integer, 1 to 64", "")


# --------------------------------------------------------------------------------- reading


def test_read_toml_returns_text_and_data(tmp_path):
    path = tmp_path / "f.toml"
    path.write_text('[log]\nlevel = "info"\n')
    assert read_toml(path) == ('[log]\nlevel = "info"\n', {"log": {"level": "info"}})


def test_read_toml_refusals_name_the_file(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_toml(tmp_path / "absent.toml")
    with pytest.raises(SchemaError, match=r": is a directory"):
        read_toml(tmp_path)
    latin = tmp_path / "latin.toml"
    latin.write_bytes("# ok\n# caf\u00e9\n".encode("latin-1"))
    with pytest.raises(SchemaError, match=rf"^{re.escape(str(latin))}:2: not UTF-8 text"):
        read_toml(latin)
    bad = tmp_path / "bad.toml"
    bad.write_text("[log]\n\nlevel = debug\n")
    with pytest.raises(SchemaError) as excinfo:
        read_toml(bad)
    assert str(excinfo.value) == (
        f"{bad}:3: invalid TOML: Invalid value (column 9); strings must be quoted, "
        'e.g. level = "debug"\n    level = debug'
    )


def test_read_toml_runs_the_stat_check_on_the_open_file(tmp_path):
    path = tmp_path / "f.toml"
    path.write_text("")
    seen: list[str] = []

    def refuse(name: str, st: os.stat_result) -> None:
        seen.append(name)
        raise SchemaError(f"{name}: refused")

    with pytest.raises(SchemaError, match="refused"):
        read_toml(path, check_stat=refuse)
    assert seen == [str(path)]


# --------------------------------------------------------------------------------- key -> line

# TOML strings hold any character but DEL (and escapes, which json.dumps writes)
TEXT_CHARS = st.characters(codec="utf-8", exclude_characters="\x7f")
KEYS = st.one_of(
    st.from_regex(r"[a-z_][a-z0-9_-]{0,8}", fullmatch=True), st.text(TEXT_CHARS, max_size=6)
)
VALUES = st.one_of(st.integers(), st.booleans(), st.text(TEXT_CHARS, max_size=10))


def toml_key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key, ensure_ascii=False)


@given(st.dictionaries(KEYS, st.dictionaries(KEYS, VALUES, max_size=4), max_size=4))
@example({"]#": {}})  # a quoted table name holding "]" and "#" (found by hypothesis)
@example({"a]": {"b": 1}, "[[x": {"#]": "y"}})
def test_every_key_is_found_on_its_own_line(tables):
    lines = []
    for table, values in tables.items():
        lines.append(f"[{toml_key(table)}]")
        lines.extend(
            f"{toml_key(k)} = {json.dumps(v, ensure_ascii=False)}" for k, v in values.items()
        )
    text = "\n".join(lines) + "\n"
    assert parse_toml(text, "f") == tables  # the text is what the mapping claims
    found = key_lines(text)
    for table, values in tables.items():
        assert text.split("\n")[found[(table,)] - 1] == f"[{toml_key(table)}]"
        for key in values:
            line = text.split("\n")[found[(table, key)] - 1]
            assert line.startswith(f"{toml_key(key)} = ")
            assert find_line(text, (table, key)) == found[(table, key)]
        assert find_line(text, (table, "\0absent")) == found[(table,)]


@given(st.lists(st.integers(0, 3), min_size=1, max_size=6))
def test_array_of_tables_entries_are_numbered(sizes):
    text = "".join("[[job]]\n" + "".join(f"k{i} = {i}\n" for i in range(size)) for size in sizes)
    found = key_lines(text)
    lines = text.splitlines()
    for index, size in enumerate(sizes):
        assert lines[found[("job", index)] - 1] == "[[job]]"
        for i in range(size):
            assert lines[found[("job", index, f"k{i}")] - 1] == f"k{i} = {i}"
            assert found[("job", index, f"k{i}")] > found[("job", index)]


def test_nested_arrays_dotted_keys_and_multiline_strings():
    text = (
        "a.b = 1\n"
        "[[x]]\n"
        'doc = """\n'
        "fake = 1\n"
        '"""\n'
        "[[x.y]]\n"
        "z = 2\n"
        "[[x]]\n"
        "[[x.y]]\n"
        "z = 3  # comment\n"
    )
    found = key_lines(text)
    assert found[("a", "b")] == 1
    assert ("x", 0, "fake") not in found
    assert found[("x", 0, "y", 0, "z")] == 7
    assert found[("x", 1, "y", 0, "z")] == 10
    assert find_line(None, ("a",)) is None
    assert find_line(text, ("nowhere",)) is None


@given(st.lists(st.one_of(st.from_regex(r"[a-z_]{1,6}", fullmatch=True), st.integers(0, 99))))
def test_msgspec_paths_read_back_as_dotted_keys(path):
    path = tuple(path)
    rendered = "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path)
    assert parse_path(rendered) == path
    if path and isinstance(path[0], str):
        assert parse_path(dotted(path)) == path


def test_a_mapping_key_msgspec_does_not_name_ends_the_path():
    assert parse_path("$.a[...].b") == ("a",)


def test_dotted_quotes_keys_that_are_not_bare():
    assert dotted(("a", 0, "b c", "d")) == 'a[0]."b c".d'


# --------------------------------------------------------------------------------- did you mean


@given(st.text(max_size=10), st.lists(st.text(max_size=10), max_size=5))
def test_did_you_mean_suggests_one_of_the_options_or_nothing(name, options):
    text = did_you_mean(name, options)
    if text:
        assert any(text == f" (did you mean {o!r}?)" for o in options)
    if name in options:
        assert text == f" (did you mean {name!r}?)"


def test_did_you_mean_examples():
    assert did_you_mean("warn", ["debug", "warning"]) == " (did you mean 'warning'?)"
    assert did_you_mean("zzz", ["debug", "warning"]) == ""


def test_schema_error_keeps_each_problem():
    error = SchemaError("a: one", "a: two")
    assert error.problems == ("a: one", "a: two")
    assert str(error) == "a: one\na: two"


def test_path_type_reads_a_checked_subclass():
    assert convert({"path": "/y"}, PathHolder, source="f").path == Path("/y")
    with pytest.raises(SchemaError, match=r"^f: path = 'y': must be an absolute path$"):
        convert({"path": "y"}, PathHolder, source="f")


class Flags(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    on: bool = False


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("true", "must be true or false, lower case and without quotes; a quoted string is not"),
        (1, "must be true or false, lower case and without quotes, not a whole number"),
    ],
)
def test_boolean_messages_say_how_to_write_one(value, expected):
    with pytest.raises(SchemaError) as excinfo:
        convert({"on": value}, Flags, source="f")
    [problem] = excinfo.value.problems
    assert problem.startswith(f"f: on = {value!r}: {expected}")
