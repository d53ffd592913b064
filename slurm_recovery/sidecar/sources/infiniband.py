"""InfiniBand and RoCE ports from sysfs: port state and error counters, debounced into findings.

Reads ``<root>/<hca>/ports/<n>/{state,phys_state,link_layer}`` and ``counters/{link_downed,
symbol_error,port_rcv_errors}`` (``/sys/class/infiniband``: both IB and RoCE ports appear
there). A port that stays down is fatal for the node; a flap that healed is a finding, never
an exclusion; rising error counters are warnings.
"""

from __future__ import annotations

import os
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slurm_recovery.sidecar.base import Finding

__all__ = ["IB_CHECKS", "InfinibandSource"]

#: Port checks and their severity (``link_flap`` is info for one flap, warning for several).
IB_CHECKS = {
    "port_down": "fatal",  # not ACTIVE for `debounce` consecutive polls (or gone from sysfs)
    "port_recovered": "info",  # ACTIVE again after a port_down
    "link_flap": "info",  # link_downed went up but the port is ACTIVE now: healed
    "symbol_errors_rising": "warning",
    "rcv_errors_rising": "warning",
}

_ACTIVE = 4
_COUNTERS = ("link_downed", "symbol_error", "port_rcv_errors")


@dataclass
class _Port:
    """What the source remembers about one port between polls."""

    seen_active: bool = False
    down_polls: int = 0
    reported_down: bool = False
    downed_while_down: int = 0  # link_downed increments seen while the port was not ACTIVE
    counters: dict[str, int] = field(default_factory=dict)
    last_report: dict[str, float] = field(default_factory=dict)
    reading: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class _Reading:
    state: int
    state_name: str
    phys_state: str
    link_layer: str
    counters: dict[str, int]


