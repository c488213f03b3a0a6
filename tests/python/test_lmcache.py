"""LMCache's remote-storage plug-in over s3dma (python/s3dma/lmcache.py),
with the real lmcache package on CPU against a real `s3dma local`
(tenant_stack.py).

* The connector's contract, through LMCache's own factory
  (``CreateConnector("plugin://s3dma", ...)`` with the plug-in config a user
  writes): put/get bit-exact with both ``save_chunk_meta`` settings, partial
  last chunks, missing keys, chunks of another size, exists, list, the
  batched calls (one GetObjects or PutObjects per slab-full, one
  HeadObjects per existence check; a chunk that fails fails alone), direct
  placement into registered memory vs the staged
  path of LMCache's default allocator, a forked process, and an outage of
  the agent and of the shim of a private agent + shim (LMCache's
  RemoteBackend answers "missing" and goes on; the backend reconnects).
* An LMCache engine configured with the ``s3dma`` plug-in stores the KV of a
  small synthetic model (4 layers, 2 KV heads of 64, bf16, chunks of 256
  tokens, a partial last chunk) through a CPU stand-in for vLLM's paged
  KV connector, retrieves it bit-exact, and a fresh engine on the same
  prefix finds every chunk again in s3dma. Over a private shim whose
  metrics count the calls it answers, an engine batch is one batched call
  (store: PutObjects, lookup: HeadObjects, retrieve: GetObjects).

lmcache is an optional extra: without it these tests skip, except under CI
(``$CI`` set), where they fail.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import multiprocessing
import os
import queue
import shutil
import socket as _socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest

os.environ.setdefault("LMCACHE_TRACK_USAGE", "false")  # no usage reports from tests
os.environ.setdefault("DO_NOT_TRACK", "1")

import tenant_stack  # noqa: E402
from tenant_stack import BUCKET, PY_CLIENT  # noqa: E402  (sets sys.path)

if os.environ.get("CI"):
    # CI installs lmcache (.ci/setup.sh): a missing one is a failure.
    import lmcache  # noqa: F401
    import torch
else:
    pytest.importorskip("lmcache", reason="lmcache is not installed (pip install 's3dma[lmcache]')")
    import torch

from lmcache.utils import CacheEngineKey  # noqa: E402
from lmcache.v1.cache_engine import LMCacheEngineBuilder  # noqa: E402
from lmcache.v1.config import LMCacheEngineConfig  # noqa: E402
from lmcache.v1.gpu_connector.gpu_connectors import GPUConnectorInterface  # noqa: E402
from lmcache.v1.memory_allocators.tensor_memory_allocator import TensorMemoryAllocator  # noqa: E402
from lmcache.v1.memory_management import MemoryFormat  # noqa: E402
from lmcache.v1.metadata import LMCacheMetadata  # noqa: E402
from lmcache.v1.protocol import RemoteMetadata  # noqa: E402
from lmcache.v1.storage_backend.connector import CreateConnector  # noqa: E402
from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend  # noqa: E402
from lmcache.v1.storage_backend.remote_backend import RemoteBackend  # noqa: E402

import s3dma  # noqa: E402
import s3dma.lmcache as s3lmc  # noqa: E402

KIB = 1024
MIB = 1024 * KIB

# The synthetic model: 4 layers, 2 KV heads of 64, bf16.
LAYERS, KV_HEADS, HEAD_SIZE = 4, 2, 64
HIDDEN = KV_HEADS * HEAD_SIZE
DTYPE = torch.bfloat16


# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------


def plugin_config(url: str, *, chunk_size: int, save_chunk_meta=True, extra=None, **top) -> LMCacheEngineConfig:
    """The config a user writes: the ``s3dma`` remote-storage plug-in."""
    extra_config = {
        "remote_storage_plugin.s3dma.module_path": "s3dma.lmcache",
        "remote_storage_plugin.s3dma.class_name": "S3dmaConnectorAdapter",
        "remote_storage_plugin.s3dma.url": url,
        "save_chunk_meta": save_chunk_meta,
        "fallback_policy": "local_cpu",
    }
    extra_config.update(extra or {})
    cfg = {
        "chunk_size": chunk_size,
        "local_cpu": True,
        "max_local_cpu_size": 0.02,
        "remote_storage_plugins": ["s3dma"],
        "remote_serde": "naive",
        "extra_config": extra_config,
    }
    cfg.update(top)
    return LMCacheEngineConfig.from_dict(cfg)


def model_metadata(chunk_size: int, name: str = "synthetic/tiny") -> LMCacheMetadata:
    return LMCacheMetadata(
        model_name=name,
        world_size=1,
        local_world_size=1,
        worker_id=0,
        local_worker_id=0,
        kv_dtype=DTYPE,
        kv_shape=(LAYERS, 2, chunk_size, KV_HEADS, HEAD_SIZE),
        chunk_size=chunk_size,
    )


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int16)


class Env:
    """What LMCache hands a connector: a config, the model's metadata, a
    LocalCPUBackend and an event loop on its own thread; and the connector
    LMCache's factory makes from the plug-in config."""

    def __init__(self, url: str, *, chunk_size: int = 16, save_chunk_meta=True, extra=None, memory_allocator=None):
        self.config = plugin_config(url, chunk_size=chunk_size, save_chunk_meta=save_chunk_meta, extra=extra)
        self.metadata = model_metadata(chunk_size)
        self.chunk_size = chunk_size
        self.backend = LocalCPUBackend(self.config, self.metadata, memory_allocator=memory_allocator)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.conn = CreateConnector(
            "plugin://s3dma", self.loop, self.backend, self.config, self.metadata, plugin_name="s3dma"
        )
        self.raw: s3lmc.S3dmaConnector = self.conn.getWrappedConnector()
        self.hashes = iter(range(1, 1 << 30))

    def run(self, coro, timeout: float = 60):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def key(self, h: int | None = None) -> CacheEngineKey:
        return CacheEngineKey("synthetic/tiny", 1, 0, next(self.hashes) if h is None else h, DTYPE)

    def chunk(self, tokens: int | None = None, seed: int = 0):
        """A memory object of ``tokens`` tokens (a full chunk by default)
        filled with random bf16, and a copy of its tensor."""
        tokens = self.chunk_size if tokens is None else tokens
        obj = self.backend.allocate(self.metadata.get_shapes(tokens), self.metadata.get_dtypes(), MemoryFormat.KV_2LTD)
        assert obj is not None
        g = torch.Generator().manual_seed(seed)
        data = torch.randn(tuple(obj.tensor.shape), generator=g).to(DTYPE)
        obj.tensor.copy_(data)
        return obj, data

    def put(self, key, tokens=None, seed=0) -> torch.Tensor:
        obj, data = self.chunk(tokens, seed)
        self.run(self.conn.put(key, obj))  # the wrapper drops the reference
        return data

    def close(self):
        try:
            self.run(self.conn.close())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
            close = getattr(self.backend.memory_allocator, "close", None)
            if close is not None:
                close()


