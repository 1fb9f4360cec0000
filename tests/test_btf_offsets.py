"""The kernel fields ustack's BPF programs read are found by a walk of
vmlinux's BTF that decodes only the structs asked about: its offsets are
those of the full parse, for every field of the kernel's structs."""
from __future__ import annotations

import os

import pytest

from ustack.capture.kernel_offsets import FIELDS
from ustack.kernel import btf
from ustack.model import UstackError

pytestmark = pytest.mark.skipif(not os.path.exists(btf.VMLINUX), reason="no kernel BTF")


@pytest.fixture(scope="module")
def both():
    blob = open(btf.VMLINUX, "rb").read()
    return btf.Btf(blob), btf.FieldOffsets(blob)


def test_the_programs_fields_are_where_the_full_parse_says(both):
    full, fast = both
    for struct_name, field in FIELDS.values():
        assert fast.offset(struct_name, field) == full.offset(struct_name, field), field


def test_every_member_of_a_thousand_structs_agrees(both):
    full, fast = both
    structs = sorted(full.by_name)[:1000]
    for name in structs:
        for member, _at, _type in full.members(name):
            if not member:
                continue
            try:
                want = full.offset(name, member)
            except UstackError as e:
                with pytest.raises(UstackError, match=str(e).split(":")[-1].strip()):
                    fast.offset(name, member)
                continue
            assert fast.offset(name, member) == want, (name, member)


def test_an_absent_field_is_named(both):
    _full, fast = both
    with pytest.raises(UstackError, match="kernel BTF has no task_struct.no_such_field"):
        fast.offset("task_struct", "no_such_field")
    with pytest.raises(UstackError, match="kernel BTF has no no_such_struct.x"):
        fast.offset("no_such_struct", "x")
