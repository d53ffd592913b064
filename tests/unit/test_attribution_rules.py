"""The attribution rules of issue 17 on real lines: every kernel and driver form, the node of
origin, warnings that fail nothing, repeats that escalate, and collective timeouts read for a
launch or code mistake. Each line is as a public report printed it (its URL beside it)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slurm_recovery.signals.logs import THIS_NODE, classify, default_catalogue

REAL = [
    (
        "Dec  2 11:38:46 worker4 kernel: [  218.250408] NVRM: GPU 0000:0a:00.0: RmInitAdapter "
        "failed! (0x24:0x72:1568)",
        "nvrm.rm_init_adapter_failed",
        "https://github.com/NVIDIA/gpu-operator/issues/1146",
    ),
    (
        "kern  :err   : 2025-01-25T10:34:54,859532+00:00 nvidia-nvswitch1: SXid (PCI:0000:84:00.0)"
        ": 12028, Data {0x000001c0, 0x00bd5c8a, 0x00000500, 0x00000064, 0x00000000, 0x40008000, "
        "0x5a001100, 0x00000000, 0x00000000}",
        "nvswitch.sxid",
        "https://github.com/leptonai/gpud/pull/338",
    ),
    (
        "RuntimeError: cuda runtime error (802) : system not yet initialized at "
        "/opt/conda/conda-bld/pytorch_1579022034529/work/aten/src/THC/THCGeneral.cpp:50",
        "cuda.error",
        "https://github.com/pytorch/pytorch/issues/35710",
    ),
    (
        "[task 2025-07-01T05:06:30.005+00:00] [train] [nvidia-smi(stdout)] Failed to initialize "
        "NVML: Driver/library version mismatch",
        "nvml.version_mismatch",
        "https://github.com/mozilla/translations/issues/1167",
    ),
    (
        "Unable to determine the device handle for GPU 0000:02:00.0: GPU is lost. Reboot the "
        "system to recover this GPU",
        "nvml.gpu_lost",
        "https://github.com/JosephKJ/OWOD/issues/81",
    ),
    (
        "[Sun Jan 11 09:52:01 2026] NVRM: nvAssertOkFailedNoLog: Assertion failed: Reset required "
        "[NV_ERR_RESET_REQUIRED] (0x00000062) returned from status @ kernel_channel.c:2874",
        "nvrm.reset_required",
        "https://github.com/scitix/sichek/issues/51",
    ),
    (
        "        Pending                           : Yes",
        "nvml.remap_pending",
        "https://github.com/leptonai/gpud/pull/80",
    ),
    (
        "Fatal error:  device '*': sys files not found (/sys/class/infiniband/*/ports)",
        "ib.no_device",
        "https://github.com/clustervision/trinity/issues/219",
    ),
    (
        "[  +0.000004] pcieport 0000:00:03.0: PCIe Bus Error: severity=Uncorrected (Fatal), "
        "type=Transaction Layer, (Requester ID)",
        "pcie.aer_uncorrected",
        "https://github.com/rwth-i6/returnn/issues/1500",
    ),
    (
        "Uncorrectable ECC / other uncorrectable memory error @P2-DIMMH2(CPU2) - Assertion",
        "host.memory_uncorrectable",
        "https://github.com/openstreetmap/operations/issues/1364",
    ),
    (
        "[May19 19:57] CMCI storm detected: switching to poll mode",
        "host.memory_error_storm",
        "https://github.com/ovro-lwa/lwa-issues/issues/117",
    ),
    (
        "May  7 06:45:12 errol kernel: [21584690.529862] mce: [Hardware Error]: Machine check "
        "events logged",
        "host.memory_corrected",
        "https://github.com/openstreetmap/operations/issues/300",
    ),
    (
        "[Thu Mar 14 01:57:54 2019] Killed process 89879 (python) total-vm:146328kB, anon-rss:0kB, "
        "file-rss:1824kB, shmem-rss:0kB",
        "kernel.oom_killed",
        "https://github.com/intel/platform-resource-manager/issues/42",
    ),
    (
        "[DEBUG] linux-firmware-network-20230804_1: failed to check hash for `./usr/lib/firmware/"
        "ti-connectivity/wl128x-fw-5-mr.bin': Input/output error",
        "fs.local_io_error",
        "https://github.com/void-linux/void-packages/issues/46054",
    ),
    (
        "May  3 09:30:47 backup kernel: [74505.779405] nfs: server rprshnas01.camh.ca not "
        "responding, still trying",
        "fs.nfs_not_responding",
        "https://github.com/TIGRLab/admin/issues/525",
    ),
    (
        "srun: error: Task launch for 23.0 failed on node hpc: Job prolog failed",
        "slurm.prolog_failed_on_node",
        "https://github.com/mknoxnv/ubuntu-slurm/issues/4",
    ),
    (
        "srun: error: Application launch failed: Job prolog failed",
        "slurm.prolog_failed",
        "https://github.com/mknoxnv/ubuntu-slurm/issues/4",
    ),
    (
        "Not responding [slurm@2022-07-10T02:00:55]",
        "slurm.node_reason",
        "https://github.com/ArjunaCluster/ArjunaUsers/issues/154",
    ),
    (
        "Kill task failed root 2024-01-25T15:12:23 ip-10-0-1-23",
        "slurm.kill_task_failed",
        "https://github.com/awslabs/awsome-distributed-ai/issues/185",
    ),
    (
        "ERROR:  nhc:  Health check failed:  Watchdog timer unable to terminate hung NHC process "
        "16263.",
        "slurm.health_check_failed",
        "https://github.com/mej/nhc/issues/134",
    ),
    (
        "ValueError: host not found: Name or service not known",
        "net.name_resolution",
        "https://github.com/pytorch/pytorch/issues/73682",
    ),
    (
        "[trainer0|0]:ncclSocketInit: connecting to address  with family 59936 is neither "
        "AF_INET(2) nor AF_INET6(10)",
        "nccl.no_interface",
        "https://github.com/NVIDIA/nccl/issues/1837",
    ),
    (
        "include/shm.h:48 NCCL WARN Error while creating shared memory segment "
        "nccl-shm-recv-250a7cc850ba9298-0-1-3 (size 9637888)",
        "nccl.shm_error",
        "https://github.com/NVIDIA/nccl/issues/342",
    ),
    (
        "Duplicate GPU detected : rank 3 and rank 2 both on CUDA device e2000",
        "nccl.invalid_usage",
        "https://github.com/NVIDIA/nccl/issues/1241",
    ),
    (
        "node23:12098:12141 [2] transport/nvls.cc:244 NCCL WARN Cuda failure 1 'invalid argument'",
        "nccl.nvls_failure",
        "https://github.com/NVIDIA/nccl/issues/1488",
    ),
    (
        "RuntimeError: CUDA error: invalid device ordinal",
        "cuda.setup_error",
        "https://github.com/LuyaooChen/uninformed-students-pytorch/issues/3",
    ),
    (
        "RuntimeError: CuDNN error: CUDNN_STATUS_NOT_SUPPORTED. This error may appear if you "
        "passed in a non-contiguous input.",
        "cudnn.error",
        "https://github.com/pytorch/pytorch/issues/11065",
    ),
    (
        "[rank0]:[E ProcessGroupNCCL.cpp:1316] [PG 5 Rank 0] Heartbeat monitor timed out! Process "
        "will be terminated after dumping debug info. workMetaList_.size()=3",
        "torch.heartbeat_timeout",
        "https://github.com/xdit-project/xDiT/issues/147",
    ),
    (
        "RuntimeError: DataLoader worker (pid 572) is killed by signal: Bus error. It is possible "
        "that dataloader's workers are out of shared memory. Please try to raise your shared "
        "memory limit.",
        # PyTorch's hint for every SIGBUS in a worker: a bus error, restarted once (i28k)
        "torch.dataloader_bus_error",
        "https://github.com/bytedance/Protenix/issues/2",
    ),
]

XID_79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus."


def verdict(lines: list[str], nodes: list[str] | None = None):
    catalogue = default_catalogue()
    return classify(list(catalogue.scan(lines, source="log")), nodes=nodes, catalogue=catalogue)


@pytest.mark.parametrize(("line", "expected", "source"), REAL, ids=[r[1] for r in REAL])
def test_real_kernel_driver_and_slurm_lines_are_recognised(
    line: str, expected: str, source: str
) -> None:
    assert [m.signature_id for m in default_catalogue().scan([line])] == [expected], source


# ---------------------------------------------------------------- the node of origin


def test_a_one_node_job_blames_its_node_whatever_host_the_line_names() -> None:
    got = verdict([f"Nov 29 13:45:01 gpu12 kernel: {XID_79}"], nodes=["n1"])
    assert (got.action, got.blame_nodes) == ("requeue_exclude", ["n1"])


def test_without_nodes_a_line_without_host_blames_the_node_that_wrote_the_log() -> None:
    got = verdict([f"[ 1234.5] {XID_79}"])
    assert (got.action, got.blame_nodes) == ("requeue_exclude", [THIS_NODE])
    # another line of the same file names its host: that is the node
    # a warning in the same file names its host: that is the node the XID line is about
    named = verdict(
        [
            "Nov 29 13:44:58 gpu07 kernel: pcieport 0000:00:01.1: AER: Corrected error received: "
            "0000:01:00.0",
            f"[ 1234.5] {XID_79}",
        ]
    )
    assert named.blame_nodes == ["gpu07"]


def test_in_a_multi_node_job_a_line_that_names_no_node_blames_none() -> None:
    got = verdict([f"[ 1234.5] {XID_79}"], nodes=["n1", "n2"])
    assert (got.action, got.blame_nodes) == ("requeue", [])


def test_a_peer_side_symptom_alone_blames_no_one() -> None:
    line = (
        "gpu01:39964:40044 [0] misc/socket.cc:49 NCCL WARN socketProgress: Connection closed by "
        "remote peer gpu02<57557>"
    )
    got = verdict([line], nodes=["gpu01", "gpu02"])
    assert (got.action, got.blame_nodes) == ("requeue", [])


# ---------------------------------------------------------------- no failure, no action


@pytest.mark.parametrize(
    "line",
    [
        "nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 egress non-posted "
        "PRIV error (First)",
        "pcieport 0000:00:01.1: AER: Corrected error received: 0000:01:00.0",
        "mlx5_ib: mlx5_ib_event:2950:(pid 0): event: CLIENT_REREGISTER on port 1",
        "gpu01:1:2 [0] NCCL WARN NET/Plugin: Could not find: libnccl-net.so",
        "NVRM: Xid (PCI:0000:0d:00): 63, pid=1, name=python, Row Remapper: New row marked for "
        "remapping, reset gpu to activate.",
    ],
)
def test_warnings_only_ask_for_nothing(line: str) -> None:
    got = verdict([line], nodes=["n1"])
    assert (got.action, got.blame_nodes) == ("none", [])


def test_a_port_race_is_requeued_not_stopped() -> None:
    line = (
        "torch.distributed.DistNetworkError: The server socket has failed to listen on any local "
        "network address. The server socket has failed to bind to [::]:29500 (errno: 98 - "
        "Address already in use)."
    )
    got = verdict([line], nodes=["n1"])
    assert (got.fault_domain, got.action, got.blame_nodes) == ("system", "requeue", [])


def test_whose_process_the_oom_killer_took_decides() -> None:
    job = "Out of memory: Killed process 4242 (python) total-vm:98765432kB, anon-rss:65432100kB"
    daemon = "Out of memory: Killed process 1842 (slurmd) total-vm:412340kB, anon-rss:10240kB"
    assert verdict([job], nodes=["n1"]).action == "stop"
    got = verdict([daemon], nodes=["n1"])
    assert (got.fault_domain, got.action, got.blame_nodes) == ("system", "requeue_exclude", ["n1"])


# ---------------------------------------------------------------- repeats escalate

CE = (
    "May  7 06:45:12 errol kernel: [21584690.529877] EDAC MC0: {n} CE error on "
    "CPU#0Channel#2_DIMM#0 (channel:2 slot:0 page:0x0 offset:0x0 grain:8 syndrome:0x0)"
)


def test_corrected_memory_errors_escalate_to_a_node_fault_when_they_repeat() -> None:
    assert verdict([CE.format(n=1), CE.format(n=1)]).action == "none"
    got = verdict([CE.format(n=1), CE.format(n=1), CE.format(n=1)])
    assert (got.action, got.blame_nodes) == ("requeue_exclude", ["errol"])
    assert "repeated: 3 events about one node" in got.cause


def test_an_edac_line_counts_as_the_corrected_errors_it_reports() -> None:
    """EDAC batches what it found in one poll: "120 CE" in one line is a storm, not one
    event; "1 CE" is one."""
    assert verdict([CE.format(n=1)]).action == "none"
    got = verdict([CE.format(n=120)])
    assert (got.action, got.blame_nodes) == ("requeue_exclude", ["errol"])
    assert "120 events" in got.cause
    assert verdict([CE.format(n=2)]).action == "none"
    assert verdict([CE.format(n=2), CE.format(n=1)]).action == "requeue_exclude"


def test_an_uncorrected_status_decoded_by_mcelog_blames_the_node_and_a_corrected_one_does_not() -> (
    None
):
    """mcelog prints a machine check as "STATUS <MCi_STATUS> MCGSTATUS <...>": the UC bit
    (61, with VAL) decides, as for the kernel's own record."""
    uc = "Dec  1 10:00:00 errol mcelog: STATUS be00000000800400 MCGSTATUS 0"
    ce = "Dec  1 10:00:00 errol mcelog: STATUS 8c00004f000800c2 MCGSTATUS 0"
    assert verdict([uc]).action == "requeue_exclude"
    assert verdict([uc]).blame_nodes == ["errol"]
    assert verdict([ce]).action == "none"


