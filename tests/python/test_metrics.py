"""Prometheus metrics: GET /metrics on metrics_listen exposes
s3dma_storage_target_requests_total with op and outcome labels."""

from __future__ import annotations

import re
import urllib.request

import pytest
from botocore.exceptions import ClientError

METRIC = "s3dma_storage_target_requests_total"
LINE_RE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)")
LABEL_RE = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def scrape(url: str) -> tuple[str, dict[tuple, float]]:
    with urllib.request.urlopen(url, timeout=10) as r:
        assert r.status == 200
        ctype = r.headers.get("Content-Type", "")
        text = r.read().decode()
    assert ctype.startswith("text/plain"), ctype
    samples = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = LINE_RE.match(line)
        if not m or m.group("name") != METRIC:
            continue
        labels = tuple(sorted(LABEL_RE.findall(m.group("labels") or "")))
        samples[labels] = float(m.group("value"))
    return text, samples


def norm(op: str) -> str:
    return op.replace("_", "").replace("-", "").lower()


def total(samples, op=None, outcome=None) -> float:
    out = 0.0
    for labels, v in samples.items():
        d = dict(labels)
        if op is not None and norm(d.get("op", "")) != norm(op):
            continue
        if outcome is not None and d.get("outcome") != str(outcome):
            continue
        out += v
    return out


def test_requests_total_by_op_and_outcome(target, s3, bucket):
    assert target.metrics_url, "metrics_listen is configured; the binary must print 'metrics on http://...'"
    _, before = scrape(target.metrics_url)
    for i in range(3):
        s3.put_object(Bucket=bucket, Key=f"m{i}", Body=b"metrics")
    s3.get_object(Bucket=bucket, Key="m0")["Body"].read()
    for _ in range(2):
        with pytest.raises(ClientError):
            s3.get_object(Bucket=bucket, Key="missing")
    text, after = scrape(target.metrics_url)
    assert f"# TYPE {METRIC} counter" in text, text[:2000]
    assert after, f"no {METRIC} samples:\n{text[:2000]}"
    for labels in after:
        keys = dict(labels)
        assert "op" in keys and "outcome" in keys, f"{METRIC} needs op and outcome labels: {labels}"
    assert total(after, "PutObject", 200) - total(before, "PutObject", 200) >= 3, after
    assert total(after, "GetObject", 200) - total(before, "GetObject", 200) >= 1, after
    assert total(after, "GetObject", 404) - total(before, "GetObject", 404) >= 2, after
    assert total(after) - total(before) >= 6
    # bounded cardinality: no bucket names or keys in label values
    for labels in after:
        for _, v in labels:
            assert bucket not in v and v not in ("m0", "m1", "m2", "missing"), f"per-bucket/key label: {labels}"
    # secrets never leak into metrics
    for u in target.users.values():
        assert u.secret not in text


def test_metrics_not_on_s3_port(target, users):
    """/metrics lives on its own listener; on the S3 port it is just a bucket path."""
    from s3util import raw_request

    r = raw_request(target.endpoint, "GET", "/metrics")
    # an anonymous S3 request for a bucket named "metrics", which does not exist
    assert r.status == 404 and b"<Code>NoSuchBucket</Code>" in r.body, r
    assert METRIC.encode() not in r.body
