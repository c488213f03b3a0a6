"""The KV-cache phase of `s3dma-tools bench --kv` (embedded in the binary and
run with the Python that has s3dma, torch, lmcache and awscrt).

Against one storage-target, in one run, LMCache stores and retrieves KV
chunks of its default size (256 tokens, bf16) for model shapes through two
remote backends:

- s3dma: LMCache's own factory (``CreateConnector``) with the ``s3dma``
  remote-storage plug-in, configured as tests/python/test_lmcache.py
  configures it (host-shim at $S3DMA_SOCKET);
- lmcache_s3: LMCache's own ``s3://`` connector (``S3Connector``, awscrt)
  pointed at the same storage-target over plain HTTP
  ($S3DMA_BENCH_ENDPOINT, the tenant's key in $AWS_ACCESS_KEY_ID /
  $AWS_SECRET_ACCESS_KEY). It only speaks virtual-hosted addressing (Host =
  its endpoint, path = "/" + the flattened key), and the storage-target is
  path-style only, so the one change made to it here is ``_format_safe_path``
  prefixing "/<bucket>" (see path_style_s3); awscrt, its threads, its HEAD
  for the size, its part size and the rest are LMCache's code unchanged.

Each connector is used as LMCache's RemoteBackend uses it: ``batched_put``
where the connector has it (s3dma), else one ``put`` coroutine per chunk on
the connector's event loop, all in flight together (lmcache_s3);
``batched_get`` (both); the lookup before a retrieve as
``RemoteBackend.batched_contains`` does it (s3dma: ``batched_contains``, a
prefix count; lmcache_s3 has none, so one ``exists`` per key, in order).
Chunks are retrieved by a second connector with its own LocalCPUBackend (a
fresh engine: LMCache's S3 connector caches the sizes of the chunks it
stored or looked up, so the storing connector would skip requests another
engine pays for), after that engine's lookup (untimed: where LMCache's S3
connector pays its HEADs).

Per shape and backend: one untimed warm-up round (connections, s3dma's
staging slab, awscrt's pool), then S3DMA_BENCH_ROUNDS timed rounds of a
batched store and a batched retrieve of every chunk (GB/s, chunks/s, the
median kept), host CPU per chunk (this process, every thread, plus the
host-shim's for s3dma, /proc/PID/stat as procfs.rs reads it), then the same
chunks stored and retrieved one at a time, ROUNDS passes (per-chunk p50/p99
latency). Every retrieved chunk is compared bit for bit with what was
stored; a mismatch or a missing chunk fails the bench. Then 1,000 small
chunks are stored through each backend and a fresh connector's lookup of
all 1,000 is timed.

Progress on stderr; the last stdout line is one JSON object.
"""

import asyncio
import contextlib
import json
import math
import os
import statistics
import sys
import threading
import time
from urllib.parse import quote as url_quote
from urllib.parse import urlsplit

CHUNK_TOKENS = 256  # LMCache's default chunk_size
# (name, layers, KV heads, head size): Llama-3-8B and a 70B-class model.
SHAPES = [("8b", 32, 8, 128), ("70b", 80, 8, 128)]
# --quick: the same heads, 1/16 of the layers (2 MiB and 5 MiB chunks).
QUICK_SHAPES = [("8b", 2, 8, 128), ("70b", 5, 8, 128)]
EXISTS_KEYS = 1000
# The existence check's chunks: 1 layer, 1 KV head of 16 (16 KiB).
EXISTS_SHAPE = (1, 1, 16)
BACKENDS = ("s3dma", "lmcache_s3")
MIB = 1 << 20
# Chunks retrieved and found bit-exact (reported as kv_chunks_verified).
VERIFIED = [0]


def progress(msg):
    print(f"bench --kv: {msg}", file=sys.stderr, flush=True)


