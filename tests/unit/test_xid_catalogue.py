"""The XID catalogue: the shipped data, lookups, refinement by message, and how bad files fail."""

from __future__ import annotations

import pytest

from slurm_recovery.decide.model import FaultClass
from slurm_recovery.signals.xid import (
    XID_ACTIONS,
    CatalogueError,
    XidInfo,
    catalogue_from_entries,
    catalogue_from_toml,
    load_xid_catalogue,
    xid_code,
)

APPLICATION_XIDS = (11, 25, 43, 69, 137)
FATAL_HARDWARE_XIDS = (48, 64, 74, 79, 95, 140, 154)
ENTRY = '[[xid]]\ncode = 1\nmeaning = "m"\nclass = "hardware"\naction = "none"\nfatal = true\n'


@pytest.fixture(scope="module")
def shipped():
    return load_xid_catalogue()


def test_shipped_catalogue_covers_the_common_xids(shipped):
    required = {13, 31, 43, 45, 68, 69, 48, 63, 64, 74, 79, 92, 94, 95, 119, 120, 140, 154}
    assert required <= set(shipped)


@pytest.mark.parametrize("code", APPLICATION_XIDS)
def test_application_xids_never_implicate_the_node(shipped, code):
    info = shipped.lookup(code)
    assert info.fault_class is FaultClass.APPLICATION
    assert not info.fatal


@pytest.mark.parametrize("code", (13, 31))
def test_a_gpu_kernel_s_fault_is_restarted_once_never_implicating_the_node(shipped, code):
    # i28k: NVIDIA's RESTART_APP; the program's, the driver's or the GPU's (its HBM): unknown
    info = shipped.lookup(code)
    assert info.fault_class is FaultClass.UNKNOWN and info.nvidia == "RESTART_APP"
    assert not info.fatal and not info.blames_node


@pytest.mark.parametrize("code", FATAL_HARDWARE_XIDS)
def test_fatal_hardware_xids(shipped, code):
    info = shipped.lookup(code)
    assert info.fault_class is FaultClass.HARDWARE
    assert info.fatal


@pytest.mark.parametrize("code", (119, 120))
def test_gsp_xids_are_system_faults(shipped, code):
    info = shipped.lookup(code)
    assert info.fault_class is FaultClass.SYSTEM
    assert info.fatal
    assert info.action == "reset_gpu"


@pytest.mark.parametrize("code", (63, 92, 94))
def test_corrected_or_contained_errors_never_implicate_the_node(shipped, code):
    # NVIDIA: 63 and 92 IGNORE, 94 RESTART_APP (the error was contained to one program).
    info = shipped.lookup(code)
    assert info.fault_class is FaultClass.UNKNOWN
    assert not info.blames_node
    assert not info.fatal


def test_xid_45_alone_implicates_the_node_unless_a_knock_on(shipped):
    info = shipped.lookup(45)
    assert info.fault_class is FaultClass.SYSTEM
    assert not info.fatal
    assert info.knock_on == "any"


def test_xid_79_means_fallen_off_the_bus(shipped):
    info = shipped.lookup(79)
    decision = (info.code, info.meaning, info.fault_class, info.action, info.fatal, info.scope)
    assert decision == (
        79,
        "GPU has fallen off the bus",
        FaultClass.HARDWARE,
        "reboot",
        True,
        "node",
    )
    assert info.label == "xid 79 (GPU has fallen off the bus)"


def test_every_entry_is_well_formed(shipped):
    for code in shipped:
        info = shipped.lookup(code)
        assert info.code == code
        assert info.action in XID_ACTIONS
        assert info.meaning and "\n" not in info.meaning
        assert not (info.fatal and info.fault_class is FaultClass.APPLICATION)


def test_unknown_xid_is_class_unknown_and_not_fatal(shipped):
    info = shipped.lookup(999)
    assert info.fault_class is FaultClass.UNKNOWN
    assert not info.fatal
    assert info.code == 999
    assert info.severity == "warning"  # a node warning, never harmless, never a verdict alone


def test_xid_154_back_to_no_recovery_is_not_fatal(shipped):
    line = "GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)"
    assert not shipped.assess(154, line).fatal
    assert not shipped.assess(154, line).blames_node
    assert shipped.assess(154, "changed from 0x0 (None) to 0x1 (GPU Reset Required)").fatal
    assert shipped.assess(154).fatal


def test_assess_without_marker_is_lookup(shipped):
    assert shipped.assess(79, "anything at all") == shipped.lookup(79)


def test_load_from_a_file(tmp_path):
    path = tmp_path / "xid.toml"
    path.write_text(
        '[[xid]]\ncode = 79\nmeaning = "off the bus"\nclass = "hardware"\n'
        'action = "reboot"\nfatal = true\n'
    )
    catalogue = load_xid_catalogue(path)
    assert catalogue.lookup(79).meaning == "off the bus"
    assert catalogue.source == str(path)
    assert len(catalogue) == 1


def test_missing_file_names_it(tmp_path):
    with pytest.raises(CatalogueError, match="no such file"):
        load_xid_catalogue(tmp_path / "absent.toml")


