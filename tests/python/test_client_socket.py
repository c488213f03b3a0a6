"""Which socket the Python client connects to when given none: the rule of
the `s3dma` CLI (`default_socket` / `pick_socket` in
cli/src/commands.rs). `$S3DMA_SOCKET` if set and not empty;
else `/run/s3dma/shim.sock` when it exists; else local mode's socket
(`$XDG_RUNTIME_DIR/s3dma/shim.sock`, else `/tmp/s3dma-<uid>/shim.sock`)
when it exists; else `/run/s3dma/shim.sock`.

The order is checked with the system path moved into tmp_path; then a real
`s3dma local` started with no `--socket` (its socket in a fresh
`$XDG_RUNTIME_DIR`) is found by every entry point that defaults a socket,
with `$S3DMA_SOCKET` unset: the "second shell" of the CLI's test
`commands_find_local_modes_default_socket`.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from tenant_stack import BUCKET, PY_CLIENT, running_stack  # noqa: E402  (sets sys.path)

import s3dma  # noqa: E402
import s3dma.client as client_mod  # noqa: E402

SYSTEM = "/run/s3dma/shim.sock"


@pytest.fixture
def paths(tmp_path, monkeypatch):
    """``(system, local)``: the installed shim's path moved under tmp_path,
    and local mode's under a tmp ``$XDG_RUNTIME_DIR``; neither exists yet.
    ``$S3DMA_SOCKET`` is unset."""
    system = tmp_path / "run-s3dma" / "shim.sock"
    monkeypatch.setattr(client_mod, "DEFAULT_SOCKET", str(system))
    xdg = tmp_path / "xdg"
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(xdg))
    monkeypatch.delenv("S3DMA_SOCKET", raising=False)
    return system, xdg / "s3dma" / "shim.sock"


def touch(p: Path) -> None:
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text("")


def test_socket_fallback_order(paths, monkeypatch, tmp_path):
    system, local = paths
    assert s3dma.local_socket() == str(local)
    # Neither exists: the installed shim's (so the error names it).
    assert s3dma.default_socket() == str(system)
    # Only local mode's: that one.
    touch(local)
    assert s3dma.default_socket() == str(local)
    # Both: the installed shim's first.
    touch(system)
    assert s3dma.default_socket() == str(system)
    # Only the installed shim's.
    local.unlink()
    assert s3dma.default_socket() == str(system)
    # $S3DMA_SOCKET wins whatever exists, even a path that does not.
    touch(local)
    monkeypatch.setenv("S3DMA_SOCKET", str(tmp_path / "x.sock"))
    assert s3dma.default_socket() == str(tmp_path / "x.sock")
    # ... unless it is empty, which counts as unset.
    monkeypatch.setenv("S3DMA_SOCKET", "")
    assert s3dma.default_socket() == str(system)
    system.unlink()
    assert s3dma.default_socket() == str(local)


def test_local_socket_counts_when_it_is_a_dangling_symlink(paths):
    # As the CLI (symlink_metadata): the path is taken, and connecting to
    # it fails naming it, rather than falling back silently.
    system, local = paths
    local.parent.mkdir(parents=True)
    local.symlink_to(local.parent / "gone.sock")
    assert s3dma.default_socket() == str(local)
    with pytest.raises(s3dma.ShimUnavailable, match=str(local)):
        s3dma.Client()


def test_local_sockets_path(monkeypatch):
    tmp_default = f"/tmp/s3dma-{os.geteuid()}/shim.sock"
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    assert s3dma.local_socket() == tmp_default
    # Empty or relative: not used (as the launcher's default_socket).
    for v in ("", "run/user/1000", "./x"):
        monkeypatch.setenv("XDG_RUNTIME_DIR", v)
        assert s3dma.local_socket() == tmp_default, v
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/1000")
    assert s3dma.local_socket() == "/run/user/1000/s3dma/shim.sock"
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/1000/")
    assert s3dma.local_socket() == "/run/user/1000/s3dma/shim.sock"


def test_no_socket_anywhere_names_both_paths(paths):
    system, local = paths
    with pytest.raises(s3dma.ShimUnavailable) as e:
        s3dma.Client()
    msg = str(e.value)
    assert f"no host-shim socket at {system}, nor at {local}" in msg, msg
    # A socket that was named (argument or $S3DMA_SOCKET) is the only one.
    with pytest.raises(s3dma.ShimUnavailable) as e:
        s3dma.Client(str(system))
    assert str(local) not in str(e.value)


def test_entry_points_resolve_through_default_socket(paths, monkeypatch):
    """Each integration that takes ``socket=None`` asks default_socket() at
    the time it connects (not at import)."""
    system, local = paths
    touch(local)  # not a socket: Client says so, naming the chosen path
    with pytest.raises(s3dma.ShimUnavailable, match=f"{local} is not a socket"):
        s3dma.Client()
    with pytest.raises(s3dma.ShimUnavailable, match=f"{local} is not a socket"):
        s3dma.download_prefix("s3://data/x/", str(local.parent / "dst"))
    from s3dma.dataset import S3dmaMapDataset

    with pytest.raises(s3dma.ShimUnavailable, match=f"{local} is not a socket"):
        S3dmaMapDataset("s3://data/x/", as_torch=False)  # lists at construction
    try:
        import s3dma.safetensors as s3st
    except ImportError:
        pass
    else:
        with pytest.raises(s3dma.ShimUnavailable, match=f"{local} is not a socket"):
            s3st.read_header("s3://data/x.safetensors")
    try:
        import s3dma.fs as s3fs
    except ImportError:
        pass
    else:
        assert s3fs.S3dmaFileSystem(skip_instance_cache=True).socket == str(local)


# -- a real `s3dma local` on its default socket ------------------------------


@pytest.fixture(scope="module")
def local_stack(tmp_path_factory):
    if os.path.lexists(SYSTEM):
        pytest.skip(f"{SYSTEM} exists here, and is tried first")
    with running_stack(tmp_path_factory.mktemp("s3dma-local-default"), default_socket=True) as s:
        assert s.socket == str(s.runtime_dir / "s3dma" / "shim.sock"), s.stdout_lines
        yield s


@pytest.fixture
def second_shell(local_stack, monkeypatch):
    """This process as a second shell: `$S3DMA_SOCKET` unset,
    `$XDG_RUNTIME_DIR` the stack's."""
    monkeypatch.delenv("S3DMA_SOCKET", raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(local_stack.runtime_dir))
    return local_stack


