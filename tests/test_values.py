"""ustack.values: the data model's classes behave as frozen dataclasses did
(equality by value and class, hashing, no assignment, defaults made afresh,
replace and as_dict)."""
import pytest

from ustack.model import Frame, Stack, StackCount
from ustack.options import Options
from ustack.values import as_dict, fields, replace


def test_frozen_value_equality_hash_and_repr():
    a = Frame(0x10, "libc.so.6", "write", 4)
    assert a == Frame(addr=0x10, module="libc.so.6", function="write", offset=4)
    assert a != Frame(0x10, "libc.so.6", "write", 5)
    assert hash(a) == hash(Frame(0x10, "libc.so.6", "write", 4))
    assert len({a, Frame(0x10, "libc.so.6", "write", 4)}) == 1
    assert Stack((a,)) != (a,)                      # another class is never equal
    assert repr(a) == ("Frame(addr=16, module='libc.so.6', function='write', offset=4, "
                       "size=0, path='', file='', line=0, inlined=False, kind='', "
                       "objaddr=0, objstart=0)")
    with pytest.raises(AttributeError, match="cannot assign to field 'line'"):
        a.line = 3


def test_missing_argument_is_a_type_error():
    with pytest.raises(TypeError):
        Frame(0x10)


def test_mutable_value_and_fresh_defaults():
    count = StackCount("chain", 1, Stack(()), 2)
    count.count += 1
    assert count.count == 3
    with pytest.raises(TypeError):
        hash(count)                                  # equal by value, so unhashable
    first, second = Options(), Options()
    first.events.append("syscall:write")
    assert second.events == []                       # each instance its own list


def test_replace_and_as_dict():
    a = Frame(0x10, "m", "f")
    b = replace(a, line=7)
    assert (a.line, b.line, b.function) == (0, 7, "f")
    assert fields(Stack) == ("frames", "notes")
    assert as_dict(Stack((a,), ("cut",))) == {
        "frames": ({"addr": 16, "module": "m", "function": "f", "offset": 0, "size": 0,
                    "path": "", "file": "", "line": 0, "inlined": False, "kind": "",
                    "objaddr": 0, "objstart": 0},),
        "notes": ("cut",)}
