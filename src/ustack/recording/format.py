"""The bytes of a recording (`ustack record`, test fixtures): one run's
stream, so it can be unwound, symbolized and reported later, elsewhere.

A gzip stream of MAGIC, then records, each `u32 length, u8 kind, payload`
(little-endian), in stream order:

  H  header (JSON): format version, probe labels, unwind modes, backend;
     from `record`: the command that decides report's default (trace |
     count | profile), the events as typed, buffer pages, stack storage,
     and `unwound` (DWARF samples unwound while recording)
  M  a mapping: pid, tid, start, end, pgoff, path, build-id of the file
  C  comm: pid, tid, exec flag, (version 3) its time, comm
  F / X  fork / exit: pid ppid tid ptid
  K  a distinct stack, defined once (version 2): id, the callchain and
     return address of a frame-pointer sample, or the addresses and notes
     of a DWARF sample unwound while recording; kernel frames
  E  an event (version 2): probe pid tid time cpu, the id of its stack,
     fetch-arg values (JSON) if any
  N  a stack counted in the kernel (version 2): probe pid tid, stack id, count
  S  a whole RawSample (version 1, and `record --raw-stacks`: a DWARF
     sample carries its registers and up to 64 KiB of stack copy)
  P  a Python code object's names (version 4): pid, address, first line,
     line table kind, qualified name, file, line table; before the stacks
     that hold it (the process is gone when the recording is read)
  I  an interpreter frame's names (version 5): pid, its frame word (Ruby,
     PHP, Perl, JS: model's *_FRAME_TAG; version 6: Java too, its word a
     Method* and bci), line, function, file; resolved per word while
     recording (a Ruby or JS line depends on the word's pc part, a Java
     line on its bci), before the stacks that hold it
  L  the losses (JSON); the last record: a file without it was cut short

An event costs ~30 bytes before compression and its stack is stored once,
so a file holds what perf.data holds in a few bytes per event. Both
directions live here: the writer (recording/writer.py) and the reader
(recording/reader.py) share them; version 1 files (S samples only) still read."""
from __future__ import annotations

import json
import struct

from ..model import (JAVA_FRAME_TAG, PERL_FRAME_TAG, PHP_FRAME_TAG, RUBY_FRAME_TAG,
                     V8_FRAME_TAG, CommEvent, ExitEvent, ForkEvent, Losses, Mapping, MmapEvent,
                     PythonCodeInfo, RawSample, UnwoundSample, UstackError, java_frame_parts,
                     perl_frame_parts, php_frame_parts, ruby_frame_parts, unwound_sample,
                     v8_frame_parts)

MAGIC = b"ustack-recording\n"
# bumped when a reader of the old one would misread (6: Java frames' I
# records, which a version 5 reader refuses as corrupt)
VERSION = 6
RECORD = struct.Struct("<IB")      # payload length, kind
HEADER, MMAP, COMM, FORK, EXIT, SAMPLE, LOSSES = b"HMCFXSL"
STACK, EVENT, COUNTED, PYCODE, SCRIPT = b"KENPI"
KINDS = b"MCFXSLKENPI"              # every kind after the header
# not in files: what the reader puts in a chunk where the file went wrong,
# so the error is raised by decode, on the caller's thread, in stream order
FAILURE = ord("!")

# an interpreter frame word's tag (its top 4 bits) -> (its kind, as the
# header's "scripts" lists the kinds whose words the run wrote, its parts)
SCRIPT_WORDS = {RUBY_FRAME_TAG >> 60: ("ruby", ruby_frame_parts),
                PHP_FRAME_TAG >> 60: ("php", php_frame_parts),
                PERL_FRAME_TAG >> 60: ("perl", perl_frame_parts),
                V8_FRAME_TAG >> 60: ("js", v8_frame_parts),
                JAVA_FRAME_TAG >> 60: ("java", java_frame_parts)}

