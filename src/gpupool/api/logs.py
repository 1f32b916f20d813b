"""Reading a job's log for the API: a part at a time, never a character cut in two."""

from __future__ import annotations

import os
from typing import BinaryIO

from gpupool.api import limits


def read_part(stream: BinaryIO, offset: int, most: int | None = None) -> tuple[str, int, int]:
    """The text of an open file from byte `offset` (at most `most` bytes, `limits.LOG_BYTES`
    by default), the offset after it, and the file's size: bytes that are not UTF-8 read as
    U+FFFD, and a character cut at the end waits for the next read."""
    size = os.fstat(stream.fileno()).st_size
    if offset >= size:
        return "", offset, size
    stream.seek(offset)
    data = stream.read(most if most is not None else limits.LOG_BYTES)
    cut = len(data)
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 != 0x80:  # the first byte of the last character
            needed = 2 if byte & 0xE0 == 0xC0 else 3 if byte & 0xF0 == 0xE0 else 4 if byte & 0xF8 == 0xF0 else 1
            if needed > back:
                cut = len(data) - back
            break
    return data[:cut].decode(errors="replace"), offset + cut, size
