"""advise(): each rule, the blast radius, the modes, and the one-line reasons admins read."""

from __future__ import annotations

import dataclasses

import pytest

from slurm_recovery.decide.advise import advise, after_drains, needs_operator_rule
from slurm_recovery.decide.model import (
    Action,
    ClusterView,
    FaultClass,
    Incident,
    IncidentKind,
    Mode,
    Verdict,
    partition_sizes,
)
from slurm_recovery.decide.policy import BlastRadius, Policy, policy_from_toml
from slurm_recovery.scheduler.base import ExitCode, Job, Node

NOW = 100_000.0
POLICY = Policy()
WIDE = dataclasses.replace(POLICY, blast_radius=BlastRadius(max_nodes=4, max_percent=100.0))


def job(state: str = "FAILED", nodes=("n1", "n2"), partition: str = "gpu", **kw) -> Job:
    fields = dict(
        job_id=42,
        name="train",
        state=state,
        reason="",
        user="alice",
        partition=partition,
        nodes=tuple(nodes),
        num_nodes=len(nodes),
        submit_time=900,
        restart_count=0,
        start_time=int(NOW) - 3_600,
        end_time=int(NOW) - 10,
    )
    fields.update(kw)
    return Job(**fields)


def cluster(size: int = 20, drained=(), partition: str = "gpu", by_tool=None) -> ClusterView:
    nodes = {
        f"n{i}": Node(
            f"n{i}",
            "IDLE",
            flags=frozenset({"DRAIN"}) if f"n{i}" in drained else frozenset(),
            partitions=(partition,),
        )
        for i in range(1, size + 1)
    }
    return ClusterView(now=NOW, jobs={}, nodes=nodes, drained_by_tool=dict(by_tool or {}))


def hardware(*nodes: str, confidence: float = 0.95) -> Verdict:
    return Verdict(
        FaultClass.HARDWARE,
        nodes=frozenset(nodes),
        gpus=frozenset((n, 1) for n in nodes),
        confidence=confidence,
        evidence_ids=(5,),
        cause=f"xid 79 (GPU has fallen off the bus) on {nodes[0]} gpu1" if nodes else "x",
    )


def crash(kind: IncidentKind = IncidentKind.CRASH) -> Incident:
    return Incident(42, 0, 900, kind, NOW - 10)


def decide(
    verdict,
    the_job=None,
    policy=WIDE,
    view=None,
    restarts=0,
    kind=IncidentKind.CRASH,
    tool_excluded=frozenset(),
    previous_cause=None,
):
    return advise(
        crash(kind),
        verdict,
        the_job or job(),
        policy,
        view or cluster(),
        restarts,
        tool_excluded=frozenset(tool_excluded),
        previous_cause=previous_cause,
    )


# --------------------------------------------------------------------------------- by class


def test_hardware_requeue_excluding_and_draining_the_node():
    advice = decide(hardware("n2"))
    assert advice.action is Action.REQUEUE_EXCLUDE
    assert advice.exclude == {"n2"}
    assert advice.drain == {"n2"}
    assert advice.rule == "classes.hardware.action"
    assert not advice.needs_operator
    assert advice.mode is Mode.MONITOR
    assert advice.reason == (
        "xid 79 (GPU has fallen off the bus) on n2 gpu1: requeue excluding n2 "
        "(restart 1 of 3), drain n2"
    )
    assert advice.verdict == hardware("n2")


def test_below_drain_min_confidence_excludes_but_does_not_drain():
    advice = decide(hardware("n2", confidence=0.6))
    assert advice.action is Action.REQUEUE_EXCLUDE
    assert advice.exclude == {"n2"}
    assert advice.drain == frozenset()
    assert "not draining (confidence 0.60 is below classes.hardware.drain_min_confidence 0.9)" in (
        advice.reason
    )


def test_system_faults_exclude_without_draining():
    verdict = Verdict(FaultClass.SYSTEM, frozenset({"n1"}), confidence=0.9, cause="xid 119 on n1")
    advice = decide(verdict)
    assert advice.action is Action.REQUEUE_EXCLUDE
    assert advice.exclude == {"n1"}
    assert advice.drain == frozenset()
    assert advice.reason == "xid 119 on n1: requeue excluding n1 (restart 1 of 3)"