_MMAP = struct.Struct("<iiQQQH")   # pid tid start end pgoff, path length
_COMM = struct.Struct("<iiBQ")     # version 3: an exec's time, for its generation
_COMM_V2 = struct.Struct("<iiB")
_FORK = struct.Struct("<iiii")
# probe pid tid time cpu, which optional parts follow, callchain length
_SAMPLE = struct.Struct("<IiiQiBI")
# id, unwound?, callchain words, return address bytes, kernel words
_STACK = struct.Struct("<IBHBH")
_EVENT = struct.Struct("<IiiQiIB")  # probe pid tid time cpu, stack id, has args
_COUNTED = struct.Struct("<IiiIQ")  # probe pid tid, stack id, count
# pid, code address, first line, then the lengths of the table kind, name,
# file and table that follow
_PYCODE = struct.Struct("<iQiBHHI")
# pid, frame word, line, then the lengths of the function and file that follow
_SCRIPT = struct.Struct("<iQiHH")
MAX_SCRIPT_TEXT = 0xFFFF // 4
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_HAS_REGS, _HAS_STACK, _HAS_ARGS, _HAS_KERNEL = 1, 2, 4, 8


def record(kind: int, payload: bytes) -> bytes:
    return RECORD.pack(len(payload), kind) + payload


# -- writing ------------------------------------------------------------------

def header_record(labels, modes, backend: str, extra: dict) -> bytes:
    header = dict(extra, version=VERSION, labels=list(labels),
                  modes=list(modes), backend=backend)
    return record(HEADER, json.dumps(header).encode())


def losses_record(losses: Losses) -> bytes:
    return record(LOSSES, json.dumps({
        "lost": losses.lost, "throttled": losses.throttled,
        "uncounted": [list(u) for u in losses.uncounted],
        "skipped": losses.skipped, "dropped": losses.dropped,
        "records_lost": losses.records_lost}).encode())


def meta_record(event, build_id: str = "") -> bytes:
    """The record of a metadata event; `build_id` (hex) of a mapped file."""
    if isinstance(event, MmapEvent):
        m = event.mapping
        path = m.path.encode("utf-8", "surrogateescape")
        bid = build_id.encode()
        return record(MMAP, _MMAP.pack(event.pid, event.tid, m.start, m.end,
                                       m.pgoff, len(path))
                      + path + bytes([len(bid)]) + bid)
    if isinstance(event, CommEvent):
        return record(COMM, _COMM.pack(event.pid, event.tid, event.exec, event.time_ns)
                      + event.comm.encode("utf-8", "surrogateescape"))
    kind = FORK if isinstance(event, ForkEvent) else EXIT
    return record(kind, _FORK.pack(event.pid, event.ppid, event.tid, event.ptid))


def sample_record(s: RawSample) -> bytes:
    flags = ((_HAS_REGS if s.regs is not None else 0)
             | (_HAS_STACK if s.stack is not None else 0)
             | (_HAS_ARGS if s.args else 0) | (_HAS_KERNEL if s.kernel else 0))
    parts = [_SAMPLE.pack(s.probe, s.pid, s.tid, s.time_ns, s.cpu, flags,
                          len(s.callchain)),
             s.callchain, bytes([len(s.return_address)]), s.return_address]
    if s.regs is not None:
        parts.append(bytes([len(s.regs)]))
        for name, value in s.regs.items():
            parts += [bytes([len(name)]), name.encode(), _U64.pack(value)]
    for flag, blob in ((_HAS_STACK, s.stack), (_HAS_ARGS, s.args and _args_json(s.args)),
                       (_HAS_KERNEL, s.kernel)):
        if flags & flag:
            parts += [_U32.pack(len(blob)), blob]
    return record(SAMPLE, b"".join(parts))