def test_second_shell_finds_local_modes_socket(second_shell):
    """A fresh interpreter with no S3DMA_SOCKET connects with s3dma.Client()."""
    env = {k: v for k, v in os.environ.items() if k != "S3DMA_SOCKET"}
    env["XDG_RUNTIME_DIR"] = str(second_shell.runtime_dir)
    env["PYTHONPATH"] = str(PY_CLIENT)
    code = textwrap.dedent(
        """
        import s3dma
        with s3dma.Client() as c:
            i = c.info()
            with c.alloc(4096) as buf:
                buf.memoryview()[:5] = b"hello"
                c.put_object_from("data", "second-shell/hello", buf, length=5)
            print(c.socket, i.tenant, c.head("data", "second-shell/hello").size)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [second_shell.socket, "local", "5"], out.stdout
    # $S3DMA_SOCKET still wins: pointing it elsewhere fails, naming it.
    env["S3DMA_SOCKET"] = str(second_shell.sockdir / "nothing.sock")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "nothing.sock" in out.stderr, out.stderr


def test_second_shell_every_entry_point(second_shell, tmp_path):
    """Client(), the datasets (URL form, no socket), download_prefix /
    upload_dir, safetensors and fsspec, all with no socket named."""
    prefix = f"ep-{uuid.uuid4().hex[:8]}/"
    with s3dma.Client() as c:
        assert c.socket == second_shell.socket
        assert c.info().tenant == "local"
    src = tmp_path / "src"
    src.mkdir()
    for i in range(3):
        (src / f"f{i}.bin").write_bytes(f"object {i}|".encode() * (i + 1))
    s = s3dma.upload_dir(str(src), f"s3://{BUCKET}/{prefix}")
    assert s.files == 3, s
    dst = tmp_path / "dst"
    s = s3dma.download_prefix(f"s3://{BUCKET}/{prefix}", str(dst))
    assert sorted(p.name for p in dst.iterdir()) == ["f0.bin", "f1.bin", "f2.bin"], s

    from s3dma.dataset import ObjectDataset, S3dmaIterableDataset, S3dmaMapDataset

    m = S3dmaMapDataset(f"s3://{BUCKET}/{prefix}", as_torch=False, return_keys=True)
    try:
        assert [(k, bytes(v)) for k, v in (m[i] for i in range(len(m)))] == [
            (f"{prefix}f{i}.bin", (src / f"f{i}.bin").read_bytes()) for i in range(3)
        ]
    finally:
        m.close()
    it = S3dmaIterableDataset(f"s3://{BUCKET}/{prefix}", as_torch=False, batch_size=2, copy=True)
    try:
        assert [bytes(v) for v in it] == [(src / f"f{i}.bin").read_bytes() for i in range(3)]
    finally:
        it.close()
    o = ObjectDataset(f"s3://{BUCKET}/{prefix}", ["f2.bin"], 4096)
    try:
        assert bytes(o[0]) == (src / "f2.bin").read_bytes()
    finally:
        o.close()

    try:
        import s3dma.fs as s3fs
    except ImportError:
        pass
    else:
        fs = s3fs.S3dmaFileSystem(skip_instance_cache=True)
        assert fs.socket == second_shell.socket
        assert fs.cat_file(f"{BUCKET}/{prefix}f0.bin") == (src / "f0.bin").read_bytes()

    try:
        import torch

        import s3dma.safetensors as s3st
    except ImportError:
        return
    t = {"w": torch.arange(12, dtype=torch.float32).reshape(3, 4)}
    s3st.save_file(t, f"s3://{BUCKET}/{prefix}m.safetensors")
    got = s3st.load_file(f"s3://{BUCKET}/{prefix}m.safetensors")
    assert torch.equal(got["w"], t["w"])


def test_socket_argument_still_wins(second_shell, tmp_path):
    sock = tmp_path / "other.sock"
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(str(sock))
    srv.close()  # bound, nobody listening
    with pytest.raises(s3dma.ShimUnavailable, match="other.sock refuses connections"):
        s3dma.Client(str(sock))
