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


def test_a_class_makes_the_same_values_before_and_after_its_init_is_compiled():
    """The first COMPILE_AFTER instances are made by a generic __init__,
    the rest by the compiled one: both take the same arguments, refuse
    the same ones and make defaults afresh."""
    from ustack.values import COMPILE_AFTER, factory, value

    @value
    class Spec:
        text: str
        seen: list = factory(list)
        kind: str = "uprobe"

    made = []
    for _ in range(COMPILE_AFTER + 2):
        made.append((Spec("a"), Spec("a", [1], kind="k"), Spec(text="b")))
        for bad in (lambda: Spec(), lambda: Spec("a", [], "k", 4),
                    lambda: Spec("a", text="b"), lambda: Spec("a", other=1)):
            with pytest.raises(TypeError):
                bad()
    first, last = made[0], made[-1]
    assert first == last == (Spec("a", [], "uprobe"), Spec("a", [1], "k"), Spec("b", [], "uprobe"))
    assert first[0].seen is not last[0].seen is not Spec("a").seen
    assert "seen" not in Spec.__dict__
