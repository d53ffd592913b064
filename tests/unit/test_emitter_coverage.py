"""The emitter tables (signals/data/emitters): every message of each emitter, classified, read by
the shipped catalogue as the table says, and the coverage table in docs/signatures.md current.

Each member's example is scanned as ``explain-log --nodes n1`` would (a member that blames no
node: as ``explain-log`` would, the line alone); the verdict must have the member's action, its
class (unless nothing is to be done) and blame a node exactly when the member does. What the
catalogue reads otherwise, or not at all, must be listed in the docs' coverage table
(``python -m bench.attribution --coverage`` prints it): a new disagreement fails here until it
is fixed or documented."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.attribution import coverage_table
from slurm_recovery.signals.coverage import (
    coverage,
    form_line,
    mismatch,
    misread_forms,
    read_example,
)
from slurm_recovery.signals.emitters import (
    EmitterError,
    _table,
    literal_pieces,
    load_emitter_tables,
)
from slurm_recovery.signals.logs import default_catalogue

DOCS = Path(__file__).resolve().parents[2] / "docs" / "signatures.md"
CATALOGUE = default_catalogue()
TABLES = list(load_emitter_tables())
#: enumerations the tables must cover (issue 28), by their file's stem
REQUIRED = {
    "cuda_runtime",
    "cuda_driver",
    "nccl_result",
    "nccl_warn",
    "nvidia_driver",
    "linux_kernel",
    "mlx5_ib",
    "ibv_wc_status",
    "slurm_errno",
    "slurm_daemons",
    "torch_distributed",
    "smartd",
    "nv_status",
    "nvml_recovery_action",
    "cublas_status",
    "nvml_return",
    "errno",
    "ipmi_sel",
    "dcgm_errors",
    "c_runtime",
    "ibv_event_type",
}


def test_every_required_enumeration_has_a_complete_table() -> None:
    names = {t.name for t in TABLES}
    assert names >= REQUIRED
    for table in TABLES:
        assert len(table.members) == table.members_total > 0, table.name
        assert table.source.strip(), table.name


@pytest.mark.parametrize("table", TABLES, ids=[t.name for t in TABLES])
def test_the_catalogue_reads_each_member_as_its_table_says_or_the_docs_say_why(table) -> None:
    c = coverage(table, CATALOGUE)
    # at least 95 % of each table's classified members read as classified
    assert c.agree >= 0.95 * len(c.classified), (c.disagree, c.unrecognised)


@pytest.mark.parametrize("table", TABLES, ids=[t.name for t in TABLES])
def test_every_other_form_of_a_member_is_read_as_that_member(table) -> None:
    assert misread_forms(table, CATALOGUE) == {}


def test_nccl_warn_lists_its_call_sites_in_every_release() -> None:
    # 993 distinct WARN formats in NCCL 2.3.5-2.30.7 (docs/signatures.md); two have too little
    # literal text to be told apart ("%s", the macro stub "Call to")
    warn = next(t for t in TABLES if t.name == "nccl_warn")
    listed = {m.message for m in warn.members} | {f for m in warn.members for f in m.forms}
    assert len(listed) >= 980
    for old in (
        "NET/IB : Got completion with error %d, opcode %d, len %d, vendor err %d",
        "Duplicate GPU detected : rank %d and rank %d both on CUDA device %x",
        "Error while %s shared memory segment %s (size %d)",
        "NCCL library is too old. This application was compiled with NCCL version %s, but is "
        "running with NCCL library version %s.",
    ):
        assert old in listed, old


def test_a_form_line_fills_each_conversion_with_a_value_of_its_kind() -> None:
    assert form_line("rank %d on %s at %p (%.2f%%)") == "rank 7 on mlx5_0 at 0x7f3a2c0040 (1.5%)"


def test_a_form_too_short_to_be_told_apart_is_refused() -> None:
    bad = """
emitter = "x"
source = "y"
members_total = 1