# ---------------------------------------------------------------- collective timeouts


def watchdog(
    rank: int,
    seq: int,
    op: str = "ALLREDUCE",
    numel: int = 466119168,
    pg: str = "",
    when: str = "E321 02:07:08.408271257",
) -> str:
    where = f"[PG {pg} Rank {rank}]" if pg else f"[Rank {rank}]"
    return (
        f"[rank{rank}]:[{when} ProcessGroupNCCL.cpp:607] {where} Watchdog caught "
        f"collective operation timeout: WorkNCCL(SeqNum={seq}, OpType={op}, NumelIn={numel}, "
        f"NumelOut={numel}, Timeout(ms)=600000) ran for 600060 milliseconds before timing out."
    )


def test_ranks_in_different_collectives_are_a_code_mismatch_stopped_without_blame() -> None:
    got = verdict([watchdog(0, 1580), watchdog(1, 1581, "BROADCAST", 12)], nodes=["n1", "n2"])
    assert (got.fault_domain, got.action, got.blame_nodes) == ("application", "stop", [])
    same_size_other_op = verdict([watchdog(0, 900), watchdog(1, 900, "ALLGATHER")])
    assert same_size_other_op.action == "stop"


def test_timeouts_in_the_first_collectives_are_a_launch_mistake() -> None:
    got = verdict([watchdog(0, 1, "BROADCAST", 1), watchdog(1, 1, "BROADCAST", 1)])
    assert (got.action, got.blame_nodes) == ("stop", [])
    assert "never met" in got.cause


