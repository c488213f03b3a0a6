"""One exception hierarchy for everything the shim (or the agent behind it)
answers, and for failing to reach the shim at all.

Every :class:`S3dmaError` has:

* ``code``: the S3 error code the agent reported (``NoSuchKey``,
  ``AccessDenied``, ``PreconditionFailed``, ``InvalidRange``, ...) or the
  shim's own reason (``NoSuchBuffer``, ``OutOfBounds``, ``UnknownTenant``,
  ...): the ``reason`` of the status' ``google.rpc.ErrorInfo`` detail.
  Client-side failures use ``ShimUnavailable``, ``LeaseRefused``,
  ``UntrustedShim`` (the socket is served by an unexpected uid) and
  ``ConnectionDropped`` (an :class:`AccessDenied`: the shim hung up before
  answering, as it does to uids that are not its tenants).
  :class:`TransferError` (a recursive transfer with failed files) carries
  its first failure's code.
* ``domain``: ``s3dma.agent``, ``s3dma.shim`` or ``s3dma.client``.
* ``message``, ``request_id`` (empty when none), ``grpc_code``
  (a ``grpc.StatusCode``, or None), ``metadata`` (the ErrorInfo metadata).

The subclass is picked by ``code`` first, then by the gRPC code.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

import grpc

if TYPE_CHECKING:  # pragma: no cover
    from .transfer import TransferSummary

AGENT_DOMAIN = "s3dma.agent"
SHIM_DOMAIN = "s3dma.shim"
CLIENT_DOMAIN = "s3dma.client"


class S3dmaError(Exception):
    def __init__(
        self,
        message: str,
        *,
        code: str = "",
        request_id: str = "",
        grpc_code: Optional[grpc.StatusCode] = None,
        domain: str = "",
        metadata: Optional[Dict[str, str]] = None,
    ):
        self.message = message
        self.code = code
        self.request_id = request_id
        self.grpc_code = grpc_code
        self.domain = domain
        self.metadata = dict(metadata or {})
        super().__init__(message)

    def __str__(self) -> str:
        s = self.message
        if self.code and not s.startswith(self.code):
            s = f"{self.code}: {s}"
        if self.request_id:
            s += f" (request id {self.request_id})"
        return s

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(code={self.code!r}, message={self.message!r}, "
            f"request_id={self.request_id!r}, grpc_code={self.grpc_code})"
        )


class NotFound(S3dmaError):
    """NoSuchKey, NoSuchBucket, NoSuchUpload, NoSuchBuffer, NoSuchLease."""


class AccessDenied(S3dmaError):
    """The policy denies the bucket/key, or the uid is not a tenant (UnknownTenant)."""


class InvalidArgument(S3dmaError):
    """A malformed request, or memory the shim cannot use (BadBuffer)."""


class OutOfBounds(InvalidArgument):
    """A slice outside its buffer (the shim's OutOfBounds), or a destination
    smaller than the object or range (the agent's DestinationTooSmall)."""


class InvalidRange(S3dmaError):
    """The range cannot be satisfied (HTTP 416)."""


class PreconditionFailed(S3dmaError):
    """``if_match`` failed, or the object changed during a chunked transfer."""


class SlowDown(S3dmaError):
    """A quota is exhausted (SlowDown, BufferLimit): back off and retry."""


class Unavailable(S3dmaError):
    """The shim, the agent or the storage cannot be reached right now."""


class ShimUnavailable(Unavailable):
    """The shim's socket is missing or refuses connections."""


class DeadlineExceeded(S3dmaError):
    pass


class Unsupported(S3dmaError):
    """A feature this shim, build or backend lacks."""


class Cancelled(S3dmaError):
    pass


class InternalError(S3dmaError):
    pass


class LeaseRefused(S3dmaError):
    """The shim refused the lease or an fd passed over it."""


class TransferError(S3dmaError):
    """Some files of a recursive transfer (:func:`s3dma.download_prefix`,
    :func:`s3dma.upload_dir`) failed, or its listing did; the other files
    were copied. ``summary`` is the run's :class:`s3dma.TransferSummary`,
    ``failures`` its ``(name, exception)`` pairs; ``code``, ``grpc_code``
    and ``request_id`` are the first failure's (``TransferFailed`` when it
    has no code, e.g. a local :class:`OSError`)."""

    def __init__(self, message: str, *, summary: "TransferSummary", **kwargs: Any):
        super().__init__(message, **kwargs)
        self.summary = summary

    def __str__(self) -> str:
        return self.message  # it names each failure with its own code

    @property
    def failures(self) -> "List[Tuple[str, BaseException]]":
        return self.summary.failures


class UntrustedShim(S3dmaError):
    """The socket is served by a uid that is neither root nor the expected
    one (yours, ``shim_uid`` or ``$S3DMA_SHIM_UID``): not the shim, maybe
    another user's fake. Nothing was sent to it."""


_BY_REASON = {
    "NoSuchKey": NotFound,
    "NoSuchBucket": NotFound,
    "NoSuchUpload": NotFound,
    "NoSuchVersion": NotFound,
    "NoSuchBuffer": NotFound,
    "NoSuchLease": NotFound,
    "AccessDenied": AccessDenied,
    "UnknownTenant": AccessDenied,
    "ConnectionDropped": AccessDenied,
    "UntrustedShim": UntrustedShim,
    "InvalidAccessKeyId": AccessDenied,
    "SignatureDoesNotMatch": AccessDenied,
    "InvalidRange": InvalidRange,
    "PreconditionFailed": PreconditionFailed,
    "SlowDown": SlowDown,
    "BufferLimit": SlowDown,
    "OutOfBounds": OutOfBounds,
    "DestinationTooSmall": OutOfBounds,
    "BadBuffer": InvalidArgument,
    "InvalidArgument": InvalidArgument,
    "Unsupported": Unsupported,
    "NotImplemented": Unsupported,
    "AgentUnavailable": Unavailable,
    "ServiceUnavailable": Unavailable,
    "RequestTimeout": DeadlineExceeded,
}

_BY_GRPC = {
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.PERMISSION_DENIED: AccessDenied,
    grpc.StatusCode.UNAUTHENTICATED: AccessDenied,
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.OUT_OF_RANGE: InvalidRange,
    grpc.StatusCode.FAILED_PRECONDITION: PreconditionFailed,
    grpc.StatusCode.RESOURCE_EXHAUSTED: SlowDown,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
    grpc.StatusCode.UNIMPLEMENTED: Unsupported,
    grpc.StatusCode.CANCELLED: Cancelled,
}

_GRPC_BY_NUMBER = {c.value[0]: c for c in grpc.StatusCode}


def client_error(cls: type, message: str, code: str = "") -> S3dmaError:
    """A failure the client itself found: a ``cls`` in :data:`CLIENT_DOMAIN`
    whose ``code`` is ``code`` (default: the class' name)."""
    return cls(message, code=code or cls.__name__, domain=CLIENT_DOMAIN)


def with_message(e: S3dmaError, message: str) -> S3dmaError:
    """``e`` told again: the same class, ``code``, ``grpc_code``,
    ``request_id`` and ``domain``, with ``message``."""
    return type(e)(message, code=e.code, grpc_code=e.grpc_code, request_id=e.request_id, domain=e.domain)


def grpc_code_from_number(n: int) -> Optional[grpc.StatusCode]:
    return _GRPC_BY_NUMBER.get(n)


def error_class(code: str, grpc_code: Optional[grpc.StatusCode]) -> type:
    cls = _BY_REASON.get(code)
    if cls is None:
        cls = _BY_GRPC.get(grpc_code, InternalError if grpc_code is not None else S3dmaError)
    return cls


def make_error(
    message: str,
    *,
    code: str = "",
    grpc_code: Optional[grpc.StatusCode] = None,
    request_id: str = "",
    domain: str = "",
    metadata: Optional[Dict[str, str]] = None,
) -> S3dmaError:
    return error_class(code, grpc_code)(
        message, code=code, grpc_code=grpc_code, request_id=request_id, domain=domain, metadata=metadata
    )


def _error_info(trailing) -> tuple:
    """(reason, domain, metadata, status message) from grpc-status-details-bin."""
    raw = None
    for k, v in trailing or ():
        if k == "grpc-status-details-bin":
            raw = v
            break
    if not raw:
        return "", "", {}, ""
    try:
        from google.rpc import error_details_pb2, status_pb2

        st = status_pb2.Status.FromString(raw)
    except Exception:  # undecodable details: fall back on code and text
        return "", "", {}, ""
    for any_ in st.details:
        if any_.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            any_.Unpack(info)
            return info.reason, info.domain, dict(info.metadata), st.message
    return "", "", {}, st.message


def from_rpc_error(e: grpc.RpcError, what: str = "") -> S3dmaError:
    """The :class:`S3dmaError` for a failed call (``what`` names the call)."""
    code = e.code() if hasattr(e, "code") else None
    details = e.details() if hasattr(e, "details") else None
    trailing = e.trailing_metadata() if hasattr(e, "trailing_metadata") else None
    reason, domain, meta, status_message = _error_info(trailing)
    message = meta.get("message") or details or status_message or str(code)
    request_id = meta.get("request_id", "")
    if not request_id:
        for k, v in trailing or ():
            if k == "x-request-id":
                request_id = v
                break
    if code == grpc.StatusCode.UNAVAILABLE and not reason:
        # gRPC's own "could not connect" (no ErrorInfo): say what and where.
        message = f"{what + ': ' if what else ''}{message}"
    return make_error(
        message, code=reason, grpc_code=code, request_id=request_id, domain=domain, metadata=meta
    )
