"""Attribution accuracy of ``srecovery explain-log`` on the corpus of real failure logs.

Usage: ``python -m bench.attribution [--corpus tests/corpus] [--misses] [--json FILE]``.

Each case in ``tests/corpus/<area>/*.toml`` (format: ``tests/corpus/README.md``) holds a log
excerpt from a public bug report and the label its source's resolution gives. Every case is
classified as ``explain-log`` does (the shipped catalogue, :func:`classify`) twice: bare, and,
for a single-node job, with the job's one node given (``--nodes n1``). Prints, per area and in
all, for both runs:

- action accuracy: the verdict's action is the labelled one;
- node-blame recall: of the cases where a node really was bad, the share that blame a node
  (with ``--nodes n1``: that blame exactly n1; bare, with a labelled ``blame``: one of those);
- application faults blamed: cases labelled ``fault_domain = "application"`` that blame a node
  (must be 0), and all false blames (a node blamed where none was at fault).

The corpus has two parts, by source thread: the **sealed** threads listed in
``tests/corpus/sealed.txt`` and the **development** part (every other thread). Signatures are
written only from the development part and from the emitters' own sources
(``signals/data/emitters``); the sealed part measures how well that generalises, and its misses
are not printed unless asked for (``--sealed-misses``: reading them opens the part, which then
has to be replaced by new sealed cases). Every figure is given for each part and for both.

Errors are counted by what they cost (``ERROR_KINDS``, most expensive first): a node fault
answered ``stop`` loses the job; an application fault with a node blamed drains a healthy node
for everyone; a failure answered ``none`` leaves a job dead that could have run; a node fault
requeued without excluding the node (or excluding another) lands on it again; an application
fault requeued wastes one restart (bounded by ``stop_on_same_failure``); a case that needed
nothing answered with an action, and a transient failure stopped, are counted last.
"""

from __future__ import annotations

import argparse
import sys
import tomllib
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from slurm_recovery.signals.coverage import coverage
from slurm_recovery.signals.logs import THIS_NODE, LogVerdict, classify, default_catalogue

try:  # python -m bench.attribution, or imported by the tests
    from bench.report import write_json
except ImportError:  # python bench/attribution.py (as python -m bench runs it)
    from report import write_json  # type: ignore[no-redef]

CORPUS = Path(__file__).resolve().parent.parent / "tests" / "corpus"
#: The sealed part's threads, one URL per line (``#`` comments allowed), in CORPUS.
SEALED_LIST = "sealed.txt"
PARTS = ("development", "sealed")
#: Error kinds, most expensive first (see the module docstring); a miss counts once, as the
#: first kind it is.
ERROR_KINDS = (
    "node_fault_stopped",
    "application_blamed",
    "healthy_node_blamed",
    "failure_left_dead",
    "node_not_excluded",
    "application_restarted",
    "transient_stopped",
    "nothing_needed",
)
ACTIONS = ("requeue_exclude", "requeue", "stop", "none")
DOMAINS = ("hardware", "system", "application", "unknown")
REQUIRED = ("url", "title", "basis", "fault_domain", "node_fault", "action", "single_node", "log")
#: the node name a single-node case is given, as the independent evaluation does
ONE_NODE = "n1"


class CaseError(ValueError):
    """A corpus file that is not a well-formed case (names the file and the key)."""


@dataclass(frozen=True)
class Case:
    path: Path
    area: str
    url: str
    title: str
    basis: str
    fault_domain: str
    node_fault: bool
    action: str
    single_node: bool
    log: str
    blame: tuple[str, ...] = ()
    part: str = "development"

    @property
    def name(self) -> str:
        return f"{self.area}/{self.path.stem}"

    @property
    def thread(self) -> str:
        return thread_of(self.url)


def thread_of(url: str) -> str:
    """The source thread a URL points into: without its #fragment, ?query and trailing slash,
    in lower case (two comments of one issue are one thread)."""
    return url.split("#", 1)[0].split("?", 1)[0].rstrip("/").lower()


def sealed_threads(root: Path = CORPUS) -> frozenset[str]:
    """The threads of the sealed part (``sealed.txt``; none when the file is absent)."""
    try:
        text = (root / SEALED_LIST).read_text(encoding="utf-8")
    except FileNotFoundError:
        return frozenset()
    lines = (line.strip() for line in text.splitlines())
    return frozenset(thread_of(line) for line in lines if line and not line.startswith("#"))


