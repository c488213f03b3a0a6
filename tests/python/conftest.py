"""Fixtures that run the real storage-target binary for the boto3 / aws CLI
integration tests.

The binary is not built here: it is ``target/debug/storage-target`` under the
repository root (``STORAGE_TARGET_BIN`` overrides). One server runs for the
whole session; every test gets its own bucket(s).

Users in the session server's config:

* alice -- ``*`` read-write (may create any bucket)
* bob   -- read-write on buckets named ``bob-*``
* carol -- read on ``shared`` (secret given through ``secret_file``)
* dave  -- write on ``shared``
* erin  -- no grants, ``create_buckets: true``, explicit ``canonical_id``
  (ERIN_CANONICAL_ID) and ``display_name`` "Erin"
* frank -- no grants, ``create_buckets: true``, default canonical id and
  display name (``owner("frank")``)

erin and frank reach only what they own or what an ACL grants them; the
``anon`` fixture is a boto3 client that sends unsigned requests.
"""

from __future__ import annotations

import hashlib
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import boto3
import pytest
import yaml
from botocore import UNSIGNED
from botocore.config import Config

sys.path.insert(0, str(Path(__file__).resolve().parent))
# The tenant client under test is the repository's source, even where .venv
# has an installed copy of the package (setup.sh installs the wheel).
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))

from s3util import REGION, User, unique_bucket  # noqa: E402
from tenant_stack import ExitedEarly, stdout_lines, with_pdeathsig  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[2]
READY_RE = re.compile(r"^storage-target listening on (http://\S+)$")
METRICS_RE = re.compile(r"^metrics on (http://\S+/metrics)$")

USERS = {
    "alice": User("alice", "alice", "alice-secret-Zk3rT9"),
    "bob": User("bob", "bob", "bob-secret-Qw8uY2"),
    "carol": User("carol", "carol", "carol-secret-Lm4nB7"),
    "dave": User("dave", "dave", "dave-secret-Hx5vC1"),
    "erin": User("erin", "erin", "erin-secret-Vb6nM3"),
    "frank": User("frank", "frank", "frank-secret-Pq2wE8"),
}
SHARED_BUCKET = "shared"
ERIN_CANONICAL_ID = "e1e2e3e4e5e6e7e8e9e0eaebecedeeef" + "0123456789abcdef0123456789abcdef"
ALL_USERS = "http://acs.amazonaws.com/groups/global/AllUsers"
AUTHENTICATED_USERS = "http://acs.amazonaws.com/groups/global/AuthenticatedUsers"


def canonical_id(user: str) -> str:
    """A session user's canonical id: erin's is configured, everyone else
    has the default, hex(sha256("s3dma-user:" + access key id))."""
    if user == "erin":
        return ERIN_CANONICAL_ID
    return hashlib.sha256(f"s3dma-user:{USERS[user].access_key}".encode()).hexdigest()


def owner(user: str) -> dict[str, str]:
    """``{"ID", "DisplayName"}`` as S3 shows a session user (the display
    name defaults to the canonical id: access key ids are never shown)."""
    return {"ID": canonical_id(user), "DisplayName": "Erin" if user == "erin" else canonical_id(user)}


def storage_target_bin() -> Path:
    env = os.environ.get("STORAGE_TARGET_BIN")
    return Path(env) if env else REPO_ROOT / "target" / "debug" / "storage-target"


def default_users_config(secret_dir: Path) -> list[dict]:
    carol_secret = secret_dir / "carol.secret"
    carol_secret.write_text(USERS["carol"].secret + "\n")
    carol_secret.chmod(0o600)
    return [
        {
            "access_key_id": USERS["alice"].access_key,
            "secret": USERS["alice"].secret,
            "buckets": [{"name": "*", "access": "read-write"}],
        },
        {
            "access_key_id": USERS["bob"].access_key,
            "secret": USERS["bob"].secret,
            "buckets": [{"name": "bob-*", "access": "read-write"}],
        },
        {
            "access_key_id": USERS["carol"].access_key,
            "secret_file": str(carol_secret),
            "buckets": [{"name": SHARED_BUCKET, "access": "read"}],
        },
        {
            "access_key_id": USERS["dave"].access_key,
            "secret": USERS["dave"].secret,
            "buckets": [{"name": SHARED_BUCKET, "access": "write"}],
        },
        {
            "access_key_id": USERS["erin"].access_key,
            "secret": USERS["erin"].secret,
            "canonical_id": ERIN_CANONICAL_ID,
            "display_name": "Erin",
            "create_buckets": True,
        },
        {
            "access_key_id": USERS["frank"].access_key,
            "secret": USERS["frank"].secret,
            "create_buckets": True,
        },
    ]


