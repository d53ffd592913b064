"""Log signatures: catalogue, scanner, classification and ``srecovery explain-log``.

Fixture lines follow the formats of real logs in public bug reports; each names its source.
Host names, ranks and numbers are changed where a test needs them; the shape is the report's.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_recovery.cli.explain_log import explain_log
from slurm_recovery.signals.logs import (
    Match,
    Signature,
    SignatureCatalogue,
    SignatureError,
    _join_lines,
    classify,
    default_catalogue,
    evidence_payload,
    nested_quantifiers,
    read_log,
    scan,
    signatures_from_toml,
)

DOCS = Path(__file__).resolve().parents[2] / "docs" / "signatures.md"
DATA = Path(__file__).parent / "data" / "logs"

# (line, signature id, source)
REAL_LINES = [
    (
        "[rank4]:[E321 02:07:08.414640780 ProcessGroupNCCL.cpp:607] [Rank 4] Watchdog caught "
        "collective operation timeout: WorkNCCL(SeqNum=1580, OpType=ALLREDUCE, NumelIn=466119168, "
        "NumelOut=466119168, Timeout(ms)=600000) ran for 600067 milliseconds before timing out.",
        "torch.nccl_watchdog_timeout",
        "https://github.com/hiyouga/LlamaFactory/issues/7396",
    ),
    (
        "[E ProcessGroupNCCL.cpp:737] [Rank 1] Watchdog caught collective operation timeout: "
        "WorkNCCL(SeqNum=469508, OpType=ALLREDUCE, Timeout(ms)=1800000) ran for 1802212 "
        "milliseconds before timing out.",
        "torch.nccl_watchdog_timeout",
        "https://github.com/OFA-Sys/OFA/issues/271",
    ),
    (
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
        "torch.child_failed",
        "https://github.com/Vision-CAIR/MiniGPT-4/issues/237",
    ),
    (
        "[rank1]:[W1229 22:06:38.558655037 TCPStore.cpp:106] [c10d] sendBytes failed on "
        "SocketImpl(fd=67, addr=[bogon]:36214, remote=[bogon]:43145): Broken pipe",
        "torch.tcpstore_broken",
        "https://github.com/xorbitsai/inference/issues/4421",
    ),
    (
        "[rank0]:[W510 09:16:33.395368149 ProcessGroupNCCL.cpp:1771] [PG ID 0 PG GUID 0 Rank 0] "
        'Failed to check the "should dump" flag on TCPStore, (maybe TCPStore server has shut '
        "down too early), with error: Broken pipe",
        "torch.tcpstore_broken",
        "https://github.com/modal-labs/modal-examples/issues/1558",
    ),
    (
        '"message": "RendezvousConnectionError: The connection to the C10d store has failed. '
        'See inner exception for details.",',
        "torch.rendezvous_error",
        "https://github.com/pytorch/pytorch/issues/64926",
    ),
    (
        "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by "
        "peer [127.0.0.1]:10895",
        "gloo.connection_closed",
        "https://github.com/RVC-Project/Retrieval-based-Voice-Conversion-WebUI/issues/1882",
    ),
    (
        "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:589] Read error "
        "[192.168.70.92]:25266: Connection reset by peer",
        "gloo.connection_closed",
        "https://github.com/RVC-Project/Retrieval-based-Voice-Conversion-WebUI/issues/1882",
    ),
    (
        "kp-ddp-worker-0:3468:3905 [4] ib_plugin.c:1615 NCCL WARN NET/IB : Got completion from "
        "peer 10.216.210.236<54862> with status=12 opcode=0 len=0 vendor err 129 (Recv) localGid "
        "fd00:1148:9000:5000:4:200:3:ff22 remoteGidsfd00:1148:9000:5000:4:200:3:ff1f",
        "nccl.ib_completion_error",
        "https://github.com/NVIDIA/nccl/issues/1405",
    ),
    (
        "H100-2:19989:20082 [1] transport/net_ib.cc:1295 NCCL WARN NET/IB : Got completion from "
        "peer fe80::966d:ae03:8b:df78%ib0<53249> with error 4, opcode 32564, len 32564, vendor "
        "err 81 (Send)",
        "nccl.ib_completion_error",
        "https://github.com/NVIDIA/nccl/issues/928",
    ),
    (
        "gpu05:2211:2290 [3] NCCL WARN NET/IB : Got async event : port error",
        "nccl.ib_async_event",
        "https://github.com/NVIDIA/nccl/issues/905",
    ),
    (
        "ncclRemoteError: A call failed possibly due to a network error or a remote process "
        "exiting prematurely.",
        "nccl.remote_error",
        "https://github.com/NVIDIA/nccl/issues/934",
    ),
    (
        "torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/"
        "NCCLUtils.hpp:268, remote process exited or there was a network error, "
        "NCCL version 2.21.5",
        "nccl.remote_error",
        "https://github.com/NVIDIA/nccl/issues/2076",
    ),
    (
        "ncclSystemError: System call (e.g. socket, malloc) or external library call failed or "
        "device error. ",
        "nccl.system_error",
        "https://github.com/pytorch/pytorch/issues/149984",
    ),
    (
        "RuntimeError: NCCL error in: /pytorch/torch/lib/c10d/ProcessGroupNCCL.cpp:825, unhandled "
        "system error, NCCL version 2.7.8",
        "nccl.error_raised",
        "https://github.com/rstrudel/segmenter/issues/60",
    ),
    (
        "ncclInternalError: Internal check failed.",
        "nccl.internal_error",
        "https://github.com/NVIDIA/nccl/issues/795",
    ),
    (
        "a100-st-p4d24xlarge-22:183006:183220 [1] misc/socket.cc:518 NCCL WARN Net : Call to recv "
        "from 10.200.84.247<58355> failed : Broken pipe",
        "nccl.peer_closed",
        "https://github.com/NVIDIA/nccl/issues/795",
    ),
    (
        "ubuntu:39964:40044 [0] misc/socket.cc:49 NCCL WARN socketProgress: Connection closed by "
        "remote peer node1<57557>",
        "nccl.peer_closed",
        "https://github.com/NVIDIA/nccl-tests/issues/166",
    ),
    (
        "65826-86bd789679-2dxbs:80744:80744 [1] misc/ibvwrap.cc:212 NCCL WARN Call to "
        "ibv_open_device failed",
        "ib.verbs_error",
        "https://github.com/zai-org/ImageReward/issues/65",
    ),
    (
        "RuntimeError: CUDA error: an illegal memory access was encountered",
        "cuda.illegal_memory_access",
        "https://github.com/evo-design/evo/issues/136",
    ),
    (
        "RuntimeError: CUDA error: unspecified launch failure",
        "cuda.launch_failure",
        "https://github.com/XPixelGroup/BasicSR/issues/211",
    ),
    (
        "RuntimeError: cuda runtime error (4) : unspecified launch failure at "
        "/pytorch/torch/lib/THC/THCTensorCopy.cu:85",
        "cuda.launch_failure",
        "https://github.com/pytorch/pytorch/issues/2567",
    ),
    (
        "RuntimeError: CUDA error: uncorrectable ECC error encountered",
        "cuda.ecc_uncorrectable",
        "https://github.com/vllm-project/vllm/issues/5222",
    ),
    (
        "failed call to cuDevicePrimaryCtxRetain: CUDA_ERROR_ECC_UNCORRECTABLE: uncorrectable "
        "ECC error encountered",
        "cuda.ecc_uncorrectable",
        "https://github.com/nagadit/DeepFaceLab_Linux/issues/89",
    ),
    (
        "  what():  CUDA error: device-side assert triggered",
        "cuda.device_assert",
        "https://github.com/OpenGVLab/InternImage/issues/134",
    ),
    (
        "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.70 GiB. GPU 0 has a "
        "total capacty of 6.00 GiB of which 0 bytes is free.",
        "cuda.out_of_memory",
        "https://github.com/carolchenyx/MGFN./issues/35",
    ),
    (
        "RuntimeError: CUDA out of memory. Tried to allocate 2.87 GiB (GPU 0; 14.76 GiB total "
        "capacity; 8.77 GiB already allocated; 19.75 MiB free)",
        "cuda.out_of_memory",
        "https://github.com/rshaojimmy/MADDoG/issues/11",
    ),
    (
        "[g07r1n14:27251:0:27251] ib_mlx5_log.c:143  Transport retry count exceeded on "
        "mlx5_0:1/IB (synd 0x15 vend 0x81 hw_synd 0/0)",
        "ib.transport_retry_exceeded",
        "https://github.com/openucx/ucx/issues/6669",
    ),
    (
        "[compute001:31180:0:31180] ib_mlx5_log.c:143  Transport retry count exceeded on "
        "mlx5_0:1/RoCE (synd 0x15 vend 0x81 hw_synd 0/0)",
        "ib.transport_retry_exceeded",
        "https://github.com/openucx/ucx/issues/6000",
    ),
    (
        "F20250821 13:22:09.976752 3186121 rdma_io.cc:811] Check failed: wc->status == "
        "IBV_WC_SUCCESS RC send CQ state error: 12, 0 IBV_WC_RETRY_EXC_ERR",
        "ib.transport_retry_exceeded",
        "https://github.com/uccl-project/uccl/issues/293",
    ),
    (
        "slurmstepd: error: *** JOB 494583 ON gpu01 CANCELLED AT 2024-04-20T09:09:37 DUE TO "
        "TIME LIMIT ***",
        "slurm.time_limit",
        "https://github.com/ZettaAI/zetta_utils/issues/671",
    ),
    (
        "slurmstepd: *** JOB 830329 CANCELLED AT 2018-08-06T17:21:44 DUE TO TIME LIMIT on n447 ***",
        "slurm.time_limit",
        "https://github.com/marbl/canu/issues/1067",
    ),
    (
        "slurmstepd: error: *** JOB 32391783 ON cn119 CANCELLED AT 2021-06-18T13:05:36 DUE TO "
        "PREEMPTION ***",
        "slurm.preemption",
        "https://github.com/SystemsGenetics/GEMmaker/pull/242",
    ),
    (
        "slurmstepd: error: Detected 1 oom_kill event in StepId=11300781.0. Some of the step "
        "tasks have been OOM Killed.",
        "slurm.oom_kill",
        "https://github.com/nextflow-io/nextflow/issues/5932",
    ),
    (
        "slurmstepd: error: Detected 1 oom-kill event(s) in StepId=14604003.batch cgroup. Some "
        "of your processes may have been killed by the cgroup out-of-memory handler.",
        "slurm.oom_kill",
        "https://www.osc.edu/documentation/knowledge_base/out_of_memory_oom_or_excessive_memory_usage",
    ),
    (
        "srun: error: o0616: task 0: Out Of Memory",
        "slurm.task_oom",
        "https://www.osc.edu/documentation/knowledge_base/out_of_memory_oom_or_excessive_memory_usage",
    ),
    (
        "salloc: error: Node failure on worker-1",
        "slurm.srun_node_failure",
        "https://github.com/nebius/soperator/issues/854",
    ),
    (
        "slurmstepd: error: *** JOB 41176 ON fnode01 CANCELLED AT 2016-11-30T10:21:37 ***",
        "slurm.cancelled",
        "https://github.com/hpc-unibe-ch/hpc-unibe-ch.github.io (docs/user-guide/job-management/"
        "investigating-job-failure.md)",
    ),
    (
        "Mar 21 20:18:56 pc kernel: [   65.315783] NVRM: Xid (PCI:0000:01:00): 79, "
        "pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
        "kernel.xid",
        "docs/signals.md (kmsg fixtures of this project)",
    ),
    (
        "ValueError: Network outputs is NAN! Stop Training",
        "python.exception",
        "https://github.com/lizhou-cs/JointNLT/issues/18",
    ),
    (
        "Loss is nan, stopping training",
        "numerics.nan_loss",
        "https://github.com/Intellindust-AI-Lab/DEIM/issues/96",
    ),
    (
        "BrokenPipeError: [Errno 32] Broken pipe",
        "python.network_exception",
        "https://github.com/wabson/chafon-rfid/issues/18",
    ),
    (
        "    running_loss += loss.item() * now_batch_size\nRuntimeError: CUDA error: device-side "
        "assert triggered",
        "cuda.device_assert",
        "https://github.com/layumi/Person_reID_baseline_pytorch/issues/372",
    ),
    (
        "[rank0]: RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/"
        "unbound_buffer.cc:78] Timed out waiting 8000ms for recv operation to complete",
        "gloo.timeout",
        "this project: tests/workloads/ddp_job.py --fault hang --timeout 8, torch 2.13.0+cpu, gloo",
    ),
    (
        "[rank2]: RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/"
        "unbound_buffer.cc:129] Timed out waiting 8000ms for send operation to complete",
        "gloo.timeout",
        "this project: tests/workloads/ddp_job.py --fault hang --timeout 8, torch 2.13.0+cpu, gloo",
    ),
    (
        "RuntimeError: Application timeout caused pair closure",
        "gloo.timeout",
        "https://github.com/lkeab/BCNet/issues/53",
    ),
    (
        "srun: error: n7: task 1: Killed",
        "slurm.task_killed",
        "this project: tests/workloads/ddp_job.py --fault crash, local cluster (docs/progress.md)",
    ),
]

HEALTHY = [
    # Megatron-LM iteration line and NCCL INFO lines: must never match.
    " [2024-05-08 08:47:31,261] iteration      100/  500000 | consumed samples:        51200 | "
    "elapsed time per iteration (ms): 1010.3 | learning rate: 1.5E-04 | global batch size:   512 "
    "| lm loss: 2.654321E+00 | loss scale: 65536.0 | grad norm: 0.512 | number of skipped "
    "iterations:   0 | number of nan iterations:   0 |",
    "gpu01:1050:1315 [0] NCCL INFO Channel 03/0 : 0[90000] -> 1[1000] [send] via NET/IB/3/GDRDMA",
    "dgx1-1:13617:13617 [0] NCCL INFO NET/IB : Using interface ib0 for sideband communication",
    "Epoch 0:   6%|██      | 32040/500150 [6:28:43<94:39:17,  1.37it/s, loss=2.6, v_num=95nc]",
    "2024-04-10 04:59:03 | INFO | logs | Total loss at epoch 5, step at 58400, "
    "loss=31.05100440979004",
]


def ids(lines: list[str]) -> list[str]:
    return [m.signature_id for m in scan(lines)]


# ---------------------------------------------------------------------- the catalogue


def test_catalogue_loads_and_covers_the_required_families() -> None:
    catalogue = default_catalogue()
    assert len(catalogue) >= 30
    families = {s.id.split(".")[0] for s in catalogue}
    assert {"torch", "gloo", "nccl", "cuda", "ib", "kernel", "slurm", "python", "numerics"} <= (
        families
    )
    for signature in catalogue:
        assert signature.fault_class in ("hardware", "system", "application", "unknown")
        assert signature.action in ("requeue_exclude", "requeue", "stop", "none")
        if signature.knock_on:
            assert not signature.blame_node and not signature.decisive


@pytest.mark.parametrize(
    "knock_on_id",
    [
        "torch.nccl_watchdog_timeout",
        "gloo.connection_closed",
        "gloo.timeout",
        "torch.tcpstore_broken",
        "nccl.remote_error",
        "nccl.peer_closed",
    ],
)
def test_waiting_rank_symptoms_are_marked_knock_on(knock_on_id: str) -> None:
    signature = default_catalogue().get(knock_on_id)
    assert signature is not None and signature.knock_on


@pytest.mark.parametrize(("line", "expected", "source"), REAL_LINES)
def test_real_lines_are_recognised(line: str, expected: str, source: str) -> None:
    assert source
    lines = line.split("\n")
    assert ids(lines)[-1] == expected


def test_healthy_training_lines_never_match() -> None:
    assert ids(HEALTHY * 100) == []


# A real torch 2.13 traceback (tests/workloads/ddp_job.py --fault app-bug --bug key, gloo):
# PyTorch prefixes every line with "[rankN]: "; the source lines it shows are indented.
TORCH_KEYERROR = [
    "[rank1]: Traceback (most recent call last):",
    '[rank1]:   File "/work/main/tests/workloads/ddp_job.py", line 220, in <module>',
    "[rank1]:     sys.exit(main())",
    "[rank1]:              ^^^^^^",
    '[rank1]:   File "/work/main/tests/workloads/ddp_job.py", line 183, in main',
    '[rank1]:     x, y = batch(rank, step, bug and args.bug == "key")',
    "[rank1]:            ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^",
    '[rank1]:   File "/work/main/tests/workloads/ddp_job.py", line 120, in batch',
    '[rank1]:     _ = samples[f"sample_{BATCH + step}"]  # the loader asks for a sample it does '
    "not have",
    "[rank1]:         ~~~~~~~^^^^^^^^^^^^^^^^^^^^^^^^^^",
    "[rank1]: KeyError: 'sample_19'",
]


def test_only_the_exception_line_of_a_traceback_is_a_python_exception() -> None:
    found = list(scan(TORCH_KEYERROR))
    assert [(m.signature_id, m.line_no, m.rank) for m in found] == [
        ("python.exception", len(TORCH_KEYERROR), 1)
    ]


@pytest.mark.parametrize(
    "source_line",
    [
        "[rank1]:     x = d[k]  # KeyError: the loader asks for a sample it does not have",
        "[rank1]:     except KeyError: pass",
        "    except KeyError: pass",
        "[rank0]:     raise ValueError: not python, but what a traceback could show",
        '[rank3]:    raise RuntimeError(f"bad batch: {e}")',  # older torch: "[rank3]:" no space
        '  File "train.py", line 9, in step: RuntimeError: in a file name',
        "0:     except OSError: retry()",  # srun --label
        "2024-05-08 08:47:31 INFO worker: ValueError: was caught and logged",
    ],
)
def test_source_lines_shown_in_a_traceback_are_not_exceptions(source_line: str) -> None:
    assert ids([source_line]) == []


@pytest.mark.parametrize(
    "line",
    [
        "[rank1]: KeyError: 'sample_19'",
        "[rank3]:ValueError: Expected input batch_size (16) to match target batch_size (8).",
        "ValueError: Network outputs is NAN! Stop Training",
        "AssertionError",
        "[rank0]: AssertionError",
        "[rank2]: torch.distributed.DistBackendError: something the catalogue does not know",
        "3: ValueError: from srun --label",
        " 12: ValueError: from srun --label, 13 or more tasks",
        "[default0]:[rank0]: ValueError: from torchrun --tee",
        "[default1]:ValueError: from torchrun --tee",
    ],
)
def test_exception_lines_with_the_launchers_prefixes_are_recognised(line: str) -> None:
    assert ids([line]) == ["python.exception"]


def test_a_chained_traceback_gives_each_exception_line_and_no_source_line() -> None:
    lines = [
        "[rank1]: Traceback (most recent call last):",
        '[rank1]:   File "/home/u/train.py", line 41, in load',
        "[rank1]:     return cache[key]",
        "[rank1]: KeyError: 'sample_20'",
        "[rank1]: ",
        "[rank1]: During handling of the above exception, another exception occurred:",
        "[rank1]: ",
        "[rank1]: Traceback (most recent call last):",
        '[rank1]:   File "/home/u/train.py", line 43, in load',
        "[rank1]:     except KeyError:",
        '[rank1]:     raise RuntimeError(f"no sample {key}") from None  # RuntimeError: x',
        "[rank1]: RuntimeError: no sample sample_20",
    ]
    found = [(m.line_no, m.signature_id) for m in scan(lines)]
    assert found == [(4, "python.exception"), (12, "python.exception")]


def test_srun_task_exits_are_knock_on_failures_and_a_killed_task_names_its_rank() -> None:
    # srun prints "Exited with exit code N" only for a non-zero code: the job step failed,
    # but not why (a knock-on symptom, never a blame). A killed task names its node and task.
    (exited,) = scan(["srun: error: n6: task 0: Exited with exit code 1"])
    assert exited.signature_id == "slurm.error"
    payload = evidence_payload(exited)
    assert payload["fault_class"] == "unknown" and payload["blame_node"] is False
    assert payload["knock_on"] is True
    (killed,) = scan(["srun: error: gpu-07.cluster: tasks 4-7: Killed"])
    assert (killed.signature_id, killed.host, killed.rank) == (
        "slurm.task_killed",
        "gpu-07.cluster",
        4,
    )
    payload = evidence_payload(killed)
    assert payload["fault_class"] == "unknown" and payload["blame_node"] is False
    assert payload["knock_on"] is False and payload["rank"] == 4
    assert ids(["srun: error: n7: task 1: Killed by a user"]) == ["slurm.task_killed"]
    # not a kill: a Slurm error line no table lists is only a failure word (generic.error_line)
    assert ids(["srun: error: n7: task 1: Killedx"]) == ["generic.error_line"]


def test_every_signature_is_documented_with_its_example() -> None:
    text = DOCS.read_text(encoding="utf-8")
    for signature in default_catalogue():
        assert f"`{signature.id}`" in text, signature.id
        assert signature.example in text, f"{signature.id}: example missing from the docs"


def test_catalogue_errors_name_entry_key_and_fix() -> None:
    bad = """
