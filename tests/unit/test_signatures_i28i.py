"""Issue 28 (i28i): message families completed from their emitters' sources.

Lines in the shape the emitter prints them (format strings from its source; hosts, ports, pids
and numbers made up); where a number in the line decides, hypothesis varies it.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.signature_verdicts import answer, verdict

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


# ------------------------------------------------ a node's own directories gone read-only


@settings(max_examples=40, deadline=None)
@given(
    top=st.sampled_from(
        ["/tmp", "/var/tmp", "/var/lib", "/var/log", "/var/spool", "/var/cache", "/run", "/dev/shm"]
    ),
    leaf=st.from_regex(r"[a-z][a-z0-9_.-]{0,20}", fullmatch=True),
    form=st.sampled_from(
        [
            "touch: cannot touch '{p}': Read-only file system",
            "mkdir: cannot create directory '{p}': Read-only file system",
            "open {p}: read-only file system",
            "OSError: [Errno 30] Read-only file system: '{p}'",
            "mktemp: failed to create file via template '{p}': Read-only file system",
        ]
    ),
)
def test_a_node_s_own_directory_read_only_blames_the_node(top: str, leaf: str, form: str) -> None:
    line = form.format(p=f"{top}/{leaf}")
    assert answer(line, nodes=["n1"]) == ("requeue_exclude", ["n1"])
    assert answer(line, nodes=["n1", "n2"]) == ("requeue", [])  # which node: not said


@pytest.mark.parametrize(
    "line",
    [
        "touch: cannot touch '/home/user/run/x.txt': Read-only file system",
        "OSError: [Errno 30] Read-only file system: '/opt/conda/lib/python3.10/site-packages/x'",
        "cp: cannot create regular file '/usr/local/bin/tool': Read-only file system",
        "open /scratch/job42/out.bin: read-only file system",
    ],
)
def test_a_read_only_image_or_share_stays_a_restart(line: str) -> None:
    assert answer(line, nodes=["n1"]) == ("requeue", [])


def test_bash_here_document_on_a_read_only_node() -> None:
    line = (
        "Nov 28 08:00:43 gpu-a07 job.sh[1051774]: /var/spool/slurmd/job42/slurm_script: line 12: "
        "cannot create temp file for here-document: Read-only file system"
    )
    assert answer(line) == ("requeue_exclude", ["gpu-a07"])


# ------------------------------------------------ Slurm refusing a submission's own options


@pytest.mark.parametrize(
    "line",
    [
        # src/common/slurm_opt.c, proc_args.c, parse_value.c, sbatch/opt.c, srun/opt.c
        "sbatch: error: Invalid --time specification",
        "srun: fatal: --mem, --mem-per-cpu, and --mem-per-gpu are mutually exclusive.",
        "sbatch: error: invalid number of nodes (-N 0-0)",
        'sbatch: error: "x2" is not a valid node count',
        "srun: error: --exact and --whole are mutually exclusive.",
        "sbatch: error: Invalid directive found in batch script: --gpu",
        "srun: fatal: --gpus-per-node and --gres=gpu are mutually exclusive.",
        "salloc: error: Cannot specify both --bb and --bbf",
    ],
)
def test_a_submission_s_invalid_options_are_its_own(line: str) -> None:
    v = verdict(line, nodes=["n1"])
    assert (v.action, v.fault_domain, v.blame_nodes) == ("stop", "application", [])


@pytest.mark.parametrize(
    ("line", "action"),
    [
        (
            "sbatch: error: There is a problem talking to the database: Connection refused.  "
            "Only local cluster communication is available, remove --cluster or contact your "
            "admin.",
            "requeue",
        ),
        ("srun: error: getcwd failed: Stale file handle", "requeue"),
        (
            "srun: error: Thread value --threads=64 exceeds recommended limit of 60",
            "none",
        ),
    ],
)
def test_a_submit_host_s_trouble_is_restarted_and_a_warning_is_nothing(
    line: str, action: str
) -> None:
    assert answer(line, nodes=["n1"]) == (action, [])


# ------------------------------------------------ the shell's report of a killed command


@settings(max_examples=40, deadline=None)
@given(
    line_no=st.integers(min_value=1, max_value=9999),
    pid=st.integers(min_value=2, max_value=4194304),
    sig=st.sampled_from(
        [
            ("Killed", "", "requeue"),
            ("Segmentation fault", " (core dumped)", "requeue"),
            ("Bus error", " (core dumped)", "requeue"),
            ("Aborted", " (core dumped)", "requeue"),
            ("Floating point exception", "(core dumped)", "stop"),
            ("Illegal instruction", " (core dumped)", "stop"),
            ("CPU time limit exceeded", " (core dumped)", "stop"),
            ("Bad system call", " (core dumped)", "stop"),
            ("Terminated", "", "none"),
            ("User defined signal 1", "", "none"),
            ("Stopped", "", "none"),
        ]
    ),
)
def test_bash_s_report_of_a_command_killed_by_a_signal(
    line_no: int, pid: int, sig: tuple[str, str, str]
) -> None:
    text, core, action = sig
    script = "/var/spool/slurmd/job42/slurm_script"
    line = f"{script}: line {line_no}: {pid:>5} {text:<24}{core} python x.py"
    assert answer(line, nodes=["n1"]) == (action, [])


def test_a_shell_error_that_is_not_a_signal_is_not_read_as_one() -> None:
    assert answer("./run.sh: line 3: cd: /nonexistent: No such file or directory")[0] != "stop"


def test_every_linux_signal_has_a_member() -> None:
    from slurm_recovery.signals.emitters import load_emitter_tables

    table = load_emitter_tables().tables["signal_desc"]
    assert sorted(m.value for m in table.members if m.value is not None) == [*range(1, 32)]


# ------------------------------------------------ NVML's recovery action in nvidia-smi's CSV


@pytest.mark.parametrize("first", ["0", "3", "00000000:4E:00.0"])
@pytest.mark.parametrize("word", ["Drain P2P", "Drain and Reset", "Reset", "Reboot"])
def test_a_csv_row_naming_a_recovery_action_blames_the_node(first: str, word: str) -> None:
    # nvidia-smi --query-gpu=index|pci.bus_id,gpu_recovery_action --format=csv,noheader
    assert answer(f"{first}, {word}", nodes=["n1"]) == ("requeue_exclude", ["n1"])


def test_a_csv_row_with_no_recovery_action_is_nothing() -> None:
    assert answer("0, NVIDIA H100 80GB HBM3, None", nodes=["n1"]) == ("none", [])


# ------------------------------------------------ language runtimes' fatal reports, MPI_Abort


@pytest.mark.parametrize(
    ("line", "action"),
    [
        ('Exception in thread "main" java.lang.OutOfMemoryError: Java heap space', "stop"),
        ("java.lang.OutOfMemoryError: GC overhead limit exceeded", "stop"),
        ("# A fatal error has been detected by the Java Runtime Environment:", "requeue"),
        ("panic: runtime error: index out of range [3] with length 3", "stop"),
        ("fatal error: all goroutines are asleep - deadlock!", "stop"),
        ("fatal error: runtime: out of memory", "stop"),
        ("thread 'main' panicked at src/main.rs:10:5:", "stop"),
        ("MPI_ABORT was invoked on rank 3 in communicator MPI_COMM_WORLD", "requeue"),
        ("application called MPI_Abort(MPI_COMM_WORLD, 1) - process 0", "requeue"),
    ],
)
def test_runtime_fatal_reports(line: str, action: str) -> None:
    assert answer(line, nodes=["n1"]) == (action, [])


def test_a_kernel_panic_is_not_a_go_panic() -> None:
    line = "[   12.345678] Kernel panic - not syncing: Fatal exception"
    assert answer(line, nodes=["n1"]) == ("requeue_exclude", ["n1"])


def test_an_mpi_abort_after_the_cause_leaves_the_cause_the_root() -> None:
    v = verdict(
        "RuntimeError: CUDA error: device-side assert triggered",
        "MPI_ABORT was invoked on rank 3 in communicator MPI_COMM_WORLD",
        nodes=["n1"],
    )
    assert v.action == "stop"
    assert v.signatures[0]["id"] == "cuda.device_assert"


# ------------------------------------------------ btrfs, NIC transmit hangs, RAID controllers


@pytest.mark.parametrize(
    ("line", "action", "blamed"),
    [
        (
            "[12345.678901] BTRFS error (device sda1): bdev /dev/sda1 errs: wr 3, rd 1, flush 0, "
            "corrupt 0, gen 0",
            "requeue_exclude",
            True,
        ),
        (
            "[   12.345678] BTRFS info (device sda1): bdev /dev/sda1 errs: wr 0, rd 12, flush 0, "
            "corrupt 0, gen 0",
            "none",
            False,
        ),
        (
            "[76469.312326] BTRFS error (device dm-0): parent transid verify failed on logical "
            "2070681747456 mirror 1 wanted 6080 found 6062",
            "requeue_exclude",
            True,
        ),
        (
            "[12345.678901] BTRFS: error (device sda1) in btrfs_run_delayed_refs:2150: errno=-5 IO "
            "failure",
            "requeue_exclude",
            True,
        ),
        ("[12345.678901] ixgbe 0000:01:00.0 eth0: Detected Tx Unit Hang", "requeue", False),
        (
            "[12345.678901] bnxt_en 0000:04:00.0 eth0: TX timeout detected, starting reset task!",
            "requeue",
            False,
        ),
        (
            "[12345.678901] i40e 0000:3b:00.0: TX driver issue detected, PF reset issued",
            "requeue",
            False,
        ),
        (
            "[12345.678901] megaraid_sas 0000:02:00.0: FW in FAULT state Fault code:0x10000 "
            "subcode:0x0 func:megasas_transition_to_ready",
            "requeue_exclude",
            True,
        ),
        (
            "[12345.678901] hpsa 0000:03:00.0: Controller lockup detected: 0x00130000",
            "requeue_exclude",
            True,
        ),
    ],
)
def test_kernel_disk_nic_and_controller_messages(line: str, action: str, blamed: bool) -> None:
    assert answer(line, nodes=["n1"]) == (action, ["n1"] if blamed else [])


# ------------------------------------------------ libnvidia-container's other error contexts


@pytest.mark.parametrize(
    ("line", "action", "blamed"),
    [
        (
            "nvidia-container-cli: requirement error: unsatisfied condition: cuda>=12.4, please "
            "update your driver to a newer version, or use an earlier cuda container: unknown.",
            "requeue",
            False,
        ),
        (
            "nvidia-container-cli: mount error: file creation failed: /var/lib/docker/overlay2/"
            "abc/merged/usr/bin/nvidia-smi: file exists: unknown.",
            "stop",
            False,
        ),
        (
            "nvidia-container-cli: ldcache error: process /sbin/ldconfig.real failed with error "
            "code: 1: unknown",
            "requeue",
            False,
        ),
        (
            "nvidia-container-cli: permission error: capability change failed: operation not "
            "permitted: unknown",
            "requeue",
            False,
        ),
        # the driver itself not usable stays the weak node blame
        (
            "nvidia-container-cli: initialization error: nvml error: driver not loaded: unknown.",
            "requeue_exclude",
            True,
        ),
    ],
)
def test_nvidia_container_cli_contexts(line: str, action: str, blamed: bool) -> None:
    assert answer(line, nodes=["n1"]) == (action, ["n1"] if blamed else [])


# ------------------------------------------------ the NVIDIA driver not loading, deviceQuery


@pytest.mark.parametrize(
    "line",
    [
        "modprobe: FATAL: could not insert 'nvidia_uvm': Unknown symbol in module, or unknown "
        "parameter (see dmesg)",
        "modprobe: ERROR: could not insert 'nvidia': Required key not available",
        "[  812.441023] NVRM: API mismatch: the client has the version 535.104.05, but",
    ],
)
def test_the_node_s_driver_not_loading_blames_the_node(line: str) -> None:
    assert answer(line, nodes=["n1"]) == ("requeue_exclude", ["n1"])


@pytest.mark.parametrize(("value", "action"), [(100, "requeue"), (35, "requeue"), (3, "requeue")])
def test_device_query_s_device_count_error_is_read_by_its_value(value: int, action: str) -> None:
    # CUDA samples' deviceQuery: "cudaGetDeviceCount returned %d\n-> %s"
    v = verdict(f"cudaGetDeviceCount returned {value}", nodes=["n1"])
    assert v.action == action
    assert v.signatures[0]["id"] == "cuda.error"


def test_modprobe_s_no_such_device_is_left_to_the_lines_beside_it() -> None:
    # a VM without its GPU passed through prints it as often as a node whose GPU is gone
    line = "modprobe: ERROR: could not insert 'nvidia': No such device"
    assert answer(line, nodes=["n1"])[1] == []


def test_a_signal_description_longer_than_bash_s_column_is_read_too() -> None:
    line = (
        "/var/spool/slurmd/job42/slurm_script: line 12: 31337 Profiling timer expired python x.py"
    )
    assert answer(line, nodes=["n1"]) == ("requeue", [])
