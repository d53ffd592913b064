"""Authentication (MUNGE credentials binding each request) and authorization (who may report
evidence about which node, who may operate). See docs/security.md."""

from slurm_recovery.auth.authorize import (
    Operators,
    authorize_evidence,
    authorize_operator,
    authorize_read,
    is_operator,
    operators_from_system,
)
from slurm_recovery.contract.munge import (
    Decoded,
    MungeCredentialError,
    MungeError,
    MungeExpired,
    MungeInvalid,
    MungeReplayed,
    MungeRewound,
    MungeSocketError,
    MungeUnavailable,
)
from slurm_recovery.contract.requests import (
    INSECURE_NO_AUTH_WARNING,
    ROLES,
    AuthError,
    Principal,
    ReplayCache,
    sign,
    verify,
)

__all__ = [
    "INSECURE_NO_AUTH_WARNING",
    "ROLES",
    "AuthError",
    "Decoded",
    "MungeCredentialError",
    "MungeError",
    "MungeExpired",
    "MungeInvalid",
    "MungeReplayed",
    "MungeRewound",
    "MungeSocketError",
    "MungeUnavailable",
    "Operators",
    "Principal",
    "ReplayCache",
    "authorize_evidence",
    "authorize_operator",
    "authorize_read",
    "is_operator",
    "operators_from_system",
    "sign",
    "verify",
]