def cpu_ticks(pid):
    """utime + stime of /proc/PID/stat (fields 14 and 15, counted after the
    last ')'), as tools/src/procfs.rs reads them."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return 0
    fields = stat[stat.rfind(")") + 1 :].split()
    return int(fields[11]) + int(fields[12])


class Cpu:
    """Host CPU seconds: this process (all its threads: event loops,
    awscrt's, s3dma's) plus, for s3dma, the host-shim."""

    def __init__(self, shim_pid):
        self.shim_pid = shim_pid
        self.tck = os.sysconf("SC_CLK_TCK")

    def now(self, backend):
        shim = cpu_ticks(self.shim_pid) / self.tck if backend == "s3dma" and self.shim_pid else 0.0
        return time.process_time() + shim


class Engine:
    """What LMCache gives a remote connector: a config, the model's
    metadata, a LocalCPUBackend (its default allocator) and an event loop
    on its own thread; and the connector LMCache's factory makes."""

    def __init__(self, backend, metadata, pool_bytes, target):
        from lmcache.v1.config import LMCacheEngineConfig
        from lmcache.v1.storage_backend.connector import CreateConnector
        from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend

        self.backend_name = backend
        self.metadata = metadata
        pool_gib = pool_bytes / (1 << 30)
        if backend == "s3dma":
            # As test_lmcache.py's plugin_config builds it.
            url = f"s3dma://{target['bucket']}/kv-bench?socket={target['socket']}"
            self.config = LMCacheEngineConfig.from_dict(
                {
                    "chunk_size": CHUNK_TOKENS,
                    "local_cpu": True,
                    "max_local_cpu_size": pool_gib,
                    "remote_storage_plugins": ["s3dma"],
                    "remote_serde": "naive",
                    "extra_config": {
                        "remote_storage_plugin.s3dma.module_path": "s3dma.lmcache",
                        "remote_storage_plugin.s3dma.class_name": "S3dmaConnectorAdapter",
                        "remote_storage_plugin.s3dma.url": url,
                        "save_chunk_meta": True,
                        "fallback_policy": "local_cpu",
                    },
                }
            )
        else:
            url = f"s3://{target['hostport']}"
            self.config = LMCacheEngineConfig.from_dict(
                {
                    "chunk_size": CHUNK_TOKENS,
                    "local_cpu": True,
                    "max_local_cpu_size": pool_gib,
                    "remote_url": url,
                    "remote_serde": "naive",
                    "extra_config": {
                        "s3_region": target["region"],
                        "disable_tls": True,
                        "s3_prefer_http2": False,
                        "aws_access_key_id": target["key_id"],
                        "aws_secret_access_key": target["secret"],
                        "save_chunk_meta": False,  # LMCache's S3 adapter requires it
                    },
                }
            )
        self.local = LocalCPUBackend(self.config, metadata)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        if backend == "s3dma":
            self.conn = CreateConnector(url, self.loop, self.local, self.config, metadata, plugin_name="s3dma")
        else:
            with path_style_s3(target["bucket"]):
                self.conn = CreateConnector(url, self.loop, self.local, self.config, metadata)

    def run(self, coro, timeout=600):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def allocate(self):
        from lmcache.v1.memory_management import MemoryFormat

        obj = self.local.allocate(self.metadata.get_shapes(), self.metadata.get_dtypes(), MemoryFormat.KV_2LTD)
        if obj is None:
            raise RuntimeError("LMCache's CPU backend had no room for a chunk")
        return obj

    def store(self, keys, objs):
        """RemoteBackend.batched_submit_put_task, waited for. The wrapper
        (InstrumentedRemoteConnector) drops one reference per chunk, so the
        sources are kept with one more (they are compared with what comes
        back)."""
        for o in objs:
            o.ref_count_up()
        if self.conn.support_batched_put():
            self.run(self.conn.batched_put(keys, objs))
        else:
            futs = [asyncio.run_coroutine_threadsafe(self.conn.put(k, o), self.loop) for k, o in zip(keys, objs)]
            for f in futs:
                f.result(600)

    def store_one(self, key, obj):
        obj.ref_count_up()
        self.run(self.conn.put(key, obj))

    def lookup(self, keys):
        """RemoteBackend.batched_contains: the connector's own when it has
        one, else StorageBackendInterface's (RemoteBackend.contains, i.e.
        the connector's ``exists`` on its loop, key after key, to the first
        miss)."""
        if self.conn.support_batched_contains():
            return self.conn.batched_contains(keys)
        n = 0
        for k in keys:
            if not self.run(self.conn.exists(k)):
                break
            n += 1
        return n

    def retrieve(self, keys):
        """RemoteBackend.batched_get_blocking."""
        if self.conn.support_batched_get():
            return self.run(self.conn.batched_get(keys))
        return [self.run(self.conn.get(k)) for k in keys]

    def close(self):
        try:
            if self.backend_name == "s3dma":
                self.run(self.conn.close(), timeout=60)
            else:
                # LMCache's S3Connector.close() awaits the blocking
                # pq_executor.shutdown() on the executor's own event loop,
                # which then waits forever for itself (RemoteBackend.close
                # would hang too): shut the executor down the way close()
                # means to, without blocking the loop.
                raw = self.conn.getWrappedConnector()
                self.run(raw.pq_executor.shutdown_async(wait=True), timeout=60)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
            close = getattr(self.local.memory_allocator, "close", None)
            if close is not None:
                close()