[[signature]]
id = "x.nested"
description = "bad"
keywords = ["foo"]
pattern = '(a+)+b'
class = "hardware"
category = "gpu"
action = "requeue"
example = "foo aab"

[[signature]]
id = "x.blame"
description = "bad"
keywords = ["bar"]
pattern = 'bar'
class = "application"
category = "gpu"
action = "stop"
blame_node = true
example = "bar"

[[signature]]
id = "x.example"
description = "bad"
keywords = ["baz"]
pattern = 'baz \\d'
class = "unknown"
category = "gpu"
action = "requeue"
clas = "x"
example = "baz"
"""
    with pytest.raises(SignatureError) as caught:
        signatures_from_toml(bad, "test.toml")
    problems = caught.value.problems
    assert problems[0] == (
        "test.toml:6: signature[0].pattern = '(a+)+b': nested quantifiers ({1,}) can backtrack "
        "catastrophically; bound or flatten the inner repeat"
    )
    assert problems[1].startswith(
        "test.toml:31: signature[2].clas: unknown key (did you mean 'class'?) (keys"
    )
    assert problems[2] == (
        "test.toml:20: signature[1].blame_node: true with class application: only hardware or "
        "system lines blame a node"
    )
    assert len(problems) == 3


def _entry(ident: str, extra: str = "", pattern: str = "pattern = 'foo'\n") -> str:
    return (
        f'[[signature]]\nid = "{ident}"\ndescription = "d"\nkeywords = ["foo"]\n{pattern}'
        f'class = "hardware"\ncategory = "gpu"\naction = "requeue"\nexample = "foo"\n{extra}'
    )


def test_rules_across_keys_name_the_line_key_and_fix() -> None:
    text = (
        _entry("Bad-Id")
        + _entry("x.knock", "knock_on = true\ndecisive = true\n")
        + _entry("x.nopattern", pattern="")
        + _entry("x.xid", 'parser = "xid"\n')
        + _entry("x.xids", "knock_on_xids = [45]\n")
        + _entry("x.escalate", "escalate_after = 1\nknock_on = true\n")
        + _entry("x.twice")
        + _entry("x.twice")
    )
    with pytest.raises(SignatureError) as caught:
        signatures_from_toml(text, "s.toml")
    assert caught.value.problems == (
        "s.toml:2: signature[0].id = 'Bad-Id': write family.name in lower case (nccl.remote_error)",
        "s.toml:19: signature[1].knock_on: true: a knock-on symptom is neither decisive nor "
        "blames a node",
        "s.toml:21: signature[2].pattern: missing; a regex signature needs a pattern",
        "s.toml:33: signature[3].pattern: not used with parser = 'xid'; remove it",
        's.toml:48: signature[4].knock_on_xids: only for parser = "xid"',
        "s.toml:58: signature[5].escalate_after: only for a hardware or system warning "
        "(knock_on = true), and at least 2",
        "s.toml:70: signature[7].id: x.twice is listed twice; keep one",
    )


def test_example_that_another_entry_takes_is_rejected() -> None:
    text = """
