"""The C runtime's own fatal reports (``runtime.c_fatal``, emitters/c_runtime.toml), read from
the emitters themselves: small C and C++ programs built and run here make glibc 2.36 and
libstdc++ print them, and the catalogue must read each as its member says. Before, a corrupted
heap, a stack smash and an uncaught C++ exception read as nothing (a job left dead)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from slurm_recovery.signals.logs import classify, default_catalogue

CATALOGUE = default_catalogue()

PROGRAMS = {
    "double_free.c": "#include <stdlib.h>\n"
    "int main(void) { char *p = malloc(32); free(p); free(p); return 0; }\n",
    "stack_smash.c": "#include <string.h>\n"
    "int main(int c, char **v) { char b[8]; strcpy(b, v[1]); return b[0]; }\n",
    "assert.c": "#include <assert.h>\nint main(int c, char **v) { assert(c > 5); return 0; }\n",
    "throw.cc": "#include <new>\n#include <stdexcept>\n#include <cstring>\n"
    "int main(int c, char **v) {\n"
    '  if (!strcmp(v[1], "oom")) throw std::bad_alloc();\n'
    '  throw std::runtime_error("the reader found no shard 7");\n}\n',
}


def run(tmp_path: Path, source: str, *args: str) -> str:
    """Build ``source`` with gcc or g++ (stack protector on) and run it; its stderr."""
    compiler = "g++" if source.endswith(".cc") else "gcc"
    if shutil.which(compiler) is None:  # scripts/bootstrap installs both
        pytest.fail(f"{compiler} is not installed: run scripts/bootstrap")
    path = tmp_path / source
    path.write_text(PROGRAMS[source])
    binary = tmp_path / path.stem
    subprocess.run(
        [compiler, "-O0", "-fstack-protector-all", "-o", str(binary), str(path)], check=True
    )
    ran = subprocess.run([str(binary), *args], capture_output=True, text=True, timeout=30)
    assert ran.returncode != 0
    return ran.stderr


def read(text: str):
    return classify(CATALOGUE.scan(["step 10", *text.splitlines()]))


@pytest.mark.parametrize(
    ("source", "args", "action", "said"),
    [
        ("double_free.c", (), "requeue", "free(): double free detected in tcache 2"),
        ("stack_smash.c", ("x" * 64,), "stop", "*** stack smashing detected ***: terminated"),
        ("assert.c", (), "requeue", "Assertion `c > 5' failed."),
        ("throw.cc", ("oom",), "stop", "terminate called after throwing an instance of 'std::bad"),
        ("throw.cc", ("other",), "requeue", "  what():  the reader found no shard 7"),
    ],
)
def test_what_glibc_and_libstdcxx_print_is_read_as_the_table_says(
    tmp_path: Path, source: str, args: tuple[str, ...], action: str, said: str
) -> None:
    stderr = run(tmp_path, source, *args)
    assert said in stderr, stderr  # the emitter's own words, as the table has them
    verdict = read(stderr)
    assert verdict.action == action, (stderr, verdict)
    assert verdict.signatures[0]["id"] == "runtime.c_fatal"
    assert not verdict.blame_nodes  # no line of the C runtime says which node


@pytest.mark.parametrize(
    "line,action",
    [
        # glibc before 2.26 (CentOS 7's 2.17): the message inside its own frame
        (
            "*** Error in `python': double free or corruption (fasttop): 0x0000000001c2d010 ***",
            "requeue",
        ),
        (
            "*** Error in `./train': munmap_chunk(): invalid pointer: 0x00007f3a2c000b20 ***",
            "requeue",
        ),
        ("*** buffer overflow detected ***: ./train terminated", "stop"),  # before 2.33
        ("3: malloc(): corrupted top size", "requeue"),  # srun --label
    ],
)
def test_older_glibc_forms_and_a_labelled_rank_are_read(line: str, action: str) -> None:
    verdict = read(line)
    assert verdict.action == action and verdict.signatures[0]["id"] == "runtime.c_fatal"


@pytest.mark.parametrize(
    "line",
    [
        "forward(): took 3 ms",
        "corrupted record skipped",
        "double free of a coupon is not allowed",
        "*** Training complete ***: saved",
        "the checker found Assertion `x' failed earlier",  # not assert()'s form
    ],
)
def test_lines_that_only_look_like_a_report_are_not_read_as_one(line: str) -> None:
    assert all(s["id"] != "runtime.c_fatal" for s in read(line).signatures)
