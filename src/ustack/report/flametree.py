"""Counted stacks merged into one tree of frames, root first: what the flame
graph formats (HTML, SVG, differential) draw.

A stack's path from the root is: the process (`comm`, or `comm-PID` with
per_pid, as folded lines start), a `[note]` frame per unwinding note (a
truncated stack is missing its outer frames, so the note stands where they
would be), then the frames outermost first. Frames are told apart by
aggregate.py's identity (module and function, plus the call site's offset
with `offsets`; a Python frame by its line too, as py-spy names it, unless
`lines` is off), and a frame inlined into its caller stays its own node."""
from __future__ import annotations

import re

from ..model import SCRIPT_KINDS, Frame, StackCount, unnamed_function
from ..symbols.kernel import KERNEL_MODULE
from ..symbols.stacks import SEPARATOR
from .aggregate import merge
from .folded import python_name

# Kinds of frames, for colours and the legend. Kernel frames come after the
# `--` SEPARATOR in root-first order.
KINDS = ("user", "lib", "kernel", "go", "python", "php", "perl", "ruby", "js", "java", "unknown",
         "separator", "note", "process", "root")
_LIBRARY = re.compile(r"\.so(\.[0-9.]+)?$|^\[")   # libc.so.6, ld-linux…so.2, [vdso]


def frame_name(f: Frame, offsets: bool = False, lines: bool = True) -> str:
    """A frame's label: its function (`+0x15` with offsets), else `[module]`
    or `[unknown]` as folded lines name it (unnamed code with a place in
    its object: `fn@0x11e0 [module]`); ` (inlined)` for an inlined call;
    a Python frame `func (file.py:LINE)`, or `func (file.py)` without lines."""
    if not f.function:
        unnamed = unnamed_function(f)
        if unnamed is None:
            return f"[{f.module}]" if f.module else "[unknown]"
        offset = f"+0x{f.offset:x}" if offsets and f.objstart else ""
        return f"{unnamed}{offset} [{f.module}]"
    if f.kind in SCRIPT_KINDS and f.line:
        return python_name(f) if lines else f"{f.function} ({f.module})"
    name = f.function
    if offsets and f.offset and not f.inlined:
        name += f"+0x{f.offset:x}"
    return name + " (inlined)" if f.inlined else name


def frame_kind(f: Frame) -> str:
    if f.kind:                         # python, js, java
        return f.kind
    if (f.function, f.module) == (SEPARATOR.function, SEPARATOR.module):
        return "separator"
    if f.module == KERNEL_MODULE:
        return "kernel"
    if f.function and f.function.startswith("runtime."):
        return "go"
    if not f.function and not f.module:
        return "unknown"
    if _LIBRARY.search(f.module):
        return "lib"
    return "user"


class Node:
    """One frame of the tree: `value` samples passed through it in the run
    drawn (B of a diff), `before` in the baseline run (A of a diff)."""
    __slots__ = ("name", "module", "kind", "source", "inlined", "value",
                 "before", "children")

    def __init__(self, name: str, module: str = "", kind: str = "user",
                 source: str = "", inlined: bool = False):
        self.name, self.module, self.kind = name, module, kind
        self.source, self.inlined = source, inlined
        self.value = self.before = 0
        self.children: dict = {}

    def child(self, key: tuple, make) -> "Node":
        node = self.children.get(key)
        if node is None:
            node = self.children[key] = make()
        return node

    def sorted_children(self) -> list:
        """Alphabetically, as flamegraph.pl orders its merged frames."""
        return sorted(self.children.values(), key=lambda n: (n.name, n.module))


def walk(root: Node):
    """(depth, node) of every node, root first, children in drawing order;
    iterative: a stack may be a thousand frames deep."""
    todo = [(0, root)]
    while todo:
        depth, node = todo.pop()
        yield depth, node
        todo.extend((depth + 1, c) for c in reversed(node.sorted_children()))