[[signature]]
id = "a.generic"
description = "generic"
keywords = ["Error"]
pattern = 'Error'
class = "unknown"
category = "gpu"
action = "requeue"
example = "Error one"

[[signature]]
id = "a.specific"
description = "specific"
keywords = ["Error"]
pattern = 'Error two'
class = "unknown"
category = "gpu"
action = "requeue"
example = "Error two"
"""
    with pytest.raises(
        SignatureError,
        match=r"^order\.toml:20: signature\[1\]\.example: recognised as a\.generic, not as "
        r"a\.specific; fix the pattern or keywords",
    ):
        signatures_from_toml(text, "order.toml")


# ------------------------------------------------------------- no catastrophic backtracking


def test_nested_quantifier_check_catches_the_classic_shapes() -> None:
    assert nested_quantifiers(r"(a+)+b")
    assert nested_quantifiers(r"(?:\w+\s?)*x")
    assert nested_quantifiers(r"(x|y{2,})*")
    assert not nested_quantifiers(r"[\w.]{0,120}(?:Error|Exception): ")
    assert not nested_quantifiers(r"(?:ab){1,3}c")


def test_no_catalogue_pattern_has_nested_quantifiers() -> None:
    for signature in default_catalogue():
        if signature.regex is not None:
            assert nested_quantifiers(signature.pattern) == [], signature.id


def _worst_time(line: str, repeats: int = 3) -> float:
    """Best of ``repeats`` in CPU time (other work on a shared machine does not count)."""
    catalogue = default_catalogue()
    best = float("inf")
    for _ in range(repeats):
        start = time.process_time()
        for signature in catalogue:
            if signature.regex is not None:
                signature.regex.search(line)
        catalogue.match_line(line)
        best = min(best, time.process_time() - start)
    return best


@settings(max_examples=25, deadline=None)
@given(
    st.text(
        alphabet=st.sampled_from(list("aZ09 .:_-[]()<>/=*Error:ExceptionNCCL WARNloss nan\t")),
        min_size=20,
        max_size=200,
    )
)
def test_random_lines_scan_in_linear_time(unit: str) -> None:
    short = unit * 10
    long = unit * 100
    small, big = _worst_time(short), _worst_time(long)
    assert big < 20 * small + 0.005, (len(short), small, big)


# ---------------------------------------------------------------- the combined prefilter

# letters that anchors share, regex metacharacters and a non-ASCII letter
_KEYWORD_ALPHABET = "abor\u00e9.*+?()[]|\\^$ {}-="


def _catalogue_of(keywords: list[str]) -> SignatureCatalogue:
    signatures = tuple(
        Signature(f"t.k{i}", "test", (k,), None, "unknown", "gpu", "none", k)
        for i, k in enumerate(keywords)
    )
    return SignatureCatalogue(signatures, default_catalogue().xids)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.text(alphabet=_KEYWORD_ALPHABET, min_size=1, max_size=6),
        min_size=1,
        max_size=8,
        unique=True,
    ),
    st.lists(st.text(alphabet=_KEYWORD_ALPHABET + "\tx", max_size=30), max_size=12),
)
def test_prefilter_finds_exactly_the_lines_holding_a_keyword(
    keywords: list[str], lines: list[str]
) -> None:
    catalogue = _catalogue_of(keywords)
    block = "\n".join(lines).encode("utf-8")
    expected, offset = [], 0
    for line in lines:
        if any(k in line for k in keywords):
            expected.append(offset)
        offset += len(line.encode("utf-8")) + 1
    assert catalogue.candidates(block) == expected


def test_the_shipped_prefilter_makes_few_passes() -> None:
    catalogue = default_catalogue()
    assert len(catalogue.prefilters) * 3 <= len(catalogue.anchors)
    for regex in catalogue.prefilters:  # each begins with one literal byte: the fast search
        assert regex.pattern[:1] not in (b"(", b"[", b"\\")
        assert nested_quantifiers(regex.pattern.decode("latin-1")) == []


def _fragments() -> list[str]:
    anchors = default_catalogue().anchors
    parts = {a[:k] for a in anchors for k in range(1, len(a))}
    parts |= {a[k:] for a in anchors for k in range(1, len(a))}
    return [*sorted(parts), " ", "x"]


def _candidates_time(data: bytes, repeats: int = 3) -> float:
    catalogue = default_catalogue()
    best = float("inf")
    for _ in range(repeats):
        start = time.process_time()
        catalogue.candidates(data)
        best = min(best, time.process_time() - start)
    return best


@settings(max_examples=20, deadline=None)
@given(
    st.lists(st.sampled_from(_fragments()), min_size=5, max_size=40).map("".join),
    st.booleans(),
)
def test_prefilter_runs_in_linear_time_on_near_misses(unit: str, lines: bool) -> None:
    """Blocks made of pieces of keywords (near misses everywhere), as one long line or as
    many lines: ten times the text takes about ten times as long."""
    unit = unit + "\n" if lines else unit
    small, big = (unit * 100).encode(), (unit * 1000).encode()
    assert _candidates_time(big) < 20 * _candidates_time(small) + 0.005


def _one(item: str | bytes | bytearray) -> bytes:
    raw = item.encode("utf-8") if isinstance(item, str) else bytes(item)
    raw = raw[:-1] if raw.endswith(b"\n") else raw
    return raw.replace(b"\n", b" ")


_items = st.one_of(
    st.lists(st.text(alphabet="ab\n\r\u00e9", max_size=8), min_size=1, max_size=10),
    st.lists(st.text(alphabet="ab\u00e9", max_size=8), min_size=1, max_size=10),
    st.lists(st.binary(max_size=8).map(lambda b: b + b"\n"), min_size=1, max_size=10),
    st.lists(
        st.one_of(st.text(max_size=8), st.binary(max_size=8), st.binary(max_size=8).map(bytearray)),
        min_size=1,
        max_size=10,
    ),
)


@settings(max_examples=200, deadline=None)
@given(_items)
def test_lines_are_joined_one_line_per_item(items: list[str | bytes | bytearray]) -> None:
    assert _join_lines(items) == b"\n".join(_one(item) for item in items)


def test_a_line_rewritten_in_place_is_matched_part_by_part() -> None:
    bar = "Epoch 1:  10%|\u2588   | 10/100 [00:10<01:30]\r" * 40
    (found,) = scan([bar + "RuntimeError: CUDA error: an illegal memory access was encountered"])
    assert found.signature_id == "cuda.illegal_memory_access"
    assert found.text.startswith("RuntimeError: CUDA error")


# ---------------------------------------------------------------------- the scanner


@settings(max_examples=50, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.sampled_from([line for line, _, _ in REAL_LINES if "\n" not in line] + HEALTHY),
            st.text(max_size=60).map(lambda t: t.replace("\n", " ").replace("\r", " ")),
        ),
        max_size=40,
    )
)
def test_block_scan_equals_line_by_line_matching(lines: list[str]) -> None:
    catalogue = default_catalogue()
    fast = [(m.line_no, m.signature_id) for m in catalogue.scan(lines, year=2024)]
    slow = []
    for number, line in enumerate(lines, start=1):
        clean = line.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
        if catalogue.candidate(clean):
            found = catalogue.match_line(clean, number, year=2024)
            if found is not None:
                slow.append((number, found.signature_id))
    assert fast == slow


def test_scan_accepts_bytes_and_newlines_and_counts_lines(tmp_path: Path) -> None:
    lines = [b"hello\n", "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.\n", b"x"]
    found = list(scan(lines))
    assert [(m.line_no, m.xid) for m in found] == [(2, 79)]
    path = tmp_path / "big.log"
    body = ("ok line\n" * 5000) + "RuntimeError: CUDA error: unspecified launch failure\n"
    path.write_text(body * 3)
    numbers = [m.line_no for m in default_catalogue().scan_file(path)]
    assert numbers == [5001, 10002, 15003]


def test_hosts_ranks_gpus_and_times_are_read_from_prefixes() -> None:
    (xid,) = scan(
        [
            "Nov 29 13:45:01 gpu12 kernel: NVRM: Xid (PCI:0000:3b:00): 48, pid=1, name=python, "
            "DBE (double bit error) ECC error"
        ],
        year=2024,
    )
    assert xid.host == "gpu12" and xid.xid == 48
    assert xid.timestamp == pytest.approx(1732887901.0)
    (watchdog,) = scan([REAL_LINES[0][0]], year=2025)
    assert watchdog.rank == 4
    assert time.gmtime(watchdog.timestamp)[:6] == (2025, 3, 21, 2, 7, 8)
    (ib,) = scan([REAL_LINES[8][0]])
    assert (ib.host, ib.gpu) == ("kp-ddp-worker-0", 4)
    (dmesg,) = scan(
        [
            "[Fri Aug 30 11:43:09 2024] NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', "
            "name=<unknown>, Graphics SM Warp Exception"
        ]
    )
    assert time.gmtime(dmesg.timestamp)[:6] == (2024, 8, 30, 11, 43, 9)


def test_journald_json_and_export_are_read(tmp_path: Path) -> None:
    record = {
        "__REALTIME_TIMESTAMP": "1732887901000000",
        "_HOSTNAME": "gpu07.cluster.example",
        "MESSAGE": "NVRM: Xid (PCI:0000:3b:00): 79, pid=9, name=python, "
        "GPU has fallen off the bus.",
    }
    (found,) = scan([json.dumps(record)])
    assert found.host == "gpu07.cluster.example" and found.timestamp == 1732887901.0
    export = tmp_path / "journal.export"
    export.write_text(
        "__CURSOR=s=1\n__REALTIME_TIMESTAMP=1732887901000000\n_HOSTNAME=gpu07\n"
        "SYSLOG_IDENTIFIER=kernel\nMESSAGE=NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the "
        "bus.\n\n__CURSOR=s=2\n__REALTIME_TIMESTAMP=1732887902000000\n_HOSTNAME=gpu07\n"
        "MESSAGE=hello\n"
    )
    assert [n for n, _ in read_log(export)] == [5, 10]
    (found,) = default_catalogue().scan_file(export)
    assert (found.line_no, found.host, found.xid) == (5, "gpu07", 79)


# ---------------------------------------------------------------------- classification


def m(signature_id: str, line_no: int, **kwargs: object) -> Match:
    return Match(signature_id=signature_id, line_no=line_no, text=signature_id, **kwargs)  # type: ignore[arg-type]


def test_application_bug_blames_no_node_and_stops() -> None:
    # rank 3 fails in user code; the other ranks time out waiting for it.
    lines = [
        "[rank0]:[E321 02:17:08.408271257 ProcessGroupNCCL.cpp:607] [Rank 0] Watchdog caught "
        "collective operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE) ran for 600013 ms",
        "[rank3]: ValueError: Expected input batch_size (16) to match target batch_size (8).",
        "gpu02:1:2 [1] NCCL WARN NET/IB : Got completion from peer 10.0.0.4<1> with status=5 "
        "opcode=0 len=0 vendor err 249 (Recv)",
        REAL_LINES[2][0],
    ]
    verdict = classify(
        scan(lines, year=2024),
        nodes=["gpu01", "gpu02"],
        rank_to_node={0: "gpu01", 3: "gpu02"},
    )
    assert verdict.fault_domain == "application"
    assert verdict.blame_nodes == []
    assert verdict.action == "stop"
    assert verdict.signatures[0]["id"] == "python.exception"


def test_a_killed_rank_is_the_root_of_the_gloo_timeouts_and_blames_no_node() -> None:
    """Rank 1 was killed; ranks 0 and 2 time out in gloo (what torch 2.13 prints, the
    traceback's last line), then srun reports the kill and the others' exit. The killed task
    is the first failure; the timeouts are knock-on symptoms; no node is blamed: a kill alone
    does not say whose fault it was."""
    lines = [
        "[rank0]: RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/"
        "unbound_buffer.cc:78] Timed out waiting 8000ms for recv operation to complete",
        "[rank2]: RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/"
        "unbound_buffer.cc:129] Timed out waiting 8000ms for send operation to complete",
        "srun: error: n7: task 1: Killed",
        "srun: error: n6: task 0: Exited with exit code 1",
        "srun: error: n8: task 2: Exited with exit code 1",
    ]
    found = list(scan(lines))
    assert [m.signature_id for m in found] == [
        "gloo.timeout",
        "gloo.timeout",
        "slurm.task_killed",
        "slurm.error",
        "slurm.error",
    ]
    verdict = classify(found, nodes=["n6", "n7", "n8"], rank_to_node={0: "n6", 1: "n7", 2: "n8"})
    assert (verdict.fault_domain, verdict.blame_nodes, verdict.action) == ("unknown", [], "requeue")
    assert verdict.signatures[0] == {"id": "slurm.task_killed", "line_no": 3, "text": lines[2]}
    assert verdict.category == "launcher"
    # with the rank's own exception, the application error is the root, as before
    bug = "[rank1]: KeyError: 'sample_20'"
    assert classify(scan([bug, *lines])).fault_domain == "application"
    for payload in map(evidence_payload, found):
        assert payload["fault_class"] != "application" and payload["blame_node"] is False


def test_first_failure_in_time_across_ranks_is_the_root() -> None:
    lines = [  # rank 0's error is printed first but happened later
        "[rank0]:[E321 02:07:09.000000000 x.cpp:1] RuntimeError: CUDA error: an illegal memory "
        "access was encountered",
        "[rank5]:[E321 02:07:01.000000000 x.cpp:1] CUDA error: uncorrectable ECC error encountered",
    ]
    verdict = classify(scan(lines, year=2024), rank_to_node={0: "gpu01", 5: "gpu03"})
    assert verdict.fault_domain == "hardware"
    assert verdict.blame_nodes == ["gpu03"]
    assert verdict.action == "requeue_exclude"


def test_decisive_hardware_beats_an_earlier_application_error() -> None:
    matches = [
        m("python.exception", 1, timestamp=100.0, rank=0),
        m("kernel.xid", 7, timestamp=105.0, host="gpu12.cluster", xid=79),
    ]
    verdict = classify(matches, nodes=["gpu11", "gpu12"])
    assert (verdict.fault_domain, verdict.blame_nodes, verdict.action) == (
        "hardware",
        ["gpu12"],
        "requeue_exclude",
    )


def test_knock_on_symptoms_never_blame() -> None:
    matches = [
        m("torch.nccl_watchdog_timeout", 1, rank=0),
        m("gloo.connection_closed", 2, rank=1),
        m("torch.tcpstore_broken", 3, rank=2, host="gpu03"),
        m("nccl.peer_closed", 4, host="gpu04"),
    ]
    verdict = classify(
        matches,
        nodes=["gpu01", "gpu02", "gpu03", "gpu04"],
        rank_to_node={0: "gpu01", 1: "gpu02", 2: "gpu03"},
    )
    assert verdict.blame_nodes == []
    assert verdict.fault_domain == "unknown"
    assert verdict.action == "requeue"
    for match in matches:
        assert evidence_payload(match)["blame_node"] is False


def test_nccl_host_names_map_to_job_nodes_only() -> None:
    line = REAL_LINES[8][0]  # reported by kp-ddp-worker-0
    verdict = classify(scan([line]), nodes=["kp-ddp-worker-0", "kp-ddp-worker-1"])
    assert verdict.blame_nodes == ["kp-ddp-worker-0"]
    assert verdict.action == "requeue_exclude"
    outsider = classify(scan([line]), nodes=["gpu01", "gpu02"])
    assert outsider.blame_nodes == [] and outsider.action == "requeue"
    assert outsider.fault_domain == "hardware"


def test_weak_evidence_blaming_every_node_blames_none() -> None:
    matches = [
        m("nccl.ib_completion_error", 1, host="gpu01"),
        m("nccl.ib_completion_error", 2, host="gpu02"),
    ]
    verdict = classify(matches, nodes=["gpu01", "gpu02"])
    assert verdict.blame_nodes == [] and verdict.action == "requeue"


def test_application_xid_and_knock_on_xid_never_blame() -> None:
    verdict = classify([m("kernel.xid", 1, host="gpu01", xid=69)], nodes=["gpu01"])
    assert (verdict.fault_domain, verdict.blame_nodes, verdict.action) == (
        "application",
        [],
        "stop",
    )
    # 31, a GPU memory page fault, is the program's, the driver's or the GPU's: restarted once
    # (i28k, docs/signatures.md "When the answer is stop"), never blamed on its own
    fault = classify([m("kernel.xid", 1, host="gpu01", xid=31)], nodes=["gpu01"])
    assert (fault.fault_domain, fault.blame_nodes, fault.action) == ("unknown", [], "requeue")
    # 45 tears channels down after another XID: a knock-on that never blames
    after = classify(
        [m("kernel.xid", 1, host="gpu01", xid=79), m("kernel.xid", 2, host="gpu01", xid=45)],
        nodes=["gpu01", "gpu02"],
    )
    assert after.blame_nodes == ["gpu01"] and after.cause.startswith("xid 79")
    assert [s["id"] for s in after.signatures] == ["kernel.xid", "kernel.xid"]
    # ... and after the job's own crash it is the crash's consequence
    crash = classify(
        [m("python.exception", 1, rank=0), m("kernel.xid", 2, host="gpu01", xid=45)],
        nodes=["gpu01", "gpu02"],
    )
    assert (crash.fault_domain, crash.blame_nodes, crash.action) == ("application", [], "stop")


def test_nothing_recognised() -> None:
    verdict = classify(scan(HEALTHY))
    assert verdict.to_json() == {
        "category": "none",
        "fault_domain": "unknown",
        "blame_nodes": [],
        "action": "none",
        "signatures": [],
    }


def test_evidence_payload_matches_the_decision_core() -> None:
    payload = evidence_payload(m("cuda.ecc_uncorrectable", 3, rank=2))
    assert payload["signature"] == "cuda.ecc_uncorrectable"
    assert payload["fault_class"] == "hardware" and payload["blame_node"] is True
    assert payload["rank"] == 2


# ---------------------------------------------------------------------- srecovery explain-log


def write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_explain_log_json_mix_of_job_output_and_syslog(tmp_path: Path) -> None:
    job = write(
        tmp_path / "slurm-4242.out",
        [
            "iteration 10 | lm loss: 2.5",
            "[rank0]:[E1129 13:55:01.000000000 ProcessGroupNCCL.cpp:607] [Rank 0] Watchdog caught "
            "collective operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE) ran for 600013 ms",
            "slurmstepd: error: *** JOB 4242 ON gpu11 CANCELLED AT 2024-11-29T13:56:00 DUE TO "
            "NODE FAILURE ***",
        ],
    )
    syslog = write(
        tmp_path / "messages",
        [
            "Nov 29 13:40:00 gpu12 systemd[1]: Started Session 5 of user root.",
            "Nov 29 13:45:01 gpu12 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, "
            "GPU has fallen off the bus.",
        ],
    )
    result = CliRunner().invoke(
        explain_log, [str(job), str(syslog), "--nodes", "gpu[11-12]", "--json"]
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert list(data) == ["category", "fault_domain", "blame_nodes", "action", "signatures"]
    assert data["fault_domain"] == "hardware"
    assert data["blame_nodes"] == ["gpu12"]
    assert data["action"] == "requeue_exclude"
    assert data["signatures"][0] == {
        "id": "kernel.xid",
        "line_no": 2,
        "text": "Nov 29 13:45:01 gpu12 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, "
        "name=python, GPU has fallen off the bus.",
    }
    assert {s["id"] for s in data["signatures"]} >= {
        "slurm.node_failure",
        "torch.nccl_watchdog_timeout",
    }


def test_explain_log_human_output_shows_decisive_lines(tmp_path: Path) -> None:
    dmesg = write(
        tmp_path / "dmesg.txt",
        [
            "[   12.000001] mlx5_core 0000:3b:00.0: firmware version 28.39.1002",
            "[  650.315783] NVRM: Xid (PCI:0000:01:00): 48, pid=77, name=python, DBE (double bit "
            "error) ECC error",
        ],
    )
    result = CliRunner().invoke(explain_log, [str(dmesg)])
    assert result.exit_code == 0, result.output
    assert "fault domain: hardware" in result.output
    assert "line 2 [kernel.xid]" in result.output


def test_explain_log_exit_codes(tmp_path: Path) -> None:
    runner = CliRunner()
    missing = runner.invoke(explain_log, [str(tmp_path / "nope.log")])
    assert missing.exit_code == 1
    assert "cannot read it" in missing.output
    assert runner.invoke(explain_log, []).exit_code == 2
    log = write(tmp_path / "a.log", ["hello"])
    assert runner.invoke(explain_log, [str(log), "--nodes", "n[1-"]).exit_code == 2
    assert runner.invoke(explain_log, [str(log)]).exit_code == 0


def test_shipped_fixture_files_classify_as_their_names_say() -> None:
    expected = {
        "app_bug_rank3.log": ("application", [], "stop"),
        "xid79_syslog.log": ("hardware", ["gpu12"], "requeue_exclude"),
        "ib_link_down_mixed.log": ("hardware", ["gpu07"], "requeue_exclude"),
        "preempted.log": ("unknown", [], "none"),
    }
    nodes = ["gpu06", "gpu07", "gpu12"]
    for name, (domain, blame, action) in expected.items():
        verdict = classify(default_catalogue().scan_file(DATA / name), nodes=nodes)
        assert (verdict.fault_domain, verdict.blame_nodes, verdict.action) == (
            domain,
            blame,
            action,
        ), name


def test_identifiers_are_stable_words() -> None:
    for signature in default_catalogue():
        assert re.fullmatch(r"[a-z][a-z0-9_]*\.[a-z0-9_]+", signature.id)


def test_blame_sole_node_is_only_for_a_node_line_that_does_not_blame_its_own() -> None:
    text = _entry("x.both", "blame_node = true\nblame_sole_node = true\n") + _entry(
        "x.app", "blame_sole_node = true\n"
    ).replace('class = "hardware"', 'class = "application"').replace('"requeue"', '"stop"')
    with pytest.raises(SignatureError) as caught:
        signatures_from_toml(text, "s.toml")
    assert [p.split(": ", 1)[1] for p in caught.value.problems] == [
        "signature[0].blame_sole_node: only for a hardware or system line that does not blame "
        "its own node",
        "signature[1].blame_sole_node: only for a hardware or system line that does not blame "
        "its own node",
    ]
