"""Slurm's refusals, in Slurm's own words, sorted into the typed errors of ``base``.

Every backend meets the same errors: pyslurm hands over Slurm's errno and its text
(``slurm_strerror``), the command-line tools print the same text after a prefix of their
own (``slurm_update error: Invalid job id specified``). One table serves both.
"""

from __future__ import annotations

from slurm_recovery.scheduler.base import (
    InvalidRequest,
    PermissionDenied,
    SchedulerError,
    UnknownJob,
    UnknownNode,
    Unreachable,
)

# Slurm's error numbers and texts, from slurm/slurm_errno.h and src/common/slurm_errno.c.
# Only numbers that are the same in Slurm 22.05 and 25.11 are listed (checked against
# libslurm 22.05.8's slurm_strerror and the 25.11 headers pyslurm 25.11.2 builds with).
# Anything Slurm refuses that is not listed here is an InvalidRequest.
_BY_ERRNO: dict[int, type[SchedulerError]] = {
    2017: UnknownJob,  # ESLURM_INVALID_JOB_ID
    2018: UnknownNode,  # ESLURM_INVALID_NODE_NAME
    2002: PermissionDenied,  # ESLURM_ACCESS_DENIED
    # slurmctld could not be asked: no connection, timeouts, rate limit, standby, auth down.
    1001: Unreachable,  # SLURM_COMMUNICATIONS_CONNECTION_ERROR
    1002: Unreachable,  # SLURM_COMMUNICATIONS_SEND_ERROR
    1003: Unreachable,  # SLURM_COMMUNICATIONS_RECEIVE_ERROR
    1004: Unreachable,  # SLURM_COMMUNICATIONS_SHUTDOWN_ERROR
    1005: Unreachable,  # SLURM_PROTOCOL_VERSION_ERROR (client and slurmctld cannot talk)
    1007: Unreachable,  # SLURM_PROTOCOL_AUTHENTICATION_ERROR (munged down, clock skew)
    1800: Unreachable,  # SLURMCTLD_COMMUNICATIONS_CONNECTION_ERROR
    1801: Unreachable,  # SLURMCTLD_COMMUNICATIONS_SEND_ERROR
    1802: Unreachable,  # SLURMCTLD_COMMUNICATIONS_RECEIVE_ERROR
    1803: Unreachable,  # SLURMCTLD_COMMUNICATIONS_SHUTDOWN_ERROR
    1804: Unreachable,  # SLURMCTLD_COMMUNICATIONS_BACKOFF (rate limit, newer Slurm)
    1805: Unreachable,  # SLURMCTLD_COMMUNICATIONS_HARD_DROP (rate limit, newer Slurm)
    2027: Unreachable,  # ESLURM_IN_STANDBY_MODE
    2131: Unreachable,  # ESLURM_IN_STANDBY_USE_BACKUP
    5004: Unreachable,  # SLURM_PROTOCOL_SOCKET_IMPL_TIMEOUT
    5005: Unreachable,  # SLURM_PROTOCOL_SOCKET_ZERO_BYTES_SENT
}

# (text Slurm prints, error). Matched as a case-insensitive substring, first match wins,
# so the tools' own prefixes ("scancel: error: Kill job error on job id 7: ...") do not
# matter. The InvalidRequest rows are the default made explicit: the refusals the
# controller meets in normal operation, kept here so their meaning is written down.
SLURM_MESSAGES: tuple[tuple[str, type[SchedulerError]], ...] = (
    ("Invalid job id specified", UnknownJob),
    ("Invalid node name specified", UnknownNode),
    ("Access/permission denied", PermissionDenied),
    ("Unable to contact slurm controller", Unreachable),  # (connect|send|receive) failure
    ("Communication connection failure", Unreachable),
    ("Socket timed out on send/recv operation", Unreachable),
    ("Zero Bytes were transmitted or received", Unreachable),
    ("Protocol authentication error", Unreachable),
    ("Incompatible versions of client and server code", Unreachable),
    ("Rate limit exceeded", Unreachable),
    ("Slurm backup controller in standby mode", Unreachable),
    ("Controller is in standby mode", Unreachable),
    ("Job is no longer pending execution", InvalidRequest),  # e.g. ExcNodeList on RUNNING
    ("Job is pending execution", InvalidRequest),  # e.g. requeue of a PENDING job
    ("Job/step already completing or completed", InvalidRequest),
    ("Job has already finished", InvalidRequest),
    ("Requested operation is presently disabled", InvalidRequest),  # e.g. requeue disabled
    ("Only batch jobs are accepted or processed", InvalidRequest),  # requeue of srun job
    ("Job can not be altered now, try again later", InvalidRequest),
    ("Invalid node state specified", InvalidRequest),  # e.g. RESUME of an idle node
)


def classify_slurm_error(message: str, errno: int | None = None) -> type[SchedulerError]:
    """The :class:`SchedulerError` subclass for Slurm's ``errno`` or, failing that, its text.

    ``errno`` wins when it is one Slurm uses for a specific case; pyslurm reports
    ``-1`` (SLURM_ERROR) when it only has a text. Unknown refusals are InvalidRequest.
    """
    if errno is not None and errno in _BY_ERRNO:
        return _BY_ERRNO[errno]
    folded = message.casefold()
    for text, error in SLURM_MESSAGES:
        if text.casefold() in folded:
            return error
    return InvalidRequest


def slurm_error(
    action: str, slurm_message: str, *, errno: int | None = None, command: str = ""
) -> SchedulerError:
    """A typed error for ``action`` (e.g. ``"requeue job 7"``) that Slurm refused."""
    error = classify_slurm_error(slurm_message, errno)
    return error(f"{action} failed", slurm_message=slurm_message.strip(), command=command)
