"""Every XID row follows NVIDIA's XID catalog by a stated rule, unless it says why not.

NVIDIA's catalog (Xid-Catalog.xlsx, docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html,
as generated into leptonai/gpud components/accelerator/nvidia/xid/catalog_generated.go) lists
codes 1-172, each with an immediate-action bucket. The rule, for the explain-log action
(``log_action``) and for whether the XID implicates its node (``blames_node``):

- IGNORE: nothing failed: ``none``, never blames.
- RESTART_APP: the application restarts: ``requeue`` (contained error) or ``stop`` (the
  program's own bug); never blames.
- RESET_GPU, RESTART_BM, RESTART_VM, CONTACT_SUPPORT and NVIDIA's node workflows: the GPU or
  node needs a reset, a reboot or a human: ``requeue_exclude``, blames.
- No bucket (""): the row's ``differs`` gives the project's reading.
"""

from __future__ import annotations

import re

import pytest

from slurm_recovery.decide.model import FaultClass
from slurm_recovery.signals.xid import (
    LOG_ACTIONS,
    NVIDIA_RESOLUTIONS,
    is_knock_on,
    load_xid_catalogue,
    log_action,
    parse_xid_line,
)

#: The codes of NVIDIA's catalog at the cited commit: every one from 1 to 172.
NVIDIA_CODES = range(1, 173)
#: NVIDIA's workflows whose first step is a GPU reset, a fabric-manager restart, a
#: mechanical check or a software update on the node: node-side.
NODE_WORKFLOWS = (
    "WORKFLOW_XID_45",
    "WORKFLOW_XID_48",
    "WORKFLOW_NVLINK_ERR",
    "WORKFLOW_NVLINK5_ERR",
    "XID_154",
    "CHECK_MECHANICALS",
    "UPDATE_SWFW",
    "CHECK_UVM",
)
NODE_SIDE = ("RESET_GPU", "RESTART_BM", "RESTART_VM", "CONTACT_SUPPORT", *NODE_WORKFLOWS)
GPUS = {"A100", "H100", "B100", "GB200"}

SHIPPED = load_xid_catalogue()
ROWS = [SHIPPED.lookup(code) for code in SHIPPED]


def test_every_code_of_nvidias_catalog_is_listed():
    assert set(NVIDIA_CODES) <= set(SHIPPED)


@pytest.mark.parametrize("info", ROWS, ids=lambda i: f"xid{i.code}")
def test_row_cites_its_source_and_commit(info):
    assert re.search(r"@[0-9a-f]{40}:", info.source), info.source
    assert "catalog_generated.go" in info.source
    assert info.mnemonic
    assert set(info.gpus) <= GPUS
    assert info.nvidia in (*NVIDIA_RESOLUTIONS, *NODE_WORKFLOWS, "")


@pytest.mark.parametrize("info", ROWS, ids=lambda i: f"xid{i.code}")
def test_decision_follows_nvidias_resolution(info):
    action = log_action(info)
    assert action in LOG_ACTIONS
    if info.differs:
        return  # the row says why it departs from NVIDIA (checked below)
    if info.nvidia == "IGNORE":
        assert action == "none", info
        assert not info.blames_node and not info.fatal
    elif info.nvidia == "RESTART_APP":
        assert action in ("requeue", "stop"), info
        assert not info.blames_node and not info.fatal
    elif info.nvidia in NODE_SIDE:
        assert action == "requeue_exclude", info
        assert info.blames_node
    else:
        pytest.fail(f"xid {info.code}: no bucket ({info.nvidia!r}) and no differs reason")


def test_rows_that_differ_say_why_and_are_few():
    differ = {info.code for info in ROWS if info.differs}
    assert differ == {43, 137} | set(range(162, 173))
    for info in ROWS:
        if info.nvidia == "":
            assert info.differs, info.code


@pytest.mark.parametrize(
    ("code", "action"),
    [
        (63, "none"),  # row remap recorded: IGNORE
        (92, "none"),  # high single-bit ECC rate: IGNORE
        (94, "requeue"),  # contained ECC error: RESTART_APP, the node is not blamed
        (13, "requeue"),  # RESTART_APP: a GPU kernel's fault, restarted once (i28k)
        (31, "requeue"),
        (43, "stop"),
        (45, "requeue_exclude"),  # alone: node-side (WORKFLOW_XID_45)
        (46, "requeue_exclude"),
        (54, "requeue_exclude"),
        (79, "requeue_exclude"),
        (109, "requeue_exclude"),
        (110, "requeue_exclude"),
        (119, "requeue_exclude"),
        (136, "requeue_exclude"),
        (143, "requeue_exclude"),
        (155, "requeue_exclude"),
        (156, "requeue_exclude"),
        (158, "requeue_exclude"),
        (167, "requeue_exclude"),
        (169, "requeue_exclude"),
        (1, "requeue_exclude"),  # legacy code: CONTACT_SUPPORT
    ],
)
def test_named_codes(code, action):
    assert log_action(SHIPPED.lookup(code)) == action


