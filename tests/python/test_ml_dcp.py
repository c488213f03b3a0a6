"""PyTorch Distributed Checkpoint through s3dma (python/s3dma/torch.py).

Everything runs against a real `s3dma local` (tenant_stack.py) with real
torch: dcp.save / dcp.load / dcp.async_save round trips checked with
torch.equal, two gloo ranks (spawned, each with its own Client) saving and
resharding a DTensor, the zero-copy paths (tensors inside registered
buffers), the objects a save leaves in the bucket (raw tensor bytes, no
pickles), and the errors.
"""

from __future__ import annotations

import functools
import os
import pickle
import socket
import uuid

import pytest

from tenant_stack import BUCKET  # noqa: E402  (sets sys.path)

if os.environ.get("CI"):
    import torch  # CI installs torch: a missing one is a failure, not a skip
else:
    torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
import torch.multiprocessing as torch_mp  # noqa: E402
from torch import nn  # noqa: E402
from torch.distributed.checkpoint.api import CheckpointException  # noqa: E402

import s3dma  # noqa: E402
import s3dma.torch as s3torch  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


# ---------------------------------------------------------------------------
# fixtures and helpers
# ---------------------------------------------------------------------------


@pytest.fixture
def url():
    return f"s3://{BUCKET}/dcp-{uuid.uuid4().hex[:12]}"


def key_of(url: str, name: str) -> str:
    return url[len(f"s3://{BUCKET}/") :] + "/" + name


def object_bytes(client, key: str) -> bytes:
    size = client.head(BUCKET, key).size
    with client.alloc(max(size, 1)) as buf:
        client.get_object_into(BUCKET, key, buf, length=size)
        mv = buf.memoryview()
        try:
            return bytes(mv[:size])
        finally:
            mv.release()


def names_under(client, url: str) -> set:
    base = key_of(url, "")
    return {o.key[len(base) :] for o in client.list_all(BUCKET, prefix=base)}


def raw(t) -> bytes:
    return t.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes()


def model_and_optimizer(seed: int):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(4, 32)).sum().backward()
    opt.step()
    return model, opt