@contextlib.contextmanager
def path_style_s3(bucket):
    """LMCache's S3 adapter, with LMCache's S3Connector addressing the
    bucket path-style: S3Connector only speaks virtual-hosted addressing
    (Host = its endpoint, path = "/" + the flattened key) and the
    storage-target is path-style only. ``_format_safe_path`` is the one
    method overridden; the adapter (which reads extra_config and picks the
    class up from its module when called) and everything else are
    LMCache's."""
    from lmcache.v1.storage_backend.connector import s3_connector

    real = s3_connector.S3Connector

    class PathStyleS3Connector(real):
        def _format_safe_path(self, key_str):
            return "/" + url_quote(bucket, safe="") + super()._format_safe_path(key_str)

    s3_connector.S3Connector = PathStyleS3Connector
    try:
        yield
    finally:
        s3_connector.S3Connector = real


def metadata_for(name, layers, heads, head_size):
    import torch
    from lmcache.v1.metadata import LMCacheMetadata

    return LMCacheMetadata(
        model_name=f"kv-bench/{name}-shape",
        world_size=1,
        local_world_size=1,
        worker_id=0,
        local_worker_id=0,
        kv_dtype=torch.bfloat16,
        kv_shape=(layers, 2, CHUNK_TOKENS, heads, head_size),
        chunk_size=CHUNK_TOKENS,
    )


def fill(objs, seed):
    """Random bytes, different in every word of every chunk: one random
    chunk, plus the chunk's index (as int64 words)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    base = torch.randint(-(2**62), 2**62, (objs[0].tensor.numel() // 4,), generator=g, dtype=torch.int64)
    for i, o in enumerate(objs):
        torch.add(base, i + 1, out=words(o))


def words(obj):
    import torch

    return obj.tensor.view(-1).view(torch.int64)


def check(got, srcs, what):
    """Every chunk came back, bit for bit; releases what came back."""
    import torch

    bad = []
    try:
        for i, (g, s) in enumerate(zip(got, srcs)):
            if g is None:
                bad.append(f"chunk {i} missing")
            elif g.get_size() != s.get_size() or not torch.equal(words(g), words(s)):
                bad.append(f"chunk {i} differs")
        if len(got) != len(srcs):
            bad.append(f"{len(got)} chunks back for {len(srcs)}")
    finally:
        for g in got:
            if g is not None:
                g.ref_count_down()
    if bad:
        raise SystemExit(f"bench --kv: {what}: {', '.join(bad[:5])}")
    VERIFIED[0] += len(srcs)


def keys_for(metadata, base, n):
    import torch
    from lmcache.utils import CacheEngineKey

    return [CacheEngineKey(metadata.model_name, 1, 0, base + i, torch.bfloat16) for i in range(n)]


def wipe(client, bucket):
    """Deletes every object of the bench's bucket (untimed, between rounds)."""
    for o in list(client.list_all(bucket)):
        client.delete(bucket, o.key)


