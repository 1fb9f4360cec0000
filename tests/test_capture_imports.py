"""capture/'s modules import one another one way: no module reaches itself
through its imports, at the top or inside a function (a deferred import
only hides a circle, it does not break it)."""
import ast
from pathlib import Path

CAPTURE = Path(__file__).resolve().parent.parent / "src" / "ustack" / "capture"


def sibling_imports(path: Path) -> set:
    """The capture modules `path` imports, wherever in the file."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:                     # from .x import y
                found.add(node.module.split(".")[0])
            else:                               # from . import x
                found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and node.module.startswith("ustack.capture."):
            found.add(node.module.split(".")[2])
    return {m for m in found if (CAPTURE / f"{m}.py").exists()}


def circles(graph: dict) -> list:
    """Every module that reaches itself, with the path it takes."""
    found = []
    for start in sorted(graph):
        stack = [(start, [start])]
        seen = set()
        while stack:
            name, path = stack.pop()
            for nxt in sorted(graph.get(name, ())):
                if nxt == start:
                    found.append(" -> ".join(path + [start]))
                elif nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, path + [nxt]))
    return found


def test_capture_has_no_import_circle():
    graph = {p.stem: sibling_imports(p) for p in CAPTURE.glob("*.py")}
    assert circles(graph) == []


def test_the_check_finds_a_circle():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == \
        ["a -> b -> c -> a", "b -> c -> a -> b", "c -> a -> b -> c"]