def test_application_faults_stop_with_the_reason():
    verdict = Verdict(FaultClass.APPLICATION, confidence=0.9, cause="log signature cuda_oom")
    advice = decide(verdict)
    assert advice.action is Action.STOP
    assert advice.rule == "classes.application.action"
    assert advice.exclude == advice.drain == frozenset()
    assert advice.reason == "log signature cuda_oom: stop (application fault, not restarted)"


def test_unknown_faults_requeue_without_exclusion():
    verdict = Verdict(FaultClass.UNKNOWN, cause="no evidence of the cause")
    advice = decide(verdict, restarts=1)
    assert advice.action is Action.REQUEUE
    assert advice.rule == "classes.unknown.action"
    assert advice.exclude == frozenset()
    assert advice.reason == (
        "no evidence of the cause: requeue without exclusion (classes.unknown.action = requeue) "
        "(restart 2 of 3)"
    )


def test_requeue_exclude_with_no_node_implicated_is_a_plain_requeue():
    verdict = Verdict(FaultClass.HARDWARE, confidence=0.5, cause="log signature ecc")
    advice = decide(verdict)
    assert advice.action is Action.REQUEUE
    assert "requeue without exclusion (no node implicated)" in advice.reason


def test_class_action_none_records_only():
    policy = policy_from_toml('[classes.unknown]\naction = "none"\n')
    advice = decide(Verdict(FaultClass.UNKNOWN, cause="c"), policy=policy)
    assert advice.action is Action.NONE
    assert advice.reason == "c: no action (classes.unknown.action = none)"


# --------------------------------------------------------------------------------- stop rules


def test_exit_code_93_stops_and_still_drains_a_broken_node():
    advice = decide(hardware("n2"), the_job=job(exit_code=ExitCode(93, 0)))
    assert advice.action is Action.STOP
    assert advice.rule == "do_not_requeue_exit_codes"
    assert advice.exclude == frozenset()
    assert advice.drain == {"n2"}
    assert advice.reason.startswith("exit code 93 (the job asked not to be requeued): stop; cause:")
    assert advice.reason.endswith("; drain n2")


def test_exit_code_93_with_no_evidence():
    verdict = Verdict(FaultClass.UNKNOWN, cause="exit code 93: the job asked not to be requeued")
    advice = decide(verdict, the_job=job(exit_code=ExitCode(93, 0)))
    assert advice.action is Action.STOP
    assert advice.reason == "exit code 93 (the job asked not to be requeued): stop"


def test_exit_codes_matter_only_for_jobs_that_ended():
    running = job(state="RUNNING", exit_code=ExitCode(93, 0))
    advice = decide(hardware("n2"), the_job=running, kind=IncidentKind.DOOMED)
    assert advice.action is Action.REQUEUE_EXCLUDE


def test_restart_limit_stops_the_job():
    advice = decide(hardware("n2"), restarts=3)
    assert advice.action is Action.STOP
    assert advice.rule == "max_restarts"
    assert advice.exclude == frozenset()
    assert advice.drain == {"n2"}  # the node is broken for everyone
    assert advice.reason.startswith("restart limit reached (3 of 3): stop; cause: xid 79")


def test_zero_restarts_allowed_stops_at_once():
    policy = dataclasses.replace(WIDE, max_restarts=0)
    advice = decide(Verdict(FaultClass.UNKNOWN, cause="c"), policy=policy)
    assert advice.action is Action.STOP
    assert advice.reason.startswith("restart limit reached (0 of 0)")


def test_an_application_fault_says_so_even_past_the_restart_limit():
    verdict = Verdict(FaultClass.APPLICATION, cause="log signature x")
    assert decide(verdict, restarts=9).rule == "classes.application.action"