def stack_record(stack_id: int, sample: RawSample) -> bytes:
    """The K record of a sample's stack (its stack_key() part and kernel)."""
    notes = ()
    if isinstance(sample, UnwoundSample):
        notes = sample.unwound[1]
    return record(STACK, _STACK.pack(
        stack_id, isinstance(sample, UnwoundSample), len(sample.callchain) // 8,
        len(sample.return_address), len(sample.kernel) // 8)
        + sample.callchain + sample.return_address + sample.kernel
        + "\0".join(notes).encode("utf-8", "surrogateescape"))


def stack_content(sample: RawSample) -> tuple:
    """What makes two stacks the same K record (the writer's table key)."""
    if isinstance(sample, UnwoundSample):
        return sample.unwound, sample.kernel
    return sample.callchain, sample.return_address, sample.kernel


def python_code_record(pid: int, code: int, info: PythonCodeInfo) -> bytes:
    kind, name, file = (t.encode("utf-8", "surrogatepass")
                        for t in (info.table_kind, info.name, info.file))
    return record(PYCODE, _PYCODE.pack(pid, code, info.firstlineno, len(kind), len(name),
                                       len(file), len(info.table))
                  + kind + name + file + info.table)


def script_frame_record(pid: int, word: int, function: str, file: str, line: int) -> bytes:
    # at most 4 bytes a character: a length fits its u16
    function_b, file_b = (t[:MAX_SCRIPT_TEXT].encode("utf-8", "surrogatepass")
                          for t in (function, file))
    line = line if 0 <= line < 1 << 31 else 0        # a garbage read kept no line
    return record(SCRIPT, _SCRIPT.pack(pid, word, line, len(function_b), len(file_b))
                  + function_b + file_b)


def _s32(value: int) -> int:
    """A kernel's 32-bit pid, tid or cpu as the signed field stores it: a
    perf record's -1 (no such task in the namespace) arrives as 2**32 - 1."""
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value & 0x80000000 else value


def event_record(sample: RawSample, stack_id: int) -> bytes:
    body = _EVENT.pack(sample.probe, _s32(sample.pid), _s32(sample.tid), sample.time_ns,
                       _s32(sample.cpu), stack_id, bool(sample.args))
    if sample.args:
        body += _args_json(sample.args)
    return record(EVENT, body)


def counted_record(sample: RawSample, stack_id: int, count: int) -> bytes:
    return record(COUNTED, _COUNTED.pack(sample.probe, sample.pid, sample.tid,
                                         stack_id, count))


def _args_json(args: tuple) -> bytes:
    # rare (fetch-args only) and small: JSON, bytes values as {"hex": ...}
    def value(v):
        if isinstance(v, (bytes, bytearray, memoryview)):
            return {"hex": bytes(v).hex()}
        return list(v) if isinstance(v, tuple) else v
    return json.dumps([[n, k, value(v)] for n, k, v in args]).encode()


# -- reading ------------------------------------------------------------------

def parse_json(payload) -> dict:
    value = json.loads(bytes(payload))
    if not isinstance(value, dict):
        raise ValueError("a JSON record is not an object")
    return value


def parse_losses(payload) -> Losses:
    d = parse_json(payload)
    return Losses(d["lost"], d["throttled"], tuple(tuple(u) for u in d["uncounted"]),
                  skipped=d.get("skipped", 0),      # recordings before it: 0
                  dropped=d.get("dropped", 0), records_lost=d.get("records_lost", 0))


def parse_mmap(payload) -> tuple:
    """(MmapEvent with no host_path, build-id hex or '')."""
    pid, tid, start, end, pgoff, n = _MMAP.unpack_from(payload)
    at = _MMAP.size
    path = bytes(payload[at:at + n]).decode("utf-8", "surrogateescape")
    at += n
    bid = bytes(payload[at + 1:at + 1 + payload[at]]).decode()
    return MmapEvent(pid, tid, Mapping(start, end, pgoff, path)), bid


def parse_meta(kind: int, payload, version: int = VERSION):
    if kind == COMM:
        if version >= 3:
            pid, tid, exec_, time_ns = _COMM.unpack_from(payload)
        else:
            (pid, tid, exec_), time_ns = _COMM_V2.unpack_from(payload), 0
        size = _COMM.size if version >= 3 else _COMM_V2.size
        return CommEvent(pid, tid, bytes(payload[size:]).decode(
            "utf-8", "surrogateescape"), bool(exec_), time_ns)
    cls = ForkEvent if kind == FORK else ExitEvent
    return cls(*_FORK.unpack_from(payload))


def parse_sample(payload) -> RawSample:
    probe, pid, tid, t, cpu, flags, n = _SAMPLE.unpack_from(payload)
    at = _SAMPLE.size
    chain = bytes(payload[at:at + n])
    at += n
    ret = bytes(payload[at + 1:at + 1 + payload[at]])
    at += 1 + payload[at]
    regs = None
    if flags & _HAS_REGS:
        regs = {}
        count, at = payload[at], at + 1
        for _ in range(count):
            name_len = payload[at]
            name = bytes(payload[at + 1:at + 1 + name_len]).decode()
            at += 1 + name_len
            regs[name] = _U64.unpack_from(payload, at)[0]
            at += 8
    blobs = {}
    for flag in (_HAS_STACK, _HAS_ARGS, _HAS_KERNEL):
        if flags & flag:
            size = _U32.unpack_from(payload, at)[0]
            blob = bytes(payload[at + 4:at + 4 + size])
            if len(blob) != size:
                raise ValueError("a sample ends early")
            blobs[flag] = blob
            at += 4 + size
    if at != len(payload) or len(chain) != n:
        raise ValueError("a sample's parts do not add up to its length")
    args = _args_of(blobs[_HAS_ARGS]) if _HAS_ARGS in blobs else ()
    return RawSample(probe, pid, tid, t, cpu, chain, ret, regs,
                     blobs.get(_HAS_STACK), args, blobs.get(_HAS_KERNEL, b""))


def parse_stack(payload) -> tuple:
    """(stack id, a RawSample template holding the stack: probe, pid, tid,
    time and cpu 0, to be filled by each event of it)."""
    stack_id, unwound, n, ret_len, kn = _STACK.unpack_from(payload)
    at = _STACK.size
    chain = bytes(payload[at:at + 8 * n])
    at += 8 * n
    ret = bytes(payload[at:at + ret_len])
    at += ret_len
    kernel = bytes(payload[at:at + 8 * kn])
    at += 8 * kn
    if len(chain) != 8 * n or len(ret) != ret_len or len(kernel) != 8 * kn:
        raise ValueError("a stack ends early")
    template = RawSample(0, 0, 0, 0, 0, chain, ret, None, None, (), kernel)
    if unwound:
        rest = bytes(payload[at:]).decode("utf-8", "surrogateescape")
        notes = tuple(rest.split("\0")) if rest else ()
        addrs = struct.unpack(f"<{n}Q", chain)
        template = unwound_sample(template, addrs, notes)
    return stack_id, template


def parse_python_code(payload) -> tuple:
    """(pid, code address, PythonCodeInfo) of a P record."""
    pid, code, first, *sizes = _PYCODE.unpack_from(payload)
    at, parts = _PYCODE.size, []
    for size in sizes:
        parts.append(bytes(payload[at:at + size]))
        at += size
    if at != len(payload):
        raise ValueError("a Python code record's parts do not add up to its length")
    kind, name, file = (p.decode("utf-8", "surrogatepass") for p in parts[:3])
    return pid, code, PythonCodeInfo(name, file, first, kind, parts[3])


def parse_script_frame(payload) -> tuple:
    """(pid, frame word, function, file, line) of an I record."""
    pid, word, line, function_len, file_len = _SCRIPT.unpack_from(payload)
    at = _SCRIPT.size
    if at + function_len + file_len != len(payload):
        raise ValueError("an interpreter frame record's parts do not add up to its length")
    function = bytes(payload[at:at + function_len]).decode("utf-8", "surrogatepass")
    file = bytes(payload[at + function_len:]).decode("utf-8", "surrogatepass")
    return pid, word, function, file, line


def parse_event(buf, at: int, size: int, stacks: dict) -> RawSample:
    """The event whose payload is buf[at:at + size] (read in place: the hot
    path of `report`), its stack from `stacks`, the K records read so far."""
    probe, pid, tid, t, cpu, stack_id, has_args = _EVENT.unpack_from(buf, at)
    stack = stacks[stack_id]
    args = (_args_of(bytes(buf[at + _EVENT.size:at + size])) if has_args else ())
    sample = _new_tuple(type(stack), (probe, pid, tid, t, cpu, stack[5], stack[6],
                                      None, None, args, stack[10]))
    if type(stack) is UnwoundSample:
        sample.unwound = stack.unwound
    return sample


_new_tuple = tuple.__new__          # a RawSample without its Python __new__


def parse_counted(payload, stacks: dict) -> tuple:
    """(RawSample, count): time 0 and cpu -1, as the kernel's counts have."""
    probe, pid, tid, stack_id, count = _COUNTED.unpack_from(payload)
    stack = stacks[stack_id]
    sample = stack._replace(probe=probe, pid=pid, tid=tid, time_ns=0, cpu=-1)
    if isinstance(stack, UnwoundSample):
        sample.unwound = stack.unwound
    return sample, count


def _args_of(blob: bytes) -> tuple:
    def value(v):
        if isinstance(v, dict):
            return bytes.fromhex(v["hex"])
        return tuple(v) if isinstance(v, list) else v
    return tuple((n, k, value(v)) for n, k, v in json.loads(blob))


def failure(message: str) -> bytes:
    return record(FAILURE, message.encode())


def raise_failure(payload) -> None:
    raise UstackError(bytes(payload).decode())
