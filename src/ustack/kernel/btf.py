"""BTF type information (include/uapi/linux/btf.h): field offsets of
kernel structs from the kernel's own BTF (/sys/kernel/btf/vmlinux), for BPF
programs that read kernel memory with bpf_probe_read_kernel (the layout of
vm_area_struct or inode changes from build to build); and the types of a
built BPF object (kernel/bpf_object.py): its maps' keys and values, its
read-only data, the records it shares with Python.

The type records are walked once; struct/union members, array shapes,
enum values and data-section variables are kept."""
from __future__ import annotations

import struct

from ..model import UstackError

VMLINUX = "/sys/kernel/btf/vmlinux"
_MAGIC = 0xEB9F
_HDR = struct.Struct("<HBBIIIII")     # magic, version, flags, hdr_len, type/str off/len
_TYPE = struct.Struct("<III")         # name_off, info, size_or_type
_MEMBER = struct.Struct("<III")       # name_off, type, offset
_HEAD = struct.Struct("<II")          # a type record's name_off, info
# bytes after a type record, per kind: fixed, and per vlen item
_FIXED = {1: 4, 3: 12, 14: 4, 17: 4}
_PER_ITEM = {4: 12, 5: 12, 6: 8, 13: 8, 15: 12, 19: 12}
_INT, _PTR, _ARRAY, _STRUCT, _UNION, _ENUM = 1, 2, 3, 4, 5, 6
_VAR, _DATASEC, _ENUM64 = 14, 15, 19
_MODIFIERS = {8, 9, 10, 11, 18}       # typedef, volatile, const, restrict, type_tag

_cache: dict = {}


