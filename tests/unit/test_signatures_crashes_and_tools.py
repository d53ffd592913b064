"""Crashes and tools, read from their emitters' sources by what each means: a DataLoader worker
killed by SIGBUS, a Slurm program's fatal line, unrelated programs crashing on one node,
gpu_burn's verdict, a client retrying its allocation.

Lines in the shape the emitter prints them (format strings from its source; hosts, pids and
numbers made up); where a number in the line decides, hypothesis varies it.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_recovery.signals.logs import LogVerdict
from tests.unit.signature_verdicts import verdict


def ids(v: LogVerdict) -> list[str]:
    return [s["id"] for s in v.signatures]


@settings(max_examples=30, deadline=None)
@given(pid=st.integers(1, 4_194_304))
def test_a_dataloader_worker_killed_by_sigbus_is_restarted_once(pid: int) -> None:
    # torch/csrc/DataLoader.cpp: a worker killed by SIGBUS gets PyTorch's hint that the workers
    # ran out of shared memory, for every SIGBUS, also the kernel's for a page an uncorrectable
    # memory error poisoned: a bus error, restarted once, no node (i28k; before: stop)
    line = (
        f"RuntimeError: DataLoader worker (pid {pid}) is killed by signal: Bus error. It is "
        "possible that dataloader's workers are out of shared memory. Please try to raise "
        "your shared memory limit."
    )
    v = verdict(line, nodes=["n1"])
    assert (v.action, v.fault_domain, v.blame_nodes) == ("requeue", "unknown", [])
    # a plain bus error: restarted once, as before
    plain = verdict("srun: error: gpu07: task 3: Bus error", nodes=["n1"])
    assert plain.action == "requeue" and plain.blame_nodes == []


@settings(max_examples=30, deadline=None)
@given(
    program=st.sampled_from(["srun", "sbatch", "salloc", "slurmstepd", "slurmd"]),
    words=st.text(alphabet="abcdefghijklmnopqrstuvwxyz -/", min_size=3, max_size=60).filter(
        lambda w: w.strip() and "warn" not in w and "retrying" not in w and "no error" not in w
    ),
)
def test_a_slurm_program_s_fatal_line_is_a_failure_of_unknown_cause(
    program: str, words: str
) -> None:
    # src/common/log.c: fatal() logs "<program>: fatal: ..." and exits the program; a form
    # Slurm's tables do not list is a failure all the same (restarted once), never "none"
    v = verdict(f"{program}: fatal: {words.strip()}", nodes=["n1"])
    assert (v.action, v.blame_nodes) == ("requeue", [])
    # Slurm ending the job on purpose still needs nothing
    ended = verdict(
        "slurmstepd: error: *** JOB 12 ON gpu07 CANCELLED AT 2026-12-01T10:00:00 "
        "DUE TO TIME LIMIT ***",
        f"{program}: fatal: {words.strip()}",
        nodes=["n1"],
    )
    assert ended.action == "none"


_COMM = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_-", min_size=2, max_size=15)
_OBJECT = st.from_regex(r"lib[a-z]{2,10}\.so(\.[0-9]{1,2})?", fullmatch=True)


def _segfault(comm: str, pid: int, obj: str, host: str = "gpu07") -> str:
    # arch/x86/mm/fault.c show_signal_msg, then print_vma_addr(" in ", ip)
    return (
        f"Dec  1 10:00:00 {host} kernel: {comm}[{pid}]: segfault at 0 ip 00007f1234567890 "
        f"sp 00007ffd12345678 error 4 in {obj}[7f1234000000+1000000]"
    )


def _gp_fault(comm: str, pid: int, obj: str, host: str = "gpu07") -> str:
    # arch/x86/kernel/traps.c: "traps: %s[%d] general protection fault ip:%lx sp:%lx error:%lx"
    return (
        f"Dec  1 10:00:01 {host} kernel: traps: {comm}[{pid}] general protection fault "
        f"ip:7f3a2b4c1d20 sp:7ffd4e2a1b80 error:0 in {obj}[7f3a2b428000+195000]"
    )


@settings(max_examples=40, deadline=None)
@given(
    comms=st.lists(_COMM, min_size=2, max_size=2, unique=True),
    objects=st.lists(_OBJECT, min_size=2, max_size=2, unique=True),
    pid=st.integers(1, 4_000_000),
    gp=st.booleans(),
)
def test_unrelated_programs_crashing_on_one_node_blame_its_memory(
    comms: list[str], objects: list[str], pid: int, gp: bool
) -> None:
    second = _gp_fault if gp else _segfault
    lines = [_segfault(comms[0], pid, objects[0]), second(comms[1], pid + 1, objects[1])]
    v = verdict(*lines)
    assert (v.action, v.fault_domain, v.blame_nodes) == ("requeue_exclude", "hardware", ["gpu07"])
    assert verdict(*lines, nodes=["n1"]).blame_nodes == ["n1"]
    # on two nodes, one crash each: each program's own crash, nothing tells a node
    apart = verdict(
        _segfault(comms[0], pid, objects[0], "gpu07"),
        second(comms[1], pid + 1, objects[1], "gpu08"),
        nodes=["gpu07", "gpu08"],
    )
    assert (apart.action, apart.blame_nodes) == ("requeue", [])


@settings(max_examples=40, deadline=None)
@given(comms=st.lists(_COMM, min_size=2, max_size=4, unique=True), obj=_OBJECT)
def test_programs_crashing_in_one_library_or_one_program_crashing_is_not_the_node(
    comms: list[str], obj: str
) -> None:
    # every program that loads one broken library crashes in it: the library, not the node
    same_object = verdict(*(_segfault(c, 100 + k, obj) for k, c in enumerate(comms)))
    assert (same_object.action, same_object.blame_nodes) == ("requeue", [])
    # one program's ranks crashing in their own objects: its bug or build
    one_program = verdict(_segfault(comms[0], 100, obj), _segfault(comms[0], 101, "libc.so.6"))
    assert (one_program.action, one_program.blame_nodes) == ("requeue", [])


@settings(max_examples=30, deadline=None)
@given(gpus=st.integers(1, 16), data=st.data())
def test_gpu_burn_s_faulty_gpu_blames_its_node_and_ok_is_nothing(
    gpus: int, data: st.DataObject
) -> None:
    # gpu_burn-drv.cpp: printf("\nTested %d GPUs:\n"), then printf("\tGPU %d: %s\n", i,
    # faulty ? "FAULTY" : "OK"): a GPU whose results differed from the reference
    bad = data.draw(st.integers(0, gpus - 1))
    report = [f"Tested {gpus} GPUs:"] + [
        f"\tGPU {i}: {'FAULTY' if i == bad else 'OK'}" for i in range(gpus)
    ]
    v = verdict(*report, nodes=["n1"])
    assert (v.action, v.fault_domain, v.blame_nodes) == ("requeue_exclude", "hardware", ["n1"])
    assert ids(v) == ["gpu_tool.burn_faulty"]
    clean = verdict(f"Tested {gpus} GPUs:", *(f"\tGPU {i}: OK" for i in range(gpus)), nodes=["n1"])
    assert clean.action == "none"


@settings(max_examples=20, deadline=None)
@given(program=st.sampled_from(["srun", "salloc", "sbatch"]))
def test_a_client_retrying_its_allocation_blames_no_node(program: str) -> None:
    # src/api/allocate.c _retry(): the client retries while slurmctld is busy; the words
    # "not responding" are the controller's, not a node reason about the client's node
    line = f"{program}: error: Slurm controller not responding, sleeping and retrying."
    v = verdict(line, nodes=["n1"])
    assert (v.action, v.blame_nodes) == ("none", [])
    failed = verdict(
        line,
        f"{program}: error: Unable to allocate resources: Socket timed out on send/recv operation",
        nodes=["n1"],
    )
    assert failed.blame_nodes == [] and failed.action != "none"
    # a node Slurm itself reports not responding still blames it
    node = verdict("   Reason=Not responding [slurm@2026-12-01T10:00:00]", nodes=["n1"])
    assert (node.action, node.blame_nodes) == ("requeue_exclude", ["n1"])
