"""Distributed programs waiting on each other: c10d's per-address connect warnings, a one-node
job's waits for another rank, and Slurm's mpi/pmix plugin between step daemons, read by what
each emitter means.

Lines in the shape the emitter prints them (format strings from its source; hosts, ports, pids
and numbers made up); where a number in the line decides, hypothesis varies it.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.signature_verdicts import answer, verdict

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


# ------------------------------------------------ Slurm's mpi/pmix plugin (PMIXP_ERROR)

PMIX = "slurmstepd: error:  mpi/pmix_v4: {func}: {host} [{nodeid}]: {file}:{line}: {msg}"


@settings(max_examples=25, deadline=None)
@given(
    host=st.sampled_from(["gpu-a07", "n12", "cn0042"]),
    nodeid=st.integers(min_value=0, max_value=4095),
    line=st.integers(min_value=1, max_value=99999),
    site=st.sampled_from(
        [
            (
                "pmixp_coll_ring_reset_if_to",
                "pmixp_coll_ring.c",
                "0x1552f4: collective timeout seq=0",
            ),
            (
                "pmixp_coll_tree_reset_if_to",
                "pmixp_coll_tree.c",
                "0x7f2c3c: collective timeout seq=4",
            ),
            ("pmixp_p2p_send", "pmixp_utils.c", "send failed, rc=2, exceeded the retry limit"),
            ("pmixp_server_direct_conn", "pmixp_server.c", "Unable to connect to 3"),
            ("_dmdx_req", "pmixp_dmdx.c", "timeout: ns=slurm.pmix.42.0, rank=5, host=n2, ts=17"),
            ("_tcp_connect", "pmixp_dconn_tcp.c", "Cannot establish the connection"),
        ]
    ),
)
def test_pmix_messages_between_step_daemons_are_symptoms(
    host: str, nodeid: int, line: int, site: tuple[str, str, str]
) -> None:
    func, file, msg = site
    text = PMIX.format(func=func, host=host, nodeid=nodeid, file=file, line=line, msg=msg)
    assert answer(text, nodes=[host, "other"]) == ("requeue", [])


@settings(max_examples=25, deadline=None)
@given(
    host=st.sampled_from(["gpu-a07", "n12", "cn0042"]),
    line=st.integers(min_value=1, max_value=99999),
    site=st.sampled_from(
        [
            (
                "pmixp_usock_create_srv",
                "pmixp_utils.c",
                "Cannot bind() UNIX socket /var/spool/slurmd/stepd.slurm.pmix.42.0: "
                "Address already in use (98)",
            ),
            (
                "pmixp_libpmix_init",
                "pmixp_client.c",
                'Cannot create server lib tmpdir: "/var/spool/slurmd/pmix.42.0/": '
                "No space left on device (28)",
            ),
            (
                "mpi_p_slurmstepd_prefork",
                "mpi_pmix.c",
                "pmi/pmix: incorrect PMIx library version loaded 4 was loaded, required 5 version",
            ),
            ("mpi_p_slurmstepd_prefork", "mpi_pmix.c", "pmi/pmix: can not load PMIx library"),
        ]
    ),
)
def test_pmix_setup_failing_on_a_node_blames_the_node_it_names(
    host: str, line: int, site: tuple[str, str, str]
) -> None:
    func, file, msg = site
    text = PMIX.format(func=func, host=host, nodeid=0, file=file, line=line, msg=msg)
    assert answer(text, nodes=[host, "other"]) == ("requeue_exclude", [host])


def test_pmix_lines_that_are_no_failure_or_unblamed() -> None:
    ring = PMIX.format(
        func="pmixp_info_set",
        host="n1",
        nodeid=0,
        file="pmixp_info.c",
        line=180,
        msg="Ring collective algorithm cannot be used with Slurm RPC's communication "
        "subsystem. Tree-based collective will be used instead.",
    )
    assert answer(ring) == ("none", [])
    init = PMIX.format(
        func="pmixp_lib_init",
        host="n1",
        nodeid=0,
        file="pmixp_client_v2.c",
        line=511,
        msg="PMIx_server_init failed with error -2",
    )
    assert answer(init, nodes=["n1", "n2"]) == ("requeue", [])
    # Slurm before the _vN plugin names: 'mpi/pmix: '
    old = (
        "[2019-03-02T10:00:00.000] [77.0] error:  mpi/pmix: pmixp_coll_ring_reset_if_to: n3 "
        "[2]: pmixp_coll_ring.c:738: 0x7f: collective timeout seq=0"
    )
    assert answer(old, nodes=["n3", "n4"]) == ("requeue", [])
