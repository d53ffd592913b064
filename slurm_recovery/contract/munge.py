"""MUNGE credentials through libmunge (ctypes): encode a payload, decode and check a credential.

MUNGE is already on every Slurm node, with one shared key: a credential proves which uid/gid
encoded it, on which host (the origin address munged stamps) and when, with no new secret to
distribute. libmunge is loaded on first use, so importing this module needs no MUNGE at all.
Each call uses its own libmunge context (created, used and destroyed in the call), so calls
are safe from any thread; ctypes releases the GIL while munged works.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import socket as _socket
import threading
from dataclasses import dataclass

# munge_err_t, from munge.h (libmunge 0.5.x).
EMUNGE_SUCCESS = 0
EMUNGE_SNAFU = 1
EMUNGE_BAD_ARG = 2
EMUNGE_BAD_LENGTH = 3
EMUNGE_OVERFLOW = 4
EMUNGE_NO_MEMORY = 5
EMUNGE_SOCKET = 6
EMUNGE_TIMEOUT = 7
EMUNGE_BAD_CRED = 8
EMUNGE_BAD_VERSION = 9
EMUNGE_BAD_CIPHER = 10
EMUNGE_BAD_MAC = 11
EMUNGE_BAD_ZIP = 12
EMUNGE_BAD_REALM = 13
EMUNGE_CRED_INVALID = 14
EMUNGE_CRED_EXPIRED = 15
EMUNGE_CRED_REWOUND = 16
EMUNGE_CRED_REPLAYED = 17
EMUNGE_CRED_UNAUTHORIZED = 18

# munge_opt_t, from munge.h.
_OPT_TTL = 4  # int
_OPT_ADDR4 = 5  # struct in_addr
_OPT_ENCODE_TIME = 6  # time_t
_OPT_SOCKET = 8  # char *
_OPT_UID_RESTRICTION = 9  # uid_t

#: Not a libmunge code: libmunge itself could not be loaded.
LIBRARY_MISSING = -1


class MungeError(Exception):
    """libmunge refused; ``code`` is its munge_err_t, ``message`` its words for it."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"{message} (munge error {code})")
        self.code = code
        self.message = message


class MungeUnavailable(MungeError):
    """libmunge.so.2 is not installed on this host."""


class MungeSocketError(MungeError):
    """munged could not be reached (not running, wrong socket path, no permission)."""


class MungeCredentialError(MungeError):
    """munged reached a verdict: this credential is not acceptable. Subclasses say why."""


class MungeInvalid(MungeCredentialError):
    """Garbage, forged or tampered with, another realm or key, or restricted to another uid."""


class MungeExpired(MungeCredentialError):
    """Older than its time-to-live."""


class MungeRewound(MungeCredentialError):
    """Encoded in the future: the encoding host's clock is ahead of this one's."""


class MungeReplayed(MungeCredentialError):
    """This munged has already decoded this very credential."""


_CLASS_BY_CODE: dict[int, type[MungeError]] = {
    EMUNGE_SOCKET: MungeSocketError,
    EMUNGE_TIMEOUT: MungeSocketError,
    EMUNGE_BAD_LENGTH: MungeInvalid,
    EMUNGE_BAD_CRED: MungeInvalid,
    EMUNGE_BAD_VERSION: MungeInvalid,
    EMUNGE_BAD_CIPHER: MungeInvalid,
    EMUNGE_BAD_MAC: MungeInvalid,
    EMUNGE_BAD_ZIP: MungeInvalid,
    EMUNGE_BAD_REALM: MungeInvalid,
    EMUNGE_CRED_INVALID: MungeInvalid,
    EMUNGE_CRED_UNAUTHORIZED: MungeInvalid,
    EMUNGE_CRED_EXPIRED: MungeExpired,
    EMUNGE_CRED_REWOUND: MungeRewound,
    EMUNGE_CRED_REPLAYED: MungeReplayed,
}