def load_case(path: Path, area: str) -> Case:
    """One case, checked: every key present and typed, labels from the allowed sets and
    consistent with each other (a node fault is requeue_exclude; an application fault blames
    no node)."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise CaseError(f"{path}: {exc}") from exc
    missing = [k for k in REQUIRED if k not in data]
    if missing:
        raise CaseError(f"{path}: missing {', '.join(missing)}")
    for key in ("url", "title", "basis", "log", "fault_domain", "action"):
        if not isinstance(data[key], str) or not data[key].strip():
            raise CaseError(f"{path}: {key} must be a non-empty string")
    for key in ("node_fault", "single_node"):
        if not isinstance(data[key], bool):
            raise CaseError(f"{path}: {key} must be true or false")
    if not data["url"].startswith("https://"):
        raise CaseError(f"{path}: url must be an https:// address")
    if data["action"] not in ACTIONS:
        raise CaseError(f"{path}: action must be one of {', '.join(ACTIONS)}")
    if data["fault_domain"] not in DOMAINS:
        raise CaseError(f"{path}: fault_domain must be one of {', '.join(DOMAINS)}")
    if data["node_fault"] != (data["action"] == "requeue_exclude"):
        raise CaseError(f"{path}: node_fault = true goes with action = requeue_exclude, only")
    if data["fault_domain"] == "application" and data["node_fault"]:
        raise CaseError(f"{path}: an application fault is not a node fault")
    blame = data.get("blame", [])
    if not isinstance(blame, list) or not all(isinstance(b, str) and b for b in blame):
        raise CaseError(f"{path}: blame must be a list of host names")
    return Case(
        path=path,
        area=area,
        url=data["url"],
        title=data["title"],
        basis=data["basis"],
        fault_domain=data["fault_domain"],
        node_fault=data["node_fault"],
        action=data["action"],
        single_node=data["single_node"],
        log=data["log"],
        blame=tuple(blame),
    )


def load_corpus(root: Path = CORPUS) -> list[Case]:
    """Every case under ``root`` (one sub-directory per area), in name order, each marked with
    its part (sealed when its thread is in ``sealed.txt``)."""
    sealed = sealed_threads(root)
    cases = []
    for path in sorted(root.glob("*/*.toml")):
        case = load_case(path, path.parent.name)
        if case.thread in sealed:
            case = replace(case, part="sealed")
        cases.append(case)
    return cases


def explain(case: Case, nodes: Sequence[str] | None) -> LogVerdict:
    """The verdict ``srecovery explain-log`` gives on the case's log (same catalogue, same
    :func:`classify`)."""
    catalogue = default_catalogue()
    matches = list(catalogue.scan_text(case.log, source=case.name))
    return classify(matches, nodes=nodes, catalogue=catalogue)


@dataclass
class Outcome:
    case: Case
    verdict: LogVerdict
    with_nodes: bool

    @property
    def right_action(self) -> bool:
        return self.verdict.action == self.case.action

    @property
    def blamed(self) -> bool:
        return bool(self.verdict.blame_nodes)

    @property
    def right_blame(self) -> bool:
        """A node fault blamed on the right node: exactly n1 with ``--nodes n1``; bare, any
        node unless the case names which, and then that one (or, for a one-node log that
        never names it, the log's own node)."""
        got = self.verdict.blame_nodes
        if self.with_nodes:
            return got == [ONE_NODE]
        if self.case.blame:
            short = {b.split(".", 1)[0] for b in self.case.blame}
            if any(g.split(".", 1)[0] in short for g in got):
                return True
            # a one-node log that never names its host: "the log's node" is the only right
            # answer the text allows (the source named the host, the lines do not)
            unnamed = not any(b in self.case.log for b in short)
            return self.case.single_node and unnamed and got == [THIS_NODE]
        return bool(got)

    @property
    def error(self) -> str | None:
        """The kind of error this outcome is (:data:`ERROR_KINDS`), or None when right."""
        case, got = self.case, self.verdict.action
        if case.node_fault:
            if got == "stop":
                return "node_fault_stopped"
            if got == "none":
                return "failure_left_dead"
            if not self.right_blame or got != "requeue_exclude":
                return "node_not_excluded"
            return None
        if self.blamed:
            return (
                "application_blamed"
                if case.fault_domain == "application"
                else ("healthy_node_blamed")
            )
        if got == case.action:
            return None
        if got == "none":
            return "failure_left_dead"
        if case.action == "stop":
            return "application_restarted"
        if case.action == "requeue" and got == "stop":
            return "transient_stopped"
        return "nothing_needed"


@dataclass
class Score:
    cases: int = 0
    right: int = 0
    node_faults: int = 0
    node_blamed: int = 0
    app_blamed: int = 0
    false_blames: int = 0
    misses: list[Outcome] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ERROR_KINDS, 0))

    def add(self, outcome: Outcome) -> None:
        self.cases += 1
        self.right += outcome.right_action
        if outcome.case.node_fault:
            self.node_faults += 1
            self.node_blamed += outcome.right_blame
        elif outcome.blamed:
            self.false_blames += 1
            self.app_blamed += outcome.case.fault_domain == "application"
        error = outcome.error
        if error is not None:
            self.errors[error] += 1
            self.misses.append(outcome)

    @property
    def accuracy(self) -> float:
        return self.right / self.cases if self.cases else 0.0

    @property
    def recall(self) -> float:
        return self.node_blamed / self.node_faults if self.node_faults else 1.0

    def row(self) -> dict[str, float | int]:
        return {
            "cases": self.cases,
            "accuracy": round(self.accuracy, 3),
            "node_faults": self.node_faults,
            "recall": round(self.recall, 3),
            "app_blamed": self.app_blamed,
            "false_blames": self.false_blames,
            "errors": dict(self.errors),
        }


