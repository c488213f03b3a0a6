"""The ML phase of `s3dma-tools bench --ml` (embedded in the binary and run
with the Python that has s3dma, torch, safetensors, boto3 and
s3torchconnector).

Against one storage-target, in one run, it loads a safetensors file and a
DCP checkpoint of the same size (S3DMA_BENCH_BYTES) through s3dma (the
host-shim at $S3DMA_SOCKET) and through the S3 clients ML users run today,
pointed at the same storage-target over HTTP ($S3DMA_BENCH_ENDPOINT, the
tenant's key in $AWS_ACCESS_KEY_ID / $AWS_SECRET_ACCESS_KEY):

- safetensors: s3dma.safetensors.load_file vs s3torchconnector's S3 reader
  (S3Checkpoint) + safetensors.torch.load vs boto3 + safetensors.torch.load;
- DCP: dcp.save/dcp.load with s3dma.torch.StorageWriter/Reader vs
  s3torchconnector's S3StorageWriter/S3StorageReader; the s3dma load both
  into ordinary tensors (staged through a registered buffer, one copy) and
  into tensors from s3dma.torch.empty_like (placed in them, no copy).

The machine's limit beside them: memcpy bandwidth of one core (a numpy copy
of the same tensors). Every load is checked bit-exact once, untimed. Each
figure is the median of S3DMA_BENCH_ROUNDS rounds. Progress on stderr; the
last stdout line is one JSON object (keys in GB/s, 10^9 bytes/s).
"""

import json
import os
import statistics
import sys
import time


def progress(msg):
    print(f"bench --ml: {msg}", file=sys.stderr, flush=True)


