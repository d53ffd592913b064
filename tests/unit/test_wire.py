"""The evidence wire format: what senders build parses back exactly; anything else is a
WireError naming the field, never another exception."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slurm_recovery.contract.wire import (
    MAX_DEPTH,
    MAX_EVENTS,
    MAX_PAYLOAD_BYTES,
    WireError,
    event_to_json,
    parse_batch,
    parse_event,
)
from slurm_recovery.store import Evidence

NOW = 1_795_960_000.25
json_scalars = st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=20)
payloads = st.dictionaries(
    st.text(max_size=10),
    st.recursive(
        json_scalars,
        lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=5), c, max_size=3),
        max_leaves=10,
    ),
    max_size=5,
)


@given(
    kind=st.from_regex(r"[a-z][a-z0-9_]{0,20}", fullmatch=True),
    node=st.none() | st.from_regex(r"[a-z][a-z0-9-]{0,10}", fullmatch=True),
    gpu=st.none() | st.integers(0, 1023),
    job_id=st.none() | st.integers(1, 2**40),
    payload=payloads,
)
def test_round_trip(kind, node, gpu, job_id, payload):
    event = event_to_json(kind, NOW, node=node, gpu=gpu, job_id=job_id, payload=payload)
    parsed = parse_event(json.loads(json.dumps(event)), "e")
    assert (parsed.kind, parsed.node, parsed.gpu, parsed.job_id) == (kind, node, gpu, job_id)
    assert parsed.observed_at == NOW
    assert parsed.payload == json.loads(json.dumps(payload))
    stored = Evidence.from_wire(parsed, "sidecar")  # what the controller stores
    assert (stored.source, stored.kind, stored.node, stored.payload) == (
        "sidecar",
        kind,
        node,
        parsed.payload,
    )
    # taken as parsed, not checked and encoded again: the same evidence, spelled as the store
    # spells it (non-ASCII text included)
    built = Evidence("sidecar", kind, NOW, node=node, gpu=gpu, payload=payload, job_id=job_id)
    assert stored == built and stored.payload_json == built.payload_json


def nesting(value: object) -> int:
    """How deep objects and lists nest (a bare payload is 1), by the definition."""
    if isinstance(value, dict):
        return 1 + max(map(nesting, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(nesting, value), default=0)
    return 0


deep_payloads = st.dictionaries(
    st.text(max_size=2),
    st.recursive(
        json_scalars,
        lambda c: st.lists(c, max_size=2) | st.dictionaries(st.text(max_size=2), c, max_size=2),
        max_leaves=14,
    ),
    max_size=3,
)


@pytest.mark.parametrize("levels", [MAX_DEPTH - 1, MAX_DEPTH, MAX_DEPTH + 1])
@pytest.mark.parametrize("container", [dict, list])
def test_the_nesting_limit_is_exact(levels, container):
    payload: dict = {"readings": 1}
    cursor: Any = payload
    for _ in range(levels - 1):
        inner: Any = container()
        if isinstance(cursor, dict):
            cursor["x"] = inner
        else:
            cursor.append(inner)
        cursor = inner
    assert nesting(payload) == levels
    event = {"kind": "x", "observed_at": NOW, "payload": payload}
    if levels > MAX_DEPTH:
        with pytest.raises(WireError, match="nested deeper"):
            parse_event(event, "e")
    else:
        parse_event(event, "e")


@given(deep_payloads)
def test_a_payload_nested_past_the_limit_and_only_that_is_refused(payload):
    event = {"kind": "x", "observed_at": NOW, "payload": payload}
    if nesting(payload) > MAX_DEPTH:
        with pytest.raises(WireError, match="nested deeper"):
            parse_event(event, "e")
    else:
        assert parse_event(event, "e").payload == payload


@given(st.binary(max_size=300))
def test_any_bytes_are_a_batch_or_a_wire_error(body):
    try:
        events = parse_batch(body)
    except WireError:
        return
    assert events and all(isinstance(Evidence.from_wire(e, "operator"), Evidence) for e in events)


@given(
    st.recursive(
        json_scalars,
        lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
        max_leaves=30,
    )
)
def test_any_json_is_a_batch_or_a_wire_error(doc):
    try:
        (event,) = parse_batch(json.dumps({"events": [doc]}).encode())
    except WireError:
        return
    assert Evidence.from_wire(event, "operator").source == "operator"


@pytest.mark.parametrize(
    ("event", "field"),
    [
        ({"kind": "XID", "observed_at": NOW}, "kind"),
        ({"kind": "xid", "observed_at": NOW * 1000}, "observed_at"),  # milliseconds
        ({"kind": "xid", "observed_at": "yesterday"}, "observed_at"),
        ({"kind": "xid", "observed_at": NOW, "node": "n1; rm -rf /"}, "node"),
        ({"kind": "xid", "observed_at": NOW, "gpu": -1}, "gpu"),
        ({"kind": "xid", "observed_at": NOW, "gpu": True}, "gpu"),
        ({"kind": "xid", "observed_at": NOW, "job_id": 0}, "job_id"),
        ({"kind": "xid", "observed_at": NOW, "source": "operator"}, "unknown field"),
        ({"kind": "xid", "observed_at": NOW, "payload": []}, "payload"),
    ],
)
def test_bad_events_name_the_field(event, field):
    with pytest.raises(WireError, match=field):
        parse_batch(
            json.dumps({"events": [{"kind": "ok", "observed_at": NOW}, event]}).encode(),
        )


def test_limits():
    deep: dict = {}
    cursor = deep
    for _ in range(MAX_DEPTH + 2):
        cursor["x"] = {}
        cursor = cursor["x"]
    with pytest.raises(WireError, match="nested deeper"):
        parse_event({"kind": "x", "observed_at": NOW, "payload": deep}, "e")
    with pytest.raises(WireError, match="larger than"):
        parse_event({"kind": "x", "observed_at": NOW, "payload": {"t": "a" * 20_000}}, "e")
    many = [{"kind": "x", "observed_at": NOW}] * (MAX_EVENTS + 1)
    with pytest.raises(WireError, match="1 to"):
        parse_batch(json.dumps({"events": many}).encode())
    with pytest.raises(WireError, match="not JSON"):
        parse_batch(b"\xff\x00")
    with pytest.raises(WireError, match=re.escape('{"events": [...]}')):
        parse_batch(b'{"events": [], "extra": 1}')


@pytest.mark.parametrize(
    ("payload", "words"),
    [
        ('{"m":"\\ud800"}', "lone surrogate"),
        ('{"m":NaN}', "NaN and Infinity"),
        ('{"m":[1,-Infinity]}', "NaN and Infinity"),
    ],
)
def test_a_payload_the_store_could_not_write_as_utf8_json_is_refused(payload, words):
    body = f'{{"events":[{{"kind":"xid","observed_at":1.7e9,"payload":{payload}}}]}}'
    with pytest.raises(WireError, match=words):
        parse_batch(body.encode())


def test_the_payload_limit_counts_utf8_bytes():
    text = "é" * (MAX_PAYLOAD_BYTES // 2)  # fits in characters, not in bytes
    body = json.dumps({"events": [{"kind": "xid", "observed_at": 1.7e9, "payload": {"m": text}}]})
    with pytest.raises(WireError, match="larger than"):
        parse_batch(body.encode())