@pytest.fixture
def prefix():
    return f"lmc-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def env_factory(stack):
    made = []

    def make(prefix: str, **kw) -> Env:
        e = Env(f"s3dma://{BUCKET}/{prefix}?socket={stack.socket}", **kw)
        made.append(e)
        return e

    yield make
    for e in made:
        e.close()


def object_of(client, key: str) -> tuple[bytes, dict]:
    info = client.head(BUCKET, key)
    with client.alloc(max(info.size, 1)) as buf:
        r = client.get_object_into(BUCKET, key, buf, length=info.size)
        mv = buf.memoryview()
        try:
            return bytes(mv[: r.bytes_placed]), r.metadata
        finally:
            mv.release()


class Counting:
    """Counts (and keeps the arguments of) one client method's calls."""

    def __init__(self, client, name: str):
        self.client, self.name = client, name
        self.real = getattr(client, name)
        self.calls: list = []

    def __enter__(self):
        def wrapper(*a, **kw):
            self.calls.append((a, kw))
            return self.real(*a, **kw)

        setattr(self.client, self.name, wrapper)
        return self

    def __exit__(self, *exc):
        delattr(self.client, self.name)


# ---------------------------------------------------------------------------
# options (no server)
# ---------------------------------------------------------------------------


def test_options_from_urls_and_extra_config():
    o = s3lmc.parse_options("s3dma://kv/llama-8b?socket=/tmp/s.sock&slab_mib=64&concurrency=4")
    assert (o.bucket, o.prefix, o.socket, o.slab_bytes, o.concurrency) == ("kv", "llama-8b/", "/tmp/s.sock", 64 * MIB, 4)
    assert s3lmc.parse_options("s3dma://kv").prefix == ""
    # extra_config keys win over the URL's query
    o = s3lmc.parse_options("s3dma://kv/a?concurrency=4", {"concurrency": 8, "prefix": "b/c"})
    assert (o.concurrency, o.prefix) == (8, "b/c/")
    o = s3lmc._options_from_config(
        plugin_config("s3dma://kv/p?timeout=5", chunk_size=16, extra={"remote_storage_plugin.s3dma.exists_via": "head"}),
        "s3dma",
        "plugin://s3dma",
    )
    assert (o.bucket, o.prefix, o.timeout, o.exists_via) == ("kv", "p/", 5.0, "head")
    assert s3lmc.parse_options("s3dma://kv?exists_via=auto").exists_via == "head"
    o = s3lmc.parse_options("s3dma://kv?batch_items=100")
    assert (o.batch_items, s3lmc.parse_options("s3dma://kv").batch_items) == (100, 1024)
    for bad, why in [
        ("s3://kv/p", "s3dma://bucket"),
        ("s3dma:///p", "bucket is empty"),
        ("s3dma://kv?bogus=1", "unknown option 'bogus'"),
        ("s3dma://kv?exists_via=get", "head \\(or auto\\) or list"),
        ("s3dma://kv?batch_items=0", "at least 1"),
        ("s3dma://kv?list_min_keys=8", "unknown option 'list_min_keys'"),
        ("s3dma://kv?concurrency=0", "at least 1"),
        ("s3dma://kv?timeout=soon", "not a number"),
    ]:
        with pytest.raises(ValueError, match=why):
            s3lmc.parse_options(bad)
    cfg = LMCacheEngineConfig.from_dict({"remote_storage_plugins": ["s3dma"], "extra_config": {}})
    with pytest.raises(ValueError, match="remote_storage_plugin.s3dma.url"):
        s3lmc._options_from_config(cfg, "s3dma", "plugin://s3dma")

    a = s3lmc.S3dmaConnectorAdapter()
    assert a.can_parse("s3dma://kv/p") and a.can_parse("plugin://s3dma") and a.can_parse("plugin://s3dma.fast")
    assert not a.can_parse("plugin://fs") and not a.can_parse("s3://kv")