class Btf:
    """The structs and unions of one BTF blob, by type id."""

    def __init__(self, blob: bytes):
        magic, _v, _f, hdr_len, type_off, type_len, str_off, str_len = _HDR.unpack_from(blob)
        if magic != _MAGIC:
            raise UstackError("kernel BTF has an unknown format")
        types = hdr_len + type_off
        self._strings = blob[hdr_len + str_off:hdr_len + str_off + str_len]
        self.kinds: list = [None]           # type id -> (kind, name_off, type, members)
        self.by_name: dict = {}             # struct name -> type id
        # type id -> what follows the record: an int's encoding, an array's
        # (elem type, nelems), an enum's {name: value}, a datasec's
        # [(var type, offset, size)]
        self.extra: dict = {}
        self.at: list = [None]              # type id -> its record's offset in blob
        self.by_kind_name: dict = {}        # (kind, name) -> type id
        pos, end = types, types + type_len
        while pos < end:
            name_off, info, size_or_type = _TYPE.unpack_from(blob, pos)
            self.at.append(pos)
            pos += _TYPE.size
            kind, vlen = (info >> 24) & 0x1F, info & 0xFFFF
            members = None
            if kind in (_STRUCT, _UNION):
                bitfields = info >> 31
                members = []
                for i in range(vlen):
                    m_name, m_type, m_off = _MEMBER.unpack_from(blob, pos + 12 * i)
                    members.append((m_name, m_type,
                                    (m_off & 0xFFFFFF) if bitfields else m_off))
                if name_off:
                    self.by_name.setdefault(self._str(name_off), len(self.kinds))
            elif kind == _INT:
                self.extra[len(self.kinds)] = struct.unpack_from("<I", blob, pos)[0]
            elif kind == _ARRAY:
                elem, _index, nelems = struct.unpack_from("<III", blob, pos)
                self.extra[len(self.kinds)] = (elem, nelems)
            elif kind in (_ENUM, _ENUM64):
                self.extra[len(self.kinds)] = self._enum(blob, pos, kind, vlen, info)
            elif kind == _DATASEC:
                self.extra[len(self.kinds)] = [struct.unpack_from("<III", blob, pos + 12 * i)
                                               for i in range(vlen)]
            if name_off and kind in (_ENUM, _ENUM64, _VAR, _DATASEC, 12):
                self.by_kind_name.setdefault((kind, self._str(name_off)), len(self.kinds))
            self.kinds.append((kind, name_off, size_or_type, members))
            pos += _FIXED.get(kind, 0) + _PER_ITEM.get(kind, 0) * vlen

    def _enum(self, blob: bytes, pos: int, kind: int, vlen: int, info: int) -> dict:
        """An enum's {name: value}."""
        signed = bool(info >> 31)
        out = {}
        for i in range(vlen):
            if kind == _ENUM:
                name, val = struct.unpack_from("<Ii" if signed else "<II", blob, pos + 8 * i)
            else:
                name, lo, hi = struct.unpack_from("<III", blob, pos + 12 * i)
                val = lo | hi << 32
                if signed and val >> 63:
                    val -= 1 << 64
            out[self._str(name)] = val
        return out

    def _str(self, off: int) -> str:
        return self._strings[off:self._strings.index(b"\0", off)].decode()

    def name(self, type_id: int) -> str:
        return self._str(self.kinds[type_id][1])

    def size(self, type_id: int) -> int:
        """The size in bytes of a type (typedefs and qualifiers resolved)."""
        type_id = self._resolve(type_id)
        kind, _name, size_or_type, _m = self.kinds[type_id]
        if kind == _PTR:
            return 8
        if kind == _ARRAY:
            elem, nelems = self.extra[type_id]
            return self.size(elem) * nelems
        return size_or_type

    def members(self, struct_name: str) -> list:
        """(name, byte offset, type id) of each member of a struct."""
        tid = self.by_name.get(struct_name)
        if tid is None:
            raise UstackError(f"BTF has no struct {struct_name}")
        return self.members_of(tid)

    def members_of(self, type_id: int) -> list:
        """(name, byte offset, type id) of each member of a struct type."""
        return [(self._str(n), bits // 8, t) for n, t, bits in self.kinds[type_id][3]]

    def int_signed(self, type_id: int) -> bool | None:
        """Whether an integer type is signed (None: not an integer)."""
        type_id = self._resolve(type_id)
        kind = self.kinds[type_id][0]
        if kind in (_ENUM, _ENUM64):
            return False
        return bool(self.extra[type_id] >> 24 & 1) if kind == _INT else None

    def enum(self, name: str) -> dict:
        """The values of a named enum, by name."""
        tid = self.by_kind_name.get((_ENUM, name), self.by_kind_name.get((_ENUM64, name)))
        if tid is None:
            raise UstackError(f"BTF has no enum {name}")
        return dict(self.extra[tid])

    def _resolve(self, type_id: int) -> int:
        while self.kinds[type_id][0] in _MODIFIERS:
            type_id = self.kinds[type_id][2]
        return type_id

    def _find(self, type_id: int, field: str) -> tuple | None:
        """(bit offset, type id) of `field` in the struct, looking inside
        its anonymous structs and unions."""
        for name_off, m_type, bits in self.kinds[type_id][3]:
            if name_off and self._str(name_off) == field:
                return bits, m_type
            if not name_off:
                inner = self._resolve(m_type)
                if self.kinds[inner][0] in (_STRUCT, _UNION):
                    found = self._find(inner, field)
                    if found is not None:
                        return bits + found[0], found[1]
        return None

    def _kind(self, type_id: int) -> int:
        return self.kinds[type_id][0]

    def offset(self, struct_name: str, field: str) -> int:
        """The byte offset of struct_name.field (a dotted path goes into
        nested structs: "context.vdso"); UstackError if absent."""
        return _path_offset(self, self.by_name.get(struct_name), struct_name, field)


def _path_offset(types, tid: int | None, struct_name: str, field: str) -> int:
    """The byte offset of struct_name.field (dotted: into nested structs)
    from struct type `tid` of `types` (a Btf or a FieldOffsets); UstackError
    if absent or a bit field."""
    bits = 0
    for part in field.split("."):
        found = None
        if tid is not None and types._kind(tid) in (_STRUCT, _UNION):
            found = types._find(tid, part)
        if found is None:
            raise UstackError(f"kernel BTF has no {struct_name}.{field}")
        bits += found[0]
        tid = types._resolve(found[1])
    if bits % 8:
        raise UstackError(f"kernel BTF: {struct_name}.{field} is a bit field")
    return bits // 8


def vmlinux() -> Btf:
    """The running kernel's BTF (parsed once per process)."""
    btf = _cache.get(VMLINUX)
    if btf is None:
        try:
            with open(VMLINUX, "rb") as f:
                blob = f.read()
        except OSError as e:
            raise UstackError(f"cannot read the kernel's BTF ({VMLINUX}): {e.strerror}")
        btf = _cache[VMLINUX] = Btf(blob)
    return btf


class FieldOffsets:
    """Byte offsets of struct fields in a BTF blob, as Btf.offset gives
    them, from a walk that only steps from record to record, no further
    than the types asked about, and decodes only the structs asked about.
    vmlinux holds ~125 k types, and Btf's full parse took ~1 s of a cold
    start on a busy 2-CPU machine, a walk of them all ~0.2 s; the structs
    ustack reads (task_struct, mm_struct, vm_area_struct, file, inode,
    super_block) and their members' types come among the first ~1,000
    (pahole emits the types of the first compilation unit first)."""

    def __init__(self, blob: bytes):
        magic, _v, _f, hdr_len, type_off, type_len, str_off, str_len = _HDR.unpack_from(blob)
        if magic != _MAGIC:
            raise UstackError("kernel BTF has an unknown format")
        self._blob = blob
        self._strings = blob[hdr_len + str_off:hdr_len + str_off + str_len]
        self._skip = [_TYPE.size + _FIXED.get(k, 0) for k in range(32)]
        self._per_item = [_PER_ITEM.get(k, 0) for k in range(32)]
        self._at = [0]                          # type id -> its record's offset, walked so far
        self._structs: dict = {}                # name offset -> first struct/union of it
        self._pos = hdr_len + type_off          # where the walk goes on
        self._end = self._pos + type_len

    def _walk(self, until=lambda: False) -> None:
        """Step on through the records until `until()` or the end."""
        blob, at, structs = self._blob, self._at, self._structs
        skip, per_item, head = self._skip, self._per_item, _HEAD.unpack_from
        pos, end = self._pos, self._end
        while pos < end and not until():
            for _ in range(256):                # `until` asked every 256 records
                if pos >= end:
                    break
                name_off, info = head(blob, pos)
                kind = (info >> 24) & 0x1F
                if (kind == _STRUCT or kind == _UNION) and name_off not in structs:
                    structs[name_off] = len(at)
                at.append(pos)
                pos += skip[kind] + per_item[kind] * (info & 0xFFFF)
            self._pos = pos

    def _offset_of(self, type_id: int) -> int:
        if type_id >= len(self._at):
            self._walk(lambda: type_id < len(self._at))
        return self._at[type_id]

    def _record(self, type_id: int) -> tuple:
        """(kind, vlen, bitfields, size or type, offset of what follows)."""
        pos = self._offset_of(type_id)
        _name, info, size_or_type = _TYPE.unpack_from(self._blob, pos)
        return (info >> 24) & 0x1F, info & 0xFFFF, info >> 31, size_or_type, pos + _TYPE.size

    def _resolve(self, type_id: int) -> int:
        while True:
            kind, _vlen, _bf, target, _pos = self._record(type_id)
            if kind not in _MODIFIERS:
                return type_id
            type_id = target

    def _str(self, off: int) -> str:
        return self._strings[off:self._strings.index(b"\0", off)].decode()

    def _struct(self, name: str) -> int | None:
        raw = name.encode()
        off = self._strings.find(b"\0" + raw + b"\0") + 1     # the strings open with \0
        if off:
            self._walk(lambda: off in self._structs)
        found = self._structs.get(off) if off else None
        if found is None:                   # strings not deduplicated: by name
            self._walk()
            found = next((tid for n, tid in self._structs.items() if self._str(n) == name),
                         None)
        return found

    def _find(self, type_id: int, field: str) -> tuple | None:
        """(bit offset, type id) of `field`, inside anonymous members too."""
        _kind, vlen, bitfields, _size, pos = self._record(type_id)
        for name_off, m_type, m_off in _MEMBER.iter_unpack(self._blob[pos:pos + 12 * vlen]):
            bits = (m_off & 0xFFFFFF) if bitfields else m_off
            if name_off and self._str(name_off) == field:
                return bits, m_type
            if not name_off:
                inner = self._resolve(m_type)
                if self._record(inner)[0] in (_STRUCT, _UNION):
                    found = self._find(inner, field)
                    if found is not None:
                        return bits + found[0], found[1]
        return None

    def _kind(self, type_id: int) -> int:
        return self._record(type_id)[0]

    def offset(self, struct_name: str, field: str) -> int:
        """The byte offset of struct_name.field (dotted: into nested
        structs); UstackError if absent or a bit field."""
        return _path_offset(self, self._struct(struct_name), struct_name, field)


def vmlinux_offsets() -> FieldOffsets:
    """Field offsets of the running kernel's structs (FieldOffsets)."""
    try:
        with open(VMLINUX, "rb") as f:
            blob = f.read()
    except OSError as e:
        raise UstackError(f"cannot read the kernel's BTF ({VMLINUX}): {e.strerror}")
    return FieldOffsets(blob)
