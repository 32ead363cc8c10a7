"""Incremental RecordIO decoding: the framing of the Mesos v1 event stream.

A record is `<decimal byte length>\\n<that many bytes>`. HTTP chunk boundaries carry no meaning, so the
decoder accepts bytes in pieces of any size (a length split in two, a record split across reads, many
records in one read) and hands back complete records only.
"""

from __future__ import annotations

from cosched.mesos.errors import RecordIOError

MAX_LENGTH_DIGITS = 20
"""More digits than any sane record length: a longer header means the stream is not RecordIO."""


class RecordIODecoder:
    """Turns a byte stream into records; bad framing raises `RecordIOError` and the decoder stays broken."""

    def __init__(self, max_record: int = 64 * 1024 * 1024) -> None:
        self.max_record = max_record
        self._buffer = bytearray()
        self._length: int | None = None
        self._broken: str | None = None

    def feed(self, data: bytes) -> list[bytes]:
        """Add `data`; return the records it completes, in order."""
        if self._broken:
            raise RecordIOError(self._broken)
        self._buffer += data
        records: list[bytes] = []
        while True:
            if self._length is None:
                newline = self._buffer.find(b"\n")
                if newline < 0:
                    self._check_header(bytes(self._buffer))
                    return records
                self._length = self._parse_header(bytes(self._buffer[:newline]))
                del self._buffer[: newline + 1]
            if len(self._buffer) < self._length:
                return records
            records.append(bytes(self._buffer[: self._length]))
            del self._buffer[: self._length]
            self._length = None

    @property
    def mid_record(self) -> bool:
        """True when bytes of an unfinished record are held: a stream that ends now was cut short."""
        return bool(self._buffer) or self._length is not None

    def _check_header(self, partial: bytes) -> None:
        if len(partial) > MAX_LENGTH_DIGITS or (partial and not partial.isdigit()):
            self._fail(f"RecordIO: a record length must be decimal digits, got {partial[:40]!r}")

    def _parse_header(self, header: bytes) -> int:
        if not header or not header.isdigit() or len(header) > MAX_LENGTH_DIGITS:
            self._fail(f"RecordIO: a record length must be decimal digits, got {header[:40]!r}")
        length = int(header)
        if length > self.max_record:
            self._fail(f"RecordIO: record of {length} bytes is over the limit of {self.max_record}")
        return length

    def _fail(self, message: str) -> None:
        self._broken = message
        raise RecordIOError(message)


def encode(record: bytes) -> bytes:
    """Frame one record (what the master does; the tests' stand-in master uses it)."""
    return b"%d\n%s" % (len(record), record)
