"""Who serves the shim's socket: the client checks the server's uid
(``SO_PEERCRED``) before it sends a byte.

Anyone who can create the socket's path (a ``/tmp/s3dma-<uid>/`` directory
made first by another user, a stale path after the shim stopped) could serve
a fake shim there: it would receive your buffers' memfds (your data) and
write what it likes into them. A shim runs as root or, in local mode, as
you; any other uid is refused unless you name it (``Client(shim_uid=...)``
or ``$S3DMA_SHIM_UID``: a uid number or a user name).
"""

from __future__ import annotations

import os
import pwd
import socket
import struct
from dataclasses import dataclass
from typing import Optional, Union

from . import errors

SHIM_UID_ENV = "S3DMA_SHIM_UID"

# The system user the packaged host-shim runs as (its systemd unit's User=);
# only root can create that account, so it is trusted by default when it exists.
SYSTEM_SHIM_USER = "s3dma-shim"

_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


def resolve_uid(value: Union[int, str]) -> int:
    """A uid from a number (``1001``, ``"1001"``) or a user name (``"s3dma"``)."""
    if isinstance(value, bool):
        raise ValueError(f"not a uid or user name: {value!r}")
    if isinstance(value, int):
        if value < 0 or value > 0xFFFFFFFF:
            raise ValueError(f"uid {value} is out of range")
        return value
    text = str(value).strip()
    if not text:
        raise ValueError("an empty uid or user name")
    if text.isdigit():
        return resolve_uid(int(text))
    try:
        return pwd.getpwnam(text).pw_uid
    except KeyError:
        raise ValueError(f"no user called {text!r} (give a uid number or an existing user name)") from None


@dataclass(frozen=True)
class ShimPolicy:
    """The uids trusted to serve the socket: root and :attr:`uid`."""

    uid: int
    source: str  # "caller", "option" or "env"
    text: str = ""  # $S3DMA_SHIM_UID as given
    system: Optional[int] = None  # uid of SYSTEM_SHIM_USER, when no uid was named

    @classmethod
    def resolve(cls, shim_uid: Optional[Union[int, str]] = None) -> "ShimPolicy":
        """``shim_uid`` if given, else ``$S3DMA_SHIM_UID`` if set, else your
        effective uid."""
        if shim_uid is not None:
            return cls(resolve_uid(shim_uid), "option")
        env = os.environ.get(SHIM_UID_ENV)
        if env:
            try:
                return cls(resolve_uid(env), "env", env)
            except ValueError as e:
                raise errors.InvalidArgument(
                    f"${SHIM_UID_ENV}: {e}", code="InvalidArgument", domain=errors.CLIENT_DOMAIN
                ) from None
        try:
            system: Optional[int] = pwd.getpwnam(SYSTEM_SHIM_USER).pw_uid
        except KeyError:
            system = None
        return cls(os.geteuid(), "caller", "", system)

    def allows(self, uid: int) -> bool:
        return uid == 0 or uid == self.uid or uid == self.system

    def expected(self) -> str:
        uids = "uid 0" if self.uid == 0 else f"uid 0 or {self.uid}"
        if self.system is not None:
            uids += f" or {self.system} ({SYSTEM_SHIM_USER})"
        if self.source == "env":
            return f"{uids} (from {SHIM_UID_ENV}={self.text})"
        if self.source == "option":
            return f"{uids} (the client's shim_uid)"
        return f"{uids} (set {SHIM_UID_ENV} if the shim runs as another user)"

    def check(self, sock: socket.socket, path: str) -> None:
        """Raises :class:`s3dma.UntrustedShim` unless root or the expected
        uid serves ``sock`` (connected to ``path``)."""
        try:
            pid, uid, _gid = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
        except OSError as e:
            raise errors.client_error(
                errors.UntrustedShim,
                f"cannot tell who serves the socket {path} (SO_PEERCRED: {e.strerror}); refusing to use it",
            ) from None
        if self.allows(uid):
            return
        who = f"uid {uid}" + (f" (pid {pid})" if pid > 0 else "")
        raise errors.client_error(
            errors.UntrustedShim,
            f"the socket {path} is served by {who}, expected {self.expected()}; nothing was sent to it",
        )