def test_a_checkpoint_save_before_the_timeout_is_the_programs_doing() -> None:
    save = (
        "[2024-05-08 09:00:01,000] [INFO] [engine.py:3484:save_checkpoint] Saving model "
        "checkpoint: /ckpt/global_step1000/mp_rank_00_model_states.pt"
    )
    later = "E0508 09:10:02.000000000"  # ten minutes after the save began
    got = verdict([save, watchdog(1, 5000, when=later), watchdog(2, 5000, when=later)])
    assert (got.action, got.blame_nodes) == ("stop", [])
    assert "checkpoint" in got.cause


def test_consistent_timeouts_deep_in_training_are_requeued_and_blame_no_one() -> None:
    got = verdict([watchdog(r, 5000) for r in range(4)], nodes=["n1", "n2"])
    assert (got.action, got.blame_nodes) == ("requeue", [])
    # sequence numbers of different process groups are not compared
    groups = verdict([watchdog(0, 5000, pg="0"), watchdog(1, 73, "SEND", 1, pg="3")])
    assert groups.action == "requeue"


def test_the_rank_that_did_not_time_out_is_named_but_not_blamed() -> None:
    got = verdict([watchdog(r, 5000) for r in (0, 1, 2, 3, 5, 6, 7)], nodes=["n1", "n2"])
    assert (got.action, got.blame_nodes) == ("requeue", [])
    assert "rank 4 did not time out" in got.cause
    assert "did not time out" not in verdict([watchdog(0, 5000)]).cause


