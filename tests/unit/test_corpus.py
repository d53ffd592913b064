"""The attribution corpus (tests/corpus): real failure logs from public reports, labelled from
their sources' resolutions, in two parts by source thread: development (signatures may be
written from it) and sealed (``tests/corpus/sealed.txt``: never). ``python -m bench.attribution``
prints every figure; ``--misses`` the development part's misses.

Issue 28's targets (each part at accuracy and recall >= 0.90, no application fault blamed on a
node) are not met: docs/signatures.md gives the figures and why. What is held here: the corpus
is as large and as split as the issue asks, no node fault is answered ``stop`` in the
development part (the sealed part's one, found when the i28j threads were added, is counted and
not read), and the development part does not fall below today's figures (so a change that loses
ground fails, and one that gains raises these floors)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from bench.attribution import (
    CORPUS,
    LIKE_SEALED,
    SEALED_LIST,
    Case,
    CaseError,
    load_case,
    load_corpus,
    root_ceiling,
    score,
    sealed_threads,
    thread_of,
)

CASES = load_corpus()
DEVELOPMENT = [c for c in CASES if c.part == "development"]
SEALED = [c for c in CASES if c.part == "sealed"]
#: Today's development figures, as floors: (accuracy, node-blame recall, application faults
#: blamed at most), bare and with the job's one node given. (Three sealed threads opened on
#: 2026-12-04 joined the development part with their misses: 0.78 -> 0.767, 3 -> 4 blamed.
#: Bare recall 0.86 -> 0.889: a one-node log that never names its host is blamed rightly on
#: "the log's node". On 2026-12-05 fifteen new host and nodes threads joined the development
#: part, eleven of them node faults; four are read as restarts without the node (a read-only
#: file system in a program's words, an NFS client's hang): recall 0.89 -> 0.86 in both runs.
#: On 2026-12-06 (i28i) a node's own directories read-only blame it and a one-node job's store
#: waits are the program's: bare 0.771, recall 0.899; --nodes n1 0.812, recall 0.902; 3 blamed.
#: On 2026-12-06 (i28j) 24 new development threads were added and measured before any signature
#: was written from them: bare 0.762, recall 0.883, 4 blamed (two NCCL system errors that the
#: threads traced to the launch's network interface); --nodes n1 0.814, recall 0.885, 3 blamed:
#: the floors came down to those figures. With the step's two rules (ncclSystemError no longer
#: blames the node; Slurm's launch failed requeued held excludes it): bare 0.766, recall 0.894,
#: 3 blamed; --nodes n1 0.819, recall 0.897, 3 blamed. On 2026-12-06 (i28k) `stop` was made
#: earned: a GPU kernel's fault (an illegal address, ...), cuDNN's failed execution, PyTorch's
#: DataLoader bus error, an unusable CUDA driver are restarted once unless a program-side line
#: says whose, since a bad node prints them too (docs/signatures.md, "When the answer is stop"):
#: XIDs 13 and 31 are restarted once too; eleven development application faults labelled `stop`
#: became one restart each, the intended trade: bare 0.725, --nodes n1 0.772, recall and blames
#: unchanged. On 2026-12-06 (i28l) two sealed threads seen through a per-area aggregate in i28j,
#: pytorch/examples#548 and pytorch/pytorch#51382, joined the development part with 6 new
#: development threads, and all 8 are missed (6 node faults read as restarts or as nothing; 2 GPU
#: application faults restarted once, as i28k meant); no signature was changed: bare 195 of 277
#: = 0.703, recall 0.84, 3 blamed; --nodes n1 183 of 244 = 0.75, recall 0.847, 3 blamed: the floors
#: came down to those figures. On 2026-12-06 (i28m) NVIDIA's container hook is read by its own
#: error set (a driver that timed out for want of a persistence daemon blames no node) and the
#: fabric manager's version mismatch blames no node: 2 application faults blamed in both runs,
#: accuracy and recall unchanged. On 2026-12-06 (i28o) the GPU setup lines a healthy node prints
#: for the job's own image, libraries or request (NVML's version mismatch, CUDA's 803, the hook's
#: no-device line, NCCL's unhandled cuda error alone) blame no node: 0 application faults blamed
#: in both runs, bare 0.671 and recall 0.75 (9 node faults not excluded), --nodes n1 0.721 and
#: 0.771 (7): the trade docs/signatures.md weighs, "GPU setup lines a healthy node prints".
#: On 2026-12-07 (i28r) torch.cuda.nccl's words for an NCCL result ("NCCL Error 2: unhandled
#: system error", every PyTorch release) read as the ncclResult_t they name, as c10d's words
#: always did: two development application faults labelled `stop`, right before only because
#: those words fell to the generic exception reading, are restarted once as ncclSystemError is
#: everywhere: bare 184 of 277 = 0.664, --nodes n1 174 of 244 = 0.713; recall and blames
#: unchanged.)
FLOORS = {False: (0.664, 0.75, 0), True: (0.713, 0.771, 0)}
#: Node faults answered ``stop``, at most, per part. The development part must keep 0. The sealed
#: part measured 1 once the 12 sealed threads of 2026-12-06 (i28j) were added: which case it is
#: was not looked at (that would open the part); it stays a finding until a signature written
#: from development cases or an emitter's source removes it. On 2026-12-06 (i28k) every stop
#: path that a bad node prints as well became a restart once, designed on the emitters' families
#: (docs/signatures.md, "When the answer is stop"); the sealed count went to 0 in both runs (with
#: XIDs 13 and 31 restarted once; which case it was was not looked at), so both parts hold 0.
STOPPED_AT_MOST = {"development": 0, "sealed": 0}


def test_the_corpus_has_300_cases_from_250_threads_and_a_sealed_part_of_100() -> None:
    assert len(CASES) >= 300
    assert len({c.thread for c in CASES}) >= 250
    assert len(SEALED) >= 100
    assert all(c.url.startswith("https://") for c in CASES)
    assert {c.area for c in CASES} >= {"application", "collective", "gpu", "system", "slurm"}
    assert sum(c.node_fault for c in CASES) >= 80
    assert sum(c.fault_domain == "application" for c in CASES) >= 100


def test_every_sealed_thread_is_in_the_corpus_and_a_thread_is_in_one_part() -> None:
    threads = {c.thread for c in CASES}
    assert sealed_threads() <= threads, sorted(sealed_threads() - threads)
    parts: dict[str, set[str]] = {}
    for case in CASES:
        parts.setdefault(case.thread, set()).add(case.part)
    assert all(len(p) == 1 for p in parts.values())


@pytest.mark.parametrize("with_nodes", [False, True], ids=["bare", "nodes-n1"])
def test_no_node_fault_is_stopped_in_either_part(with_nodes: bool) -> None:
    development = score(DEVELOPMENT, with_nodes=with_nodes)["all"]
    stopped = [m.case.name for m in development.misses if m.error == "node_fault_stopped"]
    assert len(stopped) <= STOPPED_AT_MOST["development"], stopped
    sealed = score(SEALED, with_nodes=with_nodes)["all"]
    # a count only: the sealed part's misses are not printed
    count = sum(m.error == "node_fault_stopped" for m in sealed.misses)
    assert count <= STOPPED_AT_MOST["sealed"], count


@pytest.mark.parametrize("with_nodes", [False, True], ids=["bare", "nodes-n1"])
def test_the_development_part_keeps_its_figures(with_nodes: bool) -> None:
    accuracy, recall, blamed = FLOORS[with_nodes]
    result = score(DEVELOPMENT, with_nodes=with_nodes)["all"]
    missed = [f"{m.case.name}: {m.verdict.action} ({m.verdict.cause})" for m in result.misses]
    assert result.accuracy >= accuracy, missed
    assert result.recall >= recall, missed
    assert result.app_blamed <= blamed, missed


def test_thread_of_ignores_fragments_queries_case_and_a_trailing_slash() -> None:
    url = "https://github.com/NVIDIA/nccl/issues/1234"
    for same in (url + "#issuecomment-99", url + "/", url + "?q=1", url.upper()):
        assert thread_of(same) == thread_of(url)


def test_a_case_with_inconsistent_labels_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(
        'url = "https://example.org/1"\ntitle = "t"\nbasis = "b"\nfault_domain = "application"\n'
        'node_fault = true\naction = "requeue_exclude"\nsingle_node = true\nlog = "x"\n'
    )
    with pytest.raises(CaseError, match="application fault is not a node fault"):
        load_case(bad, "x")
    bad.write_text(bad.read_text().replace("node_fault = true", "node_fault = false"))
    with pytest.raises(CaseError, match="node_fault = true goes with"):
        load_case(bad, "x")


def test_the_corpus_directory_is_where_the_bench_reads_it() -> None:
    assert Path(__file__).resolve().parents[1] / "corpus" == CORPUS
    assert (CORPUS / SEALED_LIST).is_file()


def _case(name: str, log: str, action: str, area: str = "gpu", part: str = "development") -> Case:
    return Case(
        path=Path(f"{name}.toml"),
        area=area,
        url=f"https://example.org/{name}",
        title=name,
        basis="test",
        fault_domain="application" if action == "stop" else "unknown",
        node_fault=False,
        action=action,
        single_node=True,
        log=log,
        part=part,
    )


def test_the_ceiling_counts_what_the_root_line_cannot_separate() -> None:
    segfault = "srun: error: n1: task 0: Segmentation fault (core dumped)"
    cases = [
        _case("a", segfault, "stop"),
        _case("b", segfault, "stop"),
        _case("c", segfault, "requeue"),
        _case("d", "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB", "stop"),
    ]
    assert root_ceiling(cases) == (3, 3, 4, 2)


def test_the_ceiling_without_forbidden_errors_gives_up_labels_that_would_make_one() -> None:
    """Under one root line, 3 application faults (stop) and 1 node fault: the most common
    label, stop, would stop the node fault; requeue_exclude would blame the applications.
    The constrained ceiling takes the best label left (requeue: none of these cases)."""
    segfault = "srun: error: n1: task 0: Segmentation fault (core dumped)"
    node = replace(
        _case("d", segfault, "requeue_exclude"), node_fault=True, fault_domain="hardware"
    )
    cases = [_case(name, segfault, "stop") for name in "abc"] + [node]
    assert root_ceiling(cases) == (3, 0, 4, 1)
    cases.append(_case("e", segfault, "requeue"))
    assert root_ceiling(cases) == (3, 1, 5, 1)


def test_like_for_like_scores_the_development_cases_of_the_sealed_parts_areas_only() -> None:
    oom = "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB"
    cases = [
        _case("a", oom, "stop", area="host"),
        _case("b", oom, "stop", area="gpu"),
        _case("c", oom, "stop", area="host", part="sealed"),
    ]
    scores = score(cases, with_nodes=False)
    assert scores[LIKE_SEALED].cases == 1
    assert scores["development"].cases == 2


def test_a_one_node_log_that_never_names_its_host_is_blamed_rightly_on_the_logs_node() -> None:
    from bench.attribution import Outcome, explain

    line = "Feb 23 03:28:16 kernel: EDAC MC0: 1 UE memory read error on CPU_SrcID#0_Ha#0"
    case = replace(
        _case("ue", line, "requeue_exclude"),
        fault_domain="hardware",
        node_fault=True,
        blame=("c016",),
    )
    assert Outcome(case, explain(case, None), with_nodes=False).error is None
    named = replace(case, log=f"Feb 23 03:28:16 c017 kernel: {line.split('kernel: ')[1]}")
    assert Outcome(named, explain(named, None), with_nodes=False).error == "node_not_excluded"
    several = replace(case, single_node=False)
    assert Outcome(several, explain(several, None), with_nodes=False).error == "node_not_excluded"