class InfinibandSource:
    """Port findings (``ib_finding``: port, check, severity, detail) from an IB sysfs tree.

    ``debounce``: polls a port must stay down before ``port_down``. A port counts as one
    that should be up once it has been seen ACTIVE, or when it is named in
    ``expected_ports`` (``"mlx5_0/1"``) -- so unused, never-cabled ports stay quiet.
    Counter checks fire when a counter rose by at least its threshold since the last poll,
    at most once per ``repeat_after`` seconds per port and check.
    """

    name = "infiniband"
    fast = False

    def __init__(
        self,
        sysfs_root: str | os.PathLike[str] = "/sys/class/infiniband",
        *,
        debounce: int = 2,
        symbol_error_threshold: int = 10,
        rcv_error_threshold: int = 10,
        repeat_after: float = 300.0,
        expected_ports: Collection[str] = (),
    ) -> None:
        if debounce < 1:
            raise ValueError("debounce must be at least 1 poll")
        self._root = Path(sysfs_root)
        self._debounce = debounce
        self._thresholds = {
            "symbol_error": ("symbol_errors_rising", max(1, symbol_error_threshold)),
            "port_rcv_errors": ("rcv_errors_rising", max(1, rcv_error_threshold)),
        }
        self._repeat_after = repeat_after
        self._expected = frozenset(expected_ports)
        self._ports: dict[str, _Port] = {}
        self._problems: list[str] = []

    # ------------------------------------------------------------------ Source interface

    def poll(self, now: float) -> list[Finding]:
        self._problems = []
        present = self._scan()
        findings: list[Finding] = []
        for key in sorted(set(present) | set(self._ports) | self._expected):
            port = self._ports.setdefault(key, _Port())
            reading = present.get(key)
            findings.extend(self._check(key, port, reading, now))
        return findings

    def close(self) -> None:
        """Nothing to release: every poll opens and closes its files."""

    def status(self) -> str:
        """``"ok"``, or what could not be read (for the sidecar's status event)."""
        return "; ".join(self._problems) or "ok"

    def ports(self) -> dict[str, dict[str, Any]]:
        """The last reading of every port (state, link layer, counters): telemetry."""
        return {key: dict(port.reading) for key, port in sorted(self._ports.items())}

    # ------------------------------------------------------------------ reading sysfs

    def _scan(self) -> dict[str, _Reading]:
        found: dict[str, _Reading] = {}
        try:
            hcas = sorted(p for p in self._root.iterdir() if (p / "ports").is_dir())
        except FileNotFoundError:
            return found
        except OSError as exc:
            self._problems.append(f"cannot list {self._root}: {exc.strerror or exc}")
            return found
        for hca in hcas:
            try:
                numbers = sorted((hca / "ports").iterdir(), key=lambda p: p.name)
            except OSError as exc:
                self._problems.append(f"cannot list {hca / 'ports'}: {exc.strerror or exc}")
                continue
            for port_dir in numbers:
                reading = self._read_port(port_dir)
                if reading is not None:
                    found[f"{hca.name}/{port_dir.name}"] = reading
        return found

    def _read_port(self, port_dir: Path) -> _Reading | None:
        state_text = self._text(port_dir / "state")
        if state_text is None:
            return None
        number, _, name = state_text.partition(":")
        try:
            state = int(number.strip())
        except ValueError:
            self._problems.append(f"{port_dir / 'state'}: unexpected content {state_text!r}")
            return None
        counters: dict[str, int] = {}
        for counter in _COUNTERS:
            text = self._text(port_dir / "counters" / counter, required=False)
            if text is None:
                continue
            try:
                counters[counter] = int(text.split()[0])
            except (ValueError, IndexError):
                self._problems.append(f"{port_dir / 'counters' / counter}: not a number")
        return _Reading(
            state=state,
            state_name=name.strip() or str(state),
            phys_state=self._text(port_dir / "phys_state", required=False) or "",
            link_layer=self._text(port_dir / "link_layer", required=False) or "",
            counters=counters,
        )

    def _text(self, path: Path, *, required: bool = True) -> str | None:
        try:
            return path.read_text(encoding="utf-8", errors="replace").strip()
        except FileNotFoundError:
            if required:
                self._problems.append(f"{path}: missing")
            return None
        except OSError as exc:
            self._problems.append(f"cannot read {path}: {exc.strerror or exc}")
            return None

    # ------------------------------------------------------------------ deciding

    def _check(self, key: str, port: _Port, reading: _Reading | None, now: float) -> list[Finding]:
        findings: list[Finding] = []
        layer = reading.link_layer if reading is not None else ""
        if reading is not None:
            port.reading = {
                "state": reading.state_name,
                "phys_state": reading.phys_state,
                "link_layer": reading.link_layer,
                "counters": dict(reading.counters),
            }
        else:
            port.reading = {"state": "absent from sysfs"}
        active = reading is not None and reading.state == _ACTIVE
        downed = 0
        if reading is not None:
            downed = self._counter_checks(key, port, reading, now, findings)
        if active:
            downed += port.downed_while_down
            if port.reported_down:
                findings.append(
                    self._finding(
                        key,
                        "port_recovered",
                        now,
                        f"ACTIVE again after {port.down_polls} polls down"
                        + (f" (link_downed +{downed})" if downed else ""),
                        layer,
                    )
                )
            elif downed > 0:
                severity = "info" if downed == 1 else "warning"
                findings.append(
                    self._finding(
                        key,
                        "link_flap",
                        now,
                        f"link went down {downed} time{'s' if downed > 1 else ''} and "
                        "recovered; the port is ACTIVE",
                        layer,
                        severity=severity,
                    )
                )
            port.seen_active = True
            port.down_polls = 0
            port.reported_down = False
            port.downed_while_down = 0
            return findings
        port.down_polls += 1
        port.downed_while_down += downed
        should_be_up = port.seen_active or key in self._expected
        if should_be_up and port.down_polls >= self._debounce and not port.reported_down:
            port.reported_down = True
            if reading is None:
                what = "gone from sysfs (the adapter or its driver is missing)"
            else:
                what = f"state {reading.state_name}, physical state {reading.phys_state or '?'}"
            findings.append(
                self._finding(key, "port_down", now, f"{what} for {port.down_polls} polls", layer)
            )
        return findings

    def _counter_checks(
        self, key: str, port: _Port, reading: _Reading, now: float, findings: list[Finding]
    ) -> int:
        """Compare counters with the last poll; returns the link_downed increase."""
        previous, port.counters = port.counters, dict(reading.counters)
        downed = 0
        for counter, value in reading.counters.items():
            before = previous.get(counter)
            if before is None or value < before:  # first sight, or cleared: new baseline
                continue
            delta = value - before
            if counter == "link_downed":
                downed = delta
                continue
            check, threshold = self._thresholds[counter]
            if delta < threshold:
                continue
            last = port.last_report.get(check)
            if last is not None and now - last < self._repeat_after:
                continue
            port.last_report[check] = now
            findings.append(
                self._finding(
                    key,
                    check,
                    now,
                    f"{counter} +{delta} since the last poll (now {value})",
                    reading.link_layer,
                )
            )
        return downed

    @staticmethod
    def _finding(
        port: str,
        check: str,
        now: float,
        detail: str,
        link_layer: str,
        *,
        severity: str | None = None,
    ) -> Finding:
        payload: dict[str, Any] = {
            "port": port,
            "check": check,
            "severity": severity or IB_CHECKS[check],
            "detail": detail,
        }
        if link_layer:
            payload["link_layer"] = link_layer
        return Finding(kind="ib_finding", observed_at=now, payload=payload)
