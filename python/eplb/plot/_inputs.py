"""eplb.plot's input files, read as untrusted: the plot CLI's guard (issue 29 items 13, 14).

Contract: `read_json(path, max_bytes)` reads only a regular file (opened non-blocking, so a FIFO or a
device never blocks; checked with fstat on the descriptor read), at most `max_bytes` bytes (refused
before reading when larger), decoded as UTF-8 and parsed as one JSON object; every failure is one
eplb.Error ("I/O error" for what the file is, "parse error" for what it holds) naming the path.
`expect(value, kind, field)` and friends check one field's type and raise eplb.Error ("parse error")
naming the field ("rounds[0].serving.step_seconds_p50"). `parse_byte_size` reads the CLI's byte sizes (with the CLI's C++ parser).
"""
from __future__ import annotations

import json
import os
import stat
from numbers import Integral, Real

from eplb import _eplb
from eplb.errors import Error

DEFAULT_MAX_BYTES = 1 << 30


def parse_byte_size(text: str) -> int:
    """--max-input-bytes as the eplb CLI reads it (its C++ parser: "4096", "512KiB", "1.5GiB"; powers
    of 1024, in [1 B, 1 TiB]); eplb.Error ("invalid argument") with the CLI's message otherwise."""
    return _eplb.parse_byte_size(text, "--max-input-bytes")


def _read_bytes(path: str, max_bytes: int) -> bytes:
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as failure:
        raise Error(f"{path}: cannot read: {failure.strerror}", "I/O error") from None
    status = os.fstat(descriptor)
    if not stat.S_ISREG(status.st_mode):
        os.close(descriptor)
        raise Error(f"{path}: not a regular file (a device, FIFO, socket or directory is never read)", "I/O error")
    with os.fdopen(descriptor, "rb") as file:
        if status.st_size > max_bytes:
            raise Error(f"{path}: {status.st_size} bytes, more than --max-input-bytes ({max_bytes} bytes)",
                        "I/O error")
        data = file.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise Error(f"{path}: grew past --max-input-bytes ({max_bytes} bytes) while read", "I/O error")
    return data


def read_json(path, max_bytes: int = DEFAULT_MAX_BYTES) -> dict:
    """The JSON object in the regular file `path` (see the module's contract)."""
    path = os.fspath(path)
    data = _read_bytes(path, max_bytes)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as failure:
        raise Error(f"{path}: not UTF-8 (byte {failure.start}: {failure.reason})", "parse error") from None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as failure:
        raise Error(f"{path}: not JSON: {failure}", "parse error") from None
    except RecursionError:
        raise Error(f"{path}: not JSON this reader takes: nested too deeply", "parse error") from None
    if not isinstance(value, dict):
        raise Error(f"{path}: expected a JSON object at the top, got {type(value).__name__}", "parse error")
    return value


_KINDS = {"object": dict, "list": list, "string": str}


def expect(value, kind: str, field: str, source: str):
    """`value` if it is of `kind` (object, list, string, number, integer), else eplb.Error naming `field`."""
    if kind == "number":
        ok = isinstance(value, Real) and not isinstance(value, bool)
    elif kind == "integer":
        ok = isinstance(value, Integral) and not isinstance(value, bool)
    else:
        ok = isinstance(value, _KINDS[kind])
    if not ok:
        article = "an" if kind[0] in "aeiou" else "a"
        raise Error(f"{source}: {field}: expected {article} {kind}, got {type(value).__name__} {_short(value)}",
                    "parse error")
    return value


def optional(data: dict, key: str, kind: str, field: str, source: str):
    """data[key] checked as `kind` when present (None when absent)."""
    return expect(data[key], kind, field, source) if key in data else None


def numbers(value, field: str, source: str) -> list:
    """A list of numbers, each checked."""
    for index, item in enumerate(expect(value, "list", field, source)):
        expect(item, "number", f"{field}[{index}]", source)
    return value


def _short(value) -> str:
    text = json.dumps(value) if not isinstance(value, (bytes, bytearray)) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
