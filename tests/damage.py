"""Damage a file on disk as hardware would, for tests of what fdlit trusts."""

import struct
import zipfile
from pathlib import Path


def flip_tensor_bytes(path: Path, count: int = 64) -> None:
    """Invert ``count`` bytes in the middle of the largest tensor record of a torch zip file, in
    place, as a bad sector would (hard links to the file see the damage too)."""
    with zipfile.ZipFile(path) as z:
        big = max(z.infolist(), key=lambda i: i.file_size)
    with open(path, "r+b") as f:
        f.seek(big.header_offset + 26)
        name_len, extra_len = struct.unpack("<HH", f.read(4))
        f.seek(big.header_offset + 30 + name_len + extra_len + big.file_size // 2)
        data = f.read(count)
        f.seek(-len(data), 1)
        f.write(bytes(b ^ 0xFF for b in data))