# ---------------------------------------------------------------------------
# the connector's contract
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("save_chunk_meta", [True, False], ids=["meta", "no-meta"])
def test_put_get_exists_list_bit_exact(env_factory, client, prefix, save_chunk_meta):
    env = env_factory(prefix, save_chunk_meta=save_chunk_meta)
    assert env.raw.save_chunk_meta is save_chunk_meta
    assert env.raw.placement == "staged"  # LMCache's own CPU pool is not registrable

    full_key, part_key = env.key(), env.key()
    full = env.put(full_key, seed=1)
    part = env.put(part_key, tokens=5, seed=2)  # a partial last chunk

    got = env.run(env.conn.get(full_key))
    assert got is not None and got.get_shapes() == env.metadata.get_shapes()
    assert torch.equal(bits(got.tensor), bits(full))
    got.ref_count_down()
    got = env.run(env.conn.get(part_key))
    assert got is not None and list(got.tensor.shape) == [2, LAYERS, 5, HIDDEN]
    assert torch.equal(bits(got.tensor), bits(part))
    got.ref_count_down()

    # The object's body is the chunk's bytes; LMCache's RemoteMetadata rides
    # along as user metadata.
    body, meta = object_of(client, f"{prefix}/{part_key.to_string()}")
    assert body == bytes(bits(part).numpy().tobytes())
    rm = RemoteMetadata.deserialize(base64.b64decode(meta[s3lmc.META_KEY]))
    assert rm.length == len(body) and rm.fmt == MemoryFormat.KV_2LTD and rm.dtypes == [DTYPE]
    assert list(rm.shapes[0]) == [2, LAYERS, 5, HIDDEN]

    assert env.run(env.conn.exists(full_key)) and env.conn.exists_sync(part_key)
    assert sorted(env.run(env.conn.list())) == sorted([full_key.to_string(), part_key.to_string()])
    assert env.conn.remove_sync(part_key) and not env.conn.exists_sync(part_key)
    assert env.run(env.conn.ping()) == 0


def test_missing_keys_are_none_not_errors(env_factory, prefix):
    env = env_factory(prefix)
    k1, missing, k3 = env.key(), env.key(), env.key()
    d1, d3 = env.put(k1, seed=3), env.put(k3, seed=4)
    assert env.run(env.conn.get(missing)) is None
    assert not env.run(env.conn.exists(missing)) and not env.conn.exists_sync(missing)
    objs = env.run(env.conn.batched_get([k1, missing, k3]))
    assert objs[1] is None
    assert torch.equal(bits(objs[0].tensor), bits(d1)) and torch.equal(bits(objs[2].tensor), bits(d3))
    for o in (objs[0], objs[2]):
        o.ref_count_down()
    # batched_get_non_blocking: the leading chunks only
    objs = env.run(env.conn.batched_get_non_blocking("lookup-1", [k1, missing, k3]))
    assert len(objs) == 1 and torch.equal(bits(objs[0].tensor), bits(d1))
    objs[0].ref_count_down()
    assert env.conn.batched_contains([k1, missing, k3]) == 1
    assert env.run(env.conn.batched_async_contains("lookup-2", [missing, k1])) == 0
    assert env.run(env.conn.batched_get([])) == [] and env.conn.batched_contains([]) == 0