def test_xid_154_to_none_blames_nothing():
    none = "GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)"
    reboot = "GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)"
    assert log_action(SHIPPED.lookup(154), none) == "none"
    assert log_action(SHIPPED.assess(154, none)) == "none"
    assert not SHIPPED.assess(154, none).blames_node
    assert log_action(SHIPPED.lookup(154), reboot) == "requeue_exclude"
    assert SHIPPED.assess(154, reboot).fatal


# leptonai/gpud components/accelerator/nvidia/xid/nvlink_logs_test.go (the NVLink5 line forms)
NVLINK5_NONFATAL = (
    "NVRM: Xid (PCI:0000:04:00): 145, RLW_REMAP Nonfatal XC0 i0 Link 00 "
    "(0x00000004 0x00000001 0x00000000 0x00000000)"
)
NVLINK5_FATAL = (
    "NVRM: Xid (PCI:0000:04:00): 145, RLW_REMAP Fatal XC0 i0 Link 00 "
    "(0x00000004 0x00000040 0x00000000 0x00000000)"
)


@pytest.mark.parametrize("code", range(144, 151))
def test_nvlink5_is_node_side_fatal_or_not(code):
    info = SHIPPED.lookup(code)
    assert info.scope == "node"
    assert log_action(info, "SAW_MVB Nonfatal XC0 i0 Link 00 (0x1 0x1)") == "requeue_exclude"
    assert log_action(info, "SAW_MVB Fatal XC0 i0 Link 00 (0x1 0x2)") == "requeue_exclude"


def test_nvlink5_line_word_sets_fatality_not_blame():
    nonfatal = parse_xid_line(NVLINK5_NONFATAL)
    fatal = parse_xid_line(NVLINK5_FATAL)
    assert nonfatal is not None and fatal is not None
    soft = SHIPPED.assess(nonfatal.xid, nonfatal.message)
    hard = SHIPPED.assess(fatal.xid, fatal.message)
    assert not soft.fatal and soft.blames_node
    assert hard.fatal and hard.blames_node


def test_nvlink5_subcode_is_bits_20_to_25_of_the_first_register():
    # leptonai/gpud PR #1174 (tests/unit/test_kmsg.py): XID 149 NETIR_LINK_EVT, IntrInfo 0x025001c6
    line = (
        "NVRM: Xid (PCI:0000:00:00): 149, NETIR_LINK_EVT Fatal XC0 i0 Link 00 (0x025001c6 "
        "0x00000000 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)"
    )
    found = parse_xid_line(line)
    assert found is not None and found.nvlink is not None
    assert found.nvlink["subcode"] == 0b100101  # bits 25..20 of 0x025001c6
    assert parse_xid_line(NVLINK5_FATAL).nvlink["subcode"] == 0


def test_xid_45_is_a_knock_on_only_beside_another_xid():
    info = SHIPPED.lookup(45)
    assert not is_knock_on(info, [])
    assert not is_knock_on(info, [45, 45])
    assert is_knock_on(info, [48])
    assert is_knock_on(info, [13, 45])


def test_ecc_details_are_knock_ons_of_xid_48():
    for code in (171, 172):
        info = SHIPPED.lookup(code)
        assert is_knock_on(info, [48])
        assert not is_knock_on(info, [79])
    assert not is_knock_on(SHIPPED.lookup(79), [48])


def test_unknown_code_requeues_as_a_node_warning():
    info = SHIPPED.lookup(999)
    assert info.fault_class is FaultClass.UNKNOWN
    assert info.severity == "warning"
    assert not info.blames_node
    assert log_action(info) == "requeue"


def test_gpus_transcribed_from_the_catalog():
    assert SHIPPED.lookup(54).gpus == ("A100", "H100", "B100")
    assert SHIPPED.lookup(136).gpus == ("H100",)
    assert SHIPPED.lookup(121).gpus == ("GB200",)
    assert SHIPPED.lookup(144).gpus == ("B100", "GB200")
    assert SHIPPED.lookup(1).gpus == ()  # legacy: Volta and older
