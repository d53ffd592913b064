"""Issue 28: message families read from their emitters' sources, by what each member means.

Each test holds one family to its meaning (the verdict's action, class and blame), with lines
in the shape the emitter prints them (format strings from its source; hosts and numbers are
made up). Where a family is parsed (a number in the line decides), hypothesis varies it.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_recovery.signals.logs import LogVerdict
from tests.unit.signature_verdicts import verdict


def ids(v: LogVerdict) -> list[str]:
    return [s["id"] for s in v.signatures]


# ---------------------------------------------------------------- NCCL


@settings(max_examples=40, deadline=None)
@given(local=st.integers(1, 2**31 - 1), remote=st.integers(1, 2**31 - 1))
def test_nccl_ib_collective_mismatch_is_the_program_s_mistake(local: int, remote: int) -> None:
    # NCCL 2.3.5-2.19 net_ib.cc: "Sanity checks to catch user collective call count/size
    # mismatches"; the receiver's buffer is smaller than what the sender sends
    line = (
        "gpu07:1307367:1307586 [0] transport/net_ib.cc:1038 NCCL WARN NET/IB : req 0/1 tag 0 "
        f"peer 10.0.0.6<58683> collective mismatch error, local size {local} remote size {remote}"
    )
    v = verdict(line, "gpu07:1307367:1307586 [0] NCCL INFO proxy.cc:520 -> 5")
    assert (v.action, v.fault_domain, v.blame_nodes) == ("stop", "application", [])


# ---------------------------------------------------------------- disks: smartd, md, RAID


@settings(max_examples=40, deadline=None)
@given(
    device=st.sampled_from(["/dev/sda [SAT]", "/dev/sg1 [cciss_disk_02] [SCSI]", "/dev/nvme0"]),
    count=st.integers(1, 100_000),
)
def test_smartd_failing_disk_blames_the_node_and_an_error_count_is_only_restarted(
    device: str, count: int
) -> None:
    # smartd.cpp: check_pending()'s "Device: %s, %" PRId64 " %s", MailWarning type 1 and 4
    for line in (
        f"Device: {device}, {count} Currently unreadable (pending) sectors",
        f"Device: {device}, {count} Offline uncorrectable sectors",
        f"Device: {device}, FAILED SMART self-check. BACK UP DATA NOW!",
    ):
        v = verdict(f"Nov 29 13:45:01 gpu12 smartd[811]: {line}")
        assert (v.action, v.fault_domain, v.blame_nodes) == (
            "requeue_exclude",
            "hardware",
            ["gpu12"],
        ), line
    # an error-log count that grew: ambiguous, the cheap error either way (no blame)
    for line in (
        f"Device: {device}, ATA error count increased from {count} to {count + 1}",
        f"Device: {device}, Self-Test Log error count increased from {count} to {count + 1}",
    ):
        v = verdict(f"Nov 29 13:45:01 gpu12 smartd[811]: {line}")
        assert (v.action, v.blame_nodes) == ("requeue", []), line


def test_a_smartd_attribute_trend_is_no_failure() -> None:
    v = verdict(
        "Device: /dev/sda [SAT], SMART Prefailure Attribute: 5 Reallocated_Sector_Ct "
        "changed from 100 to 99"
    )
    assert v.action == "none"


def test_md_member_failure_and_a_raid_controller_s_bad_drive_blame_the_node() -> None:
    # drivers/md/raid1.c / raid5.c pr_crit; MegaCLI / StorCLI physical drive states
    for line in (
        "Nov 29 13:45:01 gpu12 kernel: md/raid1:md0: Disk failure on sdb1, disabling device.",
        "Nov 29 13:45:01 gpu12 kernel: md/raid:md127: Disk failure on nvme1n1, disabling device.",
    ):
        v = verdict(line)
        assert (v.action, v.blame_nodes) == ("requeue_exclude", ["gpu12"]), line
    for line in ("Firmware state: Failed", "Firmware state: Unconfigured(bad)"):
        v = verdict(line, nodes=["n1"])
        assert (v.action, v.fault_domain, v.blame_nodes) == ("requeue_exclude", "hardware", ["n1"])
    # a healthy drive's state is no failure
    assert verdict("Firmware state: Online, Spun Up").action == "none"


# ---------------------------------------------------------------- slurmctld: how a job ended


@settings(max_examples=40, deadline=None)
@given(job=st.integers(1, 10**9), status=st.integers(1, 255), signal=st.integers(1, 64))
def test_slurmctld_job_end_forms(job: int, status: int, signal: int) -> None:
    # job_mgr.c _job_complete(): info("%s: %pJ WEXITSTATUS %d" / "WTERMSIG %d" / "OOM failure")
    stamp = "[2022-05-27T11:37:57.377]"
    assert verdict(f"{stamp} _job_complete: JobId={job} WEXITSTATUS 0").action == "none"
    v = verdict(f"{stamp} _job_complete: JobId={job} WEXITSTATUS {status}")
    assert (v.action, v.blame_nodes) == ("requeue", [])
    v = verdict(f"{stamp} _job_complete: JobId={job}_3({job + 3}) WTERMSIG {signal}")
    assert (v.action, v.blame_nodes) == ("requeue", [])
    v = verdict(f"{stamp} _job_complete: JobId={job} OOM failure")
    assert (v.action, v.fault_domain) == ("stop", "application")
    # kill_running_job_by_node_ptr(): the node named is the one that failed
    v = verdict(f"Nov 29 13:45:01 head slurmctld[811]: Killing JobId={job} on failed node c014")
    assert (v.action, v.blame_nodes) == ("requeue_exclude", ["c014"])


# ---------------------------------------------------------------- NVIDIA driver status codes


@settings(max_examples=60, deadline=None)
@given(
    code=st.sampled_from(
        [
            ("NV_ERR_GPU_IS_LOST", "requeue_exclude"),
            ("NV_ERR_ECC_ERROR", "requeue_exclude"),
            ("NV_ERR_NVLINK_TRAINING_ERROR", "requeue_exclude"),
            ("NV_ERR_LIB_RM_VERSION_MISMATCH", "requeue_exclude"),
            ("NV_ERR_NVLINK_FABRIC_NOT_READY", "requeue"),
            ("NV_ERR_INVALID_ARGUMENT", "requeue"),
            ("NV_ERR_NOT_SUPPORTED", "requeue"),
            ("NV_WARN_NOTHING_TO_DO", "none"),
            ("NV_WARN_MORE_PROCESSING_REQUIRED", "none"),
        ]
    ),
    value=st.integers(0, 0xFFFF),
)
def test_nv_status_codes_by_what_they_say_of_the_node(code: tuple[str, str], value: int) -> None:
    name, action = code
    line = (
        f"Nov 29 13:45:01 gpu12 kernel: NVRM: nvAssertOkFailedNoLog: Assertion failed: x "
        f"[{name}] (0x{value:08X}) returned from status @ kernel_channel.c:2874"
    )
    v = verdict(line)
    assert v.action == action
    assert v.blame_nodes == (["gpu12"] if action == "requeue_exclude" else [])


def test_fabric_manager_with_nothing_to_manage_is_no_failure() -> None:
    # FM on a machine without NVSwitches: NV_WARN_NOTHING_TO_DO, then its service wrapper and
    # systemd echo the exit: nothing failed (FM's version mismatch: test_signatures_setup_faults)
    v = verdict(
        "Sep 18 03:19:01 box nvidia-fabricmanager-start.sh[4756]: request to query NVSwitch device "
        "information from NVSwitch driver failed with error:WARNING Nothing to do "
        "[NV_WARN_NOTHING_TO_DO]",
        'Sep 18 03:19:01 box nvidia-fabricmanager-start.sh[4753]: "/usr/bin/nv-fabricmanager -c '
        '/usr/share/nvidia/nvswitch/fabricmanager.cfg" failed! Exit code: 1',
        "Sep 18 03:19:01 box systemd[1]: nvidia-fabricmanager.service: Control process exited, "
        "code=exited, status=1/FAILURE",
    )
    assert v.action == "none"


# ---------------------------------------------------------------- PyTorch: store waits, exit hangs

DESTROY = (
    "[rank{r}]:[W205 18:00:3{r}.953145631 ProcessGroupNCCL.cpp:1538] Warning: WARNING: "
    "destroy_process_group() was not called before program exit, which can leak resources. For "
    "more info, please see https://pytorch.org/docs/stable/distributed.html#shutdown "
    "(function operator())"
)
STUCK = (
    "[rank{r}]:[E205 18:11:0{r}.375750231 ProcessGroupNCCL.cpp:1870] [PG ID 12 PG GUID 99 Rank "
    "{r}] ProcessGroupNCCL's watchdog got stuck for 480 seconds without making progress in "
    "monitoring enqueued collectives."
)
WATCHDOG = (
    "[rank{r}]:[E205 18:11:0{r}.408271257 ProcessGroupNCCL.cpp:607] [Rank {r}] Watchdog caught "
    "collective operation timeout: WorkNCCL(SeqNum=1580, OpType=ALLREDUCE, NumelIn=4661, "
    "NumelOut=4661, Timeout(ms)=600000) ran for 600060 milliseconds before timing out."
)


@settings(max_examples=30, deadline=None)
@given(ranks=st.lists(st.integers(0, 7), min_size=1, max_size=4, unique=True))
def test_timeouts_after_the_program_began_to_exit_are_its_teardown(ranks: list[int]) -> None:
    exiting = [DESTROY.format(r=r) for r in ranks]
    for hang in (STUCK, WATCHDOG):
        v = verdict(*exiting, *(hang.format(r=r) for r in ranks))
        assert (v.action, v.fault_domain, v.blame_nodes) == ("stop", "application", [])
        assert "destroy_process_group" in v.cause
        # the warning after the timeouts (the program exits because of them): no mistake shown
        later = [line.replace("[W205 18:00:", "[W205 19:00:") for line in exiting]
        v = verdict(*(hang.format(r=r) for r in ranks), *later)
        assert v.action == "requeue"
    # the warning alone asks nothing
    assert verdict(*exiting).action == "none"


def test_a_store_client_s_timed_out_wait_is_a_symptom_restarted() -> None:
    # c10d/socket.cpp SocketImpl::waitForInput
    v = verdict(
        "[rank1]:[W516 14:34:56.853490829 socket.cpp:464] [c10d] waitForInput: poll for socket "
        "SocketImpl(fd=79, addr=[localhost]:41170, remote=[localhost]:29500) returned 0, likely a "
        "timeout",
        "[rank1]:[W516 14:34:56.854597329 socket.cpp:489] [c10d] waitForInput: socket "
        "SocketImpl(fd=79, addr=[localhost]:41170, remote=[localhost]:29500) timed out after "
        "1800000ms",
    )
    assert (v.action, v.blame_nodes) == ("requeue", [])


# ---------------------------------------------------------------- UCX


@settings(max_examples=30, deadline=None)
@given(
    call=st.sampled_from(["ibv_create_cq() failed", "ibv_create_srq() failed", "ibv_reg_mr(x)"]),
    kbytes=st.integers(8, 10**7),
)
def test_ucx_memlock_hint_is_a_warning_the_error_after_it_decides(call: str, kbytes: int) -> None:
    line = (
        f"[1668693503.473099] [gpu07:1188443:0] ib_log.c:246  UCX  ERROR mlx5_0: {call}: Cannot "
        f"allocate memory : Please set max locked memory (ulimit -l) to 'unlimited' (current: "
        f"{kbytes} kbytes)"
    )
    assert verdict(line).action == "none"
    # when UCX cannot carry on, the program's own failure follows
    v = verdict(line, "RuntimeError: CUDA error: out of memory")
    assert v.action == "stop"


# ---------------------------------------------------------------- GPU state as tools show it


@settings(max_examples=30, deadline=None)
@given(pad=st.integers(1, 30))
def test_nvml_recovery_action_blames_the_node_unless_none(pad: int) -> None:
    # nvmlDeviceGpuRecoveryAction_t as nvidia-smi -q shows it
    for word, action in (
        ("None", "none"),
        ("Reset", "requeue_exclude"),
        ("Reboot", "requeue_exclude"),
        ("Drain P2P", "requeue_exclude"),
        ("Drain and Reset", "requeue_exclude"),
    ):
        v = verdict(f"    GPU Recovery Action{' ' * pad}: {word}", nodes=["n1"])
        assert (v.action, v.blame_nodes) == (action, ["n1"] if action != "none" else []), word
    v = verdict("gpu 3: NVML_GPU_RECOVERY_ACTION_GPU_RESET", nodes=["n1"])
    assert (v.action, v.blame_nodes) == ("requeue_exclude", ["n1"])


def test_nvidia_smi_without_gpus_and_a_lost_gpu_in_either_case() -> None:
    # "No devices were found": a node whose GPUs are gone, or a container without them
    assert (
        verdict("No devices were found").action,
        verdict("No devices were found").blame_nodes,
    ) == (
        "requeue",
        [],
    )
    for gpu in ("GPU", "gpu"):
        v = verdict(
            f"Unable to determine the device handle for {gpu} 0000:3B:00.0: Unknown Error",
            nodes=["n1"],
        )
        assert (v.action, v.blame_nodes) == ("requeue_exclude", ["n1"])


@settings(max_examples=40, deadline=None)
@given(
    status=st.sampled_from(
        [
            ("CUBLAS_STATUS_ALLOC_FAILED", "stop"),
            ("CUBLAS_STATUS_ARCH_MISMATCH", "stop"),
            ("CUBLAS_STATUS_INVALID_VALUE", "stop"),
            ("CUBLAS_STATUS_NOT_INITIALIZED", "requeue"),
            ("CUBLAS_STATUS_EXECUTION_FAILED", "requeue"),
            ("CUBLAS_STATUS_INTERNAL_ERROR", "requeue"),
        ]
    ),
    call=st.sampled_from(["cublasCreate(handle)", "cublasSgemm( handle, opa, opb, m, n, k)"]),
)
def test_cublas_statuses_by_the_enum(status: tuple[str, str], call: str) -> None:
    name, action = status
    for line in (
        f"RuntimeError: CUDA error: {name} when calling `{call}`",
        f"cuBLAS error: {name}",
    ):
        v = verdict(line)
        assert (v.action, v.blame_nodes) == (action, []), line


def test_horovod_shutdown_is_another_rank_s_failure() -> None:
    shut = (
        "tensorflow.python.framework.errors_impl.UnknownError:  Horovod has been shut down. This "
        "was caused by an exception on one of the ranks or an attempt to allreduce, allgather or "
        "broadcast a tensor after one of the ranks finished execution."
    )
    v = verdict(shut)
    assert (v.action, v.fault_domain) == ("requeue", "unknown")
    # the rank's own exception decides
    v = verdict("[1,3]<stderr>:ValueError: bad shape", shut)
    assert v.action == "stop"


# ---------------------------------------------------------------- Slurm: limits, auth, PMIx


@settings(max_examples=30, deadline=None)
@given(kind=st.sampled_from(["job", "step"]), prefix=st.sampled_from(["slurmstepd: error: ", ""]))
def test_slurm_memory_limit_and_request_errors_are_the_job_s(kind: str, prefix: str) -> None:
    # older task/cgroup: memory.failcnt > 0, the limit was reached (not always a kill): a warning
    warning = f"{prefix}Exceeded {kind} memory limit at some point."
    if not warning.startswith("slurmstepd"):
        warning = "slurmstepd: " + warning
    assert verdict(warning).action == "none"
    for line in (
        "slurmstepd: error: Exceeded job memory limit",
        "srun: error: CPU count per node can not be satisfied",
        "srun: error: Memory specification can not be satisfied",
    ):
        if not line.startswith(("slurmstepd", "srun")):
            line = "slurmstepd: " + line
        v = verdict(line)
        assert (v.action, v.fault_domain, v.blame_nodes) == ("stop", "application", []), line


@settings(max_examples=20, deadline=None)
@given(
    why=st.sampled_from(["Expired credential", "Rewound credential", "Invalid credential"]),
)
def test_munge_and_pmix_setup_errors_are_restarted_without_blame(why: str) -> None:
    for line in (
        f"srun: error: Munge decode failed: {why}",
        "srun: error: mpi/pmix_v3: init: (null) [0]: mpi_pmix.c:171: pmi/pmix: can not load PMIx "
        "library",
    ):
        v = verdict(line)
        assert (v.action, v.fault_domain, v.blame_nodes) == ("requeue", "system", []), line


# ---------------------------------------------------------------- kernel: traps, memory storms


@settings(max_examples=30, deadline=None)
@given(
    trap=st.sampled_from(["general protection fault", "trap stack segment"]),
    lib=st.sampled_from(["libc.so.6", "libcuda.so.535.104.05", "libtorch_cuda.so"]),
)
def test_a_user_space_protection_trap_is_restarted_once_like_a_segfault(
    trap: str, lib: str
) -> None:
    # arch/x86/kernel/traps.c: the program's bug or the node's bad memory; the line cannot tell
    line = (
        f"Nov 29 13:45:01 gpu12 kernel: traps: python[23456] {trap} ip:7f3a2b4c1d20 "
        f"sp:7ffd4e2a1b80 error:0 in {lib}[7f3a2b428000+195000]"
    )
    v = verdict(line)
    assert (v.action, v.blame_nodes) == ("requeue", [])


def test_a_report_that_names_its_host_blames_that_host() -> None:
    # smartd_warning.sh's mail ("   host name:  $hostname"), scontrol show node's NodeName=
    v = verdict(
        "   host name:  katie", "Device: /dev/sda [SAT], FAILED SMART self-check. BACK UP DATA NOW!"
    )
    assert (v.action, v.blame_nodes) == ("requeue_exclude", ["katie"])
    v = verdict(
        "NodeName=c014 Arch=x86_64 CoresPerSocket=16",
        "   Reason=Not responding [slurm@2022-07-10T02:00:55]",
    )
    assert (v.action, v.blame_nodes) == ("requeue_exclude", ["c014"])
    assert verdict("   host name:  katie").action == "none"


@settings(max_examples=40, deadline=None)
@given(
    xid=st.sampled_from(
        # 13: a GPU kernel's fault, restarted once since i28k; 69: the program's class error
        [
            (79, "requeue_exclude"),
            (48, "requeue_exclude"),
            (13, "requeue"),
            (69, "stop"),
            (63, "none"),
        ]
    ),
    form=st.sampled_from(
        [
            "I0520 10:15:02.123456 1 health.go:159] XidCriticalError: Xid={x} on Device=GPU-5ba2; "
            "marking device as unhealthy.",
            "XidCriticalError: Xid={x} on Device=GPU-5ba2, the device will go unhealthy.",
            "Detected XID {x} for GPU 3",
        ]
    ),
)
def test_an_xid_a_gpu_tool_reports_reads_as_the_driver_s(xid: tuple[int, str], form: str) -> None:
    # NVIDIA's k8s device plugin (internal/rm/health.go) and DCGM (DCGM_FR_XID_ERROR_MSG)
    code, action = xid
    driver = verdict(f"NVRM: Xid (PCI:0000:3b:00): {code}, pid=1234, name=python, x", nodes=["n1"])
    tool = verdict(form.format(x=code), nodes=["n1"])
    assert (tool.action, tool.fault_domain, tool.blame_nodes) == (
        driver.action,
        driver.fault_domain,
        driver.blame_nodes,
    )
    assert tool.action == action


# ---------------------------------------------------------------- NCCL's older forms, nccl-tests


def test_nccl_shm_full_and_the_old_syscheck_spelling() -> None:
    # NCCL <= 2.8 include/checks.h: WARN("Call to " name " failed : %s"); shm.h posix_fallocate
    full = (
        "gpu01:1234:1250 [0] include/shm.h:28 NCCL WARN Call to posix_fallocate failed : "
        "No space left on device"
    )
    assert (verdict(full).action, verdict(full).fault_domain) == ("stop", "application")
    other = "gpu01:1234:1250 [0] NCCL WARN Call to connect failed : Connection refused"
    assert (verdict(other).action, verdict(other).blame_nodes) == ("requeue", [])


@settings(max_examples=40, deadline=None)
@given(
    err=st.sampled_from(
        [
            ("Test CUDA failure common.cu:892 'out of memory'", "stop", []),
            (
                "Test CUDA failure common.cu:892 'uncorrectable ECC error encountered'",
                "requeue_exclude",
                ["gpu01"],
            ),
            ("Test NCCL failure common.cu:1005 'invalid usage'", "stop", []),
            (
                "Test NCCL failure common.cu:1005 'invalid usage / Duplicate GPU detected'",
                "stop",
                [],
            ),
        ]
    ),
    line_no=st.integers(1, 99999),
)
def test_nccl_tests_checks_name_the_wrapped_error_and_their_host(
    err: tuple[str, str, list[str]], line_no: int
) -> None:
    # nccl-tests src/common.h CUDACHECK / NCCLCHECK: "%s: Test CUDA failure %s:%d '%s'"
    text, action, blame = err
    v = verdict(f"gpu01: {text.replace(':892', f':{line_no}').replace(':1005', f':{line_no}')}")
    assert v.action == action
    # an ECC error is read by cuda.ecc_uncorrectable, which blames the log's node
    assert bool(v.blame_nodes) == bool(blame)


def test_torch_without_a_usable_gpu_is_restarted_without_blame() -> None:
    # c10/cuda CUDAFunctions.cpp and torch/cuda: PyTorch's words for cudaErrorNoDevice and
    # cudaErrorInsufficientDriver, read as those members are
    for line in (
        "RuntimeError: No CUDA GPUs are available",
        "RuntimeError: The NVIDIA driver on your system is too old (found version 10010). Please "
        "update your GPU driver",
        "RuntimeError: CUDA error: no CUDA-capable device is detected",
    ):
        v = verdict(line)
        assert (v.action, v.fault_domain, v.blame_nodes) == ("requeue", "system", []), line


# ---------------------------------------------------------------- NVML return codes


@settings(max_examples=60, deadline=None)
@given(
    code=st.sampled_from(
        [
            ("GPU is lost", "requeue_exclude"),
            ("GPU requires reset", "requeue_exclude"),
            ("GPU requires restart", "requeue_exclude"),
            ("Corrupted infoROM", "requeue_exclude"),
            ("Insufficient External Power", "requeue_exclude"),
            ("Driver/library version mismatch", "requeue"),
            ("RM has detected an NVML/RM version mismatch.", "requeue"),
            ("Driver Not Loaded", "requeue"),
            ("NVML Shared Library Not Found", "requeue"),
            ("Unknown Error", "requeue"),
            ("Timeout", "requeue"),
            ("Not Supported", "none"),
        ]
    ),
    form=st.sampled_from(
        [
            "Failed to initialize NVML: {m}",
            "slurmstepd: error: NVML: Failed to get usage(3): {m}",
            "pynvml.NVMLError_X: {m}",
        ]
    ),
)
def test_nvml_return_codes_by_what_they_say_of_the_node(code: tuple[str, str], form: str) -> None:
    # nvmlReturn_t texts (libnvidia-ml's nvmlErrorString, nvidia-ml-py's own)
    text, action = code
    v = verdict(form.format(m=text), nodes=["n1"])
    assert v.action == action, form.format(m=text)
    assert v.blame_nodes == (["n1"] if action == "requeue_exclude" else [])


# ---------------------------------------------------------------- errno in Python's OSError


@settings(max_examples=60, deadline=None)
@given(
    err=st.sampled_from(
        [
            ("ESTALE", "requeue", "system"),
            ("EIO", "requeue", "system"),
            ("ETIMEDOUT", "requeue", "system"),
            ("EUCLEAN", "requeue_exclude", "system"),
            ("EDQUOT", "stop", "application"),
            ("ENOENT", "stop", "application"),
            ("EACCES", "stop", "application"),
            ("EMFILE", "stop", "application"),
        ]
    ),
    exc=st.sampled_from(["OSError", "PermissionError", "FileNotFoundError", "BlockingIOError"]),
)
def test_python_errno_by_the_c_library_s_table(err: tuple[str, str, str], exc: str) -> None:
    import errno
    import os

    name, action, domain = err
    value = getattr(errno, name)
    v = verdict(f"{exc}: [Errno {value}] {os.strerror(value)}: '/scratch/run/x'", nodes=["n1"])
    assert (v.action, v.fault_domain) == (action, domain)
    assert v.blame_nodes == (["n1"] if action == "requeue_exclude" else [])


# ---------------------------------------------------------------- launchers


@settings(max_examples=40, deadline=None)
@given(
    end=st.sampled_from(
        [
            "died with <Signals.SIGKILL: 9>.",
            "died with <Signals.SIGSEGV: 11>.",
            "returned non-zero exit status 1.",
        ]
    ),
    code=st.integers(-64, 255),
)
def test_a_launcher_s_report_of_its_child_s_end_is_a_symptom(end: str, code: int) -> None:
    # CPython subprocess.CalledProcessError.__str__; DeepSpeed launcher/launch.py sigkill_handler
    for line in (
        "subprocess.CalledProcessError: Command '['/usr/bin/python', '-u', 'train.py', "
        f"'--local_rank=0']' {end}",
        "[2023-01-01 00:00:00,000] [ERROR] [launch.py:321:sigkill_handler] ['/usr/bin/python', "
        f"'-u', 'train.py'] exits with return code = {code}",
    ):
        v = verdict(line)
        assert (v.action, v.fault_domain, v.blame_nodes) == ("requeue", "unknown", []), line
        # the child's own error decides
        assert verdict("[rank0]: ValueError: bad batch", line).action == "stop"


# ---------------------------------------------------------------- IPMI SEL (ipmitool sel list)


@settings(max_examples=60, deadline=None)
@given(
    event=st.sampled_from(
        [
            ("Memory #0x53", "Uncorrectable ECC", "requeue_exclude"),
            ("Memory CPU0_DIMM_A1", "Correctable ECC logging limit reached", "requeue_exclude"),
            ("Processor CPU1", "IERR", "requeue_exclude"),
            ("Power Supply PS2", "Failure detected", "requeue_exclude"),
            ("Critical Interrupt #0x10", "PCI SERR", "requeue_exclude"),
            ("Memory #0x53", "Correctable ECC", "none"),
            ("Power Supply PS2", "Presence detected", "none"),
            ("Drive Slot / Bay #0x01", "Drive Present", "none"),
        ]
    ),
    record=st.integers(1, 0xFFFF),
    asserted=st.booleans(),
)
def test_ipmi_sel_events_by_ipmitool_s_table(
    event: tuple[str, str, str], record: int, asserted: bool
) -> None:
    # ipmitool lib/ipmi_sel.c: "%4x | date | time | <type> <sensor> | <description> | Asserted"
    sensor, text, action = event
    state = "Asserted" if asserted else "Deasserted"
    v = verdict(f"{record:4x} | 05/20/2021 | 10:15:02 | {sensor} | {text} | {state}", nodes=["n1"])
    want = action if asserted else "none"
    assert v.action == want
    assert v.blame_nodes == (["n1"] if want == "requeue_exclude" else [])


# ---------------------------------------------------------------- machine check status (UC bit)


@settings(max_examples=80, deadline=None)
@given(
    status=st.integers(0, 2**64 - 1),
    form=st.sampled_from(
        [
            "mce: [Hardware Error]: CPU 3: Machine Check: 0 Bank {b}: {s:016x}",
            "EDAC sbridge MC1: CPU 1: Machine Check Event: 0 Bank {b}: {s:016x}",
        ]
    ),
    bank=st.integers(0, 31),
)
def test_a_machine_check_record_is_uncorrected_when_its_status_says_so(
    status: int, form: str, bank: int
) -> None:
    # Intel SDM MCi_STATUS: bit 63 VAL, bit 61 UC; mce/core.c and sb_edac.c print the status
    v = verdict(f"Nov 29 13:45:01 gpu12 kernel: {form.format(b=bank, s=status)}")
    uncorrected = bool(status >> 63 & 1) and bool(status >> 61 & 1)
    if uncorrected:
        assert (v.action, v.fault_domain, v.blame_nodes) == (
            "requeue_exclude",
            "hardware",
            ["gpu12"],
        )
    else:
        assert v.action != "requeue_exclude"


def test_slurm_gres_errors_about_gpu_devices() -> None:
    # interfaces/gres.c: a node whose GPUs changed or are missing; a job's inconsistent request
    for line in (
        "slurmctld: error: _find_invalid_job_gres_on_node: Killing job 1234: gres/gpu count "
        "mismatch on node gpu07 (7 != 8)",
        "slurmctld: error: Invalid GRES configured on node gpu07: gpu:a100:9",
    ):
        v = verdict(line)
        assert (v.action, v.fault_domain, v.blame_nodes) == ("requeue_exclude", "system", ["gpu07"])
    v = verdict(
        "slurmd: error: /dev/nvidia3 is not a valid character or block device, fix your gres.conf"
    )
    assert (v.action, v.fault_domain) == ("requeue_exclude", "system")
    v = verdict(
        "srun: error: Failed to validate job spec, --gres=gpu/--gpus-per-node not multiple of "
        "--gpus-per-task."
    )
    assert (v.action, v.fault_domain, v.blame_nodes) == ("stop", "application", [])


@settings(max_examples=40, deadline=None)
@given(
    cause=st.sampled_from(
        [
            ("out of memory", "stop", "application"),
            # a GPU kernel's fault: restarted once, no node (i28k)
            ("an illegal memory access was encountered", "requeue", "unknown"),
            ("uncorrectable ECC error encountered", "requeue_exclude", "hardware"),
        ]
    ),
    after=st.booleans(),
)
def test_nccl_s_unhandled_cuda_error_defers_to_the_cuda_error_it_wraps(
    cause: tuple[str, str, str], after: bool
) -> None:
    # NCCL 2.12+ prints the wrapped error after the wrapper ("Last error:\\nCuda failure '...'")
    text, action, domain = cause
    wrapper = (
        "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
        "NCCLUtils.hpp:275, unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL "
        "version 2.18.1"
    )
    wrapped = f"Cuda failure '{text}'"
    lines = [wrapper, "Last error:", wrapped] if after else [wrapped, wrapper]
    v = verdict(*lines, nodes=["n1"])
    assert (v.action, v.fault_domain) == (action, domain)
    # alone, the wrapper is a failure of unknown cause: restarted once, no node blamed
    assert (verdict(wrapper, nodes=["n1"]).action, verdict(wrapper, nodes=["n1"]).blame_nodes) == (
        "requeue",
        [],
    )


# ---------------------------------------------------------------- DCGM


@settings(max_examples=40, deadline=None)
@given(gpu=st.integers(0, 7), count=st.integers(1, 10_000), row=st.booleans())
def test_dcgm_findings_by_dcgm_s_own_severity(gpu: int, count: int, row: bool) -> None:
    # dcgm_errors.h formats; dcgm_errors.c severities: ISOLATE and RESET blame the node,
    # MONITOR, CONFIG and TRIAGE ask nothing by themselves
    def shaped(message: str) -> str:
        return f"| Warning: GPU{gpu}             | {message} |" if row else message

    for message in (
        f"Detected {count} volatile double-bit ECC error(s) in GPU {gpu}.",  # ISOLATE
        f"Found {count} faulty memory elements on GPU {gpu}",  # ISOLATE
        f"GPU {gpu} had memory errors and row remappings are pending",  # RESET
        f"GPU {gpu} has fallen off the bus",  # ISOLATE
    ):
        v = verdict(shaped(message), nodes=["n1"])
        assert (v.action, v.fault_domain, v.blame_nodes) == ("requeue_exclude", "hardware", ["n1"])
        assert ids(v) == ["gpu_tool.dcgm"]
    for message in (
        f"Detected clocks event due to thermal violation in GPU {gpu}.",  # MONITOR
        f"Persistence mode for GPU {gpu} is disabled.",  # CONFIG
        f"GPU {gpu}'s NvLink link 2 is currently down",  # TRIAGE (DCGM/issues/49: no NVLink)
    ):
        assert verdict(shaped(message), nodes=["n1"]).action == "none"


def test_dcgm_codes_by_name_and_the_members_that_depart_from_dcgm() -> None:
    # a code printed by its name (NVSentinel, the DCGM exporter): the table's member decides
    v = verdict("ErrorCode:DCGM_FR_VOLATILE_DBE_DETECTED GPU:0 PCI:0000:9d:00.0", nodes=["n1"])
    assert (v.action, v.blame_nodes) == ("requeue_exclude", ["n1"])
    # IMEX not READY on a node outside an active NVLink domain is no fault (NVSentinel#1471)
    v = verdict("ErrorCode:DCGM_FR_IMEX_UNHEALTHY GPU:0 IMEX daemon status is -3 (not READY)")
    assert (v.action, v.blame_nodes) == ("none", [])
    # an XID DCGM reports is the XID catalogue's; the driver's own line stays the kernel's
    assert ids(verdict("Detected XID 79 for GPU 3", nodes=["n1"])) == ["gpu_tool.xid"]
    nvrm = "NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus."
    assert "gpu_tool.dcgm" not in ids(verdict(nvrm, nodes=["n1"]))
    # a wrapper: the CUDA error it quotes decides
    v = verdict("| Warning: GPU0 | GPU 0 failed to create a CUDA context: 'out of memory' |")
    assert v.action == "stop"


# ---------------------------------------------------------------- kernel die banner, errno 133


def test_the_kernel_s_die_banner_in_each_kernel_s_wording_blames_the_node() -> None:
    # dumpstack.c __die_header: "%s: %04lx [#%d]..." before v6.9, "Oops: %s: %04lx [#%d]..." after
    for banner in (
        "[ 4242.123456] Oops: 0000 [#1] SMP PTI",
        "[ 4242.123456] invalid opcode: 0000 [#1] PREEMPT SMP NOPTI",
        "[ 4242.123456] Oops: invalid opcode: 0000 [#2] PREEMPT SMP NOPTI",
        "[ 4242.123456] Oops: general protection fault, probably for non-canonical address "
        "0xdffffc0000000001: 0000 [#1] PREEMPT SMP KASAN NOPTI",
    ):
        v = verdict(banner, nodes=["n1"])
        assert (v.action, v.fault_domain, v.blame_nodes) == ("requeue_exclude", "system", ["n1"])
    # a user-space trap is the program's (or its library's), not the kernel's
    user = "traps: python[4242] trap invalid opcode ip:7f01 sp:7ffd error:0 in libfoo.so[7f00+2000]"
    assert "kernel.oops" not in ids(verdict(user, nodes=["n1"]))


def test_errno_133_is_a_poisoned_memory_page() -> None:
    # Linux asm-generic/errno.h EHWPOISON 133 (Python's errno module does not name it)
    v = verdict("OSError: [Errno 133] Memory page has hardware error", nodes=["n1"])
    assert (v.action, v.fault_domain, v.blame_nodes) == ("requeue_exclude", "hardware", ["n1"])


# ---------------------------------------------------------------- frameworks' out-of-memory words


def test_frameworks_out_of_memory_in_their_own_words_is_the_program_s() -> None:
    for line in (
        # TensorFlow's C++ log, without the Python exception
        "W tensorflow/core/framework/op_kernel.cc:1502] OP_REQUIRES failed at conv_ops.cc:484 : "
        "Resource exhausted: OOM when allocating tensor with shape[32,512,28,28] and type float "
        "on /job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc",
        "W tensorflow/core/common_runtime/bfc_allocator.cc:419] Allocator (GPU_0_bfc) ran out of "
        "memory trying to allocate 2.00GiB (rounded to 2147483648).  Current allocation summary "
        "follows.",
        "Out of memory error on GPU 1. Cannot allocate 1.5GB memory on GPU 1, 30GB memory has "
        "been allocated and available memory is only 500MB.",
        "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to "
        "allocate 17179869184 bytes.",
        "cupy.cuda.memory.OutOfMemoryError: Out of memory allocating 1,073,741,824 bytes "
        "(allocated so far: 8,589,934,592 bytes).",
        "RuntimeError: HIP out of memory. Tried to allocate 2.00 GiB (GPU 0; 63.98 GiB total)",
    ):
        v = verdict(line, nodes=["n1"])
        assert (v.action, v.fault_domain, v.blame_nodes) == ("stop", "application", []), line
        assert ids(v) == ["framework.out_of_memory"]
    # the allocator's retry that it says is not a failure asks nothing
    benign = (
        "W tensorflow/core/common_runtime/bfc_allocator.cc:243] Allocator (GPU_0_bfc) ran out of "
        "memory trying to allocate 1.25GiB with freed_by_count=0. The caller indicates that this "
        "is not a failure, but may mean that there could be performance gains if more memory "
        "were available."
    )
    assert verdict(benign, nodes=["n1"]).action == "none"


def test_thermal_shutdown_blames_the_node_and_throttling_is_a_warning() -> None:
    # drivers/thermal/thermal_core.c, both wordings; arch/x86/kernel/cpu/mce/therm_throt.c
    for line in (
        "kernel: thermal thermal_zone0: critical temperature reached (105 C), shutting down",
        "kernel: thermal thermal_zone4: acpitz: critical temperature reached, shutting down",
    ):
        v = verdict(line, nodes=["n1"])
        assert (v.action, v.fault_domain, v.blame_nodes) == ("requeue_exclude", "hardware", ["n1"])
    throttled = "CPU0: Core temperature above threshold, cpu clock throttled (total events = 9)"
    assert verdict(throttled, nodes=["n1"]).action == "none"


def test_aer_reports_several_errors_at_once_as_multiple() -> None:
    # drivers/pci/pcie/aer.c before 6.x: "%sUncorrected (Fatal) error received" with "Multiple "
    line = "pcieport 0000:00:01.0: AER: Multiple Uncorrected (Fatal) error received: 0000:3b:00.0"
    v = verdict(line, nodes=["n1"])
    assert (v.action, v.fault_domain, v.blame_nodes) == ("requeue_exclude", "hardware", ["n1"])
    corrected = "pcieport 0000:00:01.0: AER: Multiple Corrected error received: 0000:3b:00.0"
    assert verdict(corrected, nodes=["n1"]).action == "none"


# ---------------------------------------------------------------- host memory, disks: tools' words


def test_edac_util_and_rasdaemon_counts_read_as_the_kernel_s_edac_lines() -> None:
    # edac-utils edac-util.c report formats; rasdaemon's mc_event and ras-mc-ctl --summary
    for line in (
        "mc0: csrow2: ch1: 4 Uncorrected Errors",
        "mc0: 1 Uncorrected Errors with no DIMM info",
        "\tUncorrected on DIMM Label(s): 'CPU_SrcID#0_MC#0_Chan#1_DIMM#0' location: 0:0:1:-1 "
        "errors: 3",
        "rasdaemon[1821]: mc_event: 2021-03-04 10:11:12 +0000 1 Uncorrected error: memory read "
        "error on CPU_SrcID#0_MC#0_Chan#1_DIMM#0 (mc: 0 location:0:1:0 grain:5)",
        "12 2022-10-16 11:26:39 +0000 1 Uncorrected error(s): memory read error at "
        "CPU_SrcID#1_MC#1_Chan#1_DIMM#0 location: 1:1:1:-1, addr 0x12345, grain 5",
    ):
        v = verdict(line, nodes=["n1"])
        assert (v.action, v.fault_domain, v.blame_nodes) == ("requeue_exclude", "hardware", ["n1"])
    # edac-util -v prints a zero count for every healthy row: no event, however many rows
    healthy = [
        f"mc0: csrow{i}: 0 {kind} Errors" for i in range(8) for kind in ("Uncorrected", "Corrected")
    ]
    assert verdict(*healthy, nodes=["n1"]).action == "none"
    # corrected errors are counted as the kernel's EDAC lines are: a storm blames the node
    assert verdict("mc0: csrow2: ch1: 2 Corrected Errors", nodes=["n1"]).action == "none"
    storm = verdict("mc0: csrow2: ch1: 120 Corrected Errors", nodes=["n1"])
    assert (storm.action, storm.blame_nodes) == ("requeue_exclude", ["n1"])


def test_a_disk_medium_error_blames_the_node() -> None:
    # SCSI sense key Medium Error / ASC Unrecovered read error; libata's { UNC } error flag
    for line in (
        "kernel: sd 2:0:0:0: [sdb] tag#7 Sense Key : Medium Error [current]",
        "kernel: sd 2:0:0:0: [sdb] Medium Error: Unrecovered read error - auto reallocate failed",
        "kernel: ata3.00: error: { UNC }",
    ):
        v = verdict(line, nodes=["n1"])
        assert (v.action, v.fault_domain, v.blame_nodes) == ("requeue_exclude", "hardware", ["n1"])


def test_nccl_s_unhandled_cuda_error_from_its_own_allocation_blames_no_node() -> None:
    # NCCL 2.12+: the wrapper, then "Last error:" and the WARN's text without its prefix
    wrapper = (
        "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
        "NCCLUtils.hpp:340, unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL "
        "version 2.21.5"
    )
    for alloc in (
        "Failed to CUDA calloc 8388608 bytes",
        "gpu-a17:2231:2290 [5] include/alloc.h:493 (ncclCudaCallocDebug) NCCL WARN Failed to "
        "CUDA calloc 536870912 bytes",
    ):
        v = verdict(
            wrapper,
            "ncclUnhandledCudaError: Call to CUDA function failed.",
            "Last error:",
            alloc,
            nodes=["n1"],
        )
        assert (v.action, v.blame_nodes) == ("requeue", []), alloc


def test_slurmctld_s_requeue_for_a_failed_node_blames_that_node() -> None:
    # job_mgr.c: "requeue job %pJ due to failure of node %s", "Batch %pJ missing from batch node
    # %s (not found BatchStartTime after startup)%s"
    for line in (
        "[2024-03-01T10:00:00.123] requeue job JobId=4242 due to failure of node gpu17",
        "[2024-03-01T10:00:00.123] Batch JobId=4242 missing from batch node gpu17 (not found "
        "BatchStartTime after startup), Requeuing job",
    ):
        v = verdict(line)
        assert (v.action, v.fault_domain, v.blame_nodes) == ("requeue_exclude", "system", ["gpu17"])
    # srun/opt.c: the command itself cannot be run
    v = verdict("srun: fatal: Can not execute /home/u/run/a.out", nodes=["n1"])
    assert (v.action, v.fault_domain, v.blame_nodes) == ("stop", "application", [])


def test_an_mpi_launcher_s_report_of_a_lost_process_is_a_symptom() -> None:
    # Open MPI/PRRTE help text; MPICH's banner
    for line in (
        "ORTE has lost communication with a remote daemon.",
        "PRTE has lost communication with a remote daemon.",
        "mpirun noticed that process rank 3 with PID 0 on node n4 exited on signal 9 (Killed).",
        "An MPI communication peer process has unexpectedly disconnected.",
        "===   BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES",
    ):
        v = verdict(line, nodes=["n1", "n4"])
        assert (v.action, v.blame_nodes) == ("requeue", []), line
        # never the root when the cause is in the log
        oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
        assert verdict(oom, line, nodes=["n1", "n4"]).action == "stop"
    # a signal that says more stays its own entry's
    segv = (
        "mpirun noticed that process rank 3 with PID 9 on node n4 exited on signal 11 "
        "(Segmentation fault)."
    )
    assert ids(verdict(segv)) == ["process.segfault"]


# ---------------------------------------------------------------- kernel: older and rarer forms


@settings(max_examples=30, deadline=None)
@given(section=st.integers(0, 9), record=st.integers(1, 9))
def test_a_firmware_first_section_is_read_by_its_severity(section: int, record: int) -> None:
    # drivers/firmware/efi/cper.c cper_estatus_print_section: "%s""Error %d, type: %s\n",
    # the severity from cper_severity_str (recoverable, fatal, corrected, info)
    prefix = f"[ 1234.567890] {{{record}}}[Hardware Error]:  Error {section}, type: "
    for severity, want in (
        ("recoverable", ("requeue_exclude", "hardware", ["n1"])),
        ("fatal", ("requeue_exclude", "hardware", ["n1"])),
        ("corrected", ("none", "unknown", [])),
        ("info", ("none", "unknown", [])),
    ):
        v = verdict(prefix + severity, nodes=["n1"])
        assert (v.action, v.fault_domain, v.blame_nodes) == want, severity


def test_the_kernel_s_older_and_rarer_node_faults_blame_the_node() -> None:
    for line, domain in (
        # arch/x86/mm/fault.c before v4.17: "BUG: unable to handle kernel %s at %px"
        ("BUG: unable to handle kernel NULL pointer dereference at 0000000000000008", "system"),
        ("BUG: unable to handle kernel paging request at ffffffffc0a1b2c3", "system"),
        # arch/x86/mm/fault.c do_sigbus on a poisoned page
        (
            "MCE: Killing python:23456 due to hardware memory corruption fault at 7f5be2e5a010",
            "hardware",
        ),
        # drivers/pci/pci.c: the device's config space reads all ones
        (
            "nvidia 0000:3b:00.0: Unable to change power state from D3cold to D0, device "
            "inaccessible",
            "hardware",
        ),
        (
            "nvme 0000:01:00.0: can't change power state from D3cold to D0 (config space "
            "inaccessible)",
            "hardware",
        ),
        # dumpstack.c __die_header with die()'s string: kernel-mode traps
        ("general protection fault: 0000 [#1] SMP NOPTI", "system"),
        (
            "general protection fault, probably for non-canonical address 0xdffffc0000000000: "
            "0000 [#1] PREEMPT SMP KASAN",
            "system",
        ),
        ("stack segment: 0000 [#1] SMP PTI", "system"),
    ):
        v = verdict(f"[ 1234.567890] {line}", nodes=["n1"])
        assert (v.action, v.fault_domain, v.blame_nodes) == ("requeue_exclude", domain, ["n1"])
    # a user-space process's trap of the same name stays a program's crash: restarted once
    v = verdict(
        "[ 1234.567890] traps: python[12345] general protection fault ip:7f00 sp:7ffd "
        "error:0 in libc-2.31.so[7f00+178000]",
        nodes=["n1"],
    )
    assert (v.action, v.blame_nodes) == ("requeue", [])


# ---------------------------------------------------------------- nvidia-smi


@settings(max_examples=30, deadline=None)
@given(bus=st.sampled_from(["0000:3B:00.0", "00000000:07:00.0", "0000:A1:00.0"]))
def test_a_gpu_nvidia_smi_cannot_open_blames_the_node_whatever_nvml_says(bus: str) -> None:
    # nvidia-smi: "Unable to determine the device handle for GPU%s: %s" with nvmlErrorString's
    # text (nvml_return.toml) or nvidia-smi's own longer one: the driver lists the GPU, NVML
    # cannot open it
    for text in (
        "GPU requires reset",
        "Timeout",
        "Corrupted infoROM",
        "Unable to communicate with GPU because it is insufficiently powered.",
        "The NVIDIA kernel module detected an issue with GPU interrupts.Consult the "
        '"Common Problems" Chapter of the NVIDIA Driver README for',
    ):
        for sep in (" ", ""):
            v = verdict(f"Unable to determine the device handle for GPU{sep}{bus}: {text}")
            assert (v.action, v.fault_domain, v.blame_nodes) == (
                "requeue_exclude",
                "hardware",
                ["(the log's node)"],
            ), text
    # the caller may not open it: a container's or a VM's setting, no node blamed
    for text in ("Insufficient Permissions", "GPU access blocked by the operating system"):
        v = verdict(f"Unable to determine the device handle for GPU {bus}: {text}")
        assert v.blame_nodes == []


# ---------------------------------------------------------------- IPMI SEL: generic events


@settings(max_examples=30, deadline=None)
@given(
    sensor=st.sampled_from(["Fan #0x30", "Temperature CPU1 Temp", "Voltage #0x61", "FAN5"]),
    elist=st.booleans(),
)
def test_a_sel_threshold_crossed_at_its_critical_level_blames_the_node(
    sensor: str, elist: bool
) -> None:
    # ipmitool ipmi_sel.h generic_event_types[] (threshold texts carry a trailing space for
    # "going low"), printed by sel list as "... | %s | %s | Asserted"; sel elist adds a reading
    tail = " | Reading 0 < Threshold 600 RPM" if elist else ""
    for text, want in (
        ("Lower Critical going low ", ("requeue_exclude", ["n1"])),
        ("Upper Non-recoverable going high", ("requeue_exclude", ["n1"])),
        ("Transition to Critical from less severe", ("requeue_exclude", ["n1"])),
        ("Lower Non-critical going low ", ("none", [])),
        ("Upper Critical going low ", ("none", [])),
        ("Redundancy Lost", ("none", [])),
        ("Predictive Failure Asserted", ("none", [])),
    ):
        line = f"  2c | 05/20/2021 | 10:15:02 | {sensor} | {text} | Asserted{tail}"
        v = verdict(line, nodes=["n1"])
        assert (v.action, v.blame_nodes) == want, text


# ---------------------------------------------------------------- Slurm: a node failure


@settings(max_examples=30, deadline=None)
@given(job=st.integers(1, 10**7), host=st.sampled_from(["gpu01", "n1", "node-a17"]))
def test_slurm_s_node_failure_blames_the_node_of_a_one_node_job_only(job: int, host: str) -> None:
    # slurmstepd: "*** JOB %u ON %s CANCELLED AT %s DUE TO NODE FAILURE ***", printed by the
    # step daemon of a node that is still up: in a multi-node job a survivor, so no node is
    # named; in a one-node job the failed node is the job's only one
    line = (
        f"slurmstepd: error: *** JOB {job} ON {host} CANCELLED AT 2024-04-20T09:09:37 "
        "DUE TO NODE FAILURE, SEE SLURMCTLD LOG FOR DETAILS ***"
    )
    v = verdict(line, nodes=["n1"])
    assert (v.action, v.fault_domain, v.blame_nodes) == ("requeue_exclude", "system", ["n1"])
    for nodes in (["n1", "n2"], None):
        v = verdict(line, nodes=nodes)
        assert (v.action, v.blame_nodes) == ("requeue", [])


# ---------------------------------------------------------------- disks: smartctl's own report


@settings(max_examples=30, deadline=None)
@given(warning=st.integers(1, 255), asc=st.integers(0, 255), ascq=st.integers(0, 255))
def test_smartctl_s_failed_health_blames_the_node_and_a_failed_self_test_is_restarted(
    warning: int, asc: int, ascq: int
) -> None:
    # ataprint.cpp: FAILED! and its second line; scsiprint.cpp: "SMART Health Status: %s
    # [asc=%x, ascq=%x]" only for an informational-exception condition; nvmeprint.cpp:
    # "Critical Warning:                   0x%02x", FAILED! when not zero
    for line in (
        "Drive failure expected in less than 24 hours. SAVE ALL DATA.",
        f"SMART Health Status: FAILURE PREDICTION THRESHOLD EXCEEDED [asc={asc:x}, ascq={ascq:x}]",
        f"Critical Warning:                   0x{warning:02x}",
    ):
        v = verdict(line, nodes=["n1"])
        assert (v.action, v.fault_domain, v.blame_nodes) == ("requeue_exclude", "hardware", ["n1"])
    for line in ("SMART Health Status: OK", "Critical Warning:                   0x00"):
        assert verdict(line, nodes=["n1"]).action == "none"
    # the self-test log (ataprint.cpp's status texts): a failure of unknown cause, restarted
    for status in ("read", "electrical", "servo/seek", "unknown"):
        line = f"# 1  Extended offline    Completed: {status} failure       90%     12345      123"
        v = verdict(line, nodes=["n1"])
        assert (v.action, v.blame_nodes) == ("requeue", [])
    line = "# 1  Short offline       Completed without error       00%     12345         -"
    assert verdict(line, nodes=["n1"]).action == "none"