#: The development cases of the areas the sealed part has: the like-for-like comparison (the
#: sealed threads were drawn from the areas added in issue 28 only, the hardest ones)
LIKE_SEALED = "development (sealed areas)"


def score(cases: Iterable[Case], *, with_nodes: bool) -> dict[str, Score]:
    """Scores per area, per part and ``"all"``, and :data:`LIKE_SEALED`; with ``with_nodes``
    only single-node cases, given n1."""
    cases = list(cases)
    sealed_areas = {c.area for c in cases if c.part == "sealed"}
    scores: dict[str, Score] = {"all": Score()}
    for case in cases:
        if with_nodes and not case.single_node:
            continue
        outcome = Outcome(case, explain(case, [ONE_NODE] if with_nodes else None), with_nodes)
        scores["all"].add(outcome)
        scores.setdefault(case.part, Score()).add(outcome)
        scores.setdefault(f"{case.part}:{case.area}", Score()).add(outcome)
        if case.part == "development" and case.area in sealed_areas:
            scores.setdefault(LIKE_SEALED, Score()).add(outcome)
    return scores


def root_ceiling(cases: Iterable[Case]) -> tuple[int, int, int, int]:
    """``(right at best, right at best without the two forbidden errors, cases, roots)``: the
    accuracy a classifier keyed on each verdict's root line could reach at most, each root
    signature's cases given their most common label (a root seen once always counts as right,
    so this is an upper bound). Labels that differ under the same root line are what the text
    alone cannot separate.

    The second count gives each root the best label among those that make neither error issue
    28's done-when forbids in any of its cases: ``stop`` where one is a node fault (the job
    lost), ``requeue_exclude`` where one is an application fault (a healthy node drained). It
    is the most that accuracy can be while those stay at 0."""
    labels: dict[str, Counter[str]] = {}
    forbidden: dict[str, set[str]] = {}
    count = 0
    for case in cases:
        verdict = explain(case, None)
        root = verdict.signatures[0]["id"] if verdict.signatures else "-"
        labels.setdefault(root, Counter())[case.action] += 1
        banned = forbidden.setdefault(root, set())
        if case.node_fault:
            banned.add("stop")
        if case.fault_domain == "application":
            banned.add("requeue_exclude")
        count += 1
    best = sum(max(c.values()) for c in labels.values())
    allowed = sum(max(c[a] for a in ACTIONS if a not in forbidden[r]) for r, c in labels.items())
    return best, allowed, count, len(labels)


def corpus_line(cases: Sequence[Case]) -> str:
    """``corpus: 316 cases from 308 threads; development ...; sealed ...``."""
    parts = []
    for part in PARTS:
        mine = [c for c in cases if c.part == part]
        parts.append(f"{part} {len(mine)} cases, {len({c.thread for c in mine})} threads")
    every = len({c.thread for c in cases})
    return f"corpus: {len(cases)} cases from {every} threads; " + "; ".join(parts)


