"""Helpers shared by the storage-target integration tests.

Raw HTTP requests with our own SigV4 signer (header auth, presign checks,
aws-chunked streaming payloads, skewed clocks, tampering), S3 XML error
assertions, and botocore hooks that force or record the payload mode a real
boto3 client uses.

The signer is checked against botocore's own in test_boto3_auth.py
(``test_own_signer_matches_botocore``) so raw-request failures are the
server's, not the signer's.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import hmac
import http.client
import os
import uuid
import xml.etree.ElementTree as ET
import zlib
from dataclasses import dataclass, field
from urllib.parse import quote, urlsplit

from botocore.exceptions import ClientError

REGION = "us-east-1"
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
UNSIGNED_PAYLOAD = "UNSIGNED-PAYLOAD"
STREAMING_SIGNED = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD"
STREAMING_UNSIGNED_TRAILER = "STREAMING-UNSIGNED-PAYLOAD-TRAILER"
STREAMING_SIGNED_TRAILER = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER"
S3_NS = "{http://s3.amazonaws.com/doc/2006-03-01/}"

MiB = 1024 * 1024


@dataclass(frozen=True)
class User:
    name: str
    access_key: str
    secret: str


# --------------------------------------------------------------------------
# small utilities
# --------------------------------------------------------------------------


def unique_bucket(prefix: str = "t") -> str:
    """A fresh, valid, lowercase bucket name (<= 63 chars)."""
    return f"{prefix}-{uuid.uuid4().hex[:20]}"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def md5_hex(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def md5_b64(data: bytes) -> str:
    return base64.b64encode(hashlib.md5(data).digest()).decode()


def multipart_etag(parts: list[bytes]) -> str:
    """S3 multipart ETag: md5 of the concatenated binary part md5s, '-N'."""
    digests = b"".join(hashlib.md5(p).digest() for p in parts)
    return f'"{hashlib.md5(digests).hexdigest()}-{len(parts)}"'


def crc32_b64(data: bytes) -> str:
    return base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()


def rand(n: int) -> bytes:
    return os.urandom(n)


def error_code(exc: ClientError) -> str:
    return exc.response.get("Error", {}).get("Code", "")


def http_status(exc: ClientError) -> int:
    return exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)


def assert_all_refused(calls: dict, status: int, codes: tuple[str, ...]) -> None:
    """Every ``{name: call}`` raises a ClientError with this HTTP status and
    one of these error codes; every one that does not is named in one report."""
    wrong = []
    for name, call in calls.items():
        try:
            call()
            wrong.append(f"{name} succeeded")
        except ClientError as e:
            code, got = error_code(e), http_status(e)
            if got != status or code not in codes:
                wrong.append(f"{name}: {got} {code}")
    assert not wrong, wrong


def assert_client_error(excinfo_or_exc, code: str | tuple, status: int | None = None):
    exc = getattr(excinfo_or_exc, "value", excinfo_or_exc)
    assert isinstance(exc, ClientError), exc
    codes = (code,) if isinstance(code, str) else code
    got = error_code(exc)
    assert got in codes, f"expected S3 error {codes}, got {got!r} (HTTP {http_status(exc)}): {exc.response}"
    if status is not None:
        assert http_status(exc) == status, (
            f"expected HTTP {status} for {got}, got {http_status(exc)}: {exc.response}"
        )


def amz_date(t: dt.datetime | None = None) -> str:
    t = t or dt.datetime.now(dt.timezone.utc)
    return t.astimezone(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")


# --------------------------------------------------------------------------
# SigV4 (our own, so every field can be controlled)
# --------------------------------------------------------------------------


def _hmac(key: bytes, msg: str) -> bytes:
    return hmac.new(key, msg.encode(), hashlib.sha256).digest()


def signing_key(secret: str, date: str, region: str = REGION, service: str = "s3") -> bytes:
    k = _hmac(("AWS4" + secret).encode(), date)
    k = _hmac(k, region)
    k = _hmac(k, service)
    return _hmac(k, "aws4_request")


def uri_encode(s: str, safe: str = "-_.~") -> str:
    return quote(s, safe=safe)


def key_path(bucket: str, key: str | None = None) -> str:
    """Path-style request path with S3 (botocore-compatible) encoding."""
    p = "/" + uri_encode(bucket)
    if key is not None:
        p += "/" + uri_encode(key, safe="/-_.~")
    return p


def canonical_query(query: list[tuple[str, str]]) -> str:
    enc = sorted((uri_encode(k), uri_encode(v)) for k, v in query)
    return "&".join(f"{k}={v}" for k, v in enc)


def sign_headers(
    method: str,
    path: str,
    query: list[tuple[str, str]],
    headers: dict[str, str],
    payload_hash: str,
    user: User,
    timestamp: str,
    region: str = REGION,
) -> tuple[str, str]:
    """Returns (Authorization header value, signature). ``path`` is the
    already-encoded wire path (S3 does not double-encode or normalize)."""
    lower = {k.lower().strip(): " ".join(str(v).split()) for k, v in headers.items()}
    names = sorted(lower)
    canonical_headers = "".join(f"{n}:{lower[n]}\n" for n in names)
    signed = ";".join(names)
    creq = "\n".join(
        [method.upper(), path, canonical_query(query), canonical_headers, signed, payload_hash]
    )
    date = timestamp[:8]
    scope = f"{date}/{region}/s3/aws4_request"
    sts = "\n".join(
        ["AWS4-HMAC-SHA256", timestamp, scope, hashlib.sha256(creq.encode()).hexdigest()]
    )
    sig = hmac.new(signing_key(user.secret, date, region), sts.encode(), hashlib.sha256).hexdigest()
    auth = f"AWS4-HMAC-SHA256 Credential={user.access_key}/{scope}, SignedHeaders={signed}, Signature={sig}"
    return auth, sig


# --------------------------------------------------------------------------
# raw HTTP
# --------------------------------------------------------------------------


@dataclass
class Resp:
    status: int
    reason: str
    headers: dict[str, str]  # lower-cased names
    body: bytes
    raw_headers: list[tuple[str, str]] = field(default_factory=list)

    def header(self, name: str, default=None):
        return self.headers.get(name.lower(), default)

    def xml(self) -> ET.Element:
        return ET.fromstring(self.body)

    def error(self) -> dict[str, str]:
        root = self.xml()
        return {strip_ns(c.tag): (c.text or "") for c in root}

    def __repr__(self):
        return f"<Resp {self.status} {self.reason} headers={self.headers} body={self.body[:600]!r}>"


def strip_ns(tag: str) -> str:
    return tag.split("}", 1)[1] if tag.startswith("{") else tag


def send(endpoint: str, method: str, path_qs: str, headers: dict[str, str], body=b"", timeout=60) -> Resp:
    u = urlsplit(endpoint)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    try:
        conn.putrequest(method, path_qs, skip_host=True, skip_accept_encoding=True)
        has_len = any(k.lower() in ("content-length", "transfer-encoding") for k in headers)
        for k, v in headers.items():
            conn.putheader(k, v)
        if not has_len and (body or method in ("PUT", "POST")):
            conn.putheader("Content-Length", str(len(body)))
        conn.endheaders()
        if body:
            if isinstance(body, (bytes, bytearray)):
                conn.send(body)
            else:  # iterable of byte strings
                for piece in body:
                    conn.send(piece)
        r = conn.getresponse()
        data = r.read()
        raw = r.getheaders()
        return Resp(r.status, r.reason, {k.lower(): v for k, v in raw}, data, raw)
    finally:
        conn.close()


def raw_request(
    endpoint: str,
    method: str,
    path: str,
    *,
    query: list[tuple[str, str]] | None = None,
    headers: dict[str, str] | None = None,
    body: bytes = b"",
    user: User | None = None,
    payload_hash: str | None = None,
    timestamp: str | None = None,
    region: str = REGION,
    sign_secret: str | None = None,
    after_sign=None,
    sign_path: str | None = None,
) -> Resp:
    """One request. ``user=None`` sends it anonymous (unsigned).

    ``payload_hash`` defaults to the body's sha256; pass UNSIGNED_PAYLOAD etc.
    ``sign_secret`` signs with a different secret than the user's (wrong
    secret tests). ``after_sign(headers)`` may tamper after signing.
    ``sign_path`` is the canonical URI to sign when it differs from the wire
    path (S3 canonicalizes by decoding and re-encoding each segment once).
    """
    query = query or []
    u = urlsplit(endpoint)
    hdrs = {"Host": u.netloc}
    hdrs.update(headers or {})
    if user is not None:
        ts = timestamp or amz_date()
        ph = payload_hash if payload_hash is not None else sha256(body)
        hdrs["x-amz-date"] = ts
        hdrs["x-amz-content-sha256"] = ph
        signer = User(user.name, user.access_key, sign_secret or user.secret)
        auth, _ = sign_headers(method, sign_path or path, query, hdrs, ph, signer, ts, region)
        hdrs["Authorization"] = auth
    if after_sign:
        after_sign(hdrs)
    qs = canonical_query(query) if query else ""
    return send(endpoint, method, path + ("?" + qs if qs else ""), hdrs, body)


def assert_s3_error(
    resp: Resp, status: int, code: str | tuple, head: bool = False, require_message: bool = False
) -> dict:
    """An S3 error response: status, XML <Error><Code>, and <RequestId> equal
    to the x-amz-request-id header. HEAD responses carry no body.
    ``require_message``: also insist on a non-empty <Message> (checked for
    every error code in test_error_request_ids_are_unique_and_match)."""
    codes = (code,) if isinstance(code, str) else code
    assert resp.status == status, f"expected HTTP {status} {codes}, got {resp!r}"
    rid = resp.header("x-amz-request-id")
    assert rid, f"no x-amz-request-id header on error response: {resp!r}"
    if head or resp.status == 304:
        return {}
    assert resp.body, f"empty body on {resp.status} error (expected S3 XML Error): {resp!r}"
    try:
        err = resp.error()
    except ET.ParseError as e:  # pragma: no cover - reported as failure
        raise AssertionError(f"error body is not XML ({e}): {resp!r}")
    assert strip_ns(resp.xml().tag) == "Error", f"root element is not <Error>: {resp!r}"
    assert err.get("Code") in codes, f"expected Code {codes}, got {err.get('Code')!r}: {resp!r}"
    if require_message:
        assert err.get("Message"), f"<Message> missing/empty: {resp!r}"
    assert "RequestId" in err, f"<RequestId> missing from error XML: {resp!r}"
    assert err["RequestId"] == rid, (
        f"<RequestId>{err['RequestId']}</RequestId> != x-amz-request-id {rid!r}"
    )
    return err


# --------------------------------------------------------------------------
# aws-chunked encodings
# --------------------------------------------------------------------------


def streaming_signed_put(
    endpoint: str,
    user: User,
    path: str,
    data: bytes,
    *,
    chunk_size: int = 64 * 1024,
    query: list[tuple[str, str]] | None = None,
    headers: dict[str, str] | None = None,
    tamper_chunk: int | None = None,
    tamper_data: bool = False,
    method: str = "PUT",
    decoded_length: int | None = None,
    trailer: bool = False,
    trailer_checksum: str | None = None,
    tamper_trailer_signature: bool = False,
) -> Resp:
    """PUT with x-amz-content-sha256: STREAMING-AWS4-HMAC-SHA256-PAYLOAD
    (each chunk carries a chained signature), Content-Length framing.
    ``trailer=True``: STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER, i.e. the
    same plus a signed x-amz-checksum-crc32 trailer.

    ``tamper_chunk=i`` corrupts chunk i's signature; ``tamper_data`` flips a
    byte of chunk 0 after signing it."""
    query = query or []
    u = urlsplit(endpoint)
    ts = amz_date()
    date = ts[:8]
    scope = f"{date}/{REGION}/s3/aws4_request"
    mode = STREAMING_SIGNED_TRAILER if trailer else STREAMING_SIGNED
    chunks = [data[i : i + chunk_size] for i in range(0, len(data), chunk_size)] + [b""]
    crc = trailer_checksum if trailer_checksum is not None else crc32_b64(data)
    trailer_line = f"x-amz-checksum-crc32:{crc}"

    def encode(sign) -> bytes:
        out = []
        prev = sign(None, None)
        for i, c in enumerate(chunks):
            sig = sign("chunk", (prev, c))
            prev = sig
            if tamper_chunk == i:
                sig = ("0" if sig[0] != "0" else "1") + sig[1:]
            payload = c
            if tamper_data and i == 0 and c:
                payload = bytes([c[0] ^ 0xFF]) + c[1:]
            last = i == len(chunks) - 1
            out.append(f"{len(c):x};chunk-signature={sig}\r\n".encode() + payload)
            if not (last and trailer):
                out.append(b"\r\n")
        if trailer:
            tsig = sign("trailer", (prev, trailer_line + "\n"))
            if tamper_trailer_signature:
                tsig = ("0" if tsig[0] != "0" else "1") + tsig[1:]
            out.append(f"{trailer_line}\r\nx-amz-trailer-signature:{tsig}\r\n\r\n".encode())
        return b"".join(out)

    length = len(encode(lambda kind, arg: "0" * 64))
    hdrs = {"Host": u.netloc}
    hdrs.update(headers or {})
    hdrs.update(
        {
            "x-amz-date": ts,
            "x-amz-content-sha256": mode,
            "x-amz-decoded-content-length": str(len(data) if decoded_length is None else decoded_length),
            "Content-Length": str(length),
        }
    )
    if trailer:
        hdrs["x-amz-trailer"] = "x-amz-checksum-crc32"
    # botocore's form: an existing content-encoding keeps its place, aws-chunked is appended
    ce = hdrs.pop("Content-Encoding", None)
    hdrs["Content-Encoding"] = f"{ce},aws-chunked" if ce else "aws-chunked"
    auth, seed = sign_headers(method, path, query, hdrs, mode, user, ts)
    hdrs["Authorization"] = auth
    key = signing_key(user.secret, date)

    def sign(kind, arg):
        if kind is None:
            return seed
        prev, payload = arg
        if kind == "chunk":
            sts = ["AWS4-HMAC-SHA256-PAYLOAD", ts, scope, prev, EMPTY_SHA256, hashlib.sha256(payload).hexdigest()]
        else:
            sts = ["AWS4-HMAC-SHA256-TRAILER", ts, scope, prev, hashlib.sha256(payload.encode()).hexdigest()]
        return hmac.new(key, "\n".join(sts).encode(), hashlib.sha256).hexdigest()

    body = encode(sign)
    assert len(body) == length
    qs = canonical_query(query) if query else ""
    return send(endpoint, method, path + ("?" + qs if qs else ""), hdrs, body)


def unsigned_trailer_put(
    endpoint: str,
    user: User,
    path: str,
    data: bytes,
    *,
    chunk_size: int = 64 * 1024,
    query: list[tuple[str, str]] | None = None,
    checksum: str | None = None,
    http_chunked: bool = False,
    omit_trailer: bool = False,
) -> Resp:
    """PUT with STREAMING-UNSIGNED-PAYLOAD-TRAILER and an
    x-amz-checksum-crc32 trailer (``checksum`` overrides the value)."""
    query = query or []
    u = urlsplit(endpoint)
    ts = amz_date()
    chunks = [data[i : i + chunk_size] for i in range(0, len(data), chunk_size)]
    crc = checksum if checksum is not None else crc32_b64(data)
    encoded = b"".join(f"{len(c):x}\r\n".encode() + c + b"\r\n" for c in chunks)
    trailer = b"" if omit_trailer else f"x-amz-checksum-crc32:{crc}\r\n".encode()
    encoded += b"0\r\n" + trailer + b"\r\n"
    hdrs = {
        "Host": u.netloc,
        "x-amz-date": ts,
        "x-amz-content-sha256": STREAMING_UNSIGNED_TRAILER,
        "x-amz-decoded-content-length": str(len(data)),
        "x-amz-trailer": "x-amz-checksum-crc32",
        "Content-Encoding": "aws-chunked",
    }
    if not http_chunked:
        hdrs["Content-Length"] = str(len(encoded))
    auth, _ = sign_headers("PUT", path, query, hdrs, STREAMING_UNSIGNED_TRAILER, user, ts)
    hdrs["Authorization"] = auth
    body: bytes | list = encoded
    if http_chunked:
        hdrs["Transfer-Encoding"] = "chunked"
        # HTTP/1.1 chunked framing around the aws-chunked body
        body = [f"{len(encoded):x}\r\n".encode() + encoded + b"\r\n0\r\n\r\n"]
    qs = canonical_query(query) if query else ""
    return send(endpoint, "PUT", path + ("?" + qs if qs else ""), hdrs, body)


# --------------------------------------------------------------------------
# botocore hooks
# --------------------------------------------------------------------------


class SentHeaders:
    """Records the headers of every request a boto3 client sends."""

    def __init__(self, client):
        self.requests: list[tuple[str, str, dict]] = []
        client.meta.events.register("before-send.s3", self._record)

    def _record(self, request, **kwargs):
        hdrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in request.headers.items()}
        self.requests.append((request.method, request.url, hdrs))

    def content_sha256(self, method: str = "PUT") -> list[str]:
        out = []
        for m, _, h in self.requests:
            if m == method:
                v = h.get("X-Amz-Content-SHA256") or h.get("x-amz-content-sha256")
                out.append(v)
        return out


def force_unsigned_trailer(client):
    """Make botocore use STREAMING-UNSIGNED-PAYLOAD-TRAILER (aws-chunked with
    a trailing x-amz-checksum-*) for PutObject/UploadPart even over plain
    HTTP, exactly as it does by default over HTTPS."""

    def hook(context, **kwargs):
        alg = context.get("checksum", {}).get("request_algorithm")
        if isinstance(alg, dict):
            alg["in"] = "trailer"

    for op in ("PutObject", "UploadPart"):
        client.meta.events.register(f"before-call.s3.{op}", hook)
