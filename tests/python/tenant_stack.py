"""Runs `s3dma local` (storage-target + dpu-agent + host-shim over the tcp
fabric) for the tenant-client tests, and puts python on sys.path.

`target/debug/s3dma` and the three service binaries next to it are not
built here (`cargo build -p storage-target -p dpu-agent -p host-shim -p
s3dma-cli` or the whole workspace). `S3DMA_BIN` names another `s3dma`.
Without them the end-to-end tests skip, except under CI (`$CI` set), where
they fail.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Iterator

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
PY_CLIENT = REPO_ROOT / "python"
if str(PY_CLIENT) not in sys.path:
    sys.path.insert(0, str(PY_CLIENT))

READY_RE = re.compile(r"^s3dma local ready: socket=(\S+)\s*$")
SERVICES = ("storage-target", "dpu-agent", "host-shim")
BUCKET = "data"


def s3dma_bin() -> Path:
    env = os.environ.get("S3DMA_BIN")
    return Path(env) if env else REPO_ROOT / "target" / "debug" / "s3dma"


def missing_binaries() -> list[str]:
    b = s3dma_bin()
    missing = [] if b.exists() else [str(b)]
    for name in SERVICES:
        p = b.parent / name
        if not p.exists() and shutil.which(name) is None:
            missing.append(str(p))
    return missing


def require_binaries() -> None:
    missing = missing_binaries()
    if not missing:
        return
    why = (
        f"s3dma local needs {', '.join(missing)}; build them with "
        "`cargo build -p storage-target -p dpu-agent -p host-shim -p s3dma-cli` (or set S3DMA_BIN)"
    )
    if os.environ.get("CI"):
        pytest.fail(why, pytrace=False)
    pytest.skip(why)


def interrupt(proc, timeout: float) -> int:
    """SIGINT to proc, then up to timeout seconds for it to exit (SIGKILL
    after that); its exit code."""
    proc.send_signal(signal.SIGINT)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


class ExitedEarly(Exception):
    """The process's stdout ended before it was ready; rc is its exit code."""

    def __init__(self, rc):
        super().__init__(f"exited (rc={rc})")
        self.rc = rc


def stdout_lines(proc, store: list, timeout: float, exit_wait: float) -> Iterator[str]:
    """Yields proc's stdout lines (newline stripped; each also appended to
    store, also after the caller stops reading) until timeout seconds have
    passed (then TimeoutError) or stdout ends (then ExitedEarly, after up to
    exit_wait seconds for the exit code)."""
    lines: queue.Queue = queue.Queue()

    def pump():
        for line in proc.stdout:
            line = line.rstrip("\n")
            store.append(line)
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError
        try:
            line = lines.get(timeout=remaining)
        except queue.Empty:
            continue
        if line is None:
            raise ExitedEarly(proc.wait(timeout=exit_wait))
        yield line


def require_module(name: str, install: str):
    """Imports name; without it the calling test module skips, except under
    CI (`$CI` set), where it fails: the ML tests must run there."""
    try:
        return importlib.import_module(name)
    except ImportError:
        why = f"{name} is not installed (pip install {install})"
        if os.environ.get("CI"):
            pytest.fail(f"{why}, and CI is set: the ML tests must run there", pytrace=False)
        pytest.skip(why, allow_module_level=True)


def with_pdeathsig(argv, sig="INT"):
    """`argv` run so that it gets SIG`sig` when this process dies (Linux:
    util-linux `setpriv --pdeathsig`, which then execs it). Not a
    `preexec_fn`: without one Python starts the child by vfork + exec, so
    gRPC's at-fork handlers never run in it; with one, a child of a process
    holding gRPC channels could abort before its exec (grpc/grpc#43055)."""
    if sys.platform.startswith("linux") and shutil.which("setpriv"):
        return ["setpriv", "--pdeathsig", sig, "--", *[str(a) for a in argv]]
    return [str(a) for a in argv]


class LocalStack:
    """``default_socket``: no ``--socket``; ``$XDG_RUNTIME_DIR`` is
    ``runtime_dir`` (a fresh directory), so the socket is local mode's
    default one, ``runtime_dir/s3dma/shim.sock``."""

    def __init__(self, workdir: Path, *, default_socket: bool = False):
        self.workdir = Path(workdir)
        self.dir = self.workdir / "state"
        # Unix socket paths are limited to 107 bytes: keep it short.
        self.sockdir = Path(tempfile.mkdtemp(prefix="s3dma-py-"))
        self.socket_arg: Path | None = self.sockdir / "shim.sock"
        self.runtime_dir: Path | None = None
        if default_socket:
            self.socket_arg = None
            self.runtime_dir = self.sockdir / "run"
            self.runtime_dir.mkdir(mode=0o700)
        self.socket: str | None = None
        self.proc: subprocess.Popen | None = None
        self.stdout_lines: list[str] = []
        self.log_path = self.workdir / "s3dma-local.stderr.log"

    def start(self, timeout: float = 180.0) -> "LocalStack":
        log = open(self.log_path, "ab")
        args = [str(s3dma_bin()), "local", "--dir", str(self.dir)]
        env = dict(os.environ)
        if self.socket_arg is not None:
            args += ["--socket", str(self.socket_arg)]
        else:
            env["XDG_RUNTIME_DIR"] = str(self.runtime_dir)
        self.proc = subprocess.Popen(
            with_pdeathsig(args),
            env=env,
            stdout=subprocess.PIPE,
            stderr=log,
            stdin=subprocess.DEVNULL,
            text=True,
            bufsize=1,
        )
        log.close()
        try:
            for line in stdout_lines(self.proc, self.stdout_lines, timeout, exit_wait=30):
                m = READY_RE.match(line)
                if m:
                    self.socket = m.group(1)
                    break
        except TimeoutError:
            self.stop()
            raise RuntimeError(f"s3dma local was not ready in {timeout}s\n{self.diagnostics()}") from None
        except ExitedEarly as e:
            raise RuntimeError(f"s3dma local exited (rc={e.rc}) before it was ready\n{self.diagnostics()}") from None
        return self

    def diagnostics(self, n: int = 80) -> str:
        out = [f"stdout: {self.stdout_lines!r}"]
        try:
            out.append("--- s3dma local stderr ---\n" + "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:]))
        except FileNotFoundError:
            pass
        logs = self.dir / "logs"
        if logs.is_dir():
            for f in sorted(logs.iterdir()):
                tail = "\n".join(f.read_text(errors="replace").splitlines()[-n:])
                out.append(f"--- {f.name} ---\n{tail}")
        return "\n".join(out)

    def stop(self, timeout: float = 40.0) -> int | None:
        proc, self.proc = self.proc, None
        rc = None
        if proc is not None:
            if proc.poll() is None:
                rc = interrupt(proc, timeout)
            else:
                rc = proc.returncode
        shutil.rmtree(self.sockdir, ignore_errors=True)
        return rc


@contextlib.contextmanager
def running_stack(workdir: Path, *, default_socket: bool = False) -> Iterator[LocalStack]:
    """`s3dma local` for the length of the block; on the way out it must
    stop cleanly on SIGINT, and no service may have panicked.
    ``default_socket``: see :class:`LocalStack`."""
    require_binaries()
    s = LocalStack(workdir, default_socket=default_socket)
    s.start()
    try:
        yield s
    finally:
        rc = s.stop()
        diag = s.diagnostics(200)
        assert "panicked" not in diag, f"a service panicked during the tests:\n{diag}"
        assert rc in (0, None), f"s3dma local exited {rc} on SIGINT\n{diag}"
