"""Flame graphs from counted stacks (report/flametree.py, flamegraph_html.py,
flamegraph_svg.py): the merged tree, the self-contained page and its
embedded data, the SVG's frames and tooltips, the differential graph's two
runs. Fast, no kernel; what a person sees in a browser is in
test_flamegraph_browser.py."""
from __future__ import annotations

import json
import re

import pytest

from ustack.model import Frame, Stack, StackCount, UstackError
from ustack.probes.weight import Weight
from ustack.report.flamegraph_html import DiffFlameGraphReport
from ustack.report.flametree import build_tree, flat_json
from ustack.report.formats import FORMATS, ReportContext, run_context, stack_report
from ustack.report.output import choose_format
from ustack.symbols.stacks import SEPARATOR
from helpers import render, svg_frames

TRUNCATED = "stack copy too small (8192 bytes): the stack was cut short; raise --stack-size"


def frame(function, module="prog", addr=0x1000, **kw) -> Frame:
    return Frame(addr=addr, module=module, function=function, **kw)


def counted(*outer_first, count=1, comm="prog", pid=7, notes=()) -> StackCount:
    """A StackCount from frames (or function names in module prog) given
    root first, as a flame graph reads them."""
    frames = [f if isinstance(f, Frame) else frame(f) for f in outer_first]
    return StackCount(comm, pid, Stack(tuple(reversed(frames)), notes), count)


BRANCHES = [counted("main", "left", "leaf", count=300),
            counted("main", "right", "leaf", count=100)]


def columns(root) -> dict:
    """{path of names from the root: samples} of every node."""
    out, todo = {}, [((root.name,), root)]
    while todo:
        path, node = todo.pop()
        out[path] = node.value
        todo.extend((path + (c.name,), c) for c in node.children.values())
    return out


def page_data(page: str) -> dict:
    m = re.search(r'<script type="application/json" id="flamegraph-data">(.*?)</script>',
                  page, re.S)
    assert m, "no embedded data"
    return json.loads(m.group(1))


def data_paths(data: dict) -> dict:
    """{path of names: (samples, before)} from the page's flat tree."""
    names, out, path = data["tree"]["strings"], {}, []
    for depth, name, _module, _kind, value, before, _src, _inl in data["tree"]["nodes"]:
        del path[depth:]
        path.append(names[name])
        out[tuple(path)] = (value, before)
    return out


# --- the merged tree ------------------------------------------------------------

def test_tree_merges_stacks_by_function_root_first():
    cols = columns(build_tree(BRANCHES + [counted("main", "left", "leaf", count=5)]))
    assert cols[("all",)] == 405
    assert cols[("all", "prog")] == 405
    assert cols[("all", "prog", "main")] == 405
    assert cols[("all", "prog", "main", "left", "leaf")] == 305
    assert cols[("all", "prog", "main", "right", "leaf")] == 100


def test_tree_merges_other_addresses_of_one_function():
    """ASLR'd processes of one binary: the same names merge (aggregate.py)."""
    a = counted(frame("main", addr=0x5555_0000), frame("f", addr=0x5555_0100))
    b = counted(frame("main", addr=0x7777_0000), frame("f", addr=0x7777_0100), pid=8)
    assert columns(build_tree([a, b]))[("all", "prog", "main", "f")] == 2


def test_tree_per_pid_names_the_process_first():
    cols = columns(build_tree([counted("main", pid=7), counted("main", pid=8, count=2)],
                              per_pid=True))
    assert cols[("all", "prog-7", "main")] == 1
    assert cols[("all", "prog-8", "main")] == 2


def test_tree_offsets_tell_call_sites_apart():
    a = counted(frame("main", offset=0x10), frame("f", offset=0x4))
    b = counted(frame("main", offset=0x20), frame("f", offset=0x4))
    cols = columns(build_tree([a, b], offsets=True))
    assert cols[("all", "prog", "main+0x10", "f+0x4")] == 1
    assert cols[("all", "prog", "main+0x20", "f+0x4")] == 1
    assert columns(build_tree([a, b]))[("all", "prog", "main", "f")] == 2


def test_tree_names_unnamed_and_inlined_frames():
    sc = counted("main", Frame(addr=0x10, module="libfoo.so"), Frame(addr=0x20, module=""),
                 frame("helper", inlined=True), "caller")
    cols = columns(build_tree([sc]))
    assert ("all", "prog", "main", "[libfoo.so]", "[unknown]", "helper (inlined)",
            "caller") in cols


def test_tree_notes_stand_where_the_lost_frames_would_be():
    sc = counted("c", "d", count=3, notes=(TRUNCATED,))
    cols = columns(build_tree([sc, counted("main", "c", "d")]))
    assert cols[("all", "prog", f"[{TRUNCATED}]", "c", "d")] == 3
    assert cols[("all", "prog", "main", "c", "d")] == 1