def test_too_many_excluded_nodes_stops_and_asks_for_an_operator():
    excluded = job(excluded_nodes=frozenset({"n7", "n8"}))  # the tool's, still out of service
    advice = decide(
        hardware("n2"),
        the_job=excluded,
        tool_excluded={"n7", "n8"},
        view=cluster(drained=("n7", "n8")),
    )
    assert advice.action is Action.STOP
    assert advice.rule == "max_excluded_nodes"
    assert advice.needs_operator
    assert advice.exclude == frozenset()
    assert "would leave the job with 3 excluded nodes (n[2,7-8]; max_excluded_nodes = 2)" in (
        advice.reason
    )


def test_the_users_own_exclusions_never_count_toward_the_cap():
    """``sbatch -x n1,n3``: the first fault on n2 is restarted, not stopped."""
    excluded = job(excluded_nodes=frozenset({"n1", "n3"}))
    advice = decide(hardware("n2"), the_job=excluded)
    assert advice.action is Action.REQUEUE_EXCLUDE
    assert advice.exclude == {"n2"} and advice.unexclude == frozenset()


def test_the_tools_exclusions_of_repaired_nodes_are_dropped_and_not_counted():
    """Fault n2, resume n2, fault n3, resume n3, fault n1: two healthy nodes were excluded
    by the tool; they are dropped from the next attempt instead of stopping the job."""
    excluded = job(nodes=("n1", "n4"), excluded_nodes=frozenset({"n2", "n3"}))
    advice = decide(hardware("n1"), the_job=excluded, tool_excluded={"n2", "n3"})
    assert advice.action is Action.REQUEUE_EXCLUDE
    assert advice.exclude == {"n1"}
    assert advice.unexclude == {"n2", "n3"}
    assert "no longer excluding n[2-3]: back in service" in advice.reason


def test_nodes_already_excluded_do_not_count_twice():
    excluded = job(excluded_nodes=frozenset({"n2"}))
    advice = decide(hardware("n2"), the_job=excluded)
    assert advice.action is Action.REQUEUE_EXCLUDE


# --------------------------------------------------------------------------------- blast radius


def test_drains_past_max_nodes_are_dropped_and_need_an_operator():
    by_tool = {f"n{i}": NOW - 60 for i in range(10, 14)}  # 4 drains in the last hour
    view = cluster(drained=by_tool, by_tool=by_tool)
    advice = decide(hardware("n2"), view=view)
    assert advice.action is Action.REQUEUE_EXCLUDE
    assert advice.exclude == {"n2"}  # the job still moves away from the node
    assert advice.drain == frozenset()
    assert advice.needs_operator
    assert advice.rule == "blast_radius"
    assert advice.reason.endswith(
        "; not draining n2: blast radius reached (4 drained by the tool in the last 1h; "
        "max_nodes = 4), needs operator"
    )


def test_the_needs_operator_metric_names_the_blast_radius_whatever_stopped_the_job():
    """A drain refused at the cap needs an operator even when another rule (here the restart
    limit) chose the action: srecovery_needs_operator_total counts it as ``blast_radius``."""
    by_tool = {f"n{i}": NOW - 60 for i in range(10, 14)}
    view = cluster(drained=by_tool, by_tool=by_tool)
    advice = decide(hardware("n2"), view=view, restarts=WIDE.max_restarts)
    assert advice.rule == "max_restarts" and advice.needs_operator
    assert needs_operator_rule(advice) == "blast_radius"
    capped = decide(hardware("n2"), view=view)
    assert needs_operator_rule(capped) == capped.rule == "blast_radius"


def test_drains_older_than_the_window_do_not_count():
    by_tool = {f"n{i}": NOW - 7_200 for i in range(10, 14)}
    view = cluster(drained=by_tool, by_tool=by_tool)
    assert decide(hardware("n2"), view=view).drain == {"n2"}


def test_the_cap_drains_what_fits_in_name_order():
    by_tool = {f"n{i}": NOW - 60 for i in range(10, 13)}  # 3 of 4 used
    view = cluster(drained=by_tool, by_tool=by_tool)
    advice = decide(hardware("n1", "n2"), view=view)
    assert advice.drain == {"n1"}
    assert advice.needs_operator
    assert "not draining n2" in advice.reason