def pct(v, q):
    s = sorted(v)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


def measure_shape(out, shape_idx, shape, nchunks, rounds, target, cpu, client):
    name, layers, heads, head_size = shape
    metadata = metadata_for(name, layers, heads, head_size)
    chunk = 2 * layers * CHUNK_TOKENS * heads * head_size * 2
    out[f"kv_{name}_chunk_bytes"] = chunk
    out[f"kv_{name}_chunks"] = nchunks
    out[f"kv_{name}_layers"] = layers
    gb = nchunks * chunk / 1e9
    # Room for every chunk plus slack (LMCache's allocator aligns them).
    pool = (nchunks + 2) * chunk + 64 * MIB
    for bi, backend in enumerate(BACKENDS):
        p = f"kv_{name}_{backend}"
        progress(f"{name} shape ({chunk / MIB:.0f} MiB chunks, {nchunks} of them): {backend}")
        writer = Engine(backend, metadata, pool, target)
        reader = Engine(backend, metadata, pool, target)  # a fresh engine retrieves
        srcs = [writer.allocate() for _ in range(nchunks)]
        fill(srcs, seed=shape_idx * 10 + bi)
        puts, gets = [], []
        try:
            for r in range(rounds + 1):
                keys = keys_for(metadata, (shape_idx << 40) | (bi << 36) | (r << 24), nchunks)
                c0, t0 = cpu.now(backend), time.perf_counter()
                writer.store(keys, srcs)
                t1, c1 = time.perf_counter(), cpu.now(backend)
                found = reader.lookup(keys)
                if found != nchunks:
                    raise SystemExit(f"bench --kv: {backend} stored {found} of {nchunks} chunks (lookup)")
                c2, t2 = cpu.now(backend), time.perf_counter()
                got = reader.retrieve(keys)
                t3, c3 = time.perf_counter(), cpu.now(backend)
                check(got, srcs, f"{backend} batched_get, {name} shape")
                wipe(client, target["bucket"])
                if r > 0:  # round 0 warms up
                    puts.append((t1 - t0, c1 - c0))
                    gets.append((t3 - t2, c3 - c2))
            for op, samples in (("put", puts), ("get", gets)):
                secs = statistics.median(s for s, _ in samples)
                out[f"{p}_{op}_gbps"] = gb / secs
                out[f"{p}_{op}_chunks_per_s"] = nchunks / secs
                out[f"{p}_{op}_cpu_ms_per_chunk"] = statistics.median(c for _, c in samples) * 1e3 / nchunks
            # One chunk at a time.
            lat_put, lat_get = [], []
            keys = keys_for(metadata, (shape_idx << 40) | (bi << 36) | (0xFFF << 24), nchunks)
            for _ in range(rounds):
                for k, o in zip(keys, srcs):
                    t0 = time.perf_counter()
                    writer.store_one(k, o)
                    lat_put.append(time.perf_counter() - t0)
                if reader.lookup(keys) != nchunks:
                    raise SystemExit(f"bench --kv: {backend} put() lost chunks")
                for k, o in zip(keys, srcs):
                    t0 = time.perf_counter()
                    g = reader.run(reader.conn.get(k))
                    lat_get.append(time.perf_counter() - t0)
                    check([g], [o], f"{backend} get, {name} shape")
            wipe(client, target["bucket"])
            for op, lat in (("put", lat_put), ("get", lat_get)):
                out[f"{p}_{op}_p50_ms"] = pct(lat, 0.50) * 1e3
                out[f"{p}_{op}_p99_ms"] = pct(lat, 0.99) * 1e3
            progress(
                f"{name} {backend}: put {out[f'{p}_put_gbps']:.2f} GB/s, get {out[f'{p}_get_gbps']:.2f} GB/s, "
                f"one chunk p50 put {out[f'{p}_put_p50_ms']:.1f} ms, get {out[f'{p}_get_p50_ms']:.1f} ms"
            )
        finally:
            for o in srcs:
                o.ref_count_down()
            writer.close()
            reader.close()