def coverage_table() -> list[str]:
    """The coverage of every emitter table by the shipped catalogue, as the Markdown table in
    docs/signatures.md, then each member it does not read as the table says
    (:mod:`slurm_recovery.signals.coverage`)."""
    catalogue = default_catalogue()
    rows = [
        "| emitter (table) | source | members | classified | read as classified | "
        "read otherwise | not recognised | other forms (read as their member) |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    notes = []
    for table in catalogue.emitters:
        c = coverage(table, catalogue)
        rows.append(
            f"| {table.emitter} (`{table.name}`) | {table.source.split(':')[0]} | "
            f"{len(table.members)} | {len(c.classified)} | {c.agree} | {len(c.disagree)} | "
            f"{len(c.unrecognised)} | "
            + (f"{c.forms} ({c.forms - len(c.forms_misread)}) |" if c.forms else "- |")
        )
        notes += [f"- `{table.name}` `{m.name}`: unclassified ({m.note})" for m in c.unclassified]
        notes += [f"- `{table.name}` `{name}`: read as {got}" for name, got in c.disagree.items()]
        notes += [f"- `{table.name}` `{name}`: not recognised" for name in c.unrecognised]
        misread = c.forms_misread.items()
        notes += [f"- `{table.name}` form `{f}`: read as {got}" for f, got in misread]
    return rows + [""] + (notes or ["- none"])


def accuracy_tables(cases: Sequence[Case]) -> list[str]:
    """The figures as Markdown (docs/signatures.md): each part and run, then each area of each
    part, then the errors by kind."""
    runs = {run: score(cases, with_nodes=n) for run, n in (("bare", False), ("`--nodes n1`", True))}
    rows = [
        "| run | part | cases | accuracy | node faults | recall | application faults blamed "
        "| false blames |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for keys in ([PARTS[0], LIKE_SEALED, *PARTS[1:], "all"], None):
        for run, scores in runs.items():
            names = keys or sorted(k for k in scores if ":" in k)
            for name in names:
                if name not in scores:
                    continue
                r = scores[name]
                shown = name.replace(":", ": ") if ":" in name else f"**{name}**"
                rows.append(
                    f"| {run} | {shown} | {r.cases} | {r.accuracy:.2f} | {r.node_faults} | "
                    f"{r.recall:.2f} | {r.app_blamed} | {r.false_blames} |"
                )
    rows += ["", "| errors (bare) | " + " | ".join(PARTS) + " | all |"]
    rows.append("| --- |" + " ---: |" * (len(PARTS) + 1))
    for kind in ERROR_KINDS:
        counts = [runs["bare"][p].errors[kind] if p in runs["bare"] else 0 for p in (*PARTS, "all")]
        rows.append(f"| `{kind}` | " + " | ".join(str(n) for n in counts) + " |")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", type=Path, default=CORPUS)
    parser.add_argument(
        "--misses", action="store_true", help="list every development case scored wrong"
    )
    parser.add_argument(
        "--sealed-misses",
        action="store_true",
        help="also list the sealed part's misses (opens the part: replace it afterwards)",
    )
    parser.add_argument(
        "--coverage",
        action="store_true",
        help="print the emitter coverage table (docs/signatures.md) instead",
    )
    parser.add_argument(
        "--markdown", action="store_true", help="print the figures as docs/signatures.md has them"
    )
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--quick", action="store_true", help="same run (it takes seconds)")
    args = parser.parse_args(argv)
    try:
        cases = load_corpus(args.corpus)
    except CaseError as exc:
        print(f"bench.attribution: {exc}", file=sys.stderr)
        return 2
    if args.coverage:
        print("\n".join(coverage_table()))
        return 0
    if args.markdown:
        print(corpus_line(cases) + "\n")
        print("\n".join(accuracy_tables(cases)))
        return 0
    print(corpus_line(cases))
    figures: dict[str, dict[str, dict[str, object]]] = {}
    header = f"{'run':<12}{'part:area':<28}{'cases':>6}{'accuracy':>10}{'node faults':>13}"
    header += f"{'recall':>8}{'app blamed':>12}{'false blames':>14}"
    print(header)
    for run, with_nodes in (("bare", False), ("--nodes n1", True)):
        scores = score(cases, with_nodes=with_nodes)
        figures[run] = {}
        order = sorted(scores, key=lambda a: (a == "all", a.split(":")[0], ":" not in a, a))
        for area in order:
            s = scores[area]
            figures[run][area] = s.row()
            print(
                f"{run:<12}{area:<28}{s.cases:>6}{s.accuracy:>10.2f}{s.node_faults:>13}"
                f"{s.recall:>8.2f}{s.app_blamed:>12}{s.false_blames:>14}"
            )
        print(f"{run}: errors by cost, most expensive first")
        print("  " + f"{'kind':<24}" + "".join(f"{p:>13}" for p in (*PARTS, "all")))
        for kind in ERROR_KINDS:
            counts = [scores[p].errors[kind] if p in scores else 0 for p in (*PARTS, "all")]
            print("  " + f"{kind:<24}" + "".join(f"{n:>13}" for n in counts))
        shown = [m for m in scores["all"].misses if args.sealed_misses or m.case.part != "sealed"]
        if args.misses or args.sealed_misses:
            for miss in shown:
                v, c = miss.verdict, miss.case
                print(
                    f"  miss [{c.part}] {c.name} ({miss.error}): want {c.action}"
                    f"{' (node fault)' if c.node_fault else ''}, got {v.action} "
                    f"blame={','.join(v.blame_nodes) or '-'} ({v.cause})"
                )
    for part in PARTS:
        # the sealed part's is an aggregate of its labels: it names no case
        right, allowed, count, roots = root_ceiling(c for c in cases if c.part == part)
        print(
            f"ceiling: {part} keyed on the root line, each root's cases given their most "
            f"common label: at best {right} of {count} ({right / max(count, 1):.2f}), {roots} "
            f"roots; with no node fault stopped and no application fault blamed: at best "
            f"{allowed} ({allowed / max(count, 1):.2f})"
        )
    write_json(args.json, "attribution", figures, args.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
