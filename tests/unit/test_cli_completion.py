"""``srecovery completion bash|zsh|fish``: the scripts, and completion through click's protocol
as bash runs it (the installed ``srecovery`` entry point, as a shell finds it on PATH)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_recovery.cli import cli

BIN = Path(sys.executable).parent
SRECOVERY = BIN / "srecovery"

pytestmark = pytest.mark.skipif(not SRECOVERY.exists(), reason="srecovery is not installed")


def env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PATH": f"{BIN}:{os.environ.get('PATH', '')}", **extra}


def complete(words: str, cword: int) -> list[str]:
    """What click answers bash for ``COMP_WORDS=words`` (the protocol the script speaks)."""
    out = subprocess.run(
        [str(SRECOVERY)],
        env=env(COMP_WORDS=words, COMP_CWORD=str(cword), _SRECOVERY_COMPLETE="bash_complete"),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return out.stdout.splitlines()


def test_the_protocol_completes_commands_and_options():
    assert complete("srecovery ex", 1) == ["plain,explain", "plain,explain-log"]
    assert complete("srecovery console --", 2) == [
        "plain,--interval",
        "plain,--once",
        "plain,--help",
    ]
    assert "plain,zsh" in complete("srecovery completion ", 2)


def test_sourcing_the_bash_script_completes_ex_to_explain_and_explain_log():
    if not shutil.which("bash"):
        pytest.skip("no bash")
    script = subprocess.run(
        [str(SRECOVERY), "completion", "bash"], capture_output=True, text=True, check=True
    ).stdout
    assert "complete -o nosort -F _srecovery_completion srecovery" in script
    # what bash does on `srecovery ex<TAB>`: set COMP_WORDS/COMP_CWORD, call the function
    probe = (
        'eval "$(srecovery completion bash)"\n'
        "complete -p srecovery\n"
        "COMP_WORDS=(srecovery ex); COMP_CWORD=1\n"
        "_srecovery_completion srecovery ex srecovery\n"
        'printf "reply:%s\\n" "${COMPREPLY[@]}"\n'
    )
    out = subprocess.run(
        ["bash", "--norc", "--noprofile", "-c", probe],
        env=env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "-F _srecovery_completion srecovery" in out.stdout
    replies = [line.removeprefix("reply:") for line in out.stdout.splitlines() if "reply:" in line]
    assert replies == ["explain", "explain-log"]


@pytest.mark.parametrize(
    "shell,marker",
    [("zsh", "#compdef srecovery"), ("fish", "complete --no-files --command srecovery")],
)
def test_zsh_and_fish_scripts(shell, marker):
    result = CliRunner().invoke(cli, ["completion", shell], obj={})
    assert result.exit_code == 0 and marker in result.output
    assert "_SRECOVERY_COMPLETE" in result.output


def test_an_unknown_shell_is_bad_usage():
    result = CliRunner().invoke(cli, ["completion", "tcsh"], obj={})
    assert result.exit_code == 2 and "bash" in result.output


def test_the_help_shows_the_3am_examples_and_fits_80_columns():
    result = CliRunner().invoke(cli, ["--help"], obj={}, terminal_width=80)
    assert result.exit_code == 0
    for example in (
        "srecovery status",
        "srecovery incidents --since 12h",
        "srecovery explain 4242",
        "srecovery nodes n17",
        "srecovery console",
    ):
        assert f"  {example}  " in result.output
    assert max(len(line) for line in result.output.splitlines()) <= 80


def test_every_command_help_starts_with_one_sentence():
    def walk(group, path):
        for name, command in group.commands.items():
            yield [*path, name], command
            if hasattr(command, "commands"):
                yield from walk(command, [*path, name])

    for path, command in walk(cli, []):
        first = (command.help or "").strip().split("\n\n")[0]
        assert first, f"srecovery {' '.join(path)} has no help"
        assert first.rstrip().endswith((".", ")")), f"srecovery {' '.join(path)}: {first!r}"
