"""advise(): a restart that leaves the job no room (rule ``unplaceable``), and the components
of heterogeneous jobs (rule ``hetjob``)."""

from __future__ import annotations

import dataclasses

import pytest

from slurm_recovery.decide.advise import NEEDS_OPERATOR_RULES, needs_operator_rule
from slurm_recovery.decide.model import Action, FaultClass, IncidentKind, Verdict
from slurm_recovery.decide.policy import BlastRadius, PolicyError, policy_from_toml
from tests.unit.test_decide_advise import WIDE, cluster, decide, hardware, job

STOP = dataclasses.replace(WIDE, unplaceable="stop")


def four_node_job(**kw):
    return job(nodes=("n1", "n2", "n3", "n4"), **kw)


def test_a_job_spanning_its_partition_is_requeued_and_flagged():
    advice = decide(hardware("n2"), the_job=four_node_job(), view=cluster(size=4))
    assert advice.action is Action.REQUEUE_EXCLUDE and advice.exclude == {"n2"}
    assert advice.rule == "unplaceable" and advice.needs_operator
    assert needs_operator_rule(advice) == "unplaceable"
    assert advice.drain == {"n2"}
    assert advice.reason.startswith(
        "xid 79 (GPU has fallen off the bus) on n2 gpu1: requeue excluding n2 (restart 1 of 3); "
        "it cannot run until an operator acts, needs operator: job needs 4 nodes, 3 are usable "
        "after excluding n2 (unplaceable = wait)"
    )


def test_unplaceable_stop_cancels_and_still_drains():
    advice = decide(hardware("n2"), the_job=four_node_job(), view=cluster(size=4), policy=STOP)
    assert advice.action is Action.STOP and advice.exclude == frozenset()
    assert advice.rule == "unplaceable" and advice.needs_operator
    assert advice.drain == {"n2"}
    assert "stop, needs operator: job needs 4 nodes, 3 are usable after excluding n2" in (
        advice.reason
    )


def test_room_elsewhere_in_the_partition_is_an_ordinary_requeue():
    advice = decide(hardware("n2"), the_job=four_node_job(), view=cluster(size=5))
    assert advice.rule == "classes.hardware.action" and not advice.needs_operator


def test_nodes_drained_by_someone_else_take_the_room():
    view = cluster(size=5, drained=("n5",))
    advice = decide(hardware("n2"), the_job=four_node_job(), view=view)
    assert advice.rule == "unplaceable"
    assert "3 are usable after excluding n2" in advice.reason


def test_a_plain_requeue_can_be_unplaceable_too():
    """No node implicated, but the job's partition is short already (a drain elsewhere)."""
    unknown = Verdict(FaultClass.UNKNOWN, cause="no evidence of the cause")
    view = cluster(size=4, drained=("n4",))
    advice = decide(unknown, the_job=four_node_job(), view=view)
    assert advice.action is Action.REQUEUE and advice.rule == "unplaceable"
    assert "job needs 4 nodes, 3 are usable" in advice.reason


def test_a_repaired_node_the_advice_stops_excluding_counts_as_usable():
    """The tool excluded n3 earlier; n3 is back in service: dropping it makes room."""
    the_job = four_node_job(excluded_nodes=frozenset({"n3"}))
    view = cluster(size=5)
    advice = decide(hardware("n2"), the_job=the_job, view=view, tool_excluded={"n3"})
    assert advice.unexclude == {"n3"} and advice.rule == "classes.hardware.action"


def test_the_users_own_exclusions_count_against_the_room():
    the_job = four_node_job(excluded_nodes=frozenset({"n5"}))  # sbatch -x n5
    advice = decide(hardware("n2"), the_job=the_job, view=cluster(size=5))
    assert advice.rule == "unplaceable"
    assert "after excluding n[2,5]" in advice.reason


def test_stopping_rules_come_first():
    advice = decide(hardware("n2"), the_job=four_node_job(), view=cluster(size=4), restarts=3)
    assert advice.rule == "max_restarts"
    app = Verdict(FaultClass.APPLICATION, cause="log: cuda.illegal_memory_access")
    assert decide(app, the_job=four_node_job(), view=cluster(size=4)).action is Action.STOP


