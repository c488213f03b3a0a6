"""s3dma: S3 objects straight into your memory, through the local host-shim.

See :class:`s3dma.Client` (module :mod:`s3dma.client`), the exceptions in
:mod:`s3dma.errors`, the data-loader helper :mod:`s3dma.dataset` and the
recursive transfers :func:`s3dma.download_prefix` / :func:`s3dma.upload_dir`
(:mod:`s3dma.transfer`).
"""

from .client import (  # noqa: F401
    DEFAULT_SOCKET,
    SHIM_UID_ENV,
    SOCKET_ENV,
    Buffer,
    BufferInfo,
    Client,
    CudaBuffer,
    GetItem,
    GetResult,
    Info,
    ListedObject,
    ListPage,
    ObjectInfo,
    PutItem,
    PutResult,
    default_socket,
    local_socket,
)
from .errors import (  # noqa: F401
    AccessDenied,
    Cancelled,
    DeadlineExceeded,
    InternalError,
    InvalidArgument,
    InvalidRange,
    LeaseRefused,
    NotFound,
    OutOfBounds,
    PreconditionFailed,
    S3dmaError,
    ShimUnavailable,
    SlowDown,
    TransferError,
    Unavailable,
    Unsupported,
    UntrustedShim,
)
from .ranges import ByteRange, parse_range  # noqa: F401
from .transfer import TransferSummary, download_prefix, upload_dir  # noqa: F401

__version__ = "0.1.0"
