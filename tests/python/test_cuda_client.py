"""CUDA device memory through the Python client: ``Client.register_cuda_fd``
with the POSIX fd of a ``cuMemCreate`` allocation and ``Client.alloc_cuda``,
GETs into device memory and PUTs from it through `s3dma local` (host-shim,
dpu-agent, storage-target processes); legacy IPC handles
(``Client.register_cuda``) refused by the default shim.

The test process is the tenant: it allocates device memory with the driver
API (ctypes on ``libcuda.so.1``), exports it with
``cuMemExportToShareableHandle`` and checks the bytes with ``cuMemcpyDtoH``. The driver is whichever
``libcuda.so.1`` loads: the real one on a GPU host, or the test-only
stand-in that ``.ci/cuda-standin.sh`` builds and puts on
``LD_LIBRARY_PATH`` (with a host-shim built with the ``cuda`` feature).
Without a driver the device tests skip, unless ``S3DMA_REQUIRE_CUDA=1``
makes that a failure; the refusal test runs everywhere.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import sys
import uuid
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from tenant_stack import BUCKET  # noqa: E402

import s3dma  # noqa: E402

MIB = 1 << 20


class Driver:
    """The few driver calls a tenant needs to export device memory."""

    def __init__(self):
        self.lib = ctypes.CDLL("libcuda.so.1")
        self._ok(self.lib.cuInit(0), "cuInit")
        dev = ctypes.c_int()
        self._ok(self.lib.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
        ctx = ctypes.c_void_p()
        self._ok(self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
        self._ok(self.lib.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
        self._keep = []

    def _ok(self, rc: int, what: str) -> None:
        if rc != 0:
            msg = ctypes.c_char_p()
            self.lib.cuGetErrorString(rc, ctypes.byref(msg))
            raise RuntimeError(f"{what}: CUDA error {rc} ({(msg.value or b'?').decode()})")

    def alloc(self, n: int) -> int:
        ptr = ctypes.c_uint64()
        self._ok(self.lib.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(n)), "cuMemAlloc")
        return ptr.value

    def free(self, ptr: int) -> None:
        self._ok(self.lib.cuMemFree_v2(ctypes.c_uint64(ptr)), "cuMemFree")

    def alloc_shareable(self, n: int):
        """(ptr, fd, size): cuMemCreate with a POSIX fd handle type, mapped here."""
        from s3dma import cuda

        a = cuda.ShareableAllocation(n, 0)
        self._keep.append(a)
        return a.ptr, a.export_fd(), a

    def ipc_handle(self, ptr: int) -> bytes:
        handle = (ctypes.c_char * 64)()
        self._ok(self.lib.cuIpcGetMemHandle(handle, ctypes.c_uint64(ptr)), "cuIpcGetMemHandle")
        return bytes(handle)

    def to_device(self, ptr: int, data: bytes) -> None:
        self._ok(self.lib.cuMemcpyHtoD_v2(ctypes.c_uint64(ptr), data, ctypes.c_size_t(len(data))), "cuMemcpyHtoD")

    def to_host(self, ptr: int, n: int) -> bytes:
        out = ctypes.create_string_buffer(n)
        self._ok(self.lib.cuMemcpyDtoH_v2(out, ctypes.c_uint64(ptr), ctypes.c_size_t(n)), "cuMemcpyDtoH")
        return out.raw


def load_driver():
    try:
        return Driver(), None
    except (OSError, RuntimeError) as e:
        return None, str(e)


DRIVER, NO_DRIVER = load_driver()


def need_driver():
    if DRIVER is not None:
        return DRIVER
    why = f"no usable CUDA driver ({NO_DRIVER}); .ci/cuda-standin.sh runs these against the stand-in"
    if os.environ.get("S3DMA_REQUIRE_CUDA") == "1":
        pytest.fail(f"S3DMA_REQUIRE_CUDA=1 but {why}", pytrace=False)
    pytest.skip(why)


def test_handles_of_the_wrong_size_are_refused_before_the_shim(client):
    with pytest.raises(ValueError, match="64 bytes"):
        client.register_cuda(b"\0" * 63, 4096)
    with pytest.raises(ValueError, match="positive"):
        client.register_cuda(b"\0" * 64, 0)


def test_a_handle_that_names_no_memory_is_a_clear_error(client):
    # Whatever the shim was built with: no feature, no driver, or a driver
    # that cannot open garbage. Nothing is registered.
    before = len(client.list_buffers())
    with pytest.raises(s3dma.S3dmaError) as e:
        client.register_cuda(os.urandom(64), 1 * MIB, label="garbage")
    assert e.value.code, e.value
    assert "cuda" in str(e.value).lower() or "handle" in str(e.value).lower(), e.value
    assert len(client.list_buffers()) == before


def test_legacy_ipc_handles_are_refused_naming_the_fd_way(client):
    """Issue 30 finding 13: a legacy handle is refused by a default shim,
    with the supported way named; nothing is registered."""
    drv = need_driver()
    dptr = drv.alloc(MIB)
    try:
        before = len(client.list_buffers())
        with pytest.raises(s3dma.Unsupported) as e:
            client.register_cuda(drv.ipc_handle(dptr), MIB)
        assert "cuMemExportToShareableHandle" in str(e.value) and "alloc_cuda" in str(e.value), e.value
        assert len(client.list_buffers()) == before
    finally:
        drv.free(dptr)


def test_get_into_and_put_from_device_memory(client):
    """Issue 30 finding 13: the fd way registers device memory; GETs land
    in it and PUTs read from it (bytes checked through the driver)."""
    drv = need_driver()
    n = 4 * MIB
    key = f"py-cuda-{uuid.uuid4().hex[:10]}"
    payload = os.urandom(3 * MIB + 17)
    with client.alloc(len(payload)) as host:
        host.memoryview()[:] = payload
        client.put_object_from(BUCKET, key, host)

    dptr, fd, alloc = drv.alloc_shareable(n)
    try:
        fill = b"\xa5" * n
        drv.to_device(dptr, fill)
        cbuf = client.register_cuda_fd(fd, n, label="py-cuda")
        os.close(fd)  # the shim holds its own reference
        with cbuf:
            assert cbuf.id in [b.id for b in client.list_buffers() if b.kind == "cuda"]
            # At an offset: the bytes land there and nothing around them moves.
            off = 4096 + 3
            r = client.get_object_into(BUCKET, key, cbuf, offset=off)
            assert r.bytes_placed == len(payload) and r.buffer is None
            dev = drv.to_host(dptr, n)
            assert dev[off : off + len(payload)] == payload
            assert dev[:off] == fill[:off] and dev[off + len(payload) :] == fill[off + len(payload) :]

            # A suffix range into the start of the buffer.
            r = client.get_object_into(BUCKET, key, cbuf, range="-1000")
            assert r.bytes_placed == 1000 and r.range_start == len(payload) - 1000
            assert drv.to_host(dptr, 1000) == payload[-1000:]

            # PUT from device memory, read back through a host buffer.
            back_key = key + "-back"
            drv.to_device(dptr, payload)
            p = client.put_object_from(BUCKET, back_key, cbuf, length=len(payload))
            assert p.size == len(payload)
            with client.alloc(len(payload)) as host:
                r = client.get_object_into(BUCKET, back_key, host)
                assert hashlib.sha256(r.memoryview()).digest() == hashlib.sha256(payload).digest()

            # Past the registered size: refused, nothing read.
            with pytest.raises(s3dma.S3dmaError):
                client.get_object_into(BUCKET, key, cbuf, offset=n - 10)
        assert cbuf.released
        assert all(b.kind != "cuda" for b in client.list_buffers())
        client.delete(BUCKET, key)
        client.delete(BUCKET, back_key)
    finally:
        alloc.free()


def test_alloc_cuda_owns_its_allocation(client):
    drv = need_driver()
    key = f"py-cuda-alloc-{uuid.uuid4().hex[:10]}"
    payload = os.urandom(MIB + 1)
    with client.alloc(len(payload)) as host:
        host.memoryview()[:] = payload
        client.put_object_from(BUCKET, key, host)
    with client.alloc_cuda(2 * MIB, label="owned") as cbuf:
        assert cbuf.ptr and cbuf.__cuda_array_interface__["data"][0] == cbuf.ptr
        client.get_object_into(BUCKET, key, cbuf, offset=5)
        assert drv.to_host(cbuf.ptr + 5, len(payload)) == payload
    # Released at the shim; the allocation lives as long as the object.
    assert cbuf.released
    assert all(b.kind != "cuda" for b in client.list_buffers())
    assert drv.to_host(cbuf.ptr + 5, len(payload)) == payload
    cbuf.free()
    assert cbuf.ptr == 0
    client.delete(BUCKET, key)


def test_fds_that_are_not_cuda_memory_are_refused(client):
    """Issue 30 finding 13: a memfd or a pipe passed as a CUDA fd does not
    register; nothing is held."""
    need_driver()
    before = len(client.list_buffers())
    memfd = os.memfd_create("not-cuda")
    os.ftruncate(memfd, 2 * MIB)
    r, w = os.pipe()
    try:
        for fd in (memfd, r):
            with pytest.raises(s3dma.S3dmaError) as e:
                client.register_cuda_fd(fd, MIB)
            assert "cuMemImportFromShareableHandle" in str(e.value), e.value
    finally:
        for fd in (memfd, r, w):
            os.close(fd)
    assert len(client.list_buffers()) == before


def test_torch_views_device_memory_from_alloc_cuda(client):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no GPU (the stand-in serves the driver API only); runs on a GPU host")
    key = f"py-cuda-torch-{uuid.uuid4().hex[:10]}"
    payload = os.urandom(MIB)
    with client.alloc(len(payload)) as host:
        host.memoryview()[:] = payload
        client.put_object_from(BUCKET, key, host)
    cbuf = client.alloc_cuda(2 * MIB, label="torch")
    t = torch.as_tensor(cbuf, device="cuda")
    try:
        t.zero_()
        torch.cuda.synchronize()
        client.get_object_into(BUCKET, key, cbuf, offset=4096, length=len(payload))
        assert bytes(t[4096 : 4096 + len(payload)].cpu().numpy()) == payload
        assert int(t[:4096].sum()) == 0
    finally:
        cbuf.release()
        client.delete(BUCKET, key)
    # The tensor keeps the allocation after the registration ends.
    del cbuf
    assert int(t[:4096].sum()) == 0
