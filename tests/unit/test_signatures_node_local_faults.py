"""Node faults and shared-infrastructure faults told apart by the lines that prove which (issue
28, branch i28n): a crash beside the node's own memory errors, a disk full in the node's own
system directories or under slurmstepd's TMPDIR, NFS client messages (the server's, every
client's). docs/signatures.md, "Errors, by what they cost", says why each answer."""

from __future__ import annotations

import pytest

from tests.unit.signature_verdicts import answer, verdict

EXCLUDE = "requeue_exclude"
EDAC_CE = (
    "Feb 23 03:28:16 kernel: EDAC MC1: 1 CE memory scrubbing error on "
    "CPU_SrcID#1_Ha#0_Chan#0_DIMM#0 (channel:0 slot:0 page:0xee30a0 offset:0x0 grain:32 "
    "syndrome:0x0 -  area:DRAM err_code:0008:00c2 socket:1 ha:0 channel_mask:1 rank:0)"
)
MCE_LOGGED = "[12345.678901] mce: [Hardware Error]: Machine check events logged"
MEMTESTER = "FAILURE: 0x4a2b3c4d != 0x4a2b3c5d at offset 0x0012a4f0."
CRASHES = [
    "forrtl: severe (174): SIGSEGV, segmentation fault occurred",
    "Segmentation fault (core dumped)",
    "Fatal Python error: Segmentation fault",
    "/var/spool/slurmd/job42/slurm_script: line 9: 1234 Bus error (core dumped) ./a.out",
    "[  812.1] python[4242]: segfault at 7f00deadbeef ip 00007f1234567890 sp 00007ffd1234 "
    "error 4 in libtorch_cpu.so[7f1230000000+1000000]",
]


# ------------------------------------------------------------- a crash and the node's memory


@pytest.mark.parametrize("crash", CRASHES)
def test_a_crash_alone_blames_no_node(crash: str) -> None:
    # programs segfault from their own bugs far more often than from bad RAM
    assert answer(crash, nodes=["n1"]) == ("requeue", [])
    assert answer(crash) == ("requeue", [])


@pytest.mark.parametrize("crash", CRASHES)
@pytest.mark.parametrize("memory", [EDAC_CE, MCE_LOGGED])
def test_a_crash_beside_the_nodes_corrected_memory_errors_blames_the_node(
    crash: str, memory: str
) -> None:
    for lines in ((memory, crash), (crash, memory)):
        v = verdict(*lines, nodes=["n1"])
        assert (v.action, v.blame_nodes, v.fault_domain) == (EXCLUDE, ["n1"], "hardware")
        assert v.category == "host_memory"
        assert answer(*lines) == (EXCLUDE, ["(the log's node)"])


def test_corrected_memory_errors_alone_stay_a_warning() -> None:
    assert answer(EDAC_CE, nodes=["n1"]) == ("none", [])


def test_a_memory_tester_failure_blames_the_node_with_or_without_a_crash() -> None:
    assert answer(MEMTESTER, nodes=["n1"]) == (EXCLUDE, ["n1"])
    assert answer(CRASHES[0], MEMTESTER, nodes=["n1"]) == (EXCLUDE, ["n1"])


def test_a_crash_and_memory_errors_on_different_nodes_blame_neither() -> None:
    lines = (
        "Mar  1 10:00:00 gpu05 kernel: EDAC MC0: 1 CE memory read error on "
        "CPU_SrcID#0_Ha#0_Chan#1_DIMM#0 (channel:1 slot:0 page:0x0 offset:0x0)",
        "srun: error: gpu03: task 0: Segmentation fault (core dumped)",
    )
    assert answer(*lines, nodes=["gpu03", "gpu05"]) == ("requeue", [])