def test_tree_kinds_of_frames():
    """Kernel frames follow the `--` separator (root first); Go's runtime,
    libraries, user code and the rest each have a kind for their colour."""
    stack = Stack((frame("do_sys_openat2", "kernel"), frame("entry_SYSCALL_64", "kernel"),
                   SEPARATOR, frame("open64", "libc.so.6"), frame("runtime.mallocgc"),
                   Frame(addr=1, module=""), frame("main")), (TRUNCATED,))
    data = flat_json(build_tree([StackCount("prog", 1, stack, 1)]))
    names, kinds = data["strings"], data["kinds"]
    got = [(names[n[1]], kinds[n[3]]) for n in data["nodes"]]
    assert got == [("all", "root"), ("prog", "process"), (f"[{TRUNCATED}]", "note"),
                   ("main", "user"), ("[unknown]", "unknown"), ("runtime.mallocgc", "go"),
                   ("open64", "lib"), ("--", "separator"), ("entry_SYSCALL_64", "kernel"),
                   ("do_sys_openat2", "kernel")]


def test_tree_of_a_very_deep_stack():
    """Deep recursion (the DWARF unwinder goes to 1024 frames) needs no
    Python recursion to build or embed."""
    deep = counted(*(["main"] + ["recurse"] * 3000))
    data = flat_json(build_tree([deep]))
    assert len(data["nodes"]) == 3003
    assert data["nodes"][-1][0] == 3002


# --- formats registered -----------------------------------------------------------

@pytest.mark.parametrize("path", ["out/profile.html", "page.htm", "flame.svg"])
def test_the_file_name_of_o_chooses_the_flame_graph(path):
    """-o's file name chooses the format as a run does: the page for .html
    and .htm, an SVG for .svg, each of the counted stacks."""
    out = render(stack_report(choose_format(None, path, FORMATS)), BRANCHES)
    if path.endswith(".svg"):
        labels = {title.split(" (")[0] for title, _attrs, _label in svg_frames(out)}
        assert {"main", "left", "right", "leaf"} <= labels, labels
    else:
        assert out.startswith("<!DOCTYPE html>")
        assert data_paths(page_data(out))[("all", "prog", "main", "left", "leaf")] == \
            (300, 0)


def test_diff_is_no_format_of_one_run():
    """A differential graph takes two recordings (`ustack report --diff A
    B`): -f diff on a run is refused, in one line."""
    with pytest.raises(UstackError) as e:
        choose_format("diff", None, FORMATS)
    assert str(e.value).startswith("format 'diff' is not available here (one of ")


# --- the HTML page ----------------------------------------------------------------

def test_page_is_self_contained():
    page = render(stack_report("html"), BRANCHES)
    assert page.startswith("<!DOCTYPE html>")
    assert not re.search(r"<(script|link|img|iframe)[^>]+(src|href)=", page, re.I)
    assert "http://" not in page and "https://" not in page
    assert "{{" not in page               # every placeholder filled
    assert '<canvas id="flamegraph"' in page


def test_page_embeds_the_merged_tree():
    data = page_data(render(stack_report("html"), BRANCHES))
    paths = data_paths(data)
    assert paths[("all", "prog", "main", "left", "leaf")] == (300, 0)
    assert paths[("all", "prog", "main", "right", "leaf")] == (100, 0)
    assert data["diff"] is False and data["unit"] == "events"


def test_page_title_and_time_of_a_profile():
    context = ReportContext(command="profile", events=("profile:hz:99",), frequency=99,
                            title="ustack profile -c ./busy")
    page = render(stack_report("html", context=context), [counted("main", count=198)])
    assert "<title>ustack profile -c ./busy</title>" in page
    assert "profile · 198 samples (2.000 s at 99 Hz)" in page
    data = page_data(page)
    assert (data["unit"], data["frequency"]) == ("samples", 99)


@pytest.mark.parametrize("context, title, widths", [
    (run_context("offcpu", ["offcpu"], value_unit="nanoseconds"), "ustack offcpu",
     "time (off CPU)"),
    (run_context("profile", ["profile:hz:99"], 99), "ustack profile at 99 Hz", "samples"),
    (run_context("count", ["syscall:write"]), "ustack count syscall:write", "events"),
    (run_context("count", ["syscall:write"], weight=Weight("count", "bytes")),
     "ustack count syscall:write --weight count", "bytes (count)"),
    (run_context("count", ["uprobe:/tmp/w:take"], weight=Weight("n")),
     "ustack count uprobe:/tmp/w:take --weight n", "sum of n"),
])
def test_page_says_what_its_title_and_widths_are(context, title, widths):
    """An off-CPU page is titled once by its command and its widths are
    time, not samples."""
    page = render(stack_report("html", context=context), [counted("main", count=3)])
    assert f"<title>{title}</title>" in page
    assert f"Widths are {widths}; the root is at the top, its callees below it." in page


def test_page_title_from_the_events():
    page = render(stack_report("html", context=ReportContext(events=("syscall:write",))),
                  BRANCHES)
    assert "<title>Flame graph: syscall:write</title>" in page


