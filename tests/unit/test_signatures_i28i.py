"""Issue 28 (i28i): message families completed from their emitters' sources.

Lines in the shape the emitter prints them (format strings from its source; hosts, ports, pids
and numbers made up); where a number in the line decides, hypothesis varies it.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_recovery.signals.logs import LogVerdict, classify, scan


def verdict(*lines: str, nodes: list[str] | None = None) -> LogVerdict:
    return classify(scan(list(lines)), nodes=nodes)


def answer(*lines: str, nodes: list[str] | None = None) -> tuple[str, list[str]]:
    v = verdict(*lines, nodes=nodes)
    return v.action, v.blame_nodes


# ------------------------------------------------------------ the kernel's BUG() assertion


@pytest.mark.parametrize(
    "where", ["mm/slub.c:4321", "fs/ext4/inode.c:2710", "drivers/gpu/drm/ttm/ttm_bo.c:187"]
)
def test_kernel_bug_assertion_alone_blames_the_node(where: str) -> None:
    # lib/bug.c report_bug(): "kernel BUG at %s:%u!", even without the die banner after it
    assert answer(f"[12345.678901] kernel BUG at {where}!", nodes=["n1"]) == (
        "requeue_exclude",
        ["n1"],
    )


# ------------------------------------------- c10d's per-address connect warnings (socket.cpp)

HOSTS = st.sampled_from(["[localhost]", "[gpu-a02]", "[::ffff:10.1.2.3]", "[10.0.0.7]"])
PORTS = st.integers(min_value=1024, max_value=65535)


@settings(max_examples=30, deadline=None)
@given(host=HOSTS, port=PORTS)
def test_a_connect_attempt_that_timed_out_is_a_symptom_restarted(host: str, port: int) -> None:
    line = (
        f"[W socket.cpp:663] [c10d] The client socket has failed to connect to {host}:{port} "
        "(errno: 110 - Connection timed out)."
    )
    v = verdict(line)
    assert (v.action, v.blame_nodes) == ("requeue", [])
    # a one-node job too: the address may be the node's own wrong host entry (not stopped)
    assert answer(line, nodes=["n1"]) == ("requeue", [])


@settings(max_examples=30, deadline=None)
@given(
    host=HOSTS,
    port=PORTS,
    err=st.sampled_from(
        [
            (97, "Address family not supported by protocol"),
            (99, "Cannot assign requested address"),
            (101, "Network is unreachable"),
        ]
    ),
)
def test_a_fallback_address_that_fails_at_once_is_nothing(
    host: str, port: int, err: tuple[int, str]
) -> None:
    # IPv6 ::1 or another address of the name fails at once while another works: runs that
    # train normally print these
    line = (
        f"[W socket.cpp:558] [c10d] The client socket has failed to connect to {host}:{port} "
        f"(errno: {err[0]} - {err[1]})."
    )
    assert answer(line) == ("none", [])


def test_other_c10d_connect_forms() -> None:
    assert answer(
        "[W socket.cpp:601] [c10d] The client socket has failed to connect to [10.1.2.3]:29500 "
        "(errno: 113 - No route to host)."
    ) == ("requeue", [])
    assert answer(
        "[rank3]:[W1204 01:02:11.120011093 socket.cpp:752] [c10d] The server socket on "
        "[gpu-a02]:29500 has timed out, will retry."
    ) == ("requeue", [])
    assert answer(
        "[I socket.cpp:786] [c10d] No socket on (gpu-a02, 29500) is listening yet, will retry."
    ) == ("none", [])
    assert answer(
        "[W socket.cpp:663] [c10d] The client socket has failed to connect to [LAPTOP-1]:29500 "
        "(system error: 10049 - The requested address is not valid in its context.)."
    ) == ("none", [])
    # the retry line that quotes a per-address failure stays a retry
    assert answer(
        "[rank5]:[W1204 01:02:11.120011093 TCPStore.cpp:363] [c10d] TCP client failed to "
        "connect/validate to host gpu-a02:29500 - retrying (try=3, timeout=600000ms, "
        "delay=2119ms): The client socket has failed to connect to gpu-a02:29500 (errno: 110 - "
        "Connection timed out)."
    ) == ("none", [])


# ------------------------------------------------ a one-node job's waits for another rank


@pytest.mark.parametrize(
    "line",
    [
        "[rank1]:[E516 14:34:56.854597329 socket.cpp:489] [c10d] waitForInput: poll for socket "
        "SocketImpl(fd=79, addr=[localhost]:41170, remote=[localhost]:29500) returned 0, likely "
        "a timeout",
        "[rank1]:[W516 14:34:56.854597329 socket.cpp:489] [c10d] waitForInput: socket "
        "SocketImpl(fd=79, addr=[localhost]:41170, remote=[localhost]:29500) timed out after "
        "1800000ms",
        "RuntimeError: [/opt/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] "
        "Timed out waiting 1800000ms for recv operation to complete",
    ],
)
def test_a_one_node_job_s_wait_for_another_rank_is_the_program_s(line: str) -> None:
    # connected, and waited for a rank on the same node that never answered: busy elsewhere
    # in the program, as a one-node job's collective timeout is
    assert answer(line, nodes=["n1"]) == ("stop", [])
    v = verdict(line, nodes=["n1"])
    assert v.fault_domain == "application"
    # on several nodes, or bare, a symptom restarted once
    assert answer(line, nodes=["n1", "n2"]) == ("requeue", [])
    assert answer(line) == ("requeue", [])


def test_a_one_node_job_that_never_reached_its_store_is_restarted_not_stopped() -> None:
    line = (
        "torch.distributed.DistNetworkError: The client socket has timed out after 600000ms "
        "while trying to connect to (gpu-a02, 29500)."
    )
    assert answer(line, nodes=["n1"]) == ("requeue", [])


# ------------------------------------------------ DCGM's API return codes (dcgmReturn_t)


@pytest.mark.parametrize(
    ("line", "action", "blamed"),
    [
        # dcgmi's 'Error: ... Return: ' + errorString() (dcgmlib/src/dcgm_errors.c)
        ("Error: Unable to get GPU info. Return: GPU is lost", "requeue_exclude", True),
        ("Error: Unable to update fields. Return: GPU requires reset", "requeue_exclude", True),
        (
            "dcgm_structs.DCGMError_NvvsIsolateError: The diagnostic returned an error that "
            "indicates the need to drain the GPU",
            "requeue_exclude",
            True,
        ),
        (
            "Error: Unable to start an embedded host engine. Host engine connection "
            "invalid/disconnected.",
            "requeue",
            False,
        ),
        (
            "Error: dcgmGetAllSupportedDevices() returned DCGM_ST_NVML_NOT_LOADED",
            "requeue",
            False,
        ),
        ("Error: Unable to get GPU info. Return: Timeout", "requeue", False),
        ("Error: Unable to update fields. Return: Success", "none", False),
        ("Error: Unable to retrieve job statistics. Return: No data is available.", "none", False),
        ("Error: Unable to get GPU info. Return: Field is not being watched", "none", False),
    ],
)
def test_dcgm_return_codes_read_by_their_table(line: str, action: str, blamed: bool) -> None:
    got, blame = answer(line, nodes=["n1"])
    assert got == action
    assert blame == (["n1"] if blamed else [])


def test_dcgm_s_own_finding_about_its_host_engine_stays_a_warning() -> None:
    # DCGM_FR_HOSTENGINE_CONN (severity MONITOR) quotes the return code's text: gpu_tool.dcgm's
    line = (
        "| Warning: GPU0             | Could not connect to the host engine: 'Host engine "
        "connection invalid/disconnected' |"
    )
    assert answer(line, nodes=["n1"]) == ("none", [])


def test_every_dcgm_return_code_is_listed_with_its_text() -> None:
    from slurm_recovery.signals.emitters import load_emitter_tables

    table = load_emitter_tables().tables["dcgm_return"]
    values = sorted(m.value for m in table.members if m.value is not None)
    # DCGM_ST_OK = 0 and -1 .. -67 (-2 is not used)
    assert values == sorted([0, -1, *range(-67, -2)])
    assert all(m.message for m in table.members)
