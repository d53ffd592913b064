"""Properties of the decision core over random clusters, jobs, evidence and policies.

- no node is excluded or drained unless evidence in the verdict is from that node;
- drains never break the blast radius (in-window drains by the tool plus the new ones);
- a job never has more than ``max_excluded_nodes`` excluded because of the tool;
- the same inputs, with the evidence in any order, give the same incidents, verdicts and advice;
- an application verdict never implicates a node.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_recovery.decide.advise import advise, after_drains
from slurm_recovery.decide.attribute import attribute
from slurm_recovery.decide.detect import detect
from slurm_recovery.decide.joblogs import line_nodes
from slurm_recovery.decide.model import (
    Action,
    Advice,
    ClusterView,
    Evidence,
    FaultClass,
    Incident,
    IncidentKind,
    Mode,
    Verdict,
)
from slurm_recovery.decide.policy import (
    BlastRadius,
    ClassPolicy,
    EvidenceWindow,
    Policy,
)
from slurm_recovery.scheduler.base import ExitCode, Job, Node
from slurm_recovery.signals.logs import default_catalogue
from slurm_recovery.signals.xid import load_xid_catalogue

CATALOGUE = load_xid_catalogue()
SIGNATURES = default_catalogue()
SIGNATURE_IDS = [signature.id for signature in SIGNATURES.signatures]
NOW = 1_000_000.0
PARTITIONS = ("gpu", "cpu", "big")
JOB_STATES = (
    "RUNNING",
    "FAILED",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "BOOT_FAIL",
    "COMPLETED",
    "PENDING",
    "CANCELLED",
    "TIMEOUT",
)
XIDS = (*CATALOGUE, 4242)
MESSAGES = ("", "GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)")


# --------------------------------------------------------------------------------- strategies


@st.composite
def clusters(draw) -> ClusterView:
    size = draw(st.integers(1, 12))
    nodes: dict[str, Node] = {}
    for i in range(1, size + 1):
        name = f"n{i}"
        nodes[name] = Node(
            name,
            draw(st.sampled_from(("IDLE", "ALLOCATED", "MIXED", "DOWN"))),
            flags=frozenset({"DRAIN"})
            if draw(st.booleans()) and draw(st.booleans())
            else frozenset(),
            partitions=tuple(
                draw(st.lists(st.sampled_from(PARTITIONS), min_size=0, max_size=2, unique=True))
            ),
        )
    drained_by_tool = {
        name: NOW - draw(st.floats(0, 8_000))
        for name in draw(st.lists(st.sampled_from(sorted(nodes)), unique=True))
        if nodes[name].drained or draw(st.booleans())
    }
    names = sorted(nodes)
    jobs: dict[int, Job] = {}
    for job_id in draw(st.lists(st.integers(1, 60), min_size=1, max_size=4, unique=True)):
        on = draw(st.lists(st.sampled_from(names), min_size=1, max_size=4, unique=True))
        start = NOW - draw(st.floats(60, 7_200))
        jobs[job_id] = Job(
            job_id=job_id,
            name="train",
            state=draw(st.sampled_from(JOB_STATES)),
            reason="",
            user="u",
            partition=draw(st.sampled_from(("gpu", "cpu", "big", "gpu,cpu", ""))),
            nodes=tuple(sorted(on)),
            num_nodes=len(on),
            submit_time=int(start) - 10,
            restart_count=draw(st.integers(0, 3)),
            excluded_nodes=frozenset(draw(st.lists(st.sampled_from(names), max_size=3))),
            exit_code=ExitCode(draw(st.sampled_from((0, 1, 93, 42))), 0),
            start_time=int(start),
            end_time=draw(st.sampled_from((0, int(NOW) - 30, int(NOW) - 500))),
        )
    return ClusterView(now=NOW, jobs=jobs, nodes=nodes, drained_by_tool=drained_by_tool)


@st.composite
def evidence_for(draw, view: ClusterView) -> list[Evidence]:
    names = [*sorted(view.nodes), "x9"]
    job_ids = [*sorted(view.jobs), 999]
    count = draw(st.integers(0, 14))
    ids = draw(st.lists(st.integers(1, 10_000), min_size=count, max_size=count, unique=True))
    out = []
    for ev_id in ids:
        kind = draw(
            st.sampled_from(
                ("xid", "xid", "operator_report", "log_signature", "node_state", "job_end", "gauge")
            )
        )
        node = draw(st.sampled_from([*names, None]))
        job_id = draw(st.one_of(st.none(), st.sampled_from(job_ids)))
        payload: dict = {}
        if kind == "xid":
            payload = {
                "xid": draw(st.sampled_from(XIDS)),
                "message": draw(st.sampled_from(MESSAGES)),
            }
        elif kind == "operator_report":
            payload = {"reason": draw(st.text(max_size=20))}
        elif kind == "log_signature":
            payload = {  # the controller judges lines by the catalogue, not by these claims
                "signature": draw(st.sampled_from([*SIGNATURE_IDS, "not.catalogued"])),
                "fault_class": draw(st.sampled_from([c.value for c in FaultClass] + ["odd"])),
                "blame_node": draw(st.booleans()),
                "text": draw(st.sampled_from(MESSAGES)),
            }
            host = draw(st.sampled_from([*names, None]))
            if host is not None:
                payload["host"] = host
            rank = draw(st.one_of(st.none(), st.integers(0, 7)))
            if rank is not None:
                payload["rank"] = rank
        elif kind == "node_state":
            payload = {
                "state": draw(st.sampled_from(("DOWN", "IDLE", "down*", "FAIL"))),
                "flags": draw(st.lists(st.sampled_from(("NOT_RESPONDING", "DRAIN")), unique=True)),
            }
        out.append(
            Evidence(
                id=ev_id,
                source=draw(st.sampled_from(("sidecar", "hook", "operator", "scheduler"))),
                kind=kind,
                observed_at=NOW - draw(st.one_of(st.floats(-300, 900), st.floats(-600, 9_000))),
                node=node,
                gpu=draw(st.one_of(st.none(), st.integers(0, 7))),
                job_id=job_id,
                payload=payload,
            )
        )
    return out


@st.composite
def policies(draw) -> Policy:
    classes = {}
    for fault_class in FaultClass:
        classes[fault_class] = ClassPolicy(
            action=draw(st.sampled_from(list(Action))),
            drain=draw(st.booleans())
            if fault_class in (FaultClass.HARDWARE, FaultClass.SYSTEM)
            else False,
            drain_min_confidence=draw(st.sampled_from((0.0, 0.5, 0.8, 0.9, 1.0))),
        )
    return Policy(
        mode=draw(st.sampled_from(list(Mode))),
        partition_modes={"gpu": draw(st.sampled_from(list(Mode)))},
        max_restarts=draw(st.integers(0, 4)),
        max_excluded_nodes=draw(st.integers(0, 4)),
        do_not_requeue_exit_codes=frozenset(draw(st.lists(st.sampled_from((93, 1, 42))))),
        classes=classes,
        blast_radius=BlastRadius(
            max_nodes=draw(st.integers(0, 5)),
            max_percent=draw(st.sampled_from((0.0, 10.0, 25.0, 33.3, 50.0, 100.0))),
            window=draw(st.sampled_from((60.0, 3_600.0, 7_200.0))),
        ),
        fatal_evidence_window=EvidenceWindow(
            window_before=draw(st.sampled_from((0.0, 600.0, 3_600.0))),
            window_after=draw(st.sampled_from((0.0, 300.0))),
        ),
    )


@st.composite
def scenarios(draw):
    view = draw(clusters())
    return view, draw(evidence_for(view)), draw(policies()), draw(st.sampled_from((0, 0, 1, 2, 5)))


@st.composite
def direct_scenarios(draw):
    """An incident made up for any job, not only those detect() would open."""
    view, evidence, policy, restarts = draw(scenarios())
    job = view.jobs[draw(st.sampled_from(sorted(view.jobs)))]
    incident = Incident(
        job.job_id,
        job.restart_count,
        job.submit_time,
        draw(st.sampled_from(list(IncidentKind))),
        NOW - draw(st.one_of(st.floats(0, 600), st.floats(0, 5_000))),
    )
    return view, evidence, policy, restarts, incident


# --------------------------------------------------------------------------------- the pipeline


def pipeline(view, evidence, policy, restarts, *, chain: bool = False):
    """detect -> attribute -> advise for every new incident; ``chain`` counts each advice's
    drains before the next one (as the controller does with after_drains)."""
    results = []
    for incident in detect(view, evidence, (), CATALOGUE, policy):
        job = view.jobs[incident.job_id]
        verdict = attribute(incident, job, evidence, CATALOGUE, policy, view.nodes)
        advice = advise(incident, verdict, job, policy, view, restarts)
        results.append((incident, verdict, advice))
        if chain:
            view = after_drains(view, advice.drain)
    return results


def check_evidence_backs_nodes(verdict: Verdict, advice: Advice, evidence, job: Job) -> None:
    """Every implicated node is backed by evidence in the verdict about it: sent from that
    node, or a line of the job's log that names it (its host, or its rank's node)."""
    by_id = {e.id: e for e in evidence}
    logs = [e for e in evidence if e.kind == "log_signature" and e.job_id == job.job_id]
    about = line_nodes(logs, job.nodes)
    backed = {by_id[i].node for i in verdict.evidence_ids if i in by_id}
    backed |= {about[i] for i in verdict.evidence_ids if i in about}
    assert set(verdict.evidence_ids) <= set(by_id)
    assert verdict.nodes <= backed
    assert verdict.nodes <= set(job.nodes)
    assert advice.exclude <= verdict.nodes
    assert advice.drain <= verdict.nodes
    assert {node for node, _ in verdict.gpus} <= verdict.nodes


def check_blast_radius(view: ClusterView, drains: set[str], policy: Policy) -> None:
    ours = {n for n in view.drained_by_tool if n in view.nodes and view.nodes[n].drained}
    new = drains - ours
    if not new:
        return
    radius = policy.blast_radius
    recent = {n for n, at in view.drained_by_tool.items() if at >= view.now - radius.window}
    total = recent | new
    assert len(total) <= radius.max_nodes
    for partition in {p for n in new for p in view.nodes[n].partitions}:
        size = sum(1 for node in view.nodes.values() if partition in node.partitions)
        inside = sum(1 for n in total if n in view.nodes and partition in view.nodes[n].partitions)
        assert inside * 100 <= radius.max_percent * size


def check_exclusions(job: Job, advice: Advice, policy: Policy) -> None:
    if advice.exclude:
        assert advice.action is Action.REQUEUE_EXCLUDE
        # the cap counts the tool's exclusions in force (none given here), never the user's
        assert len(advice.exclude) <= policy.max_excluded_nodes
    if advice.action in (Action.STOP, Action.NONE, Action.REQUEUE):
        assert advice.exclude == frozenset()


def check_application(verdict: Verdict, advice: Advice) -> None:
    if verdict.fault_class is FaultClass.APPLICATION:
        assert verdict.nodes == frozenset()
        assert verdict.gpus == frozenset()
        assert advice.exclude == advice.drain == frozenset()


# --------------------------------------------------------------------------------- properties


@settings(max_examples=400, deadline=None)
@given(scenarios())
def test_every_advice_keeps_the_invariants(scenario):
    view, evidence, policy, restarts = scenario
    for incident, verdict, advice in pipeline(view, evidence, policy, restarts):
        job = view.jobs[incident.job_id]
        check_evidence_backs_nodes(verdict, advice, evidence, job)
        check_blast_radius(view, set(advice.drain), policy)
        check_exclusions(job, advice, policy)
        check_application(verdict, advice)
        assert 0.0 <= verdict.confidence <= 1.0
        assert "\n" not in advice.reason and advice.reason
        assert advice.mode is policy.mode_for(job.partition)


@settings(max_examples=400, deadline=None)
@given(direct_scenarios())
def test_any_incident_keeps_the_invariants(scenario):
    view, evidence, policy, restarts, incident = scenario
    job = view.jobs[incident.job_id]
    verdict = attribute(incident, job, evidence, CATALOGUE, policy, view.nodes)
    advice = advise(incident, verdict, job, policy, view, restarts)
    check_evidence_backs_nodes(verdict, advice, evidence, job)
    check_blast_radius(view, set(advice.drain), policy)
    check_exclusions(job, advice, policy)
    check_application(verdict, advice)
    if restarts >= policy.max_restarts:
        assert advice.action not in (Action.REQUEUE, Action.REQUEUE_EXCLUDE)


@settings(max_examples=200, deadline=None)
@given(scenarios())
def test_advice_chained_with_after_drains_stays_within_the_cap_together(scenario):
    view, evidence, policy, restarts = scenario
    results = pipeline(view, evidence, policy, restarts, chain=True)
    check_blast_radius(view, {n for *_, advice in results for n in advice.drain}, policy)


@settings(max_examples=300, deadline=None)
@given(scenarios(), st.randoms(use_true_random=False))
def test_same_evidence_in_any_order_same_advice(scenario, rnd):
    view, evidence, policy, restarts = scenario
    shuffled = list(evidence)
    rnd.shuffle(shuffled)
    assert pipeline(view, shuffled, policy, restarts) == pipeline(view, evidence, policy, restarts)


@settings(max_examples=200, deadline=None)
@given(scenarios())
def test_detect_is_idempotent_over_open_attempts(scenario):
    view, evidence, policy, _ = scenario
    first = detect(view, evidence, (), CATALOGUE, policy)
    assert [i.job_id for i in first] == sorted(i.job_id for i in first)
    done = {(i.job_id, i.restart_count) for i in first}
    assert detect(view, evidence, done, CATALOGUE, policy) == []


@settings(max_examples=200, deadline=None)
@given(direct_scenarios())
def test_application_evidence_alone_never_implicates_a_node(scenario):
    view, evidence, policy, restarts, incident = scenario
    only_app = [
        e
        for e in evidence
        if (  # the controller judges a line by the catalogue, not by what the payload claims
            e.kind == "log_signature"
            and (signature := SIGNATURES.get(e.payload.get("signature", ""))) is not None
            and signature.fault_class == "application"
        )
        or (
            e.kind == "xid"
            and CATALOGUE.lookup(e.payload["xid"]).fault_class is FaultClass.APPLICATION
        )
    ]
    job = view.jobs[incident.job_id]
    verdict = attribute(incident, job, only_app, CATALOGUE, policy, view.nodes)
    assert verdict.nodes == frozenset()
    assert verdict.fault_class in (FaultClass.APPLICATION, FaultClass.SYSTEM, FaultClass.UNKNOWN)
    advice = advise(incident, verdict, job, policy, view, restarts)
    assert advice.exclude == advice.drain == frozenset()


@st.composite
def drain_scenarios(draw):
    """Node-implicating verdicts under draining policies: the blast radius under pressure."""
    view = draw(clusters())
    job = view.jobs[draw(st.sampled_from(sorted(view.jobs)))]
    fault_class = draw(st.sampled_from((FaultClass.HARDWARE, FaultClass.SYSTEM)))
    verdict = Verdict(
        fault_class,
        nodes=frozenset(draw(st.lists(st.sampled_from(job.nodes), min_size=1, unique=True))),
        confidence=draw(st.sampled_from((0.6, 0.9, 0.95, 1.0))),
        evidence_ids=(1,),
        cause="c",
    )
    policy = draw(policies())
    classes = dict(policy.classes)
    classes[fault_class] = ClassPolicy(Action.REQUEUE_EXCLUDE, True, 0.9)
    policy = Policy(
        max_restarts=5,
        max_excluded_nodes=draw(st.integers(0, 6)),
        classes=classes,
        blast_radius=policy.blast_radius,
    )
    incident = Incident(job.job_id, job.restart_count, job.submit_time, IncidentKind.CRASH, NOW)
    return view, job, verdict, policy, incident


@settings(max_examples=500, deadline=None)
@given(drain_scenarios())
def test_drains_never_break_the_blast_radius(scenario):
    view, job, verdict, policy, incident = scenario
    advice = advise(incident, verdict, job, policy, view, 0)
    check_blast_radius(view, set(advice.drain), policy)
    check_exclusions(job, advice, policy)
    assert advice.drain <= verdict.nodes
    if verdict.confidence < 0.9:
        assert advice.drain == frozenset()
    refused = verdict.nodes - advice.drain - {n for n in verdict.nodes if view.nodes[n].drained}
    if verdict.confidence >= 0.9 and refused:
        assert advice.needs_operator