def placed(root: Node):
    """(depth, start, node) of every node in walk() order: `start` is the
    samples left of the node on its row, as a flame graph's x."""
    open_rows: list = []        # per depth above: [its start, its children's samples so far]
    for depth, node in walk(root):
        del open_rows[depth:]
        start = 0
        if open_rows:
            parent = open_rows[-1]
            start = parent[0] + parent[1]
            parent[1] += node.value
        open_rows.append([start, 0])
        yield depth, start, node


def flat_json(root: Node) -> dict:
    """The tree as the page reads it: `nodes` in walk() order, each
    [depth, name, module, kind, value, before, source, inlined] with the
    strings as indexes into `strings` (names repeat across the tree)."""
    strings: dict = {}

    def index(text: str) -> int:
        return strings.setdefault(text, len(strings))

    kinds = {kind: i for i, kind in enumerate(KINDS)}
    nodes = [[depth, index(n.name), index(n.module), kinds[n.kind], n.value,
              n.before, index(n.source), int(n.inlined)]
             for depth, n in walk(root)]
    return {"strings": list(strings), "kinds": list(KINDS), "nodes": nodes}


def _source(f: Frame, offsets: bool) -> str:
    """The source file; its line too when frames are call sites (offsets):
    merged by function, one frame stands for many lines."""
    if not f.file:
        return ""
    return f"{f.file}:{f.line}" if offsets and f.line else f.file


class FlameTree:
    """Add counted stacks (those of a baseline run with before=True), then
    read `root`. `lines`: a Python frame's node is its function at one line
    (off: the function, all its lines merged)."""

    def __init__(self, per_pid: bool = False, offsets: bool = False, lines: bool = True):
        self.per_pid, self.offsets, self.lines = per_pid, offsets, lines
        self.root = Node("all", kind="root")

    def add_all(self, counts, before: bool = False) -> None:
        for sc in merge(counts, self.per_pid, self.offsets):
            self.add(sc, before)

    def add(self, sc: StackCount, before: bool = False) -> None:
        slot = "before" if before else "value"
        node = self.root
        _bump(node, slot, sc.count)
        head = f"{sc.comm}-{sc.pid}" if self.per_pid else sc.comm
        node = node.child(("process", head), lambda: Node(head, kind="process"))
        _bump(node, slot, sc.count)
        for note in sc.stack.notes:
            node = node.child(("note", note),
                              lambda: Node(f"[{note}]", kind="note"))
            _bump(node, slot, sc.count)
        for f in reversed(sc.stack.frames):
            key = (f.module, f.function or unnamed_function(f) or "",
                   f.offset if self.offsets and (f.function or f.objstart) else 0, f.inlined,
                   f.line if self.lines and f.kind in SCRIPT_KINDS else 0)
            node = node.child(key, lambda: Node(
                frame_name(f, self.offsets, self.lines), f.module, frame_kind(f),
                _source(f, self.offsets), f.inlined))
            _bump(node, slot, sc.count)


def _bump(node: Node, slot: str, count: int) -> None:
    setattr(node, slot, getattr(node, slot) + count)


def build_tree(counts, per_pid: bool = False, offsets: bool = False,
               before: list | None = None, lines: bool = True) -> Node:
    """The merged tree of `counts` (and of a baseline run's `before`)."""
    tree = FlameTree(per_pid, offsets, lines)
    tree.add_all(counts)
    if before is not None:
        tree.add_all(before, before=True)
    return tree.root


class TreeReport:
    """The counted-stacks interface (formats.py) of the formats that draw
    the merged tree: add() keeps the stacks, a subclass's finish() draws
    tree()."""
    lines = True                        # Python frames apart by line (FlameTree)

    def __init__(self, per_pid: bool = False, offsets: bool = False, context=None):
        self.per_pid, self.offsets, self.context = per_pid, offsets, context
        self.counted: list = []

    def add(self, counted: StackCount) -> None:
        self.counted.append(counted)

    def tree(self, before: list | None = None) -> Node:
        return build_tree(self.counted, self.per_pid, self.offsets, before, self.lines)

    def command(self) -> str:
        """The command the stacks came from, for a subtitle."""
        return self.context.command if self.context is not None else "count"