def test_chunks_of_another_size_read_as_missing(env_factory, client, prefix):
    env = env_factory(prefix, save_chunk_meta=False)
    small, large, odd = env.key(), env.key(), env.key()
    token_bytes = env.raw.single_token_size
    with client.alloc(env.raw.full_chunk_size_bytes * 2) as buf:
        client.put_object_from(BUCKET, f"{prefix}/{small.to_string()}", buf, length=token_bytes * 3 + 1)
        client.put_object_from(
            BUCKET, f"{prefix}/{large.to_string()}", buf, length=env.raw.full_chunk_size_bytes + token_bytes
        )
        client.put_object_from(BUCKET, f"{prefix}/{odd.to_string()}", buf, length=0)
    assert env.run(env.conn.batched_get([small, large, odd])) == [None, None, None]
    # with save_chunk_meta, metadata that disagrees with the body is refused too
    env2 = env_factory(prefix, save_chunk_meta=True)
    k = env2.key()
    meta = RemoteMetadata(123, env2.metadata.get_shapes(), env2.metadata.get_dtypes(), MemoryFormat.KV_2LTD)
    with client.alloc(4096) as buf:
        client.put_object_from(
            BUCKET,
            f"{prefix}/{k.to_string()}",
            buf,
            length=token_bytes,
            metadata={s3lmc.META_KEY: base64.b64encode(meta.serialize()).decode()},
        )
    assert env2.run(env2.conn.get(k)) is None
    assert env2.conn.exists_sync(k)  # it exists; it just is not a chunk of this engine


def test_batched_calls_are_one_call_per_batch(env_factory, client, prefix):
    # A slab of 8 chunks (of 32 KiB): 8 chunks are one GetObjects or
    # PutObjects call, 10 are two.
    env = env_factory(prefix, extra={"remote_storage_plugin.s3dma.slab_mib": 0.25})
    keys = [env.key() for _ in range(10)]
    objs, datas = zip(*(env.chunk(seed=10 + i) for i in range(10)))
    raw_client = env.raw.client
    with Counting(raw_client, "put_objects") as puts, Counting(raw_client, "put_object_from") as singles:
        env.run(env.conn.batched_put(keys[:8], list(objs[:8])))
        assert (len(puts.calls), len(singles.calls)) == (1, 0), "8 chunks that fit the slab are one PutObjects call"
        env.run(env.conn.batched_put(keys[8:], list(objs[8:])))
    assert [len(a[0]) for a, _ in puts.calls] == [8, 2] and not singles.calls
    slots = env.raw._proc().slots(env.raw.full_chunk_size_bytes)
    assert slots.count == 8
    with Counting(raw_client, "get_objects") as gets:
        got = env.run(env.conn.batched_get(keys[:8]))
    assert len(gets.calls) == 1, "8 chunks that fit the slab are one GetObjects call"
    assert all(torch.equal(bits(o.tensor), bits(d)) for o, d in zip(got, datas))
    for o in got:
        o.ref_count_down()
    with Counting(raw_client, "get_objects") as gets:
        got = env.run(env.conn.batched_get(keys))
    assert len(gets.calls) == 2 and all(torch.equal(bits(o.tensor), bits(d)) for o, d in zip(got, datas))
    for o in got:
        o.ref_count_down()

    # Existence of many keys: one HeadObjects call, no HEAD and no listing;
    # the count ends at the first missing chunk.
    missing = env.key()
    with Counting(raw_client, "head_objects") as batches, Counting(raw_client, "head") as heads, Counting(
        raw_client, "list"
    ) as lists:
        assert env.conn.batched_contains(keys) == 10
        assert env.run(env.conn.batched_async_contains("l", keys[:5] + [missing] + keys[5:])) == 5
        assert env.conn.batched_contains([missing] + keys) == 0
    assert [len(a[0]) for a, _ in batches.calls] == [10, 11, 11]
    assert (len(heads.calls), len(lists.calls)) == (0, 0)

    # batch_items splits a check into calls of at most that many keys, and
    # no call is made for keys after a missing one.
    e = env_factory(prefix, extra={"remote_storage_plugin.s3dma.batch_items": 4})
    with Counting(e.raw.client, "head_objects") as batches:
        assert e.conn.batched_contains(keys) == 10
        assert e.conn.batched_contains(keys[:2] + [missing] + keys[2:]) == 2
    assert [len(a[0]) for a, _ in batches.calls] == [4, 4, 2, 4]

    # exists_via=list pages through a listing (pages of 3 here) and never HEADs.
    e = env_factory(prefix, extra={"remote_storage_plugin.s3dma.exists_via": "list"})
    with Counting(e.raw.client, "list") as lists, Counting(e.raw.client, "head_objects") as batches:
        original = s3lmc._LIST_PAGE
        s3lmc._LIST_PAGE = 3
        try:
            assert e.conn.batched_contains(keys) == 10
            assert e.conn.batched_contains(keys[:3] + [missing]) == 3
        finally:
            s3lmc._LIST_PAGE = original
    assert len(lists.calls) >= 5 and not batches.calls
    assert sorted(env.run(env.conn.list())) == sorted(k.to_string() for k in keys)