@dataclass(frozen=True)
class Decoded:
    """What a valid credential says: its payload and who encoded it, where and when."""

    payload: bytes
    uid: int
    gid: int
    encode_time: int  # seconds since the epoch, by the encoding host's clock
    ttl: int  # seconds
    origin: str  # IPv4 address the encoding munged stamped (its --origin), dotted quad


class _Lib:
    """The loaded libmunge and libc, with the prototypes this module calls."""

    def __init__(self) -> None:
        name = ctypes.util.find_library("munge") or "libmunge.so.2"
        try:
            munge = ctypes.CDLL(name)
        except OSError as exc:
            raise MungeUnavailable(
                LIBRARY_MISSING, f"cannot load libmunge ({name}): {exc}; install munge"
            ) from exc
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")

        munge.munge_ctx_create.restype = ctypes.c_void_p
        munge.munge_ctx_create.argtypes = []
        munge.munge_ctx_destroy.restype = None
        munge.munge_ctx_destroy.argtypes = [ctypes.c_void_p]
        munge.munge_ctx_strerror.restype = ctypes.c_char_p
        munge.munge_ctx_strerror.argtypes = [ctypes.c_void_p]
        munge.munge_strerror.restype = ctypes.c_char_p
        munge.munge_strerror.argtypes = [ctypes.c_int]
        # munge_ctx_set/get are variadic: no argtypes; every argument is passed as an
        # explicit ctypes value so the C default promotions are what libmunge expects.
        munge.munge_ctx_set.restype = ctypes.c_int
        munge.munge_ctx_get.restype = ctypes.c_int
        munge.munge_encode.restype = ctypes.c_int
        munge.munge_encode.argtypes = [
            ctypes.POINTER(ctypes.c_void_p),  # char **cred (malloc'd by libmunge)
            ctypes.c_void_p,
            ctypes.c_char_p,
            ctypes.c_int,
        ]
        munge.munge_decode.restype = ctypes.c_int
        munge.munge_decode.argtypes = [
            ctypes.c_char_p,
            ctypes.c_void_p,
            ctypes.POINTER(ctypes.c_void_p),  # void **buf (malloc'd by libmunge)
            ctypes.POINTER(ctypes.c_int),
            ctypes.POINTER(ctypes.c_uint32),  # uid_t
            ctypes.POINTER(ctypes.c_uint32),  # gid_t
        ]
        libc.free.restype = None
        libc.free.argtypes = [ctypes.c_void_p]
        self.munge = munge
        self.free = libc.free

    def error(self, code: int, ctx: int | None) -> MungeError:
        raw = self.munge.munge_ctx_strerror(ctx) if ctx else None
        raw = raw or self.munge.munge_strerror(code)
        message = raw.decode("utf-8", "replace") if raw else f"munge error {code}"
        return _CLASS_BY_CODE.get(code, MungeError)(code, message)

    def new_ctx(self, socket: str | None) -> int:
        ctx = self.munge.munge_ctx_create()
        if not ctx:
            raise MungeError(EMUNGE_NO_MEMORY, "munge_ctx_create failed: out of memory")
        if socket is not None:
            rc = self.munge.munge_ctx_set(
                ctypes.c_void_p(ctx), ctypes.c_int(_OPT_SOCKET), ctypes.c_char_p(socket.encode())
            )
            if rc != EMUNGE_SUCCESS:
                err = self.error(rc, ctx)
                self.munge.munge_ctx_destroy(ctx)
                raise err
        return ctx

    def get(self, ctx: int, opt: int, out: ctypes._SimpleCData | ctypes.Array) -> None:
        rc = self.munge.munge_ctx_get(ctypes.c_void_p(ctx), ctypes.c_int(opt), ctypes.byref(out))
        if rc != EMUNGE_SUCCESS:
            raise self.error(rc, ctx)


_lib: _Lib | None = None
_lib_lock = threading.Lock()


def _load() -> _Lib:
    global _lib
    if _lib is None:
        with _lib_lock:
            if _lib is None:
                _lib = _Lib()
    return _lib