def test_percent_of_a_partition_is_capped():
    # The default 10 % of a 20-node partition is 2 nodes.
    one = {"n10": NOW - 60}
    advice = decide(hardware("n1", "n2"), policy=POLICY, view=cluster(drained=one, by_tool=one))
    assert advice.drain == {"n1"}
    assert (
        "blast radius reached in partition gpu (2 of 20 nodes drained" in advice.reason
    )  # n10 and n1
    assert "max_percent = 10), needs operator" in advice.reason


def test_partition_sizes_counted_once_per_listing_decide_the_same():
    """The loop hands the view its partition sizes (counted once per node listing); the
    advice is what counting them from the nodes gives."""
    one = {"n10": NOW - 60}
    view = cluster(drained=one, by_tool=one)
    sized = dataclasses.replace(view, partition_sizes=partition_sizes(view.nodes.values()))
    assert sized.partition_sizes == {"gpu": 20}
    for found in (hardware("n1", "n2"), hardware("n3")):
        assert decide(found, policy=POLICY, view=sized) == decide(found, policy=POLICY, view=view)
    # the sizes given are the ones used: a partition said to hold 40 nodes fits both
    assert decide(
        hardware("n1", "n2"),
        policy=POLICY,
        view=dataclasses.replace(view, partition_sizes={"gpu": 40}),
    ).drain == {"n1", "n2"}


def test_a_small_partition_with_the_default_percent_drains_nothing():
    advice = decide(hardware("n2"), policy=POLICY, view=cluster(size=4))
    assert advice.drain == frozenset()
    assert advice.needs_operator
    assert advice.exclude == {"n2"}


def test_a_node_drained_by_someone_else_keeps_their_drain():
    advice = decide(hardware("n2"), view=cluster(drained={"n2"}))
    assert advice.drain == frozenset()
    assert not advice.needs_operator
    assert "(n2 already drained)" in advice.reason


def test_our_own_drain_still_in_force_is_repeated_not_recounted():
    by_tool = {"n2": NOW - 60, "n10": NOW - 60, "n11": NOW - 60, "n12": NOW - 60}
    view = cluster(drained=by_tool, by_tool=by_tool)
    advice = decide(hardware("n2"), view=view)
    assert advice.drain == {"n2"}
    assert not advice.needs_operator


def test_a_node_slurm_does_not_show_is_not_drained():
    advice = decide(hardware("n99"))
    assert advice.drain == frozenset()
    assert advice.needs_operator
    assert "not draining n99: Slurm does not show it" in advice.reason


def test_after_drains_keeps_several_advices_within_the_cap():
    policy = dataclasses.replace(WIDE, blast_radius=BlastRadius(max_nodes=2, max_percent=100.0))
    view = cluster()
    drained = []
    for node in ("n1", "n2", "n3"):
        advice = decide(hardware(node), policy=policy, view=view)
        drained.extend(advice.drain)
        view = after_drains(view, advice.drain)
    assert drained == ["n1", "n2"]
    assert view.drained_by_tool == {"n1": NOW, "n2": NOW}


# --------------------------------------------------------------------------------- modes


@pytest.mark.parametrize(
    ("partition", "mode"),
    [("gpu", Mode.ACT), ("cpu", Mode.MONITOR), ("gpu,cpu", Mode.MONITOR)],
)
def test_mode_follows_the_job_partition(partition, mode):
    policy = policy_from_toml('[partitions.gpu]\nmode = "act"\n')
    assert decide(hardware("n2"), the_job=job(partition=partition), policy=policy).mode is mode


def test_monitor_and_act_give_the_same_advice_but_the_mode():
    act = policy_from_toml('mode = "act"\n[blast_radius]\nmax_percent = 100\n')
    acting = decide(hardware("n2"), policy=act)
    watching = decide(hardware("n2"))
    assert acting.mode is Mode.ACT
    assert dataclasses.replace(acting, mode=Mode.MONITOR) == watching


def test_reasons_are_one_line():
    verdict = Verdict(FaultClass.APPLICATION, cause="log signature\nwith a newline")
    assert "\n" not in decide(verdict).reason