def test_a_batched_put_stores_the_good_chunks_when_one_fails(env_factory, client, prefix):
    # A chunk larger than a staging slot (the engine's full chunk) fails
    # alone; the others of the batch are stored by the same PutObjects call.
    env = env_factory(prefix, save_chunk_meta=True)
    keys = [env.key() for _ in range(3)]
    good = [env.chunk(seed=50), env.chunk(tokens=3, seed=51)]
    big = env.backend.allocate(
        env.metadata.get_shapes(2 * env.chunk_size), env.metadata.get_dtypes(), MemoryFormat.KV_2LTD
    )
    assert big is not None
    with Counting(env.raw.client, "put_objects") as puts:
        with pytest.raises(s3dma.InvalidArgument, match="1 of 3 chunk PUTs failed.*more than a staging slot"):
            # the raw connector: LMCache's wrapper logs the error and drops it
            env.run(env.raw.batched_put(keys, [good[0][0], big, good[1][0]]))
    assert len(puts.calls) == 1
    assert env.conn.batched_contains(keys[:1]) == 1 and not env.conn.exists_sync(keys[1])
    got = env.run(env.conn.batched_get([keys[0], keys[2]]))
    assert torch.equal(bits(got[0].tensor), bits(good[0][1])) and torch.equal(bits(got[1].tensor), bits(good[1][1]))
    for o in got:
        o.ref_count_down()


def test_direct_placement_into_registered_memory(env_factory, prefix):
    # LMCache's pool inside a Buffer of the backend's own client: chunks land
    # in their memory objects, and no staging slab is ever registered.
    env = env_factory(prefix)
    pool = env.raw.client.alloc(2 * MIB, label="lmcache-pool")
    env.backend.memory_allocator = TensorMemoryAllocator(pool.torch())
    assert env.raw.placement == "direct"
    keys = [env.key() for _ in range(3)]
    datas = [env.put(keys[0], seed=20), env.put(keys[1], tokens=7, seed=21)]
    with Counting(env.raw.client, "get_objects") as gets:
        got = env.run(env.conn.batched_get(keys))
    assert got[2] is None
    assert all(torch.equal(bits(o.tensor), bits(d)) for o, d in zip(got, datas))
    assert list(got[1].tensor.shape) == [2, LAYERS, 7, HIDDEN]
    (items,), _ = gets.calls[0]
    assert all(it.buffer is pool for it in items)
    assert env.raw._proc()._slots is None
    for o in got[:2]:
        o.ref_count_down()


_FORKED = textwrap.dedent(
    """
    import os, sys, asyncio
    sys.path.insert(0, {tests!r}); sys.path.insert(0, {path!r})
    import test_lmcache as T
    env = T.Env({url!r})
    k1, k2 = env.key(1), env.key(2)
    d1 = env.put(k1, seed=31)                       # the parent uses it first
    parent_client = env.raw.client
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:                                    # a worker: no loop thread here
        os.close(r)
        ok = env.raw.client is not parent_client and env.raw._proc().pid == os.getpid()
        obj = asyncio.run(env.raw.get(k1))
        ok = ok and obj is not None and T.torch.equal(T.bits(obj.tensor), T.bits(d1))
        o2, d2 = env.chunk(seed=32)
        asyncio.run(env.raw.put(k2, o2))
        ok = ok and env.raw.batched_contains([k1, k2]) == 2
        T.torch.save(d2, {saved!r})
        os.write(w, b"ok" if ok else b"bad")
        os._exit(0)
    os.close(w)
    child = os.read(r, 10)
    _, status = os.waitpid(pid, 0)
    obj = env.run(env.conn.get(k2))                 # the parent's client still works
    same = obj is not None and T.torch.equal(T.bits(obj.tensor), T.bits(T.torch.load({saved!r})))
    print(child.decode(), status, same, env.raw.client is parent_client)
    env.close()
    """
)


