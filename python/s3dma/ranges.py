"""Byte ranges, as HTTP and S3 spell them (inclusive on both ends).

Accepted forms (:func:`parse_range`):

* ``"a-b"`` (or ``"bytes=a-b"``), or the tuple ``(a, b)``: bytes a..=b; a
  ``b`` past the end is clamped to the object's last byte by the server.
* ``"a-"`` or ``(a, None)``: from byte a to the end.
* ``"-n"`` or ``(None, n)``: the last n bytes.
* ``None``: the whole object.

Tuples are inclusive, like the strings (``(0, 9)`` is 10 bytes), not
Python-slice style.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional, Tuple, Union

RangeLike = Union[None, str, Tuple[Optional[int], Optional[int]], "ByteRange"]

_RE = re.compile(r"^\s*(?:bytes=)?\s*(\d*)\s*-\s*(\d*)\s*$")


@dataclass(frozen=True)
class ByteRange:
    """``first``/``last`` (bounded), ``first`` only (from), or ``suffix``."""

    first: Optional[int] = None
    last: Optional[int] = None
    suffix: Optional[int] = None

    def __post_init__(self):
        for name in ("first", "last", "suffix"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
                raise ValueError(f"range {name} must be a non-negative integer, not {v!r}")
        if self.suffix is not None:
            if self.first is not None or self.last is not None:
                raise ValueError("a suffix range has neither first nor last")
        elif self.first is None:
            raise ValueError("a range needs a first byte or a suffix length")
        elif self.last is not None and self.last < self.first:
            raise ValueError(f"range {self.first}-{self.last} ends before it starts")

    def __str__(self) -> str:
        if self.suffix is not None:
            return f"-{self.suffix}"
        return f"{self.first}-" + ("" if self.last is None else str(self.last))

    def length(self, object_size: Optional[int] = None) -> Optional[int]:
        """Bytes the range covers (clamped to ``object_size`` when given)."""
        if self.suffix is not None:
            return self.suffix if object_size is None else min(self.suffix, object_size)
        if object_size is None:
            return None if self.last is None else self.last - self.first + 1
        last = object_size - 1 if self.last is None else min(self.last, object_size - 1)
        return max(0, last - self.first + 1)

    def to_proto(self):
        from ._pb import agent_pb2

        if self.suffix is not None:
            return agent_pb2.ByteRange(suffix=self.suffix)
        if self.last is None:
            return agent_pb2.ByteRange(**{"from": self.first})
        return agent_pb2.ByteRange(bounded=agent_pb2.ByteRange.Bounded(first=self.first, last=self.last))


def parse_range(r: RangeLike) -> Optional[ByteRange]:
    """``None`` for the whole object, else a :class:`ByteRange`.

    Raises ValueError naming the input when it is not a range."""
    if r is None:
        return None
    if isinstance(r, ByteRange):
        return r
    if isinstance(r, str):
        m = _RE.match(r)
        if not m or (not m.group(1) and not m.group(2)):
            raise ValueError(f"not a byte range: {r!r} (expected 'a-b', 'a-' or '-n')")
        a, b = m.group(1), m.group(2)
        if not a:
            return ByteRange(suffix=int(b))
        try:
            return ByteRange(first=int(a), last=int(b) if b else None)
        except ValueError as e:
            raise ValueError(f"not a byte range: {r!r} ({e})") from None
    if isinstance(r, (tuple, list)) and len(r) == 2:
        a, b = r
        if a is None and b is None:
            raise ValueError(f"not a byte range: {r!r}")
        if a is None:
            return ByteRange(suffix=b)
        return ByteRange(first=a, last=b)
    raise ValueError(f"not a byte range: {r!r} (expected 'a-b', 'a-', '-n' or a (first, last) tuple)")
