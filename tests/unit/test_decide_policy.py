"""The policy file: every key, its default, how mistakes are refused, and that the docs agree."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from slurm_recovery.decide.model import Action, FaultClass, Mode
from slurm_recovery.decide.policy import (
    DEFAULT_CLASSES,
    KEYS,
    BlastRadius,
    ClassPolicy,
    EvidenceWindow,
    Policy,
    PolicyError,
    load_policy,
    policy_from_toml,
)

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "etc" / "policy.toml"
DOCS = REPO / "docs" / "policy.md"


def write(folder: Path, text: str, mode: int = 0o644) -> Path:
    path = folder / "policy.toml"
    path.write_text(text)
    path.chmod(mode)
    return path


def problem(text: str) -> str:
    with pytest.raises(PolicyError) as caught:
        policy_from_toml(text, "policy.toml")
    return str(caught.value)


# --------------------------------------------------------------------------------- defaults


def test_defaults():
    policy = Policy()
    assert policy.mode is Mode.MONITOR
    assert dict(policy.partition_modes) == {}
    assert policy.max_restarts == 3
    assert policy.max_excluded_nodes == 2
    assert policy.do_not_requeue_exit_codes == frozenset({93})
    assert policy.for_class(FaultClass.HARDWARE) == ClassPolicy(
        Action.REQUEUE_EXCLUDE, drain=True, drain_min_confidence=0.9
    )
    assert policy.for_class(FaultClass.SYSTEM) == ClassPolicy(Action.REQUEUE_EXCLUDE, drain=False)
    assert policy.for_class(FaultClass.APPLICATION).action is Action.STOP
    assert policy.for_class(FaultClass.UNKNOWN).action is Action.REQUEUE
    assert policy.blast_radius == BlastRadius(max_nodes=4, max_percent=10.0, window=3600.0)
    assert policy.fatal_evidence_window == EvidenceWindow(window_before=600.0, window_after=300.0)


def test_empty_file_is_the_defaults():
    assert policy_from_toml("") == Policy()


def test_shipped_policy_loads_and_equals_the_defaults():
    policy = load_policy(SHIPPED)
    assert policy == Policy()
    assert policy.source == str(SHIPPED)


def test_shipped_policy_lists_every_key_with_its_default():
    data = tomllib.loads(SHIPPED.read_text())
    for key in KEYS:
        if key.dotted.startswith("partitions."):
            continue  # an example only: no partition is listed by default
        node = data
        for part in key.dotted.split("."):
            assert part in node, f"etc/policy.toml lacks {key.dotted}"
            node = node[part]
        assert node == key.default, key.dotted
        assert policy_from_toml("") == policy_from_toml(_set(key.dotted, key.default))


def test_shipped_policy_comments_every_section_and_top_level_key():
    lines = SHIPPED.read_text().splitlines()
    for number, line in enumerate(lines):
        if line and not line.startswith("#") and (line.startswith("[") or "=" in line):
            previous = lines[number - 1] if number else ""
            in_table = previous and not previous.startswith("#") and not previous.startswith("[")
            assert previous.startswith("#") or in_table or previous.startswith("["), line


def test_docs_describe_every_key_with_its_default():
    docs = DOCS.read_text()
    for key in KEYS:
        assert f"`{key.dotted}`" in docs, f"docs/policy.md lacks {key.dotted}"
    for rule in ("do_not_requeue_exit_codes", "max_restarts", "max_excluded_nodes", "blast_radius"):
        assert f"`{rule}`" in docs


def _set(dotted: str, value: object) -> str:
    """TOML text setting one dotted key."""
    rendered = _toml(value)
    if "." not in dotted:
        return f"{dotted} = {rendered}\n"
    table, name = dotted.rsplit(".", 1)
    return f"[{table}]\n{name} = {rendered}\n"


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return repr(value)


# --------------------------------------------------------------------------------- every key


def test_every_key_takes_effect():
    text = """
mode = "act"
max_restarts = 5
max_excluded_nodes = 4
do_not_requeue_exit_codes = [93, 42]

[partitions.gpu]
mode = "monitor"

[partitions.debug]
mode = "act"

[classes.hardware]
action = "requeue"
drain = false
drain_min_confidence = 0.5

[classes.system]
action = "stop"
drain = true
drain_min_confidence = 0.8

[classes.application]
action = "none"

[classes.unknown]
action = "stop"

[blast_radius]
max_nodes = 10
max_percent = 25
window = "30m"

