"""A map-style dataset of S3 objects for data loaders (torch's or your own).

    ds = ObjectDataset(lambda: s3dma.Client(), "data", keys, max_size=8 << 20,
                       slots=batch_size)
    sample = ds[i]          # numpy uint8 view of the object's bytes, no copy

Fork safety: a gRPC channel does not survive ``fork``, and a lease shared
with forked workers mixes their fd requests. So the dataset never pickles
or inherits a client: it holds a *factory* (any picklable callable that
returns a :class:`s3dma.Client`, e.g. ``functools.partial(s3dma.Client,
path)``) and creates the client and its buffers lazily, once per process,
on the first ``__getitem__`` in that process. A dataset that was used in the
parent before a loader forked its workers simply starts over in each worker
(the parent's client is left alone: closing it from a child would close the
parent's connections).

Each process owns a ring of ``slots`` buffers of ``max_size`` bytes. The
array ``ds[i]`` returns is a view of one of them, valid until ``slots``
further items are read in the same process: with a loader that batches
items (torch's ``default_collate`` stacks them), use ``slots >= batch_size``,
or ``copy=True`` to get private arrays.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Callable, List, Optional, Sequence

from .client import Buffer, Client


class ObjectDataset:
    def __init__(
        self,
        client_factory: Callable[[], Client],
        bucket: str,
        keys: Sequence[str],
        max_size: int,
        *,
        slots: int = 1,
        dtype: Any = None,
        as_torch: bool = False,
        copy: bool = False,
        label: str = "dataset",
    ):
        if max_size <= 0:
            raise ValueError("max_size must be positive")
        if slots < 1:
            raise ValueError("slots must be at least 1")
        self.client_factory = client_factory
        self.bucket = bucket
        self.keys = list(keys)
        self.max_size = max_size
        self.slots = slots
        self.dtype = dtype
        self.as_torch = as_torch
        self.copy = copy
        self.label = label
        self._state_pid: Optional[int] = None
        self._client: Optional[Client] = None
        self._buffers: List[Buffer] = []
        self._next = 0
        self._lock = threading.Lock()

    # Pickled into spawn/forkserver workers: only the recipe travels.
    def __getstate__(self):
        d = dict(self.__dict__)
        d.update(_state_pid=None, _client=None, _buffers=[], _next=0, _lock=None)
        return d

    def __setstate__(self, d):
        self.__dict__.update(d)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.keys)

    def _ensure(self) -> Client:
        pid = os.getpid()
        if self._state_pid != pid:
            # Fresh process (or first use): never touch an inherited client.
            if self._client is not None:
                _inherited.append((self._client, self._buffers))
            self._client = self.client_factory()
            self._buffers = [self._client.alloc(self.max_size, label=f"{self.label}[{i}]") for i in range(self.slots)]
            self._next = 0
            self._state_pid = pid
        return self._client  # type: ignore[return-value]

    def __getitem__(self, index: int):
        if index < 0:
            index += len(self.keys)
        key = self.keys[index]
        with self._lock:
            client = self._ensure()
            buf = self._buffers[self._next]
            self._next = (self._next + 1) % self.slots
        r = client.get_object_into(self.bucket, key, buf)
        if self.as_torch:
            t = buf.torch(self.dtype, count=self._count(r.bytes_placed, torch_dtype=True))
            return t.clone() if self.copy else t
        a = r.numpy(self.dtype)
        return a.copy() if self.copy else a

    def _count(self, nbytes: int, torch_dtype: bool = False) -> int:
        import torch

        dtype = self.dtype if self.dtype is not None else torch.uint8
        return nbytes // torch.empty((), dtype=dtype).element_size()

    def close(self) -> None:
        """Closes this process's client (its buffers go with the lease)."""
        if self._client is not None and self._state_pid == os.getpid():
            self._client.close()
        self._client = None
        self._buffers = []
        self._state_pid = None


# Clients inherited over fork are kept referenced here so that garbage
# collection in the child never closes the parent's gRPC channel.
_inherited: list = []