def test_a_hardware_line_beats_the_timeouts_it_caused() -> None:
    got = verdict(
        [watchdog(0, 5000), f"Nov 29 13:45:01 n2 kernel: {XID_79}", watchdog(1, 5000)],
        nodes=["n1", "n2"],
    )
    assert (got.action, got.blame_nodes) == ("requeue_exclude", ["n2"])


def test_timeouts_in_a_one_node_job_are_the_programs_own() -> None:
    """Every rank is on the one node: no network and no other node between them, so a rank
    that did not reach the collective in time was busy elsewhere in the program (or its GPU
    hung, which the driver reports as an XID: that line wins). The same timeouts in a
    two-node job, or read without the job's nodes, stay a restart."""
    deep = [watchdog(r, 5000) for r in range(4)]
    got = verdict(deep, nodes=["n1"])
    assert (got.fault_domain, got.action, got.blame_nodes) == ("application", "stop", [])
    assert "one-node job" in got.cause
    assert verdict(deep, nodes=["n1", "n2"]).action == "requeue"
    assert verdict(deep).action == "requeue"
    heartbeat = (
        "[rank0]:[E ProcessGroupNCCL.cpp:1316] [PG 5 Rank 0] Heartbeat monitor timed out! "
        "Process will be terminated after dumping debug info. workMetaList_.size()=3"
    )
    assert verdict([heartbeat], nodes=["n1"]).action == "stop"
    assert verdict([heartbeat], nodes=["n1", "n2"]).action == "requeue"
    # the GPU's own line decides: the node is excluded, not the job stopped
    hung = verdict([deep[0], f"Nov 29 13:45:01 n1 kernel: {XID_79}", deep[1]], nodes=["n1"])
    assert (hung.action, hung.blame_nodes) == ("requeue_exclude", ["n1"])
    # a failure of unknown cause with no timeout among the symptoms is still a restart
    child = "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:"
    assert verdict([child], nodes=["n1"]).action == "requeue"