[fatal_evidence_window]
window_before = "20m"
window_after = 60
"""
    policy = policy_from_toml(text, "p.toml")
    assert policy.mode is Mode.ACT
    assert dict(policy.partition_modes) == {"debug": Mode.ACT, "gpu": Mode.MONITOR}
    assert policy.max_restarts == 5
    assert policy.max_excluded_nodes == 4
    assert policy.do_not_requeue_exit_codes == frozenset({93, 42})
    assert policy.for_class(FaultClass.HARDWARE) == ClassPolicy(Action.REQUEUE, False, 0.5)
    assert policy.for_class(FaultClass.SYSTEM) == ClassPolicy(Action.STOP, True, 0.8)
    assert policy.for_class(FaultClass.APPLICATION).action is Action.NONE
    assert policy.for_class(FaultClass.UNKNOWN).action is Action.STOP
    assert policy.blast_radius == BlastRadius(10, 25.0, 1800.0)
    assert policy.fatal_evidence_window == EvidenceWindow(1200.0, 60.0)
    assert policy.source == "p.toml"


def test_a_partial_class_table_keeps_that_class_defaults():
    policy = policy_from_toml('[classes.hardware]\naction = "requeue"\n')
    hardware = policy.for_class(FaultClass.HARDWARE)
    assert hardware.action is Action.REQUEUE
    assert hardware.drain is True
    assert policy.for_class(FaultClass.SYSTEM) == DEFAULT_CLASSES[FaultClass.SYSTEM]


def test_modes_are_case_insensitive():
    assert policy_from_toml('mode = "ACT"').mode is Mode.ACT


def test_mode_for_partitions():
    policy = policy_from_toml('[partitions.gpu]\nmode = "act"\n[partitions.big]\nmode = "act"\n')
    assert policy.mode_for("gpu") is Mode.ACT
    assert policy.mode_for("cpu") is Mode.MONITOR
    assert policy.mode_for("") is Mode.MONITOR
    assert policy.mode_for("gpu,big") is Mode.ACT
    assert policy.mode_for("gpu,cpu") is Mode.MONITOR  # act only when every partition acts
    everywhere = policy_from_toml('mode = "act"\n[partitions.cpu]\nmode = "monitor"\n')
    assert everywhere.mode_for("gpu") is Mode.ACT
    assert everywhere.mode_for("cpu") is Mode.MONITOR


def test_exit_codes_may_be_empty():
    assert policy_from_toml("do_not_requeue_exit_codes = []").do_not_requeue_exit_codes == set()


def test_zero_caps_are_allowed():
    policy = policy_from_toml("max_restarts = 0\n[blast_radius]\nmax_nodes = 0\nmax_percent = 0\n")
    assert policy.max_restarts == 0
    assert policy.blast_radius.max_nodes == 0


# --------------------------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    ("text", "key", "words"),
    [
        ('mode = "acting"', "mode", "must be one of monitor, act"),
        ("mode = 1", "mode", "must be a string"),
        ("max_restarts = -1", "max_restarts", "must be at least 0"),
        ("max_restarts = 2.5", "max_restarts", "whole number"),
        ("max_restarts = true", "max_restarts", "whole number"),
        ('max_excluded_nodes = "2"', "max_excluded_nodes", "whole number"),
        ("do_not_requeue_exit_codes = 93", "do_not_requeue_exit_codes", "must be a list"),
        ("do_not_requeue_exit_codes = [300]", "do_not_requeue_exit_codes[0]", "from 0 to 255"),
        ('[partitions.gpu]\nmode = "akt"', "partitions.gpu.mode", "did you mean 'act'"),
        ('[classes.hardware]\naction = "restart"', "classes.hardware.action", "requeue_exclude"),
        ('[classes.hardware]\ndrain = "yes"', "classes.hardware.drain", "true or false"),
        (
            "[classes.system]\ndrain_min_confidence = 1.5",
            "classes.system.drain_min_confidence",
            "from 0 to 1",
        ),
        ("[blast_radius]\nmax_nodes = -3", "blast_radius.max_nodes", "must be at least 0"),
        ("[blast_radius]\nmax_percent = 120", "blast_radius.max_percent", "from 0 to 100"),
        ("[blast_radius]\nmax_percent = nan", "blast_radius.max_percent", "from 0 to 100"),
        ('[blast_radius]\nwindow = "0s"', "blast_radius.window", "more than 0"),
        ('[blast_radius]\nwindow = "1 week"', "blast_radius.window", "not a duration"),
        (
            '[fatal_evidence_window]\nwindow_before = "-5m"',
            "fatal_evidence_window.window_before",
            "duration",
        ),
        (
            "[fatal_evidence_window]\nwindow_after = false",
            "fatal_evidence_window.window_after",
            "duration",
        ),
        (
            '[fatal_evidence_window]\nsettle = "2m"',
            "fatal_evidence_window.settle",
            "must be at most 60 seconds",
        ),
    ],
)
def test_bad_values_name_file_key_and_fix(text, key, words):
    message = problem(text)
    assert re.match(rf"policy\.toml:\d+: {re.escape(key)} = ", message), message
    assert words in message


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("max_restart = 3", "max_restart: unknown key (did you mean 'max_restarts'?)"),
        ('window = "1h"', "(did you mean 'blast_radius.window'?): write it under [blast_radius]"),
        (
            "[blast_radius]\nmax_node = 3",
            "blast_radius.max_node: unknown key (did you mean 'blast_radius.max_nodes'?)",
        ),
        ("[blast_radius]\nmax_restarts = 3", "(did you mean 'max_restarts'?): a top-level key"),
        ('[fatal_evidence_window]\nbefore = "1m"', "fatal_evidence_window.before: unknown key"),
        (
            "[blast_radis]\nmax_nodes = 3",
            "policy.toml:1: blast_radis: unknown table (did you mean '[blast_radius]'?)",
        ),
        (
            '[classes.hardwre]\naction = "stop"',
            "classes.hardwre: unknown table (did you mean '[classes.hardware]'?)",
        ),
        ("[classes.hardware]\ndrian = true", "(did you mean 'classes.hardware.drain'?)"),
        ('[partitions.gpu]\nmod = "act"', "(did you mean 'partitions.gpu.mode'?)"),
        ('[partitions]\ngpu = "act"', "write [partitions.gpu]"),
        ('classes = "x"', "classes = 'x': must be a table: write [classes]"),
        ("[classes.application]\ndrain = true", "never implicates a node"),
        ("[classes.unknown]\ndrain_min_confidence = 0.5", "never implicates a node"),
        ('[partitions."a,b"]\nmode = "act"', "not a Slurm partition name"),
    ],
)
def test_unknown_and_misplaced_keys_are_errors_with_a_hint(text, words):
    assert words in problem(text)


def test_every_problem_is_reported_at_once():
    with pytest.raises(PolicyError) as caught:
        policy_from_toml('mode = "x"\nmax_restarts = -1\n[blast_radius]\nmax_nodes = "4"\n')
    assert len(caught.value.problems) == 3


def test_every_problem_of_one_table_is_reported_with_its_line():
    with pytest.raises(PolicyError) as caught:
        policy_from_toml(
            '[partitions." "]\nmode = "act"\n[hang]\nfloor = "0s"\nrecent_intervals = 0\n',
            "policy.toml",
        )
    assert [p.split(": ")[:2] for p in caught.value.problems] == [
        ["policy.toml:1", '[partitions." "]'],
        ["policy.toml:4", "hang.floor = '0s'"],
        ["policy.toml:5", "hang.recent_intervals = 0"],
    ]


def test_syntax_errors_name_the_file():
    assert problem("mode = act\n").startswith("policy.toml:1: invalid TOML")
    assert "strings must be quoted" in problem("mode = act\n")


def test_policy_error_is_a_value_error():
    assert issubclass(PolicyError, ValueError)


# --------------------------------------------------------------------------------- the file


def test_load_policy_reads_the_file(tmp_path):
    path = write(tmp_path, "max_restarts = 1\n")
    policy = load_policy(path)
    assert policy.max_restarts == 1
    assert policy.source == str(path)


def test_missing_file_names_it(tmp_path):
    with pytest.raises(PolicyError, match="no such file"):
        load_policy(tmp_path / "absent.toml")


def test_a_directory_is_refused(tmp_path):
    with pytest.raises(PolicyError, match="is a directory"):
        load_policy(tmp_path)


def test_world_writable_file_is_refused(tmp_path):
    path = write(tmp_path, "", mode=0o666)
    with pytest.raises(PolicyError, match=r"world-writable.*chmod o-w"):
        load_policy(path)


def test_not_utf8_is_refused_with_the_line(tmp_path):
    path = tmp_path / "policy.toml"
    path.write_bytes(b"max_restarts = 3\n# \xff\n")
    path.chmod(0o644)
    with pytest.raises(PolicyError, match=r"policy.toml:2: not UTF-8"):
        load_policy(path)


def test_errors_from_a_file_name_the_file(tmp_path):
    path = write(tmp_path, "max_restarts = -1\n")
    with pytest.raises(PolicyError) as caught:
        load_policy(path)
    assert str(caught.value).startswith(f"{path}:1: max_restarts = -1")


def test_a_world_writable_folder_is_refused(tmp_path):
    folder = tmp_path / "open"
    folder.mkdir()
    path = write(folder, "")
    folder.chmod(0o777)
    with pytest.raises(PolicyError, match=r"directory .* is world-writable.*chmod o-w"):
        load_policy(path)
    folder.chmod(0o1777)  # sticky, like /tmp: only the owner may replace the file
    assert load_policy(path) == Policy()
