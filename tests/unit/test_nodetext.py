"""``scontrol -o show nodes`` lines: what the text says with certainty, and nothing else.

The lines are Slurm's own (22.05.8 and 24.11.5, ``SLURM_TIME_FORMAT=%s``); the properties
build lines the way Slurm prints them (``src/api/node_info.c``) around any free text. The
listing against the JSON on the real cluster is in tests/integration/test_scheduler_contract.py.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from slurm_recovery.scheduler.base import Node
from slurm_recovery.scheduler.nodetext import NodeLines, node_from_line

LINE_2205 = (
    "NodeName=n1 Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUEfctv=2 CPUTot=2 CPULoad=3.35 "
    "AvailableFeatures=(null) ActiveFeatures=(null) Gres=gpu:8 NodeAddr=127.0.0.1 "
    "NodeHostName=vm Port=19001 Version=22.05.8 OS=Linux 6.18.44-fc-v669 #1 SMP "
    "PREEMPT_DYNAMIC @0  RealMemory=1000 AllocMem=0 FreeMem=21881 Sockets=2 Boards=1 "
    "State=IDLE+DRAIN ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A "
    "Partitions=debug  BootTime=1796130238 SlurmdStartTime=1796186155 "
    "LastBusyTime=1796186155 CfgTRES=cpu=2,mem=1000M,billing=2 AllocTRES= CapWatts=n/a "
    "CurrentWatts=0 AveWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s "
    "Reason=gpu bad, ticket 17 [slurm@1796186156]"
)
LINE_2411 = (
    "NodeName=n3 CoresPerSocket=1  CPUAlloc=0 CPUEfctv=2 CPUTot=2 CPULoad=0.00 "
    "AvailableFeatures=(null) ActiveFeatures=(null) Gres=(null) NodeAddr=10.1.0.3 "
    "NodeHostName=gpu003 Port=20499  RealMemory=1000 AllocMem=0 FreeMem=N/A Sockets=2 "
    "Boards=1 State=UNKNOWN+NOT_RESPONDING ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A "
    "MCS_label=N/A Partitions=big,debug  BootTime=None SlurmdStartTime=None "
    "LastBusyTime=Unknown ResumeAfterTime=None CfgTRES=cpu=2,mem=1000M,billing=2 AllocTRES= "
    "CurrentWatts=0 AveWatts=0"
)
HEAD = LINE_2411.replace(" Gres=(null) ", " Gres=gpu:a100:4 ").replace("NodeName=n3", "NodeName={}")


def test_real_lines_of_both_releases():
    assert node_from_line(LINE_2205) == Node(
        name="n1",
        state="IDLE",
        flags=frozenset({"DRAIN"}),
        reason="gpu bad, ticket 17",
        partitions=("debug",),
        address="127.0.0.1",
        hostname="vm",
        reason_set_by="slurm",
        reason_changed_at=1796186156,
        gpus=8,
        features=frozenset(),
    )
    assert node_from_line(LINE_2411) == Node(
        name="n3",
        state="UNKNOWN",
        flags=frozenset({"NOT_RESPONDING"}),
        partitions=("big", "debug"),
        address="10.1.0.3",
        hostname="gpu003",
        features=frozenset(),
    )


def test_active_features_are_read_and_a_line_without_them_does_not_say():
    line = LINE_2411.replace("ActiveFeatures=(null)", "ActiveFeatures=a100,ib")
    assert node_from_line(line).features == {"a100", "ib"}
    bare = LINE_2411.replace(" ActiveFeatures=(null)", "")
    assert node_from_line(bare).features is None


def test_free_text_that_could_end_in_two_places_is_not_read():
    base = LINE_2205.rsplit(" Reason=", 1)[0]
    for tail in (
        " Reason=gpu bad [root@1796186156] Comment=rack 4",  # a comment after the reason
        " Reason=bad Comment=x [root@1796186156]",  # a reason that looks like a comment
        " Reason=first line [root@1796186156]        second line",  # a multi-line reason
        " Reason=no time mark",
    ):
        assert node_from_line(base + tail) is None, tail
    # a comment, no reason: the fixed fields are before it, whatever it says
    node = node_from_line(base + " Comment=State=DOWN Partitions=evil Reason=x [a@1]")
    assert node is not None and (node.state, node.partitions, node.reason) == (
        "IDLE",
        ("debug",),
        "",
    )
    assert node_from_line("not a node line") is None


free_text = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\n\r"), max_size=40
)


@given(
    reason=free_text,
    user=st.from_regex(r"[a-z_][a-z0-9_-]{0,8}", fullmatch=True),
    at=st.integers(1, 2**31),
    comment=st.none() | free_text,
    extra=st.none() | free_text,
)
def test_a_reason_read_from_text_is_exactly_the_reason(reason, user, at, comment, extra):
    """Slurm prints the reason, then any comment and extra text, unquoted: the parser gives
    back exactly the reason Slurm holds, or nothing (the JSON is read instead)."""
    line = HEAD.format("gpu7")
    if reason:
        line += f" Reason={reason} [{user}@{at}]"
    if comment is not None:
        line += f" Comment={comment}"
    if extra is not None:
        line += f" Extra={extra}"
    node = node_from_line(line)
    if node is None:
        assert comment is not None or extra is not None or "=" in reason  # else: read it
        return
    assert node.name == "gpu7" and node.gpus == 4 and node.partitions == ("big", "debug")
    assert node.reason == reason
    if reason:
        assert (node.reason_set_by, node.reason_changed_at) == (user, at)


def test_a_line_read_before_is_not_parsed_again_and_unclear_ones_come_from_json():
    lines = NodeLines()
    ambiguous = LINE_2205.replace("NodeName=n1", "NodeName=n9") + " Comment=rack 4"
    asked: list[set[str]] = []
    from_json_node = Node(name="n9", state="IDLE", reason="from json")

    def from_json(names):
        asked.append(set(names))
        return {"n9": from_json_node}

    text = "\n".join([LINE_2205, LINE_2411, ambiguous, ""])
    first = lines.read(text, from_json)
    assert [n.name for n in first] == ["n1", "n3", "n9"] and first[2] is from_json_node
    assert lines.parsed == 3 and asked == [{"n9"}]
    second = lines.read(text, from_json)
    assert second == first and lines.parsed == 0 and asked == [{"n9"}]
    changed = text.replace("State=IDLE+DRAIN", "State=DOWN+DRAIN", 1)
    third = lines.read(changed, from_json)
    assert lines.parsed == 1 and third[0].state == "DOWN" and third[1:] == first[1:]
    # a node gone from Slurm is gone from the listing; one the JSON no longer has, too
    assert lines.read(LINE_2411, lambda names: {}) == [first[1]]
    assert lines.read(ambiguous, lambda names: {}) == []


def test_an_unchanged_listing_gives_the_same_nodes_without_asking_again():
    lines = NodeLines()
    text = "\n".join([LINE_2205, LINE_2411, ""])
    first = lines.read(text, lambda names: {})
    again = lines.read("".join(list(text)), lambda names: {})  # equal text, another object
    assert again == first and all(a is b for a, b in zip(again, first, strict=True))
    assert lines.parsed == 0
    again.pop()  # each read returns its own list
    assert lines.read(text, lambda names: {}) == first


def test_a_listing_with_a_node_the_json_lacked_is_read_again():
    lines = NodeLines()
    ambiguous = LINE_2205.replace("NodeName=n1", "NodeName=n9") + " Comment=rack 4"
    asked: list[set[str]] = []

    def from_json(names):
        asked.append(set(names))
        return {}

    text = "\n".join([LINE_2411, ambiguous])
    assert [n.name for n in lines.read(text, from_json)] == ["n3"]
    assert [n.name for n in lines.read(text, from_json)] == ["n3"]
    assert asked == [{"n9"}, {"n9"}]  # not kept as a whole: n9 is looked for every time
