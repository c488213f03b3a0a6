"""Device memory a tenant can share with the host-shim: the few CUDA driver
calls (ctypes on ``libcuda.so.1``) that allocate GPU memory exportable as a
POSIX file descriptor.

The shim takes GPU memory only as such an fd, passed over the tenant's own
lease: ``cuMemCreate`` requesting ``CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR``,
mapped here with ``cuMemAddressReserve``/``cuMemMap``/``cuMemSetAccess`` and
exported with ``cuMemExportToShareableHandle``. A legacy IPC handle
(``cuIpcGetMemHandle``) is 64 bytes that open the memory for whoever
presents them, which is why shims refuse it by default.

:class:`ShareableAllocation` is what :meth:`s3dma.Client.alloc_cuda` uses;
it exposes ``__cuda_array_interface__``, so ``torch.as_tensor(buf,
device="cuda")`` or ``cupy.asarray(buf)`` view the same memory.
"""

from __future__ import annotations

import ctypes
import os
import threading
from typing import Optional

CU_MEM_ALLOCATION_TYPE_PINNED = 1
CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 1
CU_MEM_LOCATION_TYPE_DEVICE = 1
CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3
CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0


class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _AllocationProp(ctypes.Structure):
    # CUmemAllocationProp (cuda.h)
    _fields_ = [
        ("type", ctypes.c_int),
        ("requestedHandleTypes", ctypes.c_int),
        ("location", _Location),
        ("win32HandleMetaData", ctypes.c_void_p),
        ("allocFlags", ctypes.c_ubyte * 8),
    ]


class _AccessDesc(ctypes.Structure):
    _fields_ = [("location", _Location), ("flags", ctypes.c_int)]


class CudaError(RuntimeError):
    """A CUDA driver call failed (or no driver loads)."""


_driver = None
_driver_lock = threading.Lock()


class _Driver:
    def __init__(self):
        try:
            self.lib = ctypes.CDLL("libcuda.so.1")
        except OSError as e:
            raise CudaError(f"cannot load libcuda.so.1 ({e}); is the NVIDIA driver installed?") from None
        self.ok(self.lib.cuInit(0), "cuInit")

    def ok(self, rc: int, what: str) -> None:
        if rc != 0:
            msg = ctypes.c_char_p()
            self.lib.cuGetErrorString(rc, ctypes.byref(msg))
            raise CudaError(f"{what}: {(msg.value or b'unknown error').decode()} (CUDA error {rc})")

    def make_current(self, device: int) -> None:
        dev = ctypes.c_int()
        self.ok(self.lib.cuDeviceGet(ctypes.byref(dev), device), "cuDeviceGet")
        ctx = ctypes.c_void_p()
        self.ok(self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
        self.ok(self.lib.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")


def driver() -> _Driver:
    """The CUDA driver of this process, loaded and initialised once."""
    global _driver
    with _driver_lock:
        if _driver is None:
            _driver = _Driver()
        return _driver


class ShareableAllocation:
    """``size`` bytes of device memory on GPU ``device`` from ``cuMemCreate``
    (rounded up to the driver's granularity), mapped read-write in this
    process at :attr:`ptr`. :meth:`export_fd` returns a new POSIX fd of it
    (the caller closes it). :meth:`free`, or the object's collection, unmaps
    and releases it here; memory another process imported stays valid there
    until that process unmaps it."""

    def __init__(self, size: int, device: int = 0):
        if not isinstance(size, int) or size <= 0:
            raise ValueError(f"size must be a positive integer, not {size!r}")
        d = driver()
        d.make_current(device)
        self._d = d
        self.size = size
        self.device = device
        prop = _AllocationProp()
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED
        prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        prop.location = _Location(CU_MEM_LOCATION_TYPE_DEVICE, device)
        gran = ctypes.c_size_t()
        d.ok(
            d.lib.cuMemGetAllocationGranularity(ctypes.byref(gran), ctypes.byref(prop), CU_MEM_ALLOC_GRANULARITY_MINIMUM),
            "cuMemGetAllocationGranularity",
        )
        g = max(gran.value, 1)
        self.mapped = (size + g - 1) // g * g
        handle = ctypes.c_uint64()
        d.ok(d.lib.cuMemCreate(ctypes.byref(handle), ctypes.c_size_t(self.mapped), ctypes.byref(prop), ctypes.c_uint64(0)), "cuMemCreate")
        self._handle: Optional[int] = handle.value
        self.ptr = 0
        try:
            ptr = ctypes.c_uint64()
            d.ok(
                d.lib.cuMemAddressReserve(ctypes.byref(ptr), ctypes.c_size_t(self.mapped), ctypes.c_size_t(0), ctypes.c_uint64(0), ctypes.c_uint64(0)),
                "cuMemAddressReserve",
            )
            try:
                d.ok(d.lib.cuMemMap(ptr, ctypes.c_size_t(self.mapped), ctypes.c_size_t(0), handle, ctypes.c_uint64(0)), "cuMemMap")
                desc = _AccessDesc(_Location(CU_MEM_LOCATION_TYPE_DEVICE, device), CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
                rc = d.lib.cuMemSetAccess(ptr, ctypes.c_size_t(self.mapped), ctypes.byref(desc), ctypes.c_size_t(1))
                if rc != 0:
                    d.lib.cuMemUnmap(ptr, ctypes.c_size_t(self.mapped))
                    d.ok(rc, "cuMemSetAccess")
            except BaseException:
                d.lib.cuMemAddressFree(ptr, ctypes.c_size_t(self.mapped))
                raise
            self.ptr = ptr.value
        except BaseException:
            d.lib.cuMemRelease(handle)
            self._handle = None
            raise

    def export_fd(self) -> int:
        """A new POSIX fd of the allocation (``cuMemExportToShareableHandle``)."""
        if self._handle is None:
            raise ValueError("the allocation was freed")
        fd = ctypes.c_int(-1)
        self._d.ok(
            self._d.lib.cuMemExportToShareableHandle(
                ctypes.byref(fd), ctypes.c_uint64(self._handle), CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, ctypes.c_uint64(0)
            ),
            "cuMemExportToShareableHandle",
        )
        return fd.value

    @property
    def __cuda_array_interface__(self):
        return {"shape": (self.size,), "typestr": "|u1", "data": (self.ptr, False), "version": 3}

    def __del__(self):
        try:
            self.free()
        except Exception:  # noqa: BLE001 - at interpreter exit the driver may be gone
            pass

    def free(self) -> None:
        """Unmaps and releases the allocation here. Idempotent."""
        if getattr(self, "_handle", None) is None:
            return
        d = self._d
        d.make_current(self.device)
        if self.ptr:
            d.lib.cuMemUnmap(ctypes.c_uint64(self.ptr), ctypes.c_size_t(self.mapped))
            d.lib.cuMemAddressFree(ctypes.c_uint64(self.ptr), ctypes.c_size_t(self.mapped))
        d.lib.cuMemRelease(ctypes.c_uint64(self._handle))
        self._handle = None
        self.ptr = 0


def close_fd(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass
