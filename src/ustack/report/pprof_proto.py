"""pprof's profile.proto (github.com/google/pprof, proto/profile.proto) as
Python message classes, built at import time by the `protobuf` package
from a descriptor made here: no protoc, no generated file to keep in step.

Only the fields ustack writes or a reader needs are declared (the message
and field numbers are pprof's); a reader ignores what it does not know,
so the subset is still a valid profile.proto message."""
from __future__ import annotations

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_PACKAGE = "perftools.profiles"
_F = descriptor_pb2.FieldDescriptorProto
_I64, _U64, _STR, _BOOL = _F.TYPE_INT64, _F.TYPE_UINT64, _F.TYPE_STRING, _F.TYPE_BOOL
_MANY = "repeated"

# message -> [(field number, name, type or message name, repeated?)]
_MESSAGES = {
    "Profile": [
        (1, "sample_type", "ValueType", _MANY),
        (2, "sample", "Sample", _MANY),
        (3, "mapping", "Mapping", _MANY),
        (4, "location", "Location", _MANY),
        (5, "function", "Function", _MANY),
        (6, "string_table", _STR, _MANY),      # [0] must be ""
        (7, "drop_frames", _I64, None),
        (8, "keep_frames", _I64, None),
        (9, "time_nanos", _I64, None),
        (10, "duration_nanos", _I64, None),
        (11, "period_type", "ValueType", None),
        (12, "period", _I64, None),
        (13, "comment", _I64, _MANY),
        (14, "default_sample_type", _I64, None),
    ],
    "ValueType": [(1, "type", _I64, None), (2, "unit", _I64, None)],
    "Sample": [
        (1, "location_id", _U64, _MANY),        # leaf first
        (2, "value", _I64, _MANY),              # one per Profile.sample_type
        (3, "label", "Label", _MANY),
    ],
    "Label": [(1, "key", _I64, None), (2, "str", _I64, None),
              (3, "num", _I64, None), (4, "num_unit", _I64, None)],
    "Mapping": [
        (1, "id", _U64, None),
        (2, "memory_start", _U64, None),
        (3, "memory_limit", _U64, None),
        (4, "file_offset", _U64, None),
        (5, "filename", _I64, None),
        (6, "build_id", _I64, None),
        (7, "has_functions", _BOOL, None),
        (8, "has_filenames", _BOOL, None),
        (9, "has_line_numbers", _BOOL, None),
        (10, "has_inline_frames", _BOOL, None),
    ],
    "Location": [
        (1, "id", _U64, None),
        (2, "mapping_id", _U64, None),
        (3, "address", _U64, None),
        (4, "line", "Line", _MANY),             # inlined calls first, caller last
        (5, "is_folded", _BOOL, None),
    ],
    "Line": [(1, "function_id", _U64, None), (2, "line", _I64, None)],
    "Function": [
        (1, "id", _U64, None),
        (2, "name", _I64, None),
        (3, "system_name", _I64, None),
        (4, "filename", _I64, None),
        (5, "start_line", _I64, None),
    ],
}


def _file_descriptor() -> descriptor_pb2.FileDescriptorProto:
    fd = descriptor_pb2.FileDescriptorProto(
        name="ustack/pprof_profile.proto", package=_PACKAGE, syntax="proto3")
    for name, fields in _MESSAGES.items():
        message = fd.message_type.add(name=name)
        for number, field_name, kind, many in fields:
            field = message.field.add(
                name=field_name, number=number,
                label=_F.LABEL_REPEATED if many else _F.LABEL_OPTIONAL)
            if isinstance(kind, str):
                field.type = _F.TYPE_MESSAGE
                field.type_name = f".{_PACKAGE}.{kind}"
            else:
                field.type = kind
    return fd


def _message_classes() -> dict:
    pool = descriptor_pool.DescriptorPool()   # private: no clash with others' protos
    pool.Add(_file_descriptor())
    return {name: message_factory.GetMessageClass(
                pool.FindMessageTypeByName(f"{_PACKAGE}.{name}"))
            for name in _MESSAGES}


_CLASSES = _message_classes()
Profile = _CLASSES["Profile"]