def test_catalogue_error_is_a_value_error():
    assert issubclass(CatalogueError, ValueError)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[[xid]]\ncode = 1\n", "xid[0].meaning: missing; this key is required"),
        (
            '[[xid]]\ncode = 1\nmeaning = "m"\nclass = "hardwre"\naction = "none"\nfatal = true\n',
            "did you mean 'hardware'",
        ),
        (
            ENTRY.replace('action = "none"', 'action = "rebot"'),
            "did you mean 'reboot'",
        ),
        (
            ENTRY.replace("fatal = true", 'fatal = "yes"'),
            "must be true or false",
        ),
        (
            '[[xid]]\ncode = 1\nmeaning = "m"\nclass = "hardware"\naction = "none"\nfatal = true\n'
            "severity = 3\n",
            "severity: unknown key",
        ),
        (
            '[[xid]]\ncode = 1\nmeaning = "m"\nclass = "application"\naction = "none"\n'
            "fatal = true\n",
            "application XID leaves the GPU usable",
        ),
        (
            '[[xid]]\ncode = 1\nmeaning = "m"\nclass = "hardware"\naction = "none"\nfatal = true\n'
            '[[xid]]\ncode = 1\nmeaning = "n"\nclass = "hardware"\naction = "none"\nfatal = true\n',
            "listed twice",
        ),
        (ENTRY + 'scope = "gpus"\n', "did you mean 'gpu'"),
        ("xids = 3\n", "did you mean 'xid'"),
        ("[[xid]\n", "invalid TOML"),
    ],
)
def test_bad_catalogues_say_what_and_where(text, expected):
    with pytest.raises(CatalogueError) as caught:
        catalogue_from_toml(text, "cat.toml")
    assert expected in str(caught.value)
    assert str(caught.value).startswith("cat.toml")


def test_every_problem_is_listed_with_its_line_key_and_fix():
    text = (
        '[[xid]]\ncode = -1\nmeaning = ""\nclass = "x"\naction = "rebot"\nfatal = 1\n'
        'knock_on = "48 64"\n' + ENTRY.replace('"hardware"', '"application"') + ENTRY + ENTRY
    )
    with pytest.raises(CatalogueError) as caught:
        catalogue_from_toml(text, "cat.toml")
    assert caught.value.problems == (
        "cat.toml:2: xid[0].code = -1: must be at least 0",
        "cat.toml:3: xid[0].meaning = '': must be a non-empty one-line text",
        "cat.toml:4: xid[0].class = 'x': must be one of hardware, system, application, unknown",
        "cat.toml:5: xid[0].action = 'rebot': must be one of none, restart, reset_gpu, reboot, "
        "drain (did you mean 'reboot'?)",
        "cat.toml:6: xid[0].fatal = 1: must be true or false, lower case and without quotes, "
        "not a whole number",
        'cat.toml:7: xid[0].knock_on = \'48 64\': must be "any" or XID codes like "48" or "48, 64"',
        "cat.toml:13: xid[1].fatal: true with class application: an application XID leaves the "
        "GPU usable; set fatal = false, or use class hardware or system if the GPU needs repair",
        "cat.toml:21: xid[3].code: 1 is listed twice; keep one",
    )


def test_catalogue_from_entries_equals_loaded():
    info = XidInfo(
        code=79, meaning="GPU has fallen off the bus", klass="hardware", action="reboot", fatal=True
    )
    built = catalogue_from_entries([info])
    loaded = catalogue_from_toml(
        '[[xid]]\ncode = 79\nmeaning = "GPU has fallen off the bus"\nclass = "hardware"\n'
        'action = "reboot"\nfatal = true\n'
    )
    assert built == loaded


@pytest.mark.parametrize(
    ("payload", "code"),
    [
        ({"xid": 79}, 79),
        ({"xid": "48"}, 48),
        ({}, None),
        ({"xid": True}, None),
        ({"xid": -1}, None),
    ],
)
def test_xid_code_from_payload(payload, code):
    assert xid_code(payload) == code


def test_docs_describe_the_xid_catalogue():
    from pathlib import Path

    docs = (Path(__file__).resolve().parents[2] / "docs" / "signatures.md").read_text()
    assert "## The XID catalogue and NVIDIA's XID catalog" in docs
    assert "log_action" in docs


@pytest.mark.parametrize(
    ("code", "scope"),
    [
        (79, "node"),
        (74, "node"),
        (119, "node"),
        (120, "node"),
        (48, "gpu"),
        (94, "gpu"),
        (95, "gpu"),
        (63, "gpu"),
        (64, "gpu"),
    ],
)
def test_scope_says_whether_a_fault_reaches_the_whole_node(shipped, code, scope):
    assert shipped.lookup(code).scope == scope
    assert shipped.assess(code, "any line").scope == scope


def test_scope_defaults_to_node(shipped):
    assert catalogue_from_toml(ENTRY).lookup(1).scope == "node"
    assert shipped.lookup(9999).scope == "node"  # not in the catalogue
