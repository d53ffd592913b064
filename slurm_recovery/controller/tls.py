"""TLS for the controller's HTTP API (``controller.tls_cert`` / ``controller.tls_key``).

MUNGE authenticates every request with or without TLS; TLS keeps what crosses the network
(job names, node reasons, log lines) private. The key file is checked before it is loaded, so
a key any user can read stops the start with a fix, instead of being served.
"""

from __future__ import annotations

import os
import ssl
import stat


class TLSConfigError(Exception):
    """The certificate or key cannot be used; the message says which file and why."""


def _check_key_file(path: str) -> None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise TLSConfigError(f"controller.tls_key {path}: no such file") from None
    except OSError as exc:
        raise TLSConfigError(f"controller.tls_key {path}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(st.st_mode):
        raise TLSConfigError(f"controller.tls_key {path}: not a regular file")
    if st.st_mode & (stat.S_IROTH | stat.S_IWOTH):
        raise TLSConfigError(
            f"controller.tls_key {path}: other users can read or write it (mode "
            f"{stat.S_IMODE(st.st_mode):04o}); fix: chmod 0640 {path} (or 0600)"
        )


def server_context(cert: str, key: str) -> ssl.SSLContext:
    """The server-side context for ``cert`` (PEM, the server's certificate then any
    intermediates) and its private ``key``; TLS 1.2 or later. Raises TLSConfigError."""
    _check_key_file(key)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert, key)
    except FileNotFoundError:
        raise TLSConfigError(f"controller.tls_cert {cert}: no such file") from None
    except ssl.SSLError as exc:
        raise TLSConfigError(
            f"controller.tls_cert {cert} / tls_key {key}: cannot load them ({exc.reason or exc}); "
            "both must be PEM, and the key must be the certificate's"
        ) from None
    except OSError as exc:
        raise TLSConfigError(f"controller.tls_cert {cert}: {exc.strerror or exc}") from None
    return context