[[member]]
name = "m"
message = "Something failed: %s"
example = "Something failed: x"
class = "unknown"
action = "requeue"
blame_node = false
forms = ["%s: %d"]
"""
    with pytest.raises(EmitterError, match="under 8 literal characters"):
        _table("x", bad, "x.toml")


def test_the_coverage_table_is_current_in_the_docs() -> None:
    assert "\n".join(coverage_table()) in DOCS.read_text(encoding="utf-8")


def test_a_member_s_verdict_is_held_to_action_class_and_blame() -> None:
    cuda = next(t for t in TABLES if t.name == "cuda_runtime")
    ecc = next(m for m in cuda.members if m.name == "cudaErrorECCUncorrectable")
    seen, verdict = read_example(ecc, CATALOGUE)
    assert seen and mismatch(ecc, verdict) == ""
    assert (verdict.action, verdict.blame_nodes) == ("requeue_exclude", ["n1"])
    oom = next(m for m in cuda.members if m.name == "cudaErrorMemoryAllocation")
    seen, verdict = read_example(oom, CATALOGUE)
    assert seen and (verdict.action, verdict.fault_domain) == ("stop", "application")


@pytest.mark.parametrize(
    "line,action,domain",
    [
        # NCCL's words around a CUDA error, XLA's (one error wrapped in another's), old
        # PyTorch's number, Caffe's failed check, a program's own words ending in the runtime's
        # message, a member no signature was written for
        ("gpu1:1:2 [0] NCCL WARN Cuda failure 'out of memory'", "stop", "application"),
        (
            "XlaRuntimeError: INTERNAL: CUDA error: Could not synchronize CUDA stream: "
            "CUDA_ERROR_ECC_UNCORRECTABLE: uncorrectable ECC error encountered",
            "requeue_exclude",
            "hardware",
        ),
        (
            "THCudaCheck FAIL file=/pytorch/aten/src/THC/THCGeneral.cpp line=50 error=2 : "
            "out of memory",
            "stop",
            "application",
        ),
        (
            "F0512 syncedmem.cpp:56] Check failed: error == cudaSuccess (2 vs. 0)  out of memory",
            "stop",
            "application",
        ),
        (
            "ggml_cuda_init: failed to initialize CUDA: system not yet initialized",
            "requeue_exclude",
            "system",
        ),
        # a GPU kernel's fault: restarted once (i28k, docs/signatures.md "When the answer is
        # stop")
        ("RuntimeError: CUDA error: misaligned address", "requeue", "unknown"),
    ],
)
def test_a_cuda_error_is_classified_by_its_member_whatever_wraps_it(
    line: str, action: str, domain: str
) -> None:
    from slurm_recovery.signals.logs import classify

    got = classify(list(CATALOGUE.scan([line])), nodes=["n1"], catalogue=CATALOGUE)
    assert (got.action, got.fault_domain) == (action, domain), got.cause


def test_a_format_is_matched_by_its_literal_parts_in_order() -> None:
    assert literal_pieces("execve(): %s: %m") == ("execve():",)
    assert literal_pieces('%ps exceeded memory limit (%"PRIu64" > %"PRIu64"), being killed') == (
        "exceeded memory limit (",
        "), being killed",
    )
    assert literal_pieces("%s: %d") == ()  # too little literal text to find it by
    tables = load_emitter_tables()
    daemons = ["slurm_daemons"]
    got = tables.lookup(daemons, "slurmstepd: error: execve(): train.py: Permission denied")
    assert got is not None and got.name == "stepd.execve_failed"
    got = tables.lookup(daemons, "StepId=1.0 exceeded memory limit (10 > 5), being killed")
    assert got is not None and got.name == "jobacct.exceeded_memory"
    backwards = tables.lookup(daemons, "being killed), StepId=1.0 exceeded memory limit (10 > 5")
    assert backwards is None or backwards.name != "jobacct.exceeded_memory"


def test_a_table_that_miscounts_or_contradicts_itself_is_refused() -> None:
    text = (
        'emitter = "e"\nsource = "s"\nmembers_total = 2\n[[member]]\nname = "A"\n'
        'example = "x"\nclass = "application"\naction = "requeue_exclude"\nblame_node = true\n'
    )
    with pytest.raises(EmitterError) as caught:
        _table("e", text, "e.toml")
    problems = "\n".join(caught.value.problems)
    assert "members_total: 2, but 1 members" in problems
    assert "only a hardware or system member blames a node" in problems


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=300), st.sampled_from(sorted(REQUIRED)))
def test_a_lookup_of_any_text_names_a_member_of_its_table_or_none(code: str, name: str) -> None:
    found = load_emitter_tables().lookup([name], code)
    assert found is None or found.table == name


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.text(max_size=160), max_size=12))
def test_scanning_any_lines_never_fails_and_table_matches_carry_their_code(lines) -> None:
    for match in CATALOGUE.scan(lines):
        signature = CATALOGUE.get(match.signature_id)
        assert signature is not None
        if signature.unlisted == "ignore":
            assert match.code is not None