# ---------------------------------------------------------------- properties

APPLICATION_LINES = [
    "[rank3]: ValueError: Expected input batch_size (16) to match target batch_size (8).",
    "RuntimeError: CUDA error: device-side assert triggered",
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 22.78 GiB.",
    "RuntimeError: CUDA error: invalid device ordinal",
    "NVRM: Xid (PCI:0000:3b:00): 69, pid=1, name=python, Class Error: ChId 0010, Class 0000c5c0",
    "ValueError: Loss is nan, stopping training",
]
ANY_LINES = APPLICATION_LINES + [r[0] for r in REAL] + [XID_79, watchdog(0, 5000)]


@given(st.lists(st.sampled_from(APPLICATION_LINES), min_size=1, max_size=6))
def test_application_lines_never_blame_a_node(lines: list[str]) -> None:
    for nodes in (None, ["n1"], ["n1", "n2"]):
        got = verdict(lines, nodes=nodes)
        assert got.blame_nodes == [] and got.action == "stop"


def test_a_segfault_alone_is_restarted_once_blaming_no_node() -> None:
    """A segfault is a bug, a build, or a node's bad memory: the line cannot tell, and stopping
    a job a bad node crashed loses it, so it is restarted (stop_on_same_failure stops a program
    that crashes the same way again); an application error beside it still decides."""
    for nodes in (None, ["n1"]):
        got = verdict(["Segmentation fault (core dumped)"], nodes=nodes)
        assert (got.action, got.fault_domain, got.blame_nodes) == ("requeue", "unknown", [])
    got = verdict(["RuntimeError: CUDA error: invalid device ordinal", "Segmentation fault"])
    assert (got.action, got.fault_domain) == ("stop", "application")


@given(st.lists(st.sampled_from(ANY_LINES), max_size=8))
def test_blame_is_only_ever_the_jobs_nodes_and_goes_with_requeue_exclude(lines: list[str]) -> None:
    for nodes in (["n1"], ["n1", "n2"]):
        got = verdict(lines, nodes=nodes)
        assert set(got.blame_nodes) <= set(nodes)
        assert bool(got.blame_nodes) == (got.action == "requeue_exclude")


def test_a_job_step_that_exited_non_zero_with_nothing_else_is_restarted_not_left_dead() -> None:
    """srun prints ``Exited with exit code N`` only for a non-zero code (src/srun/launch.c): the
    step failed. Alone, a failure of unknown cause, restarted once as a launcher's report of
    its child's exit is; a rank's own error beside it decides; never a blame."""
    exited = "srun: error: gpu07: tasks 0-7: Exited with exit code 1"
    for nodes in (None, ["n1"], ["gpu07", "gpu08"]):
        got = verdict([exited], nodes=nodes)
        assert (got.action, got.fault_domain, got.blame_nodes) == ("requeue", "unknown", [])
    got = verdict(["[rank1]: KeyError: 'sample_20'", exited])
    assert (got.action, got.fault_domain) == ("stop", "application")
    assert got.signatures[0]["id"] == "python.exception"


@pytest.mark.parametrize(
    "ended",
    [
        "slurmstepd: error: *** JOB 1234 ON gpu07 CANCELLED AT 2024-01-01T00:00:00 ***",
        "slurmstepd: error: *** JOB 1234 ON gpu07 CANCELLED AT 2024-01-01T00:00:00 DUE TO "
        "PREEMPTION ***",
    ],
)
@pytest.mark.parametrize(
    "report",
    [
        "srun: error: gpu07: task 0: Exited with exit code 143",
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:",
        "make: *** [Makefile:12: all] Error 1",
    ],
)
def test_a_job_slurm_ended_on_purpose_is_no_failure_whatever_its_launchers_report(
    ended: str, report: str
) -> None:
    """A cancelled or preempted job's processes end non-zero as they are killed: srun's exit
    line, torchrun's ChildFailedError and an error word are that end's report, not a failure."""
    got = verdict([ended, report], nodes=["gpu07"])
    assert (got.action, got.blame_nodes) == ("none", [])