def assert_same(a, b, path="state"):
    """Nested state dicts equal, tensors bit for bit."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), path
        assert a.dtype == b.dtype and a.shape == b.shape, path
        assert torch.equal(a, b), path
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for k in a:
            assert_same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{path}[{i}]")
    else:
        assert a == b, path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------------------
# round trips in one process
# ---------------------------------------------------------------------------


def test_save_then_load_a_model_and_its_optimizer_bit_exact(client, url):
    model, opt = model_and_optimizer(1)
    saved = {"model": model.state_dict(), "optim": opt.state_dict(), "step": 41, "note": "hello"}
    dcp.save(saved, storage_writer=s3torch.StorageWriter(url, client=client))

    other, other_opt = model_and_optimizer(2)
    loaded = {"model": other.state_dict(), "optim": other_opt.state_dict(), "step": 0, "note": ""}
    assert not torch.equal(loaded["model"]["0.weight"], saved["model"]["0.weight"])
    dcp.load(loaded, storage_reader=s3torch.StorageReader(url, client=client))
    assert_same(saved, loaded)
    # The loaded tensors are the model's own (loaded in place).
    assert torch.equal(other.state_dict()["4.bias"], model.state_dict()["4.bias"])


def test_the_bucket_holds_metadata_and_raw_tensor_bytes_not_pickles(client, url):
    g = torch.Generator().manual_seed(3)
    state = {
        "a": torch.randn(7, 5, generator=g),  # 140 bytes: the next item starts aligned at 192
        "b": torch.randint(0, 1 << 30, (33,), generator=g, dtype=torch.int64),
        "c": torch.randn(4, 4, generator=g).to(torch.bfloat16).t(),  # not contiguous: stored row-major
        "d": torch.tensor(True),
    }
    dcp.save(state, storage_writer=s3torch.StorageWriter(url, client=client))
    assert names_under(client, url) == {".metadata", "__0_0.distcp"}

    md = pickle.loads(object_bytes(client, key_of(url, ".metadata")))
    blob = object_bytes(client, key_of(url, "__0_0.distcp"))
    slices = {idx.fqn: info for idx, info in md.storage_data.items()}
    assert set(slices) == set(state)
    end = 0
    for fqn, t in state.items():
        info = slices[fqn]
        assert isinstance(info, s3torch.ObjectSlice) and info.relative_path == "__0_0.distcp"
        assert info.offset % s3torch.ALIGN == 0 and info.length == t.numel() * t.element_size()
        assert blob[info.offset : info.offset + info.length] == raw(t), fqn
        # dtype and shape live in the metadata, not in the object
        assert md.state_dict_metadata[fqn].properties.dtype == t.dtype
        assert tuple(md.state_dict_metadata[fqn].size) == tuple(t.shape)
        end = max(end, info.offset + info.length)
    # Nothing but the raw bytes (and alignment padding): torch.save would add
    # a zip archive (b"PK") and pickles around every tensor.
    assert len(blob) == end < sum(len(raw(t)) for t in state.values()) + len(state) * s3torch.ALIGN
    assert b"PK\x03\x04" not in blob and b"\x80\x02" not in blob[:2]


def test_bounded_objects_and_read_batches_round_trip(client, url):
    """Small max_object_size / read_buffer_size: a rank's items spread
    over several objects (one item larger than the limit gets its own),
    reads go in several pipelined batches."""
    g = torch.Generator().manual_seed(4)
    state = {f"t{i}": torch.randn(100 + 37 * i, generator=g) for i in range(12)}
    state["big"] = torch.randn(64, 64, generator=g)  # 16 KiB > the 4 KiB limit
    state["empty"] = torch.empty(0, 3)
    writer = s3torch.StorageWriter(url, client=client, max_object_size=4096, staging_buffers=2)
    dcp.save(state, storage_writer=writer)
    objects = names_under(client, url) - {".metadata"}
    assert len(objects) >= 5, objects
    sizes = sorted(client.head(BUCKET, key_of(url, n)).size for n in objects)
    assert sizes[-1] == 64 * 64 * 4 and sizes[-2] <= 4096

    loaded = {k: torch.full_like(v, -1.0) for k, v in state.items()}
    dcp.load(loaded, storage_reader=s3torch.StorageReader(url, client=client, read_buffer_size=2048))
    assert_same(state, loaded)


def test_saving_again_to_the_same_prefix_replaces_the_checkpoint(client, url):
    first = {f"t{i}": torch.full((300,), float(i)) for i in range(6)}
    dcp.save(first, storage_writer=s3torch.StorageWriter(url, client=client, max_object_size=1024))
    before = names_under(client, url)
    second = {"only": torch.arange(10.0)}
    dcp.save(second, storage_writer=s3torch.StorageWriter(url, client=client, max_object_size=1024))
    # The objects of the first checkpoint that the second does not use are gone.
    assert len(before) > 3 and names_under(client, url) == {".metadata", "__0_0.distcp"}
    loaded = {"only": torch.zeros(10)}
    dcp.load(loaded, storage_reader=s3torch.StorageReader(url, client=client))
    assert torch.equal(loaded["only"], second["only"])

    with pytest.raises(CheckpointException, match="already exists"):
        dcp.save(second, storage_writer=s3torch.StorageWriter(url, client=client, overwrite=False))


def test_loading_into_tensors_in_a_registered_buffer_places_the_bytes_there(client, url):
    g = torch.Generator().manual_seed(5)
    state = {"w": torch.randn(256, 64, generator=g), "b": torch.randn(64, generator=g), "h": torch.randn(8, 8, generator=g).half()}
    dcp.save(state, storage_writer=s3torch.StorageWriter(url, client=client))

    gets = []
    real_get_objects = client.get_objects

    def recording_get_objects(items, *args, **kwargs):
        items = list(items)
        gets.extend(items)
        return real_get_objects(items, *args, **kwargs)

    with client.alloc(1 << 20, label="params") as params:
        w = params.torch(torch.float32, offset=0, count=256 * 64).view(256, 64)
        b = params.torch(torch.float32, offset=256 * 64 * 4, count=64)
        h = params.torch(torch.float16, offset=256 * 64 * 4 + 256, count=64).view(8, 8)
        w.fill_(-1)
        b.fill_(-1)
        h.fill_(-1)
        client.get_objects = recording_get_objects
        try:
            dcp.load({"w": w, "b": b, "h": h}, storage_reader=s3torch.StorageReader(url, client=client))
        finally:
            del client.get_objects
        # Each GET landed in the parameters' buffer, at the tensor's own bytes.
        assert len(gets) == 3 and all(it.buffer is params for it in gets)
        assert sorted(it.offset for it in gets) == [0, 256 * 64 * 4, 256 * 64 * 4 + 256]
        assert torch.equal(w, state["w"]) and torch.equal(b, state["b"]) and torch.equal(h, state["h"])
        mv = params.memoryview()
        assert bytes(mv[: 256 * 64 * 4]) == raw(state["w"])
        mv.release()
        del w, b, h


def test_empty_like_makes_a_registered_state_dict_that_loads_with_no_staging(client, url, monkeypatch):
    model, opt = model_and_optimizer(3)
    saved = {"model": model.state_dict(), "optim": opt.state_dict(), "step": 7}
    dcp.save(saved, storage_writer=s3torch.StorageWriter(url, client=client))

    other, other_opt = model_and_optimizer(4)
    template = {"model": other.state_dict(), "optim": other_opt.state_dict(), "step": 0}
    sd, buf = s3torch.empty_like(template, client=client, label="empty-like")
    # Same structure, shapes and dtypes; every non-empty tensor in the
    # buffer, 64-byte aligned, none overlapping; other leaves kept.
    assert sd["step"] == 0 and sd["model"].keys() == template["model"].keys()
    spans = []
    for k, t in sd["model"].items():
        assert t.shape == template["model"][k].shape and t.dtype == template["model"][k].dtype
        found = client.find_buffer(t.data_ptr(), t.numel() * t.element_size())
        assert found is not None and found[0] is buf and found[1] % 64 == 0, k
        spans.append((found[1], found[1] + t.numel() * t.element_size()))
    spans.sort()
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
    assert isinstance(sd["optim"]["state"][0]["exp_avg"], torch.Tensor)
    assert client.find_buffer(sd["optim"]["state"][0]["exp_avg"].data_ptr(), 4) is not None

    # Only the non-tensor items (pickled bytes) go through a staging buffer:
    # every tensor's bytes are placed in it.
    staged = []
    real_deliver = s3torch._RankRead._deliver

    def recording_deliver(self, r, buf, at):
        staged.append(r.item)
        return real_deliver(self, r, buf, at)

    monkeypatch.setattr(s3torch._RankRead, "_deliver", recording_deliver)
    dcp.load(sd, storage_reader=s3torch.StorageReader(url, client=client))
    monkeypatch.undo()
    assert staged and all(it.type == s3torch.LoadItemType.BYTE_IO for it in staged), staged
    assert_same(saved, sd)
    # The model adopts the tensors without a copy.
    other.load_state_dict(sd["model"], assign=True)
    assert other.state_dict()["0.weight"].data_ptr() == sd["model"]["0.weight"].data_ptr()
    assert torch.equal(other(torch.ones(2, 32)), model(torch.ones(2, 32)))
    buf.release()
    # Still readable: the tensors keep the mapping until they go.
    assert torch.equal(sd["model"]["4.bias"], saved["model"]["4.bias"])


def test_saving_tensors_in_a_registered_buffer_puts_them_from_there(client, url):
    puts = []
    real_put = client.put_object_from

    def recording_put(bucket, key, buffer, *args, **kwargs):
        puts.append((key, buffer))
        return real_put(bucket, key, buffer, *args, **kwargs)

    with client.alloc(1 << 16, label="weights") as weights:
        w = weights.torch(torch.float32, offset=4096, count=1000)
        w.copy_(torch.linspace(-1, 1, 1000))
        state = {"w": w, "plain": torch.arange(5)}
        client.put_object_from = recording_put
        try:
            dcp.save(state, storage_writer=s3torch.StorageWriter(url, client=client))
        finally:
            del client.put_object_from
        # "w" went out of the weights buffer as an object of its own.
        from_weights = [k for k, buf in puts if buf is weights]
        assert len(from_weights) == 1
        assert object_bytes(client, from_weights[0]) == raw(w)
        loaded = {"w": torch.zeros(1000), "plain": torch.zeros(5, dtype=torch.int64)}
        dcp.load(loaded, storage_reader=s3torch.StorageReader(url, client=client))
        assert torch.equal(loaded["w"], w) and torch.equal(loaded["plain"], state["plain"])
        del w, state


def test_async_save_round_trip(client, url):
    model, opt = model_and_optimizer(6)
    saved = {"model": model.state_dict(), "optim": opt.state_dict()}
    expected = {"model": {k: v.clone() for k, v in saved["model"].items()}}
    # The writer stages (torch's AsyncStager protocol) straight into
    # registered memory, and the upload PUTs the tensors from there.
    labels = []
    real_put = client.put_object_from

    def put(bucket, key, buffer, *args, **kwargs):
        labels.append(getattr(buffer, "label", None))
        return real_put(bucket, key, buffer, *args, **kwargs)

    client.put_object_from = put
    try:
        fut = dcp.async_save(saved, storage_writer=s3torch.StorageWriter(url, client=client))
        # The staged copy is what gets written: changing the model now is safe.
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)
        result = fut.result(timeout=60) if hasattr(fut, "result") else fut.upload_completion.result(timeout=60)
    finally:
        client.put_object_from = real_put
    assert result is not None
    tensors = len(saved["model"]) + sum(
        isinstance(v, torch.Tensor) and v.numel() > 0 for s in saved["optim"]["state"].values() for v in s.values()
    )
    assert labels.count("dcp-stage") == tensors, labels
    # The rest: the non-tensor items (param_groups) packed in one object,
    # and .metadata.
    assert sorted(x for x in labels if x != "dcp-stage") == ["dcp-metadata", "dcp-write"], labels
    other, other_opt = model_and_optimizer(7)
    loaded = {"model": other.state_dict(), "optim": other_opt.state_dict()}
    dcp.load(loaded, storage_reader=s3torch.StorageReader(url, client=client))
    assert_same(expected["model"], loaded["model"])
    assert_same(saved["optim"], loaded["optim"])


def test_a_checkpoint_written_under_a_checkpoint_id_loads_by_checkpoint_id(client, url):
    writer = s3torch.StorageWriter(f"s3://{BUCKET}/placeholder", client=client)
    state = {"x": torch.arange(12.0).view(3, 4)}
    dcp.save(state, checkpoint_id=url, storage_writer=writer)
    assert writer.checkpoint_id == url and ".metadata" in names_under(client, url)
    loaded = {"x": torch.zeros(3, 4)}
    dcp.load(loaded, checkpoint_id=url, storage_reader=s3torch.StorageReader(f"s3://{BUCKET}/elsewhere", client=client))
    assert torch.equal(loaded["x"], state["x"])


def test_rank_local_metadata_without_collectives(client, url):
    dcp.save({"a": torch.ones(5), "n": 1}, storage_writer=s3torch.StorageWriter(url, client=client))
    state = {"a": torch.arange(5.0), "n": 3}
    dcp.save(state, storage_writer=s3torch.StorageWriter(url, client=client), use_collectives=False)
    # The earlier global .metadata is gone: loads would prefer it.
    assert names_under(client, url) == {"__0.metadata", "__0_0.distcp"}
    loaded = {"a": torch.zeros(5), "n": 0}
    # torch looks for .metadata first (and logs that it is missing), then __0.metadata.
    dcp.load(loaded, storage_reader=s3torch.StorageReader(url, client=client))
    assert torch.equal(loaded["a"], state["a"]) and loaded["n"] == 3


def test_writer_and_reader_pickle_without_their_client(stack, url):
    writer = s3torch.StorageWriter(url, socket=stack.socket, max_object_size=8192)
    with writer:
        dcp.save({"x": torch.ones(3)}, storage_writer=writer)
    copy = pickle.loads(pickle.dumps(writer))
    assert copy.checkpoint_id == url and copy.max_object_size == 8192
    with s3dma.Client(stack.socket) as c:
        reader = pickle.loads(pickle.dumps(s3torch.StorageReader(url, client=c)))
        with reader:  # makes its own Client on the socket of the one given
            loaded = {"x": torch.zeros(3)}
            dcp.load(loaded, storage_reader=reader)
        assert torch.equal(loaded["x"], torch.ones(3))

    # A client_factory (picklable) makes the Client; close() closes it.
    reader = pickle.loads(pickle.dumps(s3torch.StorageReader(url, client_factory=functools.partial(s3dma.Client, stack.socket))))
    loaded = {"x": torch.zeros(3)}
    dcp.load(loaded, storage_reader=reader)
    made = reader._clients.get()
    assert torch.equal(loaded["x"], torch.ones(3)) and not made.closed
    reader.close()
    assert made.closed


# ---------------------------------------------------------------------------
# two ranks
# ---------------------------------------------------------------------------


def _full_matrix():
    return torch.arange(8 * 6, dtype=torch.float32).view(8, 6) / 7.0


def _two_rank_worker(rank: int, world: int, port: int, sock: str, url: str, async_url: str):
    from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        mesh = init_device_mesh("cpu", (world,))
        full = _full_matrix()
        state = {
            "w": distribute_tensor(full, mesh, [Shard(0)]),  # rows 0-3 on rank 0, 4-7 on rank 1
            f"only_rank{rank}": torch.full((5,), float(rank + 1)),
            "replicated": torch.arange(4),
        }
        # Each rank (and the checkpoint process of async_save) makes its own Client on the socket.
        dcp.save(state, storage_writer=s3torch.StorageWriter(url, socket=sock))

        # Resharded: columns instead of rows, so every rank reads a strided
        # region from both ranks' objects.
        target = {
            "w": distribute_tensor(torch.zeros(8, 6), mesh, [Shard(1)]),
            f"only_rank{rank}": torch.zeros(5),
            "replicated": torch.zeros(4, dtype=torch.int64),
        }
        with s3torch.StorageReader(url, socket=sock) as reader:
            dcp.load(target, storage_reader=reader)
        cols = slice(3 * rank, 3 * rank + 3)
        assert torch.equal(target["w"].to_local(), full[:, cols]), target["w"].to_local()
        assert torch.equal(target[f"only_rank{rank}"], state[f"only_rank{rank}"])
        assert torch.equal(target["replicated"], torch.arange(4))

        # async_save in a checkpoint process: the writer is pickled over, its
        # Client is made there.
        writer = s3torch.StorageWriter(async_url, socket=sock)
        resp = dcp.async_save(state, storage_writer=writer, async_checkpointer_type=AsyncCheckpointerType.PROCESS)
        fut = resp.upload_completion if hasattr(resp, "upload_completion") else resp
        fut.result(timeout=120)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_two_ranks_save_shards_and_load_them_resharded(stack, client, url):
    async_url = url + "-async"
    torch_mp.spawn(_two_rank_worker, args=(2, free_port(), stack.socket, url, async_url), nprocs=2, join=True)

    for u in (url, async_url):
        names = names_under(client, u)
        assert {".metadata", "__0_0.distcp", "__1_0.distcp"} <= names, names
        # Read back whole, in one process: the row shards come from both objects.
        loaded = {"w": torch.zeros(8, 6), "only_rank0": torch.zeros(5), "only_rank1": torch.zeros(5), "replicated": torch.zeros(4, dtype=torch.int64)}
        dcp.load(loaded, storage_reader=s3torch.StorageReader(u, client=client), no_dist=True)
        assert torch.equal(loaded["w"], _full_matrix())
        assert torch.equal(loaded["only_rank0"], torch.full((5,), 1.0))
        assert torch.equal(loaded["only_rank1"], torch.full((5,), 2.0))
        assert torch.equal(loaded["replicated"], torch.arange(4))
        # Rank 1's object holds rows 4-7 of w, raw.
        md = pickle.loads(object_bytes(client, key_of(u, ".metadata")))
        w1 = [info for idx, info in md.storage_data.items() if idx.fqn == "w" and tuple(idx.offset) == (4, 0)]
        assert len(w1) == 1 and w1[0].relative_path == "__1_0.distcp"
        blob = object_bytes(client, key_of(u, "__1_0.distcp"))
        assert blob[w1[0].offset : w1[0].offset + w1[0].length] == raw(_full_matrix()[4:])


# ---------------------------------------------------------------------------
# errors
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["data/ckpt", "s3://", "s3://data", "s3://data/", "/tmp/ckpt", "gs://data/ckpt", "s3:///ckpt"])
def test_a_bad_url_is_a_value_error_naming_it(bad):
    with pytest.raises(ValueError, match=f"not an s3dma checkpoint url: '{bad}'"):
        s3torch.StorageWriter(bad, socket="/nonexistent")
    with pytest.raises(ValueError, match="not an s3dma checkpoint url"):
        s3torch.StorageReader(bad, socket="/nonexistent")
    assert not s3torch.StorageWriter.validate_checkpoint_id(bad)
    assert not s3torch.StorageReader.validate_checkpoint_id(bad)


def test_good_urls_parse_and_validate():
    assert s3torch.parse_url("s3://data/a/b/") == ("data", "a/b")
    assert s3torch.parse_url("s3dma://data/ckpt") == ("data", "ckpt")
    assert s3torch.StorageWriter.validate_checkpoint_id("s3://data/ckpt/step-1")
    assert s3torch.StorageReader.validate_checkpoint_id("s3://data/ckpt")
    with pytest.raises(ValueError, match="not an s3dma checkpoint url: 'file:///x'"):
        s3torch.StorageWriter(f"s3://{BUCKET}/x", socket="/nonexistent").reset("file:///x")


def test_a_missing_checkpoint_names_its_url(client, url):
    reader = s3torch.StorageReader(url, client=client)
    with pytest.raises(FileNotFoundError, match=f"no DCP checkpoint at {url}: {url}/.metadata does not exist") as e:
        reader.read_metadata()
    assert isinstance(e.value.__cause__, s3dma.NotFound)
    with pytest.raises(BaseException, match=f"no DCP checkpoint at {url}"):
        dcp.load({"x": torch.zeros(1)}, storage_reader=reader)


def test_s3dma_errors_pass_through(client):
    writer = s3torch.StorageWriter("s3://no-such-bucket-here/ckpt", client=client)
    with pytest.raises(CheckpointException) as e:
        dcp.save({"x": torch.ones(2)}, storage_writer=writer)
    failures = [exc for exc, _ in e.value.failures.values()]
    assert failures and all(isinstance(exc, s3dma.S3dmaError) for exc in failures), failures


@pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="needs a GPU that torch can use (the CUDA stand-in serves only the driver API the shim uses); "
    "runs on a GPU host with a host-shim built with the cuda feature",
)
def test_loading_into_cuda_tensors_lands_in_gpu_memory(client, url):
    g = torch.Generator().manual_seed(11)
    state = {"w": torch.randn(512, 512, generator=g), "b": torch.randn(512, generator=g).half()}
    dcp.save(state, storage_writer=s3torch.StorageWriter(url, client=client))
    target = {k: torch.zeros_like(v, device="cuda") for k, v in state.items()}
    dcp.load(target, storage_reader=s3torch.StorageReader(url, client=client))
    for k, v in state.items():
        assert target[k].is_cuda and torch.equal(target[k].cpu(), v), k
    # Each destination was registered for the read and let go after it.
    assert not [b for b in client.list_buffers() if b.kind == "cuda"]