def test_the_documented_examples_are_what_advise_says():
    from pathlib import Path

    docs = (Path(__file__).resolve().parents[2] / "docs" / "policy.md").read_text()
    by_tool = {f"n{i}": NOW - 60 for i in range(10, 14)}
    full = cluster(drained=by_tool, by_tool=by_tool)
    xid48 = Verdict(
        FaultClass.HARDWARE,
        frozenset({"n5"}),
        confidence=0.95,
        cause="xid 48 (double-bit ECC error in GPU memory) on n5 gpu0",
    )
    examples = [
        decide(hardware("n2")),
        decide(hardware("n2"), restarts=3),
        decide(xid48, view=full),
        decide(Verdict(FaultClass.UNKNOWN, cause="c"), the_job=job(exit_code=ExitCode(93, 0))),
    ]
    for advice in examples:
        assert advice.reason in docs, advice.reason


# ------------------------------------------------------------------------ the job's own terms


def test_a_no_requeue_job_is_stopped_not_requeued_and_the_node_still_drained():
    advice = decide(hardware("n2"), the_job=job(requeueable=False))
    assert advice.action is Action.STOP and advice.rule == "job.no_requeue"
    assert advice.exclude == frozenset() and advice.drain == {"n2"}
    assert "--no-requeue" in advice.reason


def test_a_job_pinned_to_the_bad_node_needs_an_operator():
    advice = decide(hardware("n2"), the_job=job(required_nodes=frozenset({"n1", "n2"})))
    assert advice.action is Action.STOP and advice.rule == "job.required_nodes"
    assert advice.needs_operator and advice.exclude == frozenset()
    assert "may run only on n[1-2] (--nodelist), which includes n2" in advice.reason
    pinned_elsewhere = decide(hardware("n2"), the_job=job(required_nodes=frozenset({"n1"})))
    assert pinned_elsewhere.action is Action.REQUEUE_EXCLUDE


# --------------------------------------------------------------------------------- repeats

TIMEOUTS = (
    "log: only symptoms of a failure elsewhere (torch.nccl_watchdog_timeout); no root cause in "
    "the log"
)


def unknown(cause=TIMEOUTS, evidence_ids=(7,)):
    return Verdict(FaultClass.UNKNOWN, confidence=0.0, evidence_ids=evidence_ids, cause=cause)


def test_the_same_failure_after_a_restart_stops_instead_of_burning_restarts():
    advice = decide(unknown(), restarts=1, previous_cause=TIMEOUTS)
    assert (advice.action, advice.rule) == (Action.STOP, "stop_on_same_failure")
    assert "the same failure as before the last restart" in advice.reason


def test_a_first_failure_another_cause_or_the_policy_off_restarts_as_before():
    assert decide(unknown(), restarts=0, previous_cause=TIMEOUTS).action is Action.REQUEUE
    other = decide(unknown(), restarts=1, previous_cause="log: python.network_exception")
    assert other.action is Action.REQUEUE
    off = dataclasses.replace(WIDE, stop_on_same_failure=False)
    assert decide(unknown(), policy=off, restarts=1, previous_cause=TIMEOUTS).action is (
        Action.REQUEUE
    )
    # a cause read from no evidence at all (the job just ended FAILED) is not "the same failure"
    bare = unknown("no evidence of the cause (job ended FAILED, exit 1:0)", evidence_ids=())
    assert decide(bare, restarts=1, previous_cause=bare.cause).action is Action.REQUEUE


def test_a_node_fault_that_repeats_is_a_new_fault_on_another_node():
    verdict = hardware("n2")
    advice = decide(verdict, restarts=1, previous_cause=verdict.cause)
    assert advice.action is Action.REQUEUE_EXCLUDE


def test_a_hang_at_the_same_step_after_a_restart_is_the_same_failure():
    before = "no progress for 612 s (deadline 600 s); last step 1200; stopped first: rank 3"
    now = "no progress for 640 s (deadline 600 s); last step 1200; stopped first: rank 3"
    hang = Verdict(FaultClass.UNKNOWN, cause=now)
    advice = decide(hang, kind=IncidentKind.HANG, restarts=1, previous_cause=before)
    assert advice.rule == "stop_on_same_failure"
    later_step = before.replace("1200", "900")
    assert decide(hang, kind=IncidentKind.HANG, restarts=1, previous_cause=later_step).rule != (
        "stop_on_same_failure"
    )