def available() -> bool:
    """True when libmunge can be loaded on this host (munged may still be down)."""
    try:
        _load()
    except MungeUnavailable:
        return False
    return True


def encode(
    payload: bytes,
    *,
    socket: str | None = None,
    ttl: int | None = None,
    uid_restriction: int | None = None,
) -> str:
    """A credential for ``payload``, encoded by munged as the calling process's uid/gid.

    ``socket``: munged's socket (None: libmunge's default, /run/munge/munge.socket.2).
    ``ttl``: seconds the credential stays valid (None: munged's default, normally 300; munged
    caps it at its --max-ttl). ``uid_restriction``: only a process of this uid may decode it
    (munged refuses others: EMUNGE_CRED_UNAUTHORIZED); the payload travels encrypted.
    """
    lib = _load()
    ctx = lib.new_ctx(socket)
    out = ctypes.c_void_p()
    try:
        if ttl is not None:
            rc = lib.munge.munge_ctx_set(
                ctypes.c_void_p(ctx), ctypes.c_int(_OPT_TTL), ctypes.c_int(ttl)
            )
            if rc != EMUNGE_SUCCESS:
                raise lib.error(rc, ctx)
        if uid_restriction is not None:
            rc = lib.munge.munge_ctx_set(
                ctypes.c_void_p(ctx),
                ctypes.c_int(_OPT_UID_RESTRICTION),
                ctypes.c_uint32(uid_restriction),
            )
            if rc != EMUNGE_SUCCESS:
                raise lib.error(rc, ctx)
        rc = lib.munge.munge_encode(ctypes.byref(out), ctx, payload, len(payload))
        if rc != EMUNGE_SUCCESS:
            raise lib.error(rc, ctx)
        raw = ctypes.string_at(out.value) if out.value else b""
        return raw.decode("ascii")
    finally:
        if out.value:
            lib.free(out.value)
        lib.munge.munge_ctx_destroy(ctx)


def decode(cred: str, *, socket: str | None = None) -> Decoded:
    """Check ``cred`` with munged and return what it carries; raises a MungeError subclass.

    munged remembers every credential it has decoded until it expires: decoding the same
    credential twice through the same munged raises MungeReplayed.
    """
    try:
        raw = cred.encode("ascii")
    except UnicodeEncodeError:
        raise MungeInvalid(EMUNGE_BAD_CRED, "credential is not ASCII") from None
    if b"\0" in raw:
        raise MungeInvalid(EMUNGE_BAD_CRED, "credential contains a NUL byte")
    lib = _load()
    ctx = lib.new_ctx(socket)
    buf = ctypes.c_void_p()
    length = ctypes.c_int(0)
    uid = ctypes.c_uint32(0)
    gid = ctypes.c_uint32(0)
    try:
        rc = lib.munge.munge_decode(
            raw, ctx, ctypes.byref(buf), ctypes.byref(length), ctypes.byref(uid), ctypes.byref(gid)
        )
        if rc != EMUNGE_SUCCESS:
            raise lib.error(rc, ctx)
        payload = ctypes.string_at(buf.value, length.value) if buf.value else b""
        ttl = ctypes.c_int(0)
        encode_time = ctypes.c_int64(0)  # time_t on every Linux ABI Slurm runs on (LP64)
        addr = (ctypes.c_ubyte * 4)()  # struct in_addr, network byte order
        lib.get(ctx, _OPT_TTL, ttl)
        lib.get(ctx, _OPT_ENCODE_TIME, encode_time)
        lib.get(ctx, _OPT_ADDR4, addr)
        return Decoded(
            payload=payload,
            uid=uid.value,
            gid=gid.value,
            encode_time=encode_time.value,
            ttl=ttl.value,
            origin=_socket.inet_ntoa(bytes(addr)),
        )
    finally:
        # libmunge allocates the payload even for expired, rewound and replayed credentials.
        if buf.value:
            lib.free(buf.value)
        lib.munge.munge_ctx_destroy(ctx)