def test_a_forked_worker_reconnects(stack, prefix, tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            _FORKED.format(
                tests=str(Path(__file__).parent),
                path=str(PY_CLIENT),
                url=f"s3dma://{BUCKET}/{prefix}?socket={stack.socket}",
                saved=str(tmp_path / "d2.pt"),
            ),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    assert out.stdout.strip().splitlines()[-1] == "ok 0 True True", out.stderr[-4000:]


# ---------------------------------------------------------------------------
# outages: a private agent and shim in front of the stack's storage-target
# ---------------------------------------------------------------------------


def _binary(name: str) -> str:
    p = tenant_stack.s3dma_bin().parent / name
    return str(p) if p.exists() else (shutil.which(name) or str(p))


class Front:
    """A dpu-agent and a host-shim of their own (configs from the stack's),
    each stoppable."""

    def __init__(self, stack, work: Path):
        import yaml

        self.work = work
        self.sockdir = Path(tempfile.mkdtemp(prefix="s3dma-lmc-"))
        self.socket = str(self.sockdir / "shim.sock")
        self.agent_cfg = yaml.safe_load((stack.dir / "dpu-agent.yaml").read_text())
        self.agent_cfg["listen"]["address"] = "127.0.0.1:0"
        self.shim_cfg = yaml.safe_load((stack.dir / "host-shim.yaml").read_text())
        self.shim_cfg["socket"]["path"] = self.socket
        self.shim_cfg["fabric"]["listen"] = "127.0.0.1:0"
        self.shim_cfg["metrics"] = {"address": "127.0.0.1:0"}
        self.metrics_url: str | None = None
        self.agent = self.shim = None

    def _spawn(self, name: str, cfg: dict):
        import yaml

        (self.work / f"{name}.yaml").write_text(yaml.safe_dump(cfg))
        log = open(self.work / f"{name}.log", "ab")
        proc = subprocess.Popen(
            tenant_stack.with_pdeathsig(
                [_binary(name), "--config", str(self.work / f"{name}.yaml")]
            ),
            stdout=subprocess.PIPE,
            stderr=log,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        log.close()
        return proc

    def start_agent(self):
        self.agent = self._spawn("dpu-agent", self.agent_cfg)
        lines: queue.Queue = queue.Queue()
        threading.Thread(target=lambda: [lines.put(x) for x in self.agent.stdout] + [lines.put(None)], daemon=True).start()
        deadline = time.monotonic() + 60
        while True:
            line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            assert line is not None, (self.work / "dpu-agent.log").read_text()
            if line.startswith("dpu-agent listening on "):
                addr = line[len("dpu-agent listening on ") :].strip().removeprefix("http://")
                self.shim_cfg["agent"]["endpoint"] = f"http://{addr}"
                return

    def start_shim(self):
        self.shim = self._spawn("host-shim", self.shim_cfg)
        lines: queue.Queue = queue.Queue()
        threading.Thread(target=lambda: [lines.put(x) for x in self.shim.stdout] + [lines.put(None)], daemon=True).start()
        deadline = time.monotonic() + 60
        self.metrics_url = None
        while self.metrics_url is None:
            line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            assert line is not None, (self.work / "host-shim.log").read_text()
            if line.startswith("metrics on "):
                self.metrics_url = line[len("metrics on ") :].strip()
        while True:
            assert self.shim.poll() is None, (self.work / "host-shim.log").read_text()
            try:
                with _socket.socket(_socket.AF_UNIX) as s:
                    s.connect(self.socket)
                with s3dma.Client(self.socket) as c:
                    if c.info().agent_connected:
                        return
            except (OSError, s3dma.S3dmaError):
                pass
            assert time.monotonic() < deadline, "the private host-shim did not start"
            time.sleep(0.05)

    @staticmethod
    def _stop(proc):
        if proc is not None and proc.poll() is None:
            proc.send_signal(2)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def calls(self) -> dict:
        """The shim's tenant calls so far by operation
        (``s3dma_shim_requests_total``, every tenant and outcome)."""
        import urllib.request

        with urllib.request.urlopen(self.metrics_url, timeout=10) as r:
            text = r.read().decode()
        out: dict = {}
        for line in text.splitlines():
            if line.startswith("s3dma_shim_requests_total{"):
                labels, _, value = line.rpartition(" ")
                op = labels.split('op="', 1)[1].split('"', 1)[0]
                out[op] = out.get(op, 0) + int(float(value))
        return out

    def calls_since(self, before: dict) -> dict:
        now = self.calls()
        return {op: n - before.get(op, 0) for op, n in now.items() if n != before.get(op, 0)}

    def stop_agent(self):
        self._stop(self.agent)

    def stop_shim(self):
        self._stop(self.shim)

    def close(self):
        self.stop_shim()
        self.stop_agent()
        shutil.rmtree(self.sockdir, ignore_errors=True)


@pytest.fixture
def front(stack, tmp_path):
    tenant_stack.require_binaries()
    f = Front(stack, tmp_path)
    try:
        f.start_agent()
        f.start_shim()
        yield f
    finally:
        f.close()


def test_an_outage_is_a_clear_error_and_lmcache_goes_on(front, prefix):
    env = Env(
        f"s3dma://{BUCKET}/{prefix}?socket={front.socket}&retry_interval=0.2&timeout=10",
        extra={"remote_storage_plugin.s3dma.slab_mib": 1},
    )
    try:
        k, later = env.key(), env.key()
        data = env.put(k, seed=40)
        remote = RemoteBackend(env.config, env.metadata, env.loop, env.backend, plugin_name="s3dma")

        # The agent goes: the shim answers, every data call fails clearly.
        front.stop_agent()
        with pytest.raises(s3dma.Unavailable) as ei:
            env.run(env.conn.get(k))
        assert "agent" in str(ei.value).lower(), ei.value
        with pytest.raises(s3dma.Unavailable):
            env.conn.exists_sync(k)
        with pytest.raises(s3dma.Unavailable):
            env.run(env.conn.put(later, env.chunk(seed=41)[0]))
        with pytest.raises(s3dma.Unavailable):
            env.conn.batched_contains([k] * 10)
        assert env.run(env.conn.ping()) == s3lmc.PING_AGENT_DISCONNECTED
        # LMCache's RemoteBackend turns that into "not here" and goes on.
        assert remote.contains(k) is False
        assert remote.get_blocking(k) is None
        assert remote.batched_get_blocking([k]) == [None]

        # The shim goes too: ShimUnavailable, at once while retry_interval runs.
        front.stop_shim()
        with pytest.raises(s3dma.ShimUnavailable):
            env.conn.exists_sync(k)
        t = time.monotonic()
        with pytest.raises(s3dma.ShimUnavailable, match="shim"):
            env.run(env.conn.get(k))
        assert time.monotonic() - t < 1.0
        assert env.run(env.conn.ping()) == s3lmc.PING_SHIM_UNREACHABLE
        assert remote.get_blocking(k) is None

        # Both back (the same socket): the backend reconnects by itself.
        front.start_agent()
        front.start_shim()
        time.sleep(0.3)  # past retry_interval
        got = env.run(env.conn.get(k))
        assert got is not None and torch.equal(bits(got.tensor), bits(data))
        got.ref_count_down()
        assert env.run(env.conn.ping()) == 0
        remote.close()
    finally:
        env.close()


# ---------------------------------------------------------------------------
# an LMCache engine with the s3dma plug-in
# ---------------------------------------------------------------------------


class CPUPagedKV(GPUConnectorInterface):
    """A CPU stand-in for vLLM's paged KV connector: per layer a
    ``[2, slots, hidden]`` tensor, tokens at ``slot_mapping``; memory
    objects in LMCache's KV_2LTD layout ``[2, layers, tokens, hidden]``."""

    def __init__(self):
        self.kvcaches = None

    def from_gpu(self, memory_obj, start, end, **kw):
        slots = kw["slot_mapping"][start:end]
        for layer, kv in enumerate(kw["kvcaches"]):
            memory_obj.tensor[:, layer] = kv[:, slots]

    def to_gpu(self, memory_obj, start, end, **kw):
        slots = kw["slot_mapping"][start:end]
        for layer, kv in enumerate(kw["kvcaches"]):
            kv[:, slots] = memory_obj.tensor[:, layer]

    def batched_from_gpu(self, memory_objs, starts, ends, **kw):
        for m, s, e in zip(memory_objs, starts, ends):
            self.from_gpu(m, s, e, **kw)

    def batched_to_gpu(self, memory_objs, starts, ends, **kw):
        for m, s, e in zip(memory_objs, starts, ends):
            self.to_gpu(m, s, e, **kw)

    def get_shape(self, num_tokens):
        return torch.Size([2, LAYERS, num_tokens, HIDDEN])


LMCACHE_YAML = """\
chunk_size: {chunk}
local_cpu: true
max_local_cpu_size: 0.02
save_unfull_chunk: true
remote_serde: naive
remote_storage_plugins: ["s3dma"]
extra_config:
  remote_storage_plugin.s3dma.module_path: s3dma.lmcache
  remote_storage_plugin.s3dma.class_name: S3dmaConnectorAdapter
  remote_storage_plugin.s3dma.url: "{url}"
  save_chunk_meta: {save_chunk_meta}
  fallback_policy: local_cpu
"""


@contextlib.contextmanager
def engine(name: str, config, metadata):
    # LMCacheEngine sets the process's multiprocessing start method to
    # "spawn": put it back for the tests that share this worker.
    method = multiprocessing.get_start_method(allow_none=True)
    try:
        eng = LMCacheEngineBuilder.get_or_create(
            name, config, metadata, CPUPagedKV(), lambda t, s: None, lambda o, s: o
        )
    finally:
        multiprocessing.set_start_method(method, force=True)
    try:
        eng.post_init()
        yield eng
    finally:
        LMCacheEngineBuilder.destroy(name)


@pytest.mark.parametrize("save_chunk_meta", [True, False], ids=["meta", "no-meta"])
def test_an_lmcache_engine_stores_and_finds_kv_in_s3dma(stack, client, prefix, save_chunk_meta, tmp_path):
    chunk = 256  # LMCache's default
    url = f"s3dma://{BUCKET}/{prefix}?socket={stack.socket}"
    metadata = model_metadata(chunk)
    n = 3 * chunk + 100  # three full chunks and a partial one
    g = torch.Generator().manual_seed(7)
    tokens = torch.randint(0, 32000, (n,), generator=g)
    slot_mapping = torch.randperm(2048, generator=g)[:n]
    kv = [torch.randn(2, 2048, HIDDEN, generator=g).to(DTYPE) for _ in range(LAYERS)]

    def fresh_kv():
        return [torch.zeros_like(x) for x in kv]

    def same(got):
        return all(torch.equal(bits(a[:, slot_mapping]), bits(b[:, slot_mapping])) for a, b in zip(kv, got))

    # The config file a user writes (docs/ML.md), loaded as LMCache loads
    # $LMCACHE_CONFIG_FILE.
    config_file = tmp_path / "lmcache.yaml"
    config_file.write_text(
        LMCACHE_YAML.format(url=url, save_chunk_meta=str(save_chunk_meta).lower(), chunk=chunk)
    )
    cfg = LMCacheEngineConfig.from_file(str(config_file))
    assert cfg.remote_storage_plugins == ["s3dma"]
    with engine(f"s3dma-a-{prefix}", cfg, metadata) as eng:
        backends = eng.storage_manager.storage_backends
        assert "RemoteBackend-s3dma" in backends, list(backends)
        eng.store(tokens, kvcaches=kv, slot_mapping=slot_mapping)
        # The remote puts run in the background: wait for the four objects.
        deadline = time.monotonic() + 30
        while len(list(client.list_all(BUCKET, prefix=prefix + "/"))) < 4:
            assert time.monotonic() < deadline, "the chunks did not reach s3dma"
            time.sleep(0.05)
        got = fresh_kv()
        assert int(eng.retrieve(tokens, kvcaches=got, slot_mapping=slot_mapping).sum()) == n
        assert same(got)
    objs = list(client.list_all(BUCKET, prefix=prefix + "/"))
    sizes = sorted(o.size for o in objs)
    token_bytes = 2 * LAYERS * HIDDEN * 2
    assert sizes == [100 * token_bytes] + [chunk * token_bytes] * 3
    assert all(o.key.startswith(f"{prefix}/synthetic/tiny@1@0@") for o in objs)

    # A fresh engine (empty CPU tier) on the same prefix finds every chunk in
    # s3dma and reads it back bit-exact.
    with engine(f"s3dma-b-{prefix}", LMCacheEngineConfig.from_file(str(config_file)), metadata) as eng:
        local = eng.storage_manager.storage_backends["LocalCPUBackend"]
        assert not local.contains(next(iter(eng.token_database.process_tokens(tokens)))[2])
        assert eng.lookup(tokens) == n
        got = fresh_kv()
        assert int(eng.retrieve(tokens, kvcaches=got, slot_mapping=slot_mapping).sum()) == n
        assert same(got)
        # A longer prompt with the same prefix: the cached part is found.
        longer = torch.cat([tokens, torch.randint(0, 32000, (300,), generator=g)])
        assert eng.lookup(longer) == 3 * chunk
    for o in objs:
        client.delete(BUCKET, o.key)


def test_an_engine_batch_is_one_batched_call_at_the_shim(front, client, prefix):
    # An LMCache engine over a private shim, whose metrics count every call
    # it answers: storing 4 chunks is one PutObjects, a fresh engine's
    # lookup of them one HeadObjects, its retrieve one GetObjects, and no
    # single-object call at all.
    chunk = 64
    url = f"s3dma://{BUCKET}/{prefix}?socket={front.socket}"
    metadata = model_metadata(chunk)
    n = 4 * chunk
    g = torch.Generator().manual_seed(8)
    tokens = torch.randint(0, 32000, (n,), generator=g)
    slot_mapping = torch.randperm(1024, generator=g)[:n]
    kv = [torch.randn(2, 1024, HIDDEN, generator=g).to(DTYPE) for _ in range(LAYERS)]
    single = {"PutObject", "HeadObject", "GetObject", "ListObjects"}

    def config():
        return plugin_config(url, chunk_size=chunk)

    with engine(f"s3dma-c-{prefix}", config(), metadata) as eng:
        before = front.calls()
        eng.store(tokens, kvcaches=kv, slot_mapping=slot_mapping)
        # The remote put runs in the background: wait for the four objects
        # (listed through the stack's own shim) and the private shim's
        # answer to whatever stored them.
        deadline = time.monotonic() + 30
        while True:
            stored = front.calls_since(before)
            if {"PutObjects", "PutObject"} & set(stored) and len(list(client.list_all(BUCKET, prefix=prefix + "/"))) == 4:
                break
            assert time.monotonic() < deadline, f"the chunks did not reach s3dma: {stored}"
            time.sleep(0.05)
    assert stored.get("PutObjects") == 1 and not single & set(stored), stored

    with engine(f"s3dma-d-{prefix}", config(), metadata) as eng:
        before = front.calls()
        assert eng.lookup(tokens) == n
        looked = front.calls_since(before)
        assert looked.get("HeadObjects") == 1 and not single & set(looked), looked
        before = front.calls()
        got = [torch.zeros_like(x) for x in kv]
        assert int(eng.retrieve(tokens, kvcaches=got, slot_mapping=slot_mapping).sum()) == n
        fetched = front.calls_since(before)
        assert fetched.get("GetObjects") == 1 and not single & set(fetched), fetched
        assert all(torch.equal(bits(a[:, slot_mapping]), bits(b[:, slot_mapping])) for a, b in zip(kv, got))
    for o in client.list_all(BUCKET, prefix=prefix + "/"):
        client.delete(BUCKET, o.key)