def test_a_crash_and_memory_errors_on_the_same_node_of_a_multi_node_job() -> None:
    edac = (
        "Mar  1 10:00:00 gpu03 kernel: EDAC MC0: 1 CE memory read error on "
        "CPU_SrcID#0_Ha#0_Chan#1_DIMM#0 (channel:1 slot:0 page:0x0 offset:0x0)"
    )
    crash = (
        "Mar  1 10:00:01 gpu03 kernel: python[4242]: segfault at 7f00deadbeef ip "
        "00007f1234567890 sp 00007ffd1234 error 4 in libtorch_cpu.so[7f1230000000+1000000]"
    )
    assert answer(edac, crash, nodes=["gpu03", "gpu05"]) == (EXCLUDE, ["gpu03"])
    # a crash line that does not name its node in a job of several: the file's one named host
    # is not proof it is that node's
    srun = "srun: error: gpu03: task 0: Segmentation fault (core dumped)"
    assert answer(edac, srun, nodes=["gpu03", "gpu05"]) == ("requeue", [])


def test_the_programs_own_error_before_the_crash_still_decides() -> None:
    lines = (
        "Traceback (most recent call last):",
        '  File "train.py", line 3, in <module>',
        "ValueError: bad shape",
        EDAC_CE,
        CRASHES[1],
    )
    # the crash is weak evidence, never decisive: the first failure in time is the root
    assert answer(*lines, nodes=["n1"]) == ("stop", [])


# ----------------------------------------------------------------------------- a full disk


@pytest.mark.parametrize(
    "line",
    [
        "slurmstepd: error: write /var/spool/slurmd/job12345/slurm_script: No space left on device",
        "slurmstepd: error: Unable to create TMPDIR [/local/tmp/1234]: No space left on device",
        "slurmstepd: error: Unable to create TMPDIR [/local/tmp/1234]: Read-only file system",
        "slurmstepd: error: Unable to create TMPDIR [/local/tmp/1234]: Input/output error",
        "OSError: [Errno 28] No space left on device: '/var/lib/docker/overlay2/x'",
        "failed to register layer: write /var/lib/docker/tmp/GetImageBlob123: no space left on "
        "device",
        "cp: error writing '/var/log/app/out.log': No space left on device",
        "tee: /run/user/1000/x: No space left on device",
    ],
)
def test_a_full_or_broken_node_system_directory_blames_the_node(line: str) -> None:
    assert answer(line, nodes=["n1"]) == (EXCLUDE, ["n1"])


@pytest.mark.parametrize(
    "line",
    [
        # the job writes these itself, or they are shared: restarted, no node
        "touch: cannot touch 'testfile': No space left on device",
        "npm ERR! nospc ENOSPC: no space left on device, write",
        "cp: error writing '/tmp/x': No space left on device",
        "OSError: [Errno 28] No space left on device: '/dev/shm/batch_17'",
        "cp: error writing '/scratch/u1/ckpt.pt': No space left on device",
        "write /home/u1/run/ckpt: no space left on device",
        # the site's or the user's TMPDIR setting: not the node's disk
        "slurmstepd: error: Unable to create TMPDIR [/local/tmp/1234]: Permission denied",
    ],
)
def test_a_full_job_or_shared_directory_is_restarted_without_a_blame(line: str) -> None:
    assert answer(line, nodes=["n1"]) == ("requeue", [])


# ------------------------------------------------------------------------ NFS client lines


@pytest.mark.parametrize(
    "line",
    [
        "[ 4856.819067] nfs: server ease not responding, still trying",
        "[184074.486065] nfs: server filer01 not responding, timed out",
        "Mar  1 10:00:00 gpu07 kernel: lockd: server 10.1.0.5 not responding, still trying",
        "[184081.319496] NFS: server nfs.vds-solr.svc.cluster.local error: fileid changed",
        "ls: cannot access '/mnt/nfs/data': Stale file handle",
    ],
)
def test_a_file_servers_trouble_is_every_clients_and_blames_no_node(line: str) -> None:
    assert answer(line, nodes=["n1"]) == ("requeue", [])
    assert answer(line) == ("requeue", [])


def test_a_file_server_that_answers_again_is_nothing() -> None:
    assert answer("[ 4893.959982] nfs: server ease OK", nodes=["n1"]) == ("none", [])