def test_page_names_cannot_break_out_of_the_script():
    """A (C++) name with `</script>` or `<` stays data, not markup."""
    page = render(stack_report("html"), [counted("main", "operator<</script><b>x")])
    assert page.count("</script>") == 2  # the data's and the code's
    assert ("all", "prog", "main", "operator<</script><b>x") in data_paths(page_data(page))


def test_page_of_no_stacks():
    data = page_data(render(stack_report("html"), []))
    assert data_paths(data) == {("all",): (0, 0)}


# --- SVG ---------------------------------------------------------------------------


def test_svg_frames_carry_counts_in_titles():
    frames = svg_frames(render(stack_report("svg"), BRANCHES))
    titles = [t for t, _, _ in frames]
    assert "all (400 events, 100.00%)" in titles
    assert "left (300 events, 75.00%) [prog]" in titles
    assert "right (100 events, 25.00%) [prog]" in titles
    assert titles.count("leaf (300 events, 75.00%) [prog]") == 1
    assert titles.count("leaf (100 events, 25.00%) [prog]") == 1


def test_svg_of_weighted_stacks_names_what_they_sum():
    """count --weight: the sums, named by the argument and its unit."""
    context = run_context("count", ["syscall:write"], weight=Weight("count", "bytes"))
    text = render(stack_report("svg", context=context), BRANCHES)
    titles = [t for t, _, _ in svg_frames(text)]
    assert "all (400 bytes (count), 100.00%)" in titles
    assert "left (300 bytes (count), 75.00%) [prog]" in titles
    assert "count · 400 bytes (count)" in text


def test_svg_widths_and_rows():
    frames = svg_frames(render(stack_report("svg"), BRANCHES))
    rect = {title.split(" [")[0]: r for title, r, _ in frames}   # titles are unique here
    width = {t: float(r["width"]) for t, r in rect.items()}
    assert width["all (400 events, 100.00%)"] == pytest.approx(1180, abs=0.1)  # 1200 less margins
    left, right = width["left (300 events, 75.00%)"], width["right (100 events, 25.00%)"]
    assert left / right == pytest.approx(3, rel=1e-3)
    assert width["leaf (300 events, 75.00%)"] == left
    assert (float(rect["left (300 events, 75.00%)"]["x"]) + left
            == pytest.approx(float(rect["right (100 events, 25.00%)"]["x"]), abs=0.2))
    # the root at the bottom, each frame 16 px above its parent, 15 px tall
    y = {t: float(r["y"]) for t, r in rect.items()}
    assert y["main (400 events, 100.00%)"] == y["prog (400 events, 100.00%)"] - 16
    assert y["leaf (300 events, 75.00%)"] == y["left (300 events, 75.00%)"] - 16
    assert all(r["height"] == "15" for r in rect.values())


def test_svg_labels_fit_their_frames():
    sc = counted("main", "a_very_long_function_name_that_cannot_fit_in_a_narrow_frame", count=10)
    frames = svg_frames(render(stack_report("svg"), [sc, counted("main", "wide", count=90)]))
    labels = {t.split(" (")[0]: label for t, _, label in frames}
    assert labels["wide"] == "wide"
    narrow = labels["a_very_long_function_name_that_cannot_fit_in_a_narrow_frame"]
    assert narrow == "a_very_long_fu..", narrow       # 118 px: 16 characters of 7 px


def test_svg_leaves_out_frames_too_thin_to_see():
    frames = svg_frames(render(stack_report("svg"),
                               [counted("main", "big", count=100_000), counted("main", "tiny")]))
    assert not any(t.startswith("tiny") for t, _, _ in frames)


def test_svg_escapes_names():
    frames = svg_frames(render(stack_report("svg"), [counted("main", "std::vector<int>::at&")]))
    assert any(t.startswith("std::vector<int>::at& (1 event") for t, _, _ in frames)


# --- the differential graph -----------------------------------------------------------

def test_diff_carries_both_runs():
    """A: left 300, right 100; B: left 100, right 300. Widths come from B,
    `before` keeps A, and a frame only in A is kept with no width in B."""
    before = BRANCHES + [counted("main", "gone", count=50)]
    after = [counted("main", "left", "leaf", count=100), counted("main", "right", "leaf", count=300)]
    data = page_data(render(DiffFlameGraphReport(), after, before))
    paths = data_paths(data)
    assert data["diff"] is True
    assert paths[("all",)] == (400, 450)
    assert paths[("all", "prog", "main", "left")] == (100, 300)
    assert paths[("all", "prog", "main", "right")] == (300, 100)
    assert paths[("all", "prog", "main", "gone")] == (0, 50)


def test_diff_page_title():
    page = render(DiffFlameGraphReport(), BRANCHES, BRANCHES)
    assert "<title>Differential flame graph</title>" in page
    assert "A: 400 events · B: 400 events" in page