def main():
    socket = os.environ["S3DMA_SOCKET"]
    endpoint = os.environ["S3DMA_BENCH_ENDPOINT"]
    bucket = os.environ.get("S3DMA_BENCH_BUCKET", "bench")
    total = int(os.environ.get("S3DMA_BENCH_BYTES", str(2 << 30)))
    rounds = int(os.environ.get("S3DMA_BENCH_ROUNDS", "3"))
    region = os.environ.get("AWS_DEFAULT_REGION", "us-east-1")

    import warnings

    import numpy as np
    import torch

    # Single-process DCP (no process group) is what this measures.
    warnings.filterwarnings("ignore", message="torch.distributed is disabled")
    import torch.distributed.checkpoint as dcp

    import s3dma
    import s3dma.safetensors as s3st
    import s3dma.torch as s3torch
    import safetensors.torch as st

    out = {"ml_bytes": total, "ml_rounds": rounds}
    peers_missing = {}

    # A model-like state dict: 64 MiB tensors (smaller when the total is),
    # float32 and bfloat16, random bytes (no zero pages, no compression).
    tensor_bytes = min(64 << 20, max(1 << 20, total // 8))
    count = max(1, total // tensor_bytes)
    rng = np.random.default_rng(7)
    block = torch.from_numpy(rng.integers(0, 256, tensor_bytes, dtype=np.uint8))
    state = {}
    for i in range(count):
        dtype = torch.float32 if i % 2 == 0 else torch.bfloat16
        t = block.clone().view(dtype)
        t = t.view(-1, 1024) if t.numel() % 1024 == 0 else t
        state[f"layer{i:03d}.weight"] = t
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    out["ml_bytes"] = nbytes
    gb = nbytes / 1e9
    progress(f"{count} tensors, {nbytes / (1 << 20):.0f} MiB, {rounds} rounds per figure")

    def timed(fn):
        times = []
        result = None
        for _ in range(rounds):
            result = None
            t0 = time.perf_counter()
            result = fn()
            times.append(time.perf_counter() - t0)
        return gb / statistics.median(times), result

    def same(a, b):
        return a.keys() == b.keys() and all(torch.equal(a[k].view(torch.uint8), b[k].view(torch.uint8)) for k in a)

    # The machine's limit: copying the same bytes in memory.
    def memcpy(dst={k: torch.empty_like(v) for k, v in state.items()}):
        for k, v in state.items():
            dst[k].copy_(v)

    out["ml_memcpy_gbps"], _ = timed(memcpy)

    client = s3dma.Client(socket)

    import boto3
    from botocore.config import Config

    s3 = boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name=region,
        config=Config(s3={"addressing_style": "path"}, max_pool_connections=16),
    )

    # -- safetensors ---------------------------------------------------------
    key = "ml-bench/model.safetensors"
    url = f"s3://{bucket}/{key}"
    blob = st.save(state)
    s3.put_object(Bucket=bucket, Key=key, Body=blob)
    del blob
    # The data path's own speed for the same bytes: one plain GET into (and
    # PUT from) a registered buffer, as an application with its own buffer
    # does. The buffer is allocated once; like the loaders' first round,
    # the first GET faults its pages in.
    size = client.head(bucket, key).size
    plain = client.alloc(size, label="ml-bench-plain")
    progress("plain s3dma GET and PUT of the same bytes")
    out["ml_get_gbps"], _ = timed(lambda: client.get_object_into(bucket, key, plain))
    out["ml_put_gbps"], _ = timed(lambda: client.put_object_from(bucket, "ml-bench/plain-put", plain))
    plain.release()
    progress("safetensors: s3dma.safetensors.load_file")
    out["ml_safetensors_gbps"], loaded = timed(lambda: s3st.load_file(url, client=client))
    assert same(state, loaded), "s3dma.safetensors.load_file returned other bytes"
    del loaded

    def boto3_load():
        body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        return st.load(body)

    progress("safetensors: boto3 + safetensors.torch.load")
    out["ml_safetensors_boto3_gbps"], loaded = timed(boto3_load)
    assert same(state, loaded)
    del loaded

    try:
        from s3torchconnector import S3Checkpoint, S3ClientConfig

        ckpt = S3Checkpoint(region, endpoint=endpoint, s3client_config=S3ClientConfig(force_path_style=True))

        def s3tc_load():
            with ckpt.reader(url) as r:
                return st.load(r.read())

        progress("safetensors: s3torchconnector S3Checkpoint reader + safetensors.torch.load")
        out["ml_safetensors_s3torchconnector_gbps"], loaded = timed(s3tc_load)
        assert same(state, loaded)
        del loaded
    except ImportError as e:
        peers_missing["s3torchconnector"] = str(e)

    # -- DCP -------------------------------------------------------------------
    prefix = f"s3://{bucket}/ml-bench/dcp-s3dma"

    def s3dma_save():
        dcp.save(state, storage_writer=s3torch.StorageWriter(prefix, client=client))

    progress("DCP: dcp.save with s3dma.torch.StorageWriter")
    out["ml_dcp_save_gbps"], _ = timed(s3dma_save)
    target = {k: torch.empty_like(v) for k, v in state.items()}

    def s3dma_load():
        dcp.load(target, storage_reader=s3torch.StorageReader(prefix, client=client))
        return target

    progress("DCP: dcp.load with s3dma.torch.StorageReader")
    out["ml_dcp_load_gbps"], loaded = timed(s3dma_load)
    assert same(state, loaded), "DCP load through s3dma returned other bytes"
    del loaded

    # The same load into a state dict whose tensors lie in registered memory
    # (s3dma.torch.empty_like): the bytes land in the tensors, no staging copy.
    registered, reg_buf = s3torch.empty_like(state, client=client, label="ml-bench-dcp")

    def s3dma_load_registered():
        dcp.load(registered, storage_reader=s3torch.StorageReader(prefix, client=client))
        return registered

    progress("DCP: dcp.load with s3dma.torch.StorageReader into s3dma.torch.empty_like tensors")
    out["ml_dcp_load_registered_gbps"], loaded = timed(s3dma_load_registered)
    assert same(state, loaded), "DCP load into registered tensors returned other bytes"
    del loaded, registered
    reg_buf.release()

    try:
        from s3torchconnector import S3ClientConfig
        from s3torchconnector._s3client import S3Client
        from s3torchconnector.dcp import S3StorageReader, S3StorageWriter
        from s3torchconnector.dcp.s3_file_system import S3FileSystem

        tc_prefix = f"s3://{bucket}/ml-bench/dcp-s3torchconnector"
        config = S3ClientConfig(force_path_style=True)

        def with_endpoint(storage):
            # Its DCP classes take no endpoint; their file system takes a client that does.
            storage.fs = S3FileSystem(region, s3_client=S3Client(region, endpoint=endpoint, s3client_config=config))
            return storage

        def tc_save():
            dcp.save(state, storage_writer=with_endpoint(S3StorageWriter(region, tc_prefix, s3client_config=config, thread_count=4)))

        progress("DCP: dcp.save with s3torchconnector S3StorageWriter")
        out["ml_dcp_save_s3torchconnector_gbps"], _ = timed(tc_save)
        for v in target.values():
            v.zero_()

        def tc_load():
            dcp.load(target, storage_reader=with_endpoint(S3StorageReader(region, tc_prefix, s3client_config=config)))
            return target

        progress("DCP: dcp.load with s3torchconnector S3StorageReader")
        out["ml_dcp_load_s3torchconnector_gbps"], loaded = timed(tc_load)
        assert same(state, loaded)
    except ImportError as e:
        peers_missing["s3torchconnector"] = str(e)

    client.close()

    # http = the fastest peer measured.
    def best(*keys):
        vals = [out[k] for k in keys if k in out]
        return max(vals) if vals else None

    out["ml_safetensors_http_gbps"] = best("ml_safetensors_boto3_gbps", "ml_safetensors_s3torchconnector_gbps")
    out["ml_dcp_load_http_gbps"] = best("ml_dcp_load_s3torchconnector_gbps")
    out["ml_dcp_save_http_gbps"] = best("ml_dcp_save_s3torchconnector_gbps")
    out["ml_peers_missing"] = peers_missing
    print(json.dumps(out))


if __name__ == "__main__":
    try:
        main()
    except KeyError as e:
        sys.exit(f"bench --ml: the environment lacks {e}")