class StorageTarget:
    """One storage-target process. ``start``/``stop``/``restart`` keep the
    same config and data directory (the port changes on every start).

    The data directory is ``<workdir>/jail/data``; ``<workdir>/jail`` holds
    nothing else, so a test can check that nothing escaped the data dir."""

    def __init__(self, workdir: Path, *, users=None, extra: dict | None = None, metrics=True):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.jail = self.workdir / "jail"
        self.data_dir = self.jail / "data"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.config_path = self.workdir / "storage-target.yaml"
        self.log_path = self.workdir / "storage-target.stderr.log"
        self.users = dict(USERS)
        cfg = {
            "listen": "127.0.0.1:0",
            "region": REGION,
            "data_dir": str(self.data_dir),
            "users": users if users is not None else default_users_config(self.workdir),
        }
        if metrics:
            cfg["metrics_listen"] = "127.0.0.1:0"
        cfg.update(extra or {})
        self.config = cfg
        self.config_path.write_text(yaml.safe_dump(cfg, sort_keys=False))
        self.proc: subprocess.Popen | None = None
        self.endpoint: str | None = None
        self.metrics_url: str | None = None
        self.stdout_lines: list[str] = []
        self._metrics = metrics

    # -- lifecycle ---------------------------------------------------------

    def start(self, timeout: float = 60.0) -> "StorageTarget":
        binary = storage_target_bin()
        if not binary.exists():
            pytest.fail(
                f"storage-target binary not found at {binary}; build it with "
                "`cargo build -p storage-target` or set STORAGE_TARGET_BIN",
                pytrace=False,
            )
        log = open(self.log_path, "ab")
        env = dict(os.environ)
        # SIGTERM the server if pytest dies without cleaning up.
        self.proc = subprocess.Popen(
            with_pdeathsig([binary, "--config", self.config_path], "TERM"),
            stdout=subprocess.PIPE,
            stderr=log,
            stdin=subprocess.DEVNULL,
            env=env,
            text=True,
            bufsize=1,
        )
        log.close()
        self.stdout_lines = []
        self.endpoint = None
        self.metrics_url = None
        try:
            for line in stdout_lines(self.proc, self.stdout_lines, timeout, exit_wait=10):
                m = READY_RE.match(line)
                if m:
                    self.endpoint = m.group(1).rstrip("/")
                m = METRICS_RE.match(line)
                if m:
                    self.metrics_url = m.group(1)
                if self.endpoint is not None and (not self._metrics or self.metrics_url is not None):
                    break
        except TimeoutError:
            self.kill()
            raise RuntimeError(
                f"storage-target did not report readiness in {timeout}s; "
                f"stdout={self.stdout_lines!r}\n{self.stderr_tail()}"
            ) from None
        except ExitedEarly as e:
            raise RuntimeError(
                f"storage-target exited (rc={e.rc}) before it was ready; "
                f"stdout={self.stdout_lines!r}\n{self.stderr_tail()}"
            ) from None
        return self

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM, wait; returns the exit code (None if it was not running)."""
        if self.proc is None:
            return None
        proc, self.proc = self.proc, None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                return proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                raise RuntimeError(f"storage-target ignored SIGTERM for {timeout}s")
        return proc.returncode

    def kill(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def restart(self) -> "StorageTarget":
        self.stop()
        return self.start()

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    # -- helpers -----------------------------------------------------------

    def stderr_tail(self, n: int = 60) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except FileNotFoundError:
            return "(no stderr log)"
        return "--- storage-target stderr (tail) ---\n" + "\n".join(lines[-n:])

    def client(self, user: str | User = "alice", *, s3: dict | None = None, region: str = REGION, **cfg):
        """A boto3 S3 client for ``user`` (name or User) against this server,
        signing for ``region``."""
        u = self.users[user] if isinstance(user, str) else user
        s3cfg = {"addressing_style": "path"}
        s3cfg.update(s3 or {})
        config = Config(
            signature_version="s3v4",
            s3=s3cfg,
            retries={"max_attempts": 1, "mode": "standard"},
            connect_timeout=10,
            read_timeout=120,
            **cfg,
        )
        return boto3.session.Session().client(
            "s3",
            endpoint_url=self.endpoint,
            region_name=region,
            aws_access_key_id=u.access_key,
            aws_secret_access_key=u.secret,
            config=config,
        )

    def anonymous_client(self):
        """A boto3 S3 client that sends unsigned (anonymous) requests."""
        config = Config(
            signature_version=UNSIGNED,
            s3={"addressing_style": "path"},
            retries={"max_attempts": 1, "mode": "standard"},
            connect_timeout=10,
            read_timeout=120,
        )
        return boto3.session.Session().client("s3", endpoint_url=self.endpoint, region_name=REGION, config=config)


def empty_and_delete_bucket(client, bucket: str):
    """Best effort: remove everything in ``bucket`` and the bucket itself."""
    try:
        token = None
        while True:
            kw = {"Bucket": bucket}
            if token:
                kw["ContinuationToken"] = token
            page = client.list_objects_v2(**kw)
            keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
            for k in keys:
                try:
                    client.delete_object(Bucket=bucket, Key=k["Key"])
                except Exception:
                    pass
            if not page.get("IsTruncated") or not page.get("NextContinuationToken"):
                break
            token = page["NextContinuationToken"]
    except Exception:
        pass
    try:
        for up in client.list_multipart_uploads(Bucket=bucket).get("Uploads", []):
            client.abort_multipart_upload(Bucket=bucket, Key=up["Key"], UploadId=up["UploadId"])
    except Exception:
        pass
    try:
        client.delete_bucket(Bucket=bucket)
    except Exception:
        pass


# ------------------------------------------------------------------------
# fixtures
# ------------------------------------------------------------------------


@pytest.fixture(scope="session")
def target(tmp_path_factory):
    """The session's storage-target: ``.endpoint``, ``.data_dir``,
    ``.metrics_url``, ``.users``, ``.client(user)``, ``.restart()``,
    ``.stop()``, ``.start()``."""
    server = StorageTarget(tmp_path_factory.mktemp("storage-target"))
    server.start()
    try:
        alice = server.client("alice")
        try:
            alice.create_bucket(Bucket=SHARED_BUCKET)
        except Exception as e:  # reported by the tests that use it
            print(f"warning: could not create {SHARED_BUCKET!r}: {e}", file=sys.stderr)
        yield server
    finally:
        server.stop()
        tail = server.stderr_tail(200)
        if "panicked" in tail:
            print(f"storage-target panicked during the session:\n{tail}", file=sys.stderr)


@pytest.fixture
def make_target(tmp_path):
    """Factory for a private server (own config/data dir); stopped at the end."""
    servers: list[StorageTarget] = []

    def factory(**kwargs) -> StorageTarget:
        s = StorageTarget(tmp_path / f"st{len(servers)}", **kwargs)
        servers.append(s)
        return s

    yield factory
    for s in servers:
        try:
            s.stop()
        except Exception:
            s.kill()


@pytest.fixture
def users():
    return USERS


@pytest.fixture
def anon(target):
    """boto3 client without credentials (unsigned requests)."""
    return target.anonymous_client()


@pytest.fixture
def s3(target):
    """boto3 client for alice."""
    return target.client("alice")


@pytest.fixture
def bucket(target, s3):
    """A fresh bucket owned by alice, emptied and deleted afterwards."""
    name = unique_bucket("t")
    s3.create_bucket(Bucket=name)
    yield name
    empty_and_delete_bucket(s3, name)


@pytest.fixture
def bucket_factory(target):
    """Create extra buckets as any user: ``bucket_factory(prefix, user)``;
    keyword arguments go to CreateBucket (``ACL=...``, ``GrantRead=...``)."""
    made: list[tuple[str, str]] = []

    def factory(prefix: str = "t", user: str = "alice", **create) -> str:
        name = unique_bucket(prefix)
        target.client(user).create_bucket(Bucket=name, **create)
        made.append((name, user))
        return name

    yield factory
    for name, user in made:
        empty_and_delete_bucket(target.client(user), name)


# -- the tenant-client suites: `s3dma local` per test module ----------------


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """storage-target, dpu-agent and host-shim (`s3dma local`, tcp fabric)
    for one test module (see tenant_stack.py)."""
    from tenant_stack import running_stack

    with running_stack(tmp_path_factory.mktemp("s3dma-local")) as s:
        yield s


@pytest.fixture(scope="module")
def client(stack):
    """An s3dma.Client of the module's stack."""
    import s3dma

    with s3dma.Client(stack.socket) as c:
        yield c
