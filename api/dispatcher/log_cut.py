"""Bounded log lines: whatever a job prints, the dispatcher holds at most a bounded part of each line.

A job's log, as the dispatcher stores it, is Ray's log passed through `LineCutter`: a line longer than
`line_max_bytes` (UTF-8) keeps its first bytes, then `… [cut: N bytes]` where N counts what was
dropped, and the dropped part is counted as it streams, never held. The cutter's output depends only
on the text, not on how it was split into chunks, so an attempt's `log_offset` (characters of this
output already stored) means the same whether the text came from the websocket tail or a final read.
"""

from __future__ import annotations

import codecs
import io
from collections.abc import Iterable

CUT_MARKER = " … [cut: {dropped} bytes]"


def _size(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


class LineCutter:
    """Feed text in any chunks; get it back with every line cut to `line_max_bytes` plus the marker."""

    def __init__(self, line_max_bytes: int):
        if line_max_bytes < 1:
            raise ValueError("line_max_bytes must be at least 1")
        self.line_max_bytes = line_max_bytes
        self.kept = 0  # bytes of the current line passed on
        self.dropped = 0  # bytes of the current line past the bound, counted and dropped
        self.cut = False

    def feed(self, text: str) -> str:
        out: list[str] = []
        pieces = text.split("\n")
        for n, piece in enumerate(pieces):
            if n:  # a newline ended the line before this piece
                self._end_line(out)
                out.append("\n")
            if piece:
                self._take(piece, out)
        return "".join(out)

    def finish(self) -> str:
        """The end of the log: the marker of a last line that was cut and has no newline."""
        out: list[str] = []
        self._end_line(out)
        return "".join(out)

    def _take(self, piece: str, out: list[str]) -> None:
        if self.cut:
            self.dropped += _size(piece)
            return
        room = self.line_max_bytes - self.kept
        size = _size(piece)
        if size <= room:
            out.append(piece)
            self.kept += size
            return
        raw = piece.encode("utf-8", "surrogatepass")
        head = raw[:room].decode("utf-8", "ignore")  # never half a character
        out.append(head)
        self.kept += len(head.encode("utf-8", "surrogatepass"))
        self.dropped += size - len(head.encode("utf-8", "surrogatepass"))
        self.cut = True

    def _end_line(self, out: list[str]) -> None:
        if self.cut:
            out.append(CUT_MARKER.format(dropped=self.dropped))
        self.kept = self.dropped = 0
        self.cut = False


def text_chunks(chunks: Iterable[bytes]) -> Iterable[str]:
    """Raw log bytes as the text Ray's own readers give (UTF-8, universal newlines), chunk by chunk."""
    decoder = io.IncrementalNewlineDecoder(codecs.getincrementaldecoder("utf-8")(errors="replace"), translate=True)
    for chunk in chunks:
        if text := decoder.decode(chunk):
            yield text
    if text := decoder.decode(b"", final=True):
        yield text


def cut_read(texts: Iterable[str], *, offset: int, max_chars: int, line_max_bytes: int) -> tuple[str, bool]:
    """The cut log after its first `offset` characters, at most `max_chars` of it, and whether it
    reached the log's end (False: the budget stopped it; read again from where this ends)."""
    cutter = LineCutter(line_max_bytes)
    seen = 0  # characters of cut output produced so far
    kept: list[str] = []
    held = 0

    def take(out: str) -> bool:
        nonlocal seen, held
        start, seen = seen, seen + len(out)
        if seen <= offset:
            return True
        out = out[max(0, offset - start) :]
        room = max_chars - held
        kept.append(out[:room])
        held += min(len(out), room)
        return len(out) < room

    for text in texts:
        if not take(cutter.feed(text)):
            return "".join(kept), False
    if not take(cutter.finish()):
        return "".join(kept), False
    return "".join(kept), True
