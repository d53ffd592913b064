"""The attribution corpus (tests/corpus): real failure logs from public reports, labelled from
their sources' resolutions. The classifier must score at least 0.90 action accuracy and 0.90
node-blame recall on it, bare and with the job's one node, and never blame a node for an
application fault. ``python -m bench.attribution --misses`` prints the figures and the misses."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.attribution import CORPUS, CaseError, load_case, load_corpus, score

CASES = load_corpus()


def test_the_corpus_has_at_least_150_sourced_cases_in_every_area() -> None:
    assert len(CASES) >= 150
    urls = [case.url for case in CASES]
    assert all(url.startswith("https://") for url in urls)
    assert {case.area for case in CASES} >= {"application", "collective", "gpu", "system"}
    assert sum(case.node_fault for case in CASES) >= 40
    assert sum(case.fault_domain == "application" for case in CASES) >= 40


@pytest.mark.parametrize("with_nodes", [False, True], ids=["bare", "nodes-n1"])
def test_the_classifier_meets_the_targets_on_the_corpus(with_nodes: bool) -> None:
    result = score(CASES, with_nodes=with_nodes)["all"]
    missed = [f"{m.case.name}: {m.verdict.action} ({m.verdict.cause})" for m in result.misses]
    assert result.app_blamed == 0, missed
    assert result.accuracy >= 0.90, missed
    assert result.recall >= 0.90, missed


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
