"""One-dimensional PostgreSQL arrays in their binary wire format, built with `struct` in one call each.

psycopg dumps a Python list into a binary array element by element in Python (its C extension does not
cover arrays): for a metric batch of 1,000 points, five lists cost 1.4 ms of the API's CPU, the most
after validation (profile in bench/README.md). These builders pack the same bytes from the columns with
one `struct` call per array (about 0.3 ms for the five) and hand them to psycopg as values of their own
types, which a registered dumper passes through untouched, with the array's type oid.

The format (PostgreSQL's array_send): ndim, has-nulls flag, element type oid, then per dimension its
length and lower bound (1), then each element as a 4-byte length (-1 for NULL) and its bytes.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from functools import lru_cache
from typing import TypeVar

from psycopg import adapters
from psycopg.adapt import Buffer, Dumper
from psycopg.pq import Format

_HEADER = struct.Struct(">iiIii")
_LENGTH = struct.Struct(">i")
_NULL = _LENGTH.pack(-1)


class PgArray(bytes):
    """A built array; the subclass says its type: `OID` the array type's, `ELEMENT` its elements', and
    `CODE` their `struct` format (fixed-width types)."""

    OID = ELEMENT = 0
    CODE = ""


class Int4Array(PgArray):
    OID, ELEMENT, CODE = 1007, 23, "i"


class Int8Array(PgArray):
    OID, ELEMENT, CODE = 1016, 20, "q"


class Float8Array(PgArray):
    OID, ELEMENT, CODE = 1022, 701, "d"


class TextArray(PgArray):
    OID, ELEMENT = 1009, 25


class TimestamptzArray(PgArray):
    """Elements are microseconds since 2000-01-01 00:00 UTC, PostgreSQL's own timestamptz."""

    OID, ELEMENT, CODE = 1185, 1184, "q"


Array = TypeVar("Array", bound=PgArray)


@lru_cache(maxsize=256)
def _elements(code: str, count: int) -> struct.Struct:
    return struct.Struct(">" + f"i{code}" * count)


def _header(cls: type[PgArray], count: int, has_nulls: bool = False) -> bytes:
    return _HEADER.pack(1, has_nulls, cls.ELEMENT, count, 1)


def _fixed(cls: type[Array], values: Sequence[int | float]) -> Array:
    """Every element is there (no NULL), each its length and its bytes."""
    count = len(values)
    interleaved: list[int | float] = [struct.calcsize(">" + cls.CODE)] * (2 * count)
    interleaved[1::2] = values
    return cls(_header(cls, count) + _elements(cls.CODE, count).pack(*interleaved))


def int4_array(values: Sequence[int]) -> Int4Array:
    """Raises struct.error for a value outside int4 (callers validate ranges first)."""
    return _fixed(Int4Array, values)


def float8_array(values: Sequence[float]) -> Float8Array:
    return _fixed(Float8Array, values)


def timestamptz_array(micros: Sequence[int]) -> TimestamptzArray:
    return _fixed(TimestamptzArray, micros)


def int8_array(values: Sequence[int | None]) -> Int8Array:
    """NULL where a value is None."""
    if None not in values:
        return _fixed(Int8Array, values)  # type: ignore[arg-type]  # no None: checked just above
    item = struct.Struct(">iq")
    parts = [_NULL if value is None else item.pack(8, value) for value in values]
    return Int8Array(_header(Int8Array, len(values), has_nulls=True) + b"".join(parts))


def text_array(values: Sequence[str]) -> TextArray:
    """Each distinct string is encoded once (a batch repeats a few metric names)."""
    encoded: dict[str, bytes] = {}
    parts = []
    for value in values:
        element = encoded.get(value)
        if element is None:
            raw = value.encode()
            element = encoded[value] = _LENGTH.pack(len(raw)) + raw
        parts.append(element)
    return TextArray(_header(TextArray, len(values)) + b"".join(parts))


def _dumper(cls: type[PgArray]) -> type[Dumper]:
    class Passthrough(Dumper):
        format = Format.BINARY
        oid = cls.OID

        def dump(self, obj: Buffer) -> Buffer:
            return obj

    Passthrough.__name__ = f"{cls.__name__}Dumper"
    return Passthrough


for _array in (Int4Array, Int8Array, Float8Array, TextArray, TimestamptzArray):
    adapters.register_dumper(_array, _dumper(_array))