def test_a_blast_radius_refusal_keeps_the_unplaceable_rule():
    tight = dataclasses.replace(WIDE, blast_radius=BlastRadius(max_nodes=0, max_percent=100.0))
    advice = decide(hardware("n2"), the_job=four_node_job(), view=cluster(size=4), policy=tight)
    # n2 is not drained (refused) but still excluded, so the job still has 3 of 4
    assert advice.drain == frozenset() and advice.rule == "unplaceable"


# ---------------------------------------------------------------------- heterogeneous jobs


@pytest.mark.parametrize("offset", [0, 1])
def test_a_component_of_a_heterogeneous_job_is_left_to_an_operator(offset):
    component = job(job_id=40 + offset, het_job_id=40, het_job_offset=offset)
    advice = decide(hardware("n2"), the_job=component)
    assert advice.action is Action.NONE and advice.rule == "hetjob" and advice.needs_operator
    assert advice.exclude == frozenset() and advice.drain == {"n2"}
    assert f"job {40 + offset} is component {offset} of heterogeneous job 40" in advice.reason


@pytest.mark.parametrize(
    "verdict",
    [
        Verdict(FaultClass.APPLICATION, cause="log: cuda.illegal_memory_access"),
        Verdict(FaultClass.UNKNOWN, cause="no evidence of the cause"),
    ],
)
def test_no_half_action_on_a_heterogeneous_job_whatever_the_class(verdict):
    component = job(job_id=41, het_job_id=40, het_job_offset=1)
    advice = decide(verdict, the_job=component)
    assert advice.action is Action.NONE and advice.rule == "hetjob"


def test_a_heterogeneous_job_exiting_93_is_not_half_stopped():
    from slurm_recovery.scheduler.base import ExitCode

    component = job(job_id=40, het_job_id=40, exit_code=ExitCode(93, 0))
    assert decide(hardware("n2"), the_job=component).rule == "hetjob"


def test_a_running_fault_on_a_heterogeneous_job_stays_advice_only():
    component = job(state="RUNNING", job_id=40, het_job_id=40)
    app = Verdict(FaultClass.APPLICATION, cause="log: x")
    advice = decide(app, the_job=component, kind=IncidentKind.APP_FAULT)
    assert advice.rule == "app_fault.running"


def test_every_needs_operator_rule_is_listed():
    assert {"unplaceable", "hetjob"} <= set(NEEDS_OPERATOR_RULES)


# ---------------------------------------------------------------------------- policy key


def test_the_policy_key_reads_both_choices_and_refuses_others():
    assert policy_from_toml('unplaceable = "stop"').unplaceable == "stop"
    assert policy_from_toml("").unplaceable == "wait"
    with pytest.raises(PolicyError, match="unplaceable"):
        policy_from_toml('unplaceable = "drain"')


def test_a_view_of_the_jobs_own_nodes_never_judges_placement():
    """explain-log and replay without a listing see only the job's nodes: every partition
    would look as small as the job, and every restart excluding a node unplaceable."""
    partial = dataclasses.replace(cluster(size=4), whole_listing=False)
    advice = decide(hardware("n2"), the_job=four_node_job(), view=partial)
    assert advice.rule == "classes.hardware.action" and not advice.needs_operator


def test_explain_log_of_a_one_node_job_is_not_called_unplaceable(tmp_path):
    import json

    from click.testing import CliRunner

    from slurm_recovery.cli import cli

    log = tmp_path / "job.out"
    log.write_text("NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.\n")
    args = ["explain-log", str(log), "--nodes", "n1", "--state", "failed", "--json"]
    out = CliRunner().invoke(cli, args)
    assert out.exit_code == 0, out.output
    answer = json.loads(out.output)
    assert answer["action"] == "requeue_exclude"
    assert "needs operator" not in json.dumps(answer), answer
