"""Find PyBullet's C-API client handle for a pybullet client id, for the C step loop (_servo.c).

pybullet keeps its clients in `static b3PhysicsClientHandle sPhysicsClients1[1024]`, indexed by
client id. The array is not exported, but the wheel keeps its symbol table (.symtab), so its
offset from an exported symbol (PyInit_pybullet) is read from the file once, and the address of
PyInit_pybullet in this process gives the array's address. Everything is checked: the ELF must
parse and hold both symbols, the array slot must be non-null, and (in ArmPlant) the joint state
read through the handle must equal pybullet.getJointStates. Any failure returns None and the
plant runs its Python loop; nothing here can change a result, only its speed.
"""

from __future__ import annotations

import ctypes
import struct
import sys
from functools import lru_cache

import numpy as np

MAX_PHYSICS_CLIENTS = 1024
_TABLE = b"sPhysicsClients1"
_ANCHOR = b"PyInit_pybullet"
# Elf64_Sym: st_name, st_info, st_other, st_shndx, st_value, st_size
_SYM = np.dtype([("name", "<u4"), ("info", "u1"), ("other", "u1"), ("shndx", "<u2"),
                 ("value", "<u8"), ("size", "<u8")])


def _elf_symbols(path: str, names: tuple[bytes, ...]) -> dict[bytes, int]:
    """Return st_value of the named symbols from the .symtab of a 64-bit little-endian ELF."""
    with open(path, "rb") as f:
        ident = f.read(64)
        if ident[:4] != b"\x7fELF" or ident[4] != 2 or ident[5] != 1:
            return {}
        e_shoff, = struct.unpack_from("<Q", ident, 0x28)
        e_shentsize, e_shnum = struct.unpack_from("<HH", ident, 0x3A)
        f.seek(e_shoff)
        raw = f.read(e_shentsize * e_shnum)
        sections = [struct.unpack_from("<IIQQQQIIQQ", raw, i * e_shentsize)
                    for i in range(e_shnum)]
        out: dict[bytes, int] = {}
        for sh in sections:
            if sh[1] != 2:  # SHT_SYMTAB
                continue
            offset, size, link, entsize = sh[4], sh[5], sh[6], sh[9]
            strtab = sections[link]
            f.seek(strtab[4])
            strings = f.read(strtab[5])
            wanted = {}
            for name in names:
                pos = strings.find(b"\0" + name + b"\0")
                if pos >= 0:
                    wanted[pos + 1] = name
            if not wanted or entsize != 24:
                continue
            f.seek(offset)
            table = np.frombuffer(f.read(size), dtype=_SYM)
            for st_name, name in wanted.items():
                hit = np.flatnonzero(table["name"] == st_name)
                if hit.size:
                    out[name] = int(table["value"][hit[0]])
        return out


@lru_cache(maxsize=1)
def _table_address() -> int | None:
    """Address of pybullet's client table in this process, or None when it cannot be found."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import pybullet

        path = pybullet.__file__
        syms = _elf_symbols(path, (_TABLE, _ANCHOR))
        if _TABLE not in syms or _ANCHOR not in syms:
            return None
        lib = ctypes.CDLL(path)
        anchor = ctypes.cast(getattr(lib, _ANCHOR.decode()), ctypes.c_void_p).value
        if not anchor:
            return None
        return anchor - syms[_ANCHOR] + syms[_TABLE]
    except Exception:  # noqa: BLE001 - any failure means "use the Python loop"
        return None


def client_handle_findable() -> bool:
    """True when pybullet's client table can be located in this process."""
    return _table_address() is not None


def client_handle(client_id: int) -> int | None:
    """Return the b3PhysicsClientHandle of a connected pybullet client id, or None."""
    base = _table_address()
    if base is None or not (0 <= int(client_id) < MAX_PHYSICS_CLIENTS):
        return None
    value = ctypes.c_void_p.from_address(base + 8 * int(client_id)).value
    return int(value) if value else None


def pybullet_path() -> str:
    """Path of the loaded pybullet extension module."""
    import pybullet

    return str(pybullet.__file__)
