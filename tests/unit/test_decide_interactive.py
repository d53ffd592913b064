"""Interactive (srun/salloc) jobs: Slurm cannot requeue them, so advice never asks it to
(issue 16, item 7). The node is drained as for any job; the job is left or cancelled."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_recovery.decide.model import Action, FaultClass, IncidentKind, Verdict
from slurm_recovery.decide.policy import ClassPolicy, PolicyError, policy_from_toml
from tests.unit.test_decide_advise import WIDE, decide, hardware, job


def test_an_interactive_job_is_left_running_and_its_node_still_drained():
    advice = decide(hardware("n2"), the_job=job(state="RUNNING", batch=False))
    assert advice.action is Action.NONE and advice.rule == "interactive_jobs"
    assert advice.drain == {"n2"} and advice.exclude == frozenset()
    assert advice.reason == (
        "xid 79 (GPU has fallen off the bus) on n2 gpu1: left to end on its own: job 42 is "
        "interactive (srun/salloc), which Slurm cannot requeue (interactive_jobs = leave); "
        "drain n2"
    )


def test_with_interactive_jobs_cancel_it_is_stopped_with_the_reason():
    policy = dataclasses.replace(WIDE, interactive_jobs="cancel")
    advice = decide(hardware("n2"), the_job=job(state="RUNNING", batch=False), policy=policy)
    assert advice.action is Action.STOP and advice.rule == "interactive_jobs"
    assert advice.drain == {"n2"}
    assert "stop: job 42 is interactive" in advice.reason
    assert "interactive_jobs = cancel" in advice.reason


def test_the_key_is_read_and_checked():
    assert policy_from_toml('interactive_jobs = "cancel"').interactive_jobs == "cancel"
    assert policy_from_toml("").interactive_jobs == "leave"
    with pytest.raises(PolicyError, match=r"interactive_jobs = 'requeue': must be one of leave"):
        policy_from_toml('interactive_jobs = "requeue"')


CLASSES = st.sampled_from([FaultClass.HARDWARE, FaultClass.SYSTEM, FaultClass.UNKNOWN])


@settings(max_examples=200, deadline=None)
@given(
    fault_class=CLASSES,
    class_action=st.sampled_from(
        [Action.REQUEUE_EXCLUDE, Action.REQUEUE, Action.STOP, Action.NONE]
    ),
    nodes=st.sets(st.sampled_from(["n1", "n2", "n3"]), max_size=2),
    setting=st.sampled_from(["leave", "cancel"]),
    restarts=st.integers(0, 4),
    kind=st.sampled_from([IncidentKind.CRASH, IncidentKind.HANG]),
)
def test_an_interactive_job_is_never_requeued_and_drains_as_a_batch_job(
    fault_class, class_action, nodes, setting, restarts, kind
):
    classes = dict(WIDE.classes)
    classes[fault_class] = ClassPolicy(class_action, drain=fault_class is not FaultClass.UNKNOWN)
    policy = dataclasses.replace(WIDE, classes=classes, interactive_jobs=setting)
    verdict = Verdict(
        fault_class,
        nodes=frozenset(nodes) if fault_class is not FaultClass.UNKNOWN else frozenset(),
        confidence=0.95,
        evidence_ids=(5,),
        cause="a fault",
    )
    as_batch = decide(verdict, the_job=job(), policy=policy, restarts=restarts, kind=kind)
    advice = decide(verdict, the_job=job(batch=False), policy=policy, restarts=restarts, kind=kind)
    assert advice.action not in (Action.REQUEUE, Action.REQUEUE_EXCLUDE)
    assert advice.exclude == frozenset()
    assert advice.drain == as_batch.drain
    if as_batch.action in (Action.REQUEUE, Action.REQUEUE_EXCLUDE):
        expected = Action.STOP if setting == "cancel" else Action.NONE
        assert (advice.action, advice.rule) == (expected, "interactive_jobs")
    elif as_batch.rule != "max_restarts":  # a class that stops or records stays so
        assert advice.action is as_batch.action
