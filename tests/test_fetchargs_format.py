"""kernel.trace_format.ArgsDecoder.decode() + report.fetchargs.format_args
show a uprobe's fetch-args as the kernel's print fmt does, on the format
files the kernel writes for real probes of every fetch type."""
from __future__ import annotations

import os
import random
import struct

import pytest

from ustack.kernel import trace_format as tf
from ustack.kernel.uprobe_events import UprobeEvents, event_format
from ustack.probes.fetchargs import display_kinds, kernel_fetch_args, parse_fetch_args
from ustack.report.fetchargs import format_args

pytestmark = pytest.mark.kernel

# every type the kernel formats differently, arrays, a bitfield and strings
ARGS = ["plain=%di", "u8=%si:u8", "s16=%dx:s16", "s32=%cx:s32", "s64=%r8:s64",
        "x32=%r9:x32", "c=%di:char", "arr=+0(%sp):x16[3]", "sarr=+8(%sp):s32[2]",
        "bits=%di:b4@2/8", "comm=$comm", "str=+0(%si):string",
        "ustr=+0(%dx):ustring", "ip=%ip:x64"]


@pytest.fixture(scope="module")
def decoder():
    """The ArgsDecoder and record size of a real probe with ARGS."""
    event_text = "uprobe:/bin/true:0 " + " ".join(ARGS)
    triples = parse_fetch_args(ARGS, "uprobe", event_text)
    events = UprobeEvents()
    try:
        event = events.define(os.path.realpath("/bin/true"), 0, False, "fmt",
                              kernel_fetch_args(triples, False, event_text))
        fmt = event_format(event)
    finally:
        events.close()
    fields = tf.parse_format(fmt)
    size = max(f.offset + f.size for f in fields.values())
    return tf.ArgsDecoder(fields, display_kinds(triples)), fields, size


def _record(fields: dict, size: int, values: dict, strings: dict) -> bytes:
    """A record of `size` bytes (strings after it, as __data_loc puts them)."""
    data = bytearray(size)
    tail = bytearray()
    for name, f in fields.items():
        if f.data_loc:
            text = strings.get(name, b"") + b"\0"
            struct.pack_into("<I", data, f.offset, len(text) << 16 | (size + len(tail)))
            tail += text
        elif name in values:
            data[f.offset:f.offset + f.size] = values[name][:f.size].ljust(f.size, b"\0")
    return bytes(data + tail)


# What the kernel's uprobe print fmt shows for these records (and what
# ustack printed before decoding and formatting were split), but for a
# string's bytes: escaped on one line, a byte that is not UTF-8 as \xNN.
SHOWN = {
    "ones": (' plain=0xffffffffffffffff u8=255 s16=-1 s32=-1 s64=-1 x32=0xffffffff '
             "c='\xff' arr={0xffff,0xffff,0xffff} sarr={-1,-1} bits=255 comm=\"true\" "
             'str="a \\"quoted\\"\\\\ line\\nand \\xff bytes\\r\\x0b" ustr="cut" '
             'ip=0xffffffffffffffff'),
    "small": (' plain=0x807060504030241 u8=65 s16=577 s32=67306049 s64=578437695752307265 '
              "x32=0x4030241 c='A' arr={0x241,0x403,0x605} sarr={67306049,134678021} "
              'bits=65 comm="true" str="a \\"quoted\\"\\\\ line\\nand \\xff bytes\\r\\x0b" '
              'ustr="cut" ip=0x807060504030241'),
    "zeros": (" plain=0x0 u8=0 s16=0 s32=0 s64=0 x32=0x0 c='\\x00' arr={0x0,0x0,0x0} "
              'sarr={0,0} bits=0 comm="true" str="a \\"quoted\\"\\\\ line\\nand '
              '\\xff bytes\\r\\x0b" ustr="cut" ip=0x0'),
}


def test_decode_then_format(decoder):
    dec, fields, size = decoder
    ones = {name: b"\xff" * 8 for name in fields}          # -1 / max values
    small = {name: bytes([0x41, 0x02, 0x03, 0x04, 5, 6, 7, 8]) for name in fields}
    strings = {"comm": b"true", "str": b'a "quoted"\\ line\nand \xff bytes\r\x0b',
               "ustr": b"cut\0here"}
    for name, values in (("ones", ones), ("small", small), ("zeros", {})):
        data = _record(fields, size, values, strings)
        assert format_args(dec.decode(data)) == SHOWN[name], name
        assert len(format_args(dec.decode(data)).splitlines()) == 1, name
        assert format_args(dec.decode(memoryview(data))) == SHOWN[name], name


def test_short_and_random_records_show_every_arg(decoder):
    dec, fields, size = decoder
    names = [a.split("=")[0] for a in ARGS]
    assert format_args(dec.decode(b"\x01" * 10)) == "".join(f" {n}=?" for n in names)
    rng = random.Random(9)
    for n in range(300):
        data = bytes(rng.randrange(256) for _ in range(rng.randrange(size + 64)))
        shown = format_args(dec.decode(data))
        assert [w.split("=")[0] for w in shown.split(" ")[1:] if "=" in w][:1] == ["plain"], n


def test_decode_gives_raw_values(decoder):
    dec, fields, size = decoder
    data = _record(fields, size, {"u8": b"\xfe", "s16": b"\xff\xff", "arr": b"\x01\0\x02\0"},
                   {"str": b"hi"})
    values = {name: (kind, value) for name, kind, value in dec.decode(data)}
    assert list(values) == [a.split("=")[0] for a in ARGS]
    assert values["u8"] == ("dec", 0xFE)
    assert values["s16"] == ("dec", -1)
    assert values["arr"] == ("hex", (1, 2, 0))
    assert values["str"] == ("str", b"hi")
    assert format_args(()) == ""
    assert tf.ArgsDecoder({}, {}).decode(b"") == ()
    assert all(value is None for _n, _k, value in dec.decode(b"\0" * 8))