def measure_exists(out, target, client):
    """A fresh engine's lookup of 1,000 chunks that all exist."""
    layers, heads, head_size = EXISTS_SHAPE
    metadata = metadata_for("exists", layers, heads, head_size)
    chunk = 2 * layers * CHUNK_TOKENS * heads * head_size * 2
    pool = (EXISTS_KEYS + 16) * chunk + 64 * MIB
    for bi, backend in enumerate(BACKENDS):
        progress(f"lookup of {EXISTS_KEYS} stored chunks: {backend}")
        writer = Engine(backend, metadata, pool, target)
        srcs = [writer.allocate() for _ in range(EXISTS_KEYS)]
        fill(srcs, seed=100 + bi)
        keys = keys_for(metadata, (7 << 40) | (bi << 36), EXISTS_KEYS)
        try:
            writer.store(keys, srcs)
        finally:
            for o in srcs:
                o.ref_count_down()
            writer.close()
        checker = Engine(backend, metadata, 64 * MIB, target)
        try:
            # Its first request (connection, s3dma's lease) on a key not stored.
            checker.lookup(keys_for(metadata, 1 << 62, 1))
            t0 = time.perf_counter()
            found = checker.lookup(keys)
            out[f"kv_exists_{EXISTS_KEYS}_{backend}_ms"] = (time.perf_counter() - t0) * 1e3
        finally:
            checker.close()
        if found != EXISTS_KEYS:
            raise SystemExit(f"bench --kv: {backend}'s lookup found {found} of {EXISTS_KEYS} stored chunks")
        wipe(client, target["bucket"])


def main():
    endpoint = os.environ["S3DMA_BENCH_ENDPOINT"]
    target = {
        "socket": os.environ["S3DMA_SOCKET"],
        "bucket": os.environ.get("S3DMA_BENCH_BUCKET", "bench"),
        "hostport": urlsplit(endpoint).netloc,
        "region": os.environ.get("AWS_REGION", "us-east-1"),
        "key_id": os.environ["AWS_ACCESS_KEY_ID"],
        "secret": os.environ["AWS_SECRET_ACCESS_KEY"],
    }
    quick = os.environ.get("S3DMA_BENCH_QUICK") == "1"
    rounds = int(os.environ.get("S3DMA_BENCH_ROUNDS", "3"))
    per_shape = int(os.environ.get("S3DMA_BENCH_KV_BYTES", str(1 << 30)))
    cpu = Cpu(int(os.environ.get("S3DMA_BENCH_SHIM_PID", "0")))

    import s3dma

    client = s3dma.Client(target["socket"])
    out = {"kv_rounds": rounds, "kv_chunk_tokens": CHUNK_TOKENS}
    for i, shape in enumerate(QUICK_SHAPES if quick else SHAPES):
        chunk = 2 * shape[1] * CHUNK_TOKENS * shape[2] * shape[3] * 2
        measure_shape(out, i, shape, max(2, math.ceil(per_shape / chunk)), rounds, target, cpu, client)
    measure_exists(out, target, client)
    client.close()
    out["kv_chunks_verified"] = VERIFIED[0]
    print(json.dumps(out))


if __name__ == "__main__":
    try:
        main()
    except KeyError as e:
        sys.exit(f"bench --kv: the environment lacks {e}")
