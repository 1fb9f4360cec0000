"""Value classes for the data that flows between stages: `@value` makes a
class whose annotated fields get an __init__ (with their defaults), a repr,
equality and, when frozen (the default), a hash and no assignment — what
`@dataclass(frozen=True)` gives, for what ustack uses of it.

Why not dataclasses: it sat on the path from launch to probes live, the
start-up of every run. Importing it costs ~7 ms (it pulls inspect), and
each class ~0.7 ms (six methods compiled one by one, on CPython 3.11): with
~25 classes before the first probe that was ~25 ms of a ~120 ms start.
Here a class costs one compile of its __init__ (~0.08-0.5 ms), once it is
made often (COMPILE_AFTER): a short run makes most of its ~20 classes a
few times each, by a generic __init__, and compiles none of those."""
from __future__ import annotations

from operator import attrgetter

_MISSING = object()
# instances a class makes by the generic __init__ before its own is
# compiled (~0.15 ms a class on the first use's path; the generic one
# costs ~1 us more an instance)
COMPILE_AFTER = 32


class factory:
    """A default made afresh for each instance: `events: list = factory(list)`."""
    __slots__ = ("make",)

    def __init__(self, make):
        self.make = make


class FrozenError(AttributeError):
    """Assignment to a field of a frozen value."""


def value(cls=None, *, frozen: bool = True):
    """Decorate a class (`@value`, or `@value(frozen=False)` for a mutable one)."""
    def make(cls):
        return _complete(cls, frozen)
    return make(cls) if cls is not None else make


def fields(obj) -> tuple:
    """The field names of a value class or instance, in __init__'s order."""
    return obj.__value_fields__


def replace(obj, **changes):
    """A copy of `obj` with the named fields changed (dataclasses.replace)."""
    kwargs = {name: getattr(obj, name) for name in fields(obj)}
    kwargs.update(changes)
    return obj.__class__(**kwargs)


def as_dict(obj) -> dict:
    """The fields as a dict, nested values too (dataclasses.asdict)."""
    def plain(v):
        if hasattr(v, "__value_fields__"):
            return {n: plain(getattr(v, n)) for n in fields(v)}
        if isinstance(v, (list, tuple)):
            return type(v)(plain(x) for x in v)
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        return v
    return plain(obj)


def _field_defaults(cls) -> dict:
    """name -> default (or _MISSING) for every annotated field, base classes'
    first, as dataclasses orders them."""
    found: dict = {}
    for klass in reversed(cls.__mro__):
        for name in klass.__dict__.get("__annotations__", {}):
            found[name] = klass.__dict__.get(name, found.get(name, _MISSING))
    return found


def _complete(cls, frozen: bool):
    defaults = _field_defaults(cls)
    names = tuple(defaults)
    cls.__init__ = _init(cls, names, defaults)
    as_tuple = attrgetter(*names) if len(names) > 1 else (
        (lambda obj: (getattr(obj, names[0]),)) if names else (lambda obj: ()))

    def __repr__(self):
        shown = ", ".join(f"{n}={v!r}" for n, v in zip(names, as_tuple(self)))
        return f"{type(self).__qualname__}({shown})"

    def __eq__(self, other):
        if other.__class__ is self.__class__:
            return as_tuple(self) == as_tuple(other)
        return NotImplemented

    cls.__repr__, cls.__eq__ = __repr__, __eq__
    cls.__value_fields__ = names
    if not frozen:
        cls.__hash__ = None          # mutable and equal by value: unhashable
        return cls
    field_names = frozenset(names)

    def __hash__(self):
        return hash(as_tuple(self))

    def __setattr__(self, name, value):
        if type(self) is cls or name in field_names:
            raise FrozenError(f"cannot assign to field {name!r}")
        object.__setattr__(self, name, value)

    def __delattr__(self, name):
        if type(self) is cls or name in field_names:
            raise FrozenError(f"cannot delete field {name!r}")
        object.__delattr__(self, name)

    cls.__hash__, cls.__setattr__, cls.__delattr__ = __hash__, __setattr__, __delattr__
    return cls


def _init(cls, names: tuple, defaults: dict):
    """__init__ compiled for the fields (the one method where a generic loop
    would cost every instance: millions of frames are made), on first use."""
    env = {"_MISSING": _MISSING}
    params, body = [], []
    for name in names:
        default = defaults[name]
        if default is _MISSING:
            params.append(name)
            body.append(f" d[{name!r}] = {name}")
        elif isinstance(default, factory):
            env[f"_f_{name}"] = default.make
            params.append(f"{name}=_MISSING")
            body.append(f" d[{name!r}] = _f_{name}() if {name} is _MISSING else {name}")
        else:
            env[f"_d_{name}"] = default
            params.append(f"{name}=_d_{name}")
            body.append(f" d[{name!r}] = {name}")
    source = "\n".join([f"def __init__(self, {', '.join(params)}):",
                        " d = self.__dict__", *body])

    made = 0

    def __init__(self, *args, **kwargs):
        # the first instances by the generic loop; then compiled (~0.15 ms
        # a class: many are made a few times in a given run, or never),
        # and in the class for good
        nonlocal made
        made += 1
        if made <= COMPILE_AFTER:
            return _generic_init(cls, self, names, defaults, args, kwargs)
        exec(source, env)
        init = env["__init__"]
        init.__qualname__ = f"{cls.__qualname__}.__init__"
        cls.__init__ = init
        init(self, *args, **kwargs)
    for name in names:      # as dataclasses: each instance has its own
        if isinstance(defaults[name], factory) and name in cls.__dict__:
            delattr(cls, name)
    return __init__


def _generic_init(cls, obj, names: tuple, defaults: dict, args: tuple, kwargs: dict) -> None:
    """What the compiled __init__ does, by a loop over the fields."""
    if len(args) > len(names):
        raise TypeError(f"{cls.__qualname__}.__init__() takes {len(names) + 1} positional "
                        f"arguments but {len(args) + 1} were given")
    d = obj.__dict__
    for name, v in zip(names, args):
        if name in kwargs:
            raise TypeError(f"{cls.__qualname__}.__init__() got multiple values for "
                            f"argument {name!r}")
        d[name] = v
    for name in names[len(args):]:
        if name in kwargs:
            d[name] = kwargs.pop(name)
            continue
        default = defaults[name]
        if default is _MISSING:
            raise TypeError(f"{cls.__qualname__}.__init__() missing 1 required "
                            f"positional argument: {name!r}")
        d[name] = default.make() if isinstance(default, factory) else default
    if kwargs:
        raise TypeError(f"{cls.__qualname__}.__init__() got an unexpected keyword "
                        f"argument {next(iter(kwargs))!r}")
