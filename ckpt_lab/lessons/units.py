"""Byte units for what lessons print: MiB and GiB as powers of two, and a short human form."""
from __future__ import annotations

MIB = 2 ** 20
GIB = 2 ** 30


def fmt_bytes(n: float) -> str:
    """Bytes as a short human string in KiB/MiB/GiB."""
    n = float(n)
    for unit, size in (("GiB", GIB), ("MiB", MIB), ("KiB", 1024)):
        if abs(n) >= size:
            return f"{n / size:,.2f} {unit}"
    return f"{n:,.0f} B"
