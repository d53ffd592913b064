"""NCCL's InfiniBand async events, in every release's words, read by the event they print
(emitters/ibv_event_type.toml), not by the printer: NCCL 2.23+ prints a port coming back up and a
port failing through the same "Got non-fatal async event" line."""

from __future__ import annotations

import pytest

from slurm_recovery.signals.emitters import load_emitter_tables
from tests.unit.signature_verdicts import answer, verdict

PREFIX = "gpu07:4411:4470 [2] transport/net_ib/common.cc:179 NCCL WARN NET/IB : "

#: (the words after "NET/IB : ", the release that prints them)
PORT_ERROR = [
    ("Got async event : port error", "NCCL 2.3.5-2.19"),
    ("mlx5_0:1 Got async event : port error", "NCCL 2.20-2.22"),
    ("mlx5_0:1 Got async error event: port error", "NCCL 2.23-2.28"),
    ("mlx5_0:1 Got non-fatal async event: port error(10)", "NCCL 2.23+"),
]
BENIGN = [
    "Got async event : port active",
    "mlx5_0:1 Got async event : LID change",
    "mlx5_0:1 Got non-fatal async event: port active(9)",
    "mlx5_0:1 Got non-fatal async event: SM change(13)",
    "mlx5_0:1 Got non-fatal async event: client reregistration(17)",
    "mlx5_0:1 Got non-fatal async event: P_Key change(12)",
]


@pytest.mark.parametrize(("words", "release"), PORT_ERROR)
def test_a_port_error_blames_its_node_in_every_release(words: str, release: str) -> None:
    v = verdict(PREFIX + words)
    assert (v.action, v.blame_nodes) == ("requeue_exclude", ["gpu07"]), release
    assert v.signatures[0]["id"] == "nccl.ib_async_event"


@pytest.mark.parametrize("words", BENIGN)
def test_a_port_coming_up_or_a_subnet_manager_change_is_nothing(words: str) -> None:
    # before: the non-fatal printer's member read every event as a port error (a healthy node
    # excluded after its link came back up)
    assert answer(PREFIX + words) == ("none", [])


def test_the_hca_failing_blames_its_node_a_queue_pair_failing_does_not() -> None:
    assert answer(PREFIX + "mlx5_0:1 async fatal event: local catastrophic error") == (
        "requeue_exclude",
        ["gpu07"],
    )
    assert answer(PREFIX + "Got async event : local catastrophic error") == (
        "requeue_exclude",
        ["gpu07"],
    )
    qp = (
        "mlx5_1:1 async fatal event on QP (0x7f2a3c012340) qpn=4711 handle=12 send_cq=3 "
        "recv_cq=3 state=6 sq_psn=1048 rq_psn=977: local work queue catastrophic error"
    )
    assert answer(PREFIX + qp) == ("requeue", [])
    assert answer(PREFIX + "mlx5_1:1 async fatal event on QP (0x7f2a3c012340): CQ error") == (
        "requeue",
        [],
    )


def test_an_event_beside_the_real_failure_does_not_take_its_place() -> None:
    # a port flap that recovered, then the program's own error: the program's error decides
    v = verdict(
        PREFIX + "mlx5_0:1 Got non-fatal async event: port active(9)",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
    )
    assert (v.action, v.blame_nodes) == ("stop", [])


def test_the_event_table_holds_every_member_of_the_enum() -> None:
    table = load_emitter_tables().tables["ibv_event_type"]
    assert sorted(m.value for m in table.members) == list(range(21))
    assert {m.name for m in table.members if m.blame_node} == {
        "IBV_EVENT_PORT_ERR",
        "IBV_EVENT_DEVICE_FATAL",
    }


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        # NCCL 2.3.5-2.9: no peer named
        (
            "gpu07:4411:4470 [2] transport/net_ib.cc:788 NCCL WARN NET/IB : Got completion "
            "with error 12, opcode 1, len 32784, vendor err 129",
            ("requeue_exclude", ["gpu07"]),
        ),
        (
            "gpu07:4411:4470 [2] transport/net_ib.cc:788 NCCL WARN NET/IB : Got completion "
            "with error 5, opcode 1, len 0, vendor err 249",
            ("requeue", []),
        ),
    ],
)
def test_the_oldest_completion_error_reads_as_the_newer_ones(
    line: str, expected: tuple[str, list[str]]
) -> None:
    assert answer(line) == expected
