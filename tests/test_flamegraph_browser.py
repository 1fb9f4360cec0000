"""The flame graphs as a person sees them, in a real headless Chromium: the
HTML page draws the known columns with the right widths, a click zooms, the
search highlights and gives the matched share, the tooltip tells name,
module, samples and percent; the differential page colours growth red and
shrinkage blue; the SVG opens. No page asks the network for anything.

Known counts from a real run: tests/programs/branches.c calls leaf 300
times through main -> left and 100 times through main -> right."""
from __future__ import annotations

import re
import time

import pytest
from browser import chromium, keep_screenshot, network_requests  # noqa: F401 (fixture)

from helpers import (FP, build, build_go, counted, drawn, drawn_count, element, frames, one, open_page,
                     point_at, run_ustack, write)
from ustack.model import Frame, Stack, StackCount
from ustack.report.flamegraph_html import DiffFlameGraphReport
from ustack.report.formats import ReportContext, stack_report

MAGENTA = "rgb(230,0,230)"          # flamegraph.pl's colour of a search match


BRANCHES = [counted("main", "left", "leaf", count=300),
            counted("main", "right", "leaf", count=100)]


def state(driver) -> dict:
    return driver.execute_script("return window.flamegraph.state()")


def search(driver, text: str, regex: bool = False):
    box = element(driver, "search")
    box.clear()
    if element(driver, "regex").is_selected() != regex:
        element(driver, "regex").click()
    box.send_keys(text)
    return element(driver, "matched").text


def check_branches(driver, leaf_module: str):
    """The known columns of branches (300 : 100) drawn as they should be."""
    st = state(driver)
    assert st["total"] == 400
    everything = one(driver, "all")
    assert everything["width"] == pytest.approx(st["canvasWidth"], abs=0.5)
    left, right = one(driver, "left"), one(driver, "right")
    assert (left["samples"], right["samples"]) == (300, 100)
    assert left["width"] / right["width"] == pytest.approx(3, rel=0.01)
    assert left["width"] / everything["width"] == pytest.approx(0.75, rel=0.01)
    leaves = sorted(drawn(driver, "leaf"), key=lambda f: f["x"])
    assert [f["samples"] for f in leaves] == [300, 100]
    assert leaves[0]["width"] == pytest.approx(left["width"])
    assert all(f["module"] == leaf_module for f in leaves)
    # the root at the top: each frame a row (16 px) below its caller
    main = one(driver, "main")
    assert everything["y"] == 0
    assert left["y"] == right["y"] == main["y"] + 16
    assert leaves[0]["y"] == left["y"] + 16
    assert everything["y"] < main["y"]


def check_zoom(driver):
    """Click `right`: it spans the whole width, its callers stay, `left` goes;
    Reset brings the whole graph back."""
    point_at(driver, one(driver, "right"), click=True)
    st = state(driver)
    assert st["zoomed"] == "right"
    assert one(driver, "right")["width"] == pytest.approx(st["canvasWidth"], abs=0.5)
    assert one(driver, "leaf")["width"] == pytest.approx(st["canvasWidth"], abs=0.5)
    assert one(driver, "main")["width"] == pytest.approx(st["canvasWidth"], abs=0.5)
    assert drawn(driver, "left") == []
    assert element(driver, "reset").is_enabled()
    element(driver, "reset").click()
    assert state(driver)["zoomed"] == "all"
    assert len(drawn(driver, "leaf")) == 2
    assert not element(driver, "reset").is_enabled()


def check_search(driver):
    """`left` matches one frame, 75% of the samples; `lea` both leaves (all
    400 samples, each counted once); a regex; an empty box clears."""
    assert search(driver, "left") == "Matched: 75.0% (300 events of 400)"
    assert [f["name"] for f in frames(driver) if f["matched"]] == ["left"]
    assert one(driver, "left")["colour"] == MAGENTA
    assert search(driver, "lea").startswith("Matched: 100.0% (400 events")
    assert sorted(f["samples"] for f in frames(driver) if f["matched"]) == [100, 300]
    assert search(driver, "^ri.ht$", regex=True) == "Matched: 25.0% (100 events of 400)"
    assert search(driver, "") == ""
    assert not any(f["matched"] for f in frames(driver))


# --- the HTML page, from known stacks ---------------------------------------------

def test_page_draws_known_widths(chromium, tmp_path):
    open_page(chromium, write(stack_report("html"), tmp_path / "fg.html", BRANCHES))
    check_branches(chromium, "prog")
    assert network_requests(chromium) == []


def test_click_zooms_into_a_frame(chromium, tmp_path):
    open_page(chromium, write(stack_report("html"), tmp_path / "fg.html", BRANCHES))
    check_zoom(chromium)


def test_escape_zooms_out(chromium, tmp_path):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys
    open_page(chromium, write(stack_report("html"), tmp_path / "fg.html", BRANCHES))
    point_at(chromium, one(chromium, "left"), click=True)
    assert state(chromium)["zoomed"] == "left"
    element(chromium, "title").click()
    ActionChains(chromium).send_keys(Keys.ESCAPE).perform()
    assert state(chromium)["zoomed"] == "all"


def test_search_highlights_and_shows_the_share(chromium, tmp_path):
    open_page(chromium, write(stack_report("html"), tmp_path / "fg.html", BRANCHES))
    check_search(chromium)


def test_bad_regex_is_marked_not_thrown(chromium, tmp_path):
    open_page(chromium, write(stack_report("html"), tmp_path / "fg.html", BRANCHES))
    assert search(chromium, "le(ft", regex=True) == ""
    assert "invalid" in element(chromium, "search").get_attribute("class")
    assert not any(f["matched"] for f in frames(chromium))


def test_tooltip_tells_name_module_samples_percent(chromium, tmp_path):
    context = ReportContext(command="profile", frequency=100)
    open_page(chromium, write(stack_report("html", context=context), tmp_path / "fg.html",
                              BRANCHES))
    point_at(chromium, one(chromium, "left"))
    tip = element(chromium, "tooltip")
    assert tip.is_displayed()
    assert tip.text.splitlines() == ["left", "module: prog (user code)",
                                     "300 samples (3.000 s), 75.00%"]
    assert element(chromium, "details").text == "left (300 samples (3.000 s), 75.00%)"


def test_colours_by_kind_and_by_module_with_a_legend(chromium, tmp_path):
    from selenium.webdriver.support.ui import Select
    sep = Frame(addr=0, module="", function="--")
    stack = Stack((Frame(1, "kernel", "ksys_write"), sep, Frame(2, "libc.so.6", "write"),
                   Frame(3, "prog", "main")))
    counts = [StackCount("prog", 7, stack, 10), counted("main", "runtime.mallocgc", count=5),
              counted("main", "helper", count=5)]
    open_page(chromium, write(stack_report("html"), tmp_path / "fg.html", counts))
    legend = element(chromium, "legend").text
    for kind in ("user code", "libraries", "kernel", "Go runtime"):
        assert kind in legend
    kinds = {f["name"]: f["kind"] for f in frames(chromium)}
    assert (kinds["ksys_write"], kinds["--"], kinds["write"], kinds["runtime.mallocgc"],
            kinds["helper"]) == ("kernel", "separator", "lib", "go", "user")
    by_kind = {f["name"]: f["colour"] for f in frames(chromium)}
    Select(element(chromium, "colours")).select_by_value("module")
    assert state(chromium)["colours"] == "module"
    assert element(chromium, "legend").text.split() == ["prog", "kernel", "libc.so.6"]  # widest first
    by_module = {f["name"]: f["colour"] for f in frames(chromium)}
    assert by_module != by_kind
    keep_screenshot(chromium, "flamegraph_by_module")


def test_python_js_and_java_frames_have_colours_of_their_own(chromium, tmp_path):
    """Interpreted and JIT frames are told apart from native code: each kind
    its hue and legend entry; a Python frame is named as py-spy names it."""
    python = Frame(0, "spy.py", "leaf", file="/srv/spy.py", line=4, kind="python")
    js = Frame(0x3a000, "", "JS:*add", kind="js")
    java = Frame(0x7f00, "", "LChain;::leaf", kind="java")
    native = Frame(3, "prog", "main")
    counts = [StackCount("prog", 7, Stack((python, native)), 10),
              StackCount("prog", 7, Stack((js, native)), 5),
              StackCount("prog", 7, Stack((java, native)), 5)]
    open_page(chromium, write(stack_report("html"), tmp_path / "fg.html", counts))
    legend = element(chromium, "legend").text
    for kind in ("user code", "Python", "JavaScript (JIT)", "Java (JIT)"):
        assert kind in legend
    drawn_kinds = {f["name"]: f["kind"] for f in frames(chromium)}
    assert (drawn_kinds["leaf (spy.py:4)"], drawn_kinds["JS:*add"], drawn_kinds["LChain;::leaf"],
            drawn_kinds["main"]) == ("python", "js", "java", "user")
    hues = {f["name"]: float(re.match(r"hsl\(([\d.]+)", f["colour"])[1]) for f in frames(chromium)}
    assert abs(hues["leaf (spy.py:4)"] - 215) <= 8      # blue
    assert abs(hues["JS:*add"] - 95) <= 8 and abs(hues["LChain;::leaf"] - 135) <= 8   # greens
    assert hues["main"] <= 16                           # warm user code
    point_at(chromium, one(chromium, "leaf (spy.py:4)"))
    assert element(chromium, "tooltip").text.splitlines()[:2] == \
        ["leaf (spy.py:4)", "module: spy.py (Python)"]
    keep_screenshot(chromium, "flamegraph_python_js_java")


def test_many_frames_stay_fast(chromium, tmp_path):
    """4,000 distinct stacks 40 frames deep (140,000 frames in the tree):
    measured and printed (no timing assertion); the page must draw, zoom
    and search."""
    counts = [counted(*["main"] + [f"g{i % 50}_{d}" for d in range(5)]
                      + [f"f{i}_{d}" for d in range(34)] + [f"leaf{i}"], count=1 + i % 5)
              for i in range(4000)]
    path = write(stack_report("html"), tmp_path / "big.html", counts)
    start = time.monotonic()
    open_page(chromium, path)
    loaded = time.monotonic() - start
    first = state(chromium)
    drawn_frames = drawn_count(chromium)
    point_at(chromium, one(chromium, "g7_0"), click=True)
    zoomed = state(chromium)
    searched = search(chromium, "leaf1")
    print(f"\n{path.stat().st_size / 1e6:.1f} MB page; load {loaded:.2f} s; draw "
          f"{first['drawMs']:.0f} ms ({drawn_frames} frames drawn of 140,000), "
          f"zoomed {zoomed['drawMs']:.0f} ms, search+draw {state(chromium)['drawMs']:.0f} ms; "
          f"{searched}")
    assert drawn_frames > 1000 and zoomed["zoomed"] == "g7_0"
    keep_screenshot(chromium, "flamegraph_many_frames")


def test_a_thousand_frames_deep(chromium, tmp_path):
    """Deep recursion: every frame a row, the innermost at the bottom, clickable."""
    open_page(chromium, write(stack_report("html"), tmp_path / "deep.html",
                              [counted(*["main"] + ["recurse"] * 1000 + ["leaf"], count=3)]))
    rows = sorted(frames(chromium), key=lambda f: -f["y"])
    assert len(rows) == 1004 and rows[0]["name"] == "leaf" and rows[0]["y"] == 1003 * 16
    assert state(chromium)["canvasHeight"] == 1004 * 16 + 2
    point_at(chromium, rows[0], click=True)
    assert state(chromium)["zoomed"] == "leaf"


def in_first_view(driver, frame) -> bool:
    """Whether the frame is inside the window as the page opens, unscrolled."""
    return driver.execute_script("""
        const r = document.getElementById('flamegraph').getBoundingClientRect();
        const top = r.top + arguments[0].y, left = r.left + arguments[0].x;
        return window.scrollY === 0 && top >= 0 && top + arguments[0].height <= window.innerHeight
            && left >= 0 && left < window.innerWidth;""", frame)


def test_first_view_shows_the_root_and_the_widest_frames(chromium, tmp_path):
    """A page 300 frames deep (a 4,800 px canvas in a 900 px window) opens
    showing the root and the frames that take most samples, unscrolled:
    `all`, main, and main's widest callee `hot` (90 of 100) with its own;
    only the narrow deep chain lies below."""
    deep = ["main", "cold"] + [f"d{i}" for i in range(300)]
    open_page(chromium, write(stack_report("html"), tmp_path / "deep.html",
                              [counted("main", "hot", "work", count=90), counted(*deep, count=10)]))
    assert state(chromium)["canvasHeight"] > 4000
    for name in ("all", "main", "hot", "work", "cold"):
        assert in_first_view(chromium, one(chromium, name)), name
    assert not in_first_view(chromium, one(chromium, "d299"))


# --- the differential graph ---------------------------------------------------------

def test_diff_colours_growth_red_and_shrinkage_blue(chromium, tmp_path):
    """A: left 300, right 100, gone 50; B: left 100, right 300. Widths from
    B; `right` grew (red), `left` shrank (blue), `gone` has no width until
    the widths come from A, where it shows blue."""
    from selenium.webdriver.support.ui import Select
    before = BRANCHES + [counted("main", "gone", count=50)]
    after = [counted("main", "left", "leaf", count=100), counted("main", "right", "leaf", count=300)]
    open_page(chromium, write(DiffFlameGraphReport(), tmp_path / "diff.html", after, before))
    st = state(chromium)
    assert st["diff"] and st["colours"] == "diff" and st["total"] == 400
    right, left = one(chromium, "right"), one(chromium, "left")
    assert right["width"] / left["width"] == pytest.approx(3, rel=0.01)
    red, blue = rgb(right["colour"]), rgb(left["colour"])
    assert red[0] == 255 and red[1] < 200 and red[1] == red[2]
    assert blue[2] == 255 and blue[0] < 200 and blue[0] == blue[1]
    assert drawn(chromium, "gone") == []
    assert "1 frame only in A, not drawn" in element(chromium, "legend").text
    point_at(chromium, right)
    assert element(chromium, "tooltip").text.splitlines()[1:] == [
        "module: prog (user code)", "A (before): 100 events, 22.22%",
        "B (after): 300 events, 75.00%", "change: +52.78 points of share, +200 events"]
    keep_screenshot(chromium, "flamegraph_diff")
    Select(element(chromium, "widths")).select_by_value("before")
    gone = one(chromium, "gone")
    assert gone["samples"] == 50 and rgb(gone["colour"])[2] == 255
    assert one(chromium, "left")["samples"] == 300
    assert network_requests(chromium) == []


def rgb(colour: str) -> tuple:
    return tuple(int(c) for c in re.findall(r"\d+", colour))


# --- SVG in the browser ---------------------------------------------------------------

def svg_rects(driver) -> dict:
    """{tooltip title: rendered width} of the SVG's frames, as laid out."""
    return driver.execute_script("""
        const out = {};
        for (const g of document.querySelectorAll('g.frame'))
            out[g.querySelector('title').textContent] =
                g.querySelector('rect').getBoundingClientRect().width;
        return out;""")


def test_svg_opens_in_the_browser(chromium, tmp_path):
    open_svg = tmp_path / "fg.svg"
    write(stack_report("svg"), open_svg, BRANCHES)
    chromium.get(f"file://{open_svg}")
    rects = svg_rects(chromium)
    left, right = rects["left (300 events, 75.00%) [prog]"], rects["right (100 events, 25.00%) [prog]"]
    assert left / right == pytest.approx(3, rel=0.01)
    assert rects["all (400 events, 100.00%)"] == pytest.approx(1180, abs=1)
    assert network_requests(chromium) == []
    keep_screenshot(chromium, "flamegraph_svg")


def test_svg_opens_on_its_root(chromium, tmp_path):
    """A deep SVG (flamegraph.pl's orientation, root at the bottom) opens
    scrolled to its root: the root and the widest frames are the first view."""
    deep = ["main", "cold"] + [f"d{i}" for i in range(300)]
    path = write(stack_report("svg"), tmp_path / "deep.svg",
                 [counted("main", "hot", "work", count=90), counted(*deep, count=10)])
    chromium.get(f"file://{path}")
    seen = chromium.execute_script("""
        const inView = {};
        for (const g of document.querySelectorAll('g.frame')) {
            const r = g.querySelector('rect').getBoundingClientRect();
            inView[g.getAttribute('data-name')] = r.top >= 0 && r.bottom <= window.innerHeight;
        }
        return [document.documentElement.getBoundingClientRect().height, inView];""")
    height, in_view = seen
    assert height > 4000
    for name in ("all", "main", "hot", "work", "cold"):
        assert in_view[name], name
    assert not in_view["d299"]


def test_svg_zoom_and_search_as_flamegraph_pl(chromium, tmp_path):
    """Click `right`: it and its callers span the width, `left` is hidden;
    Reset Zoom; Search asks for a regex, paints matches and gives the share."""
    from selenium.webdriver.common.by import By
    path = tmp_path / "fg.svg"
    write(stack_report("svg"), path, BRANCHES)
    chromium.get(f"file://{path}")
    chromium.find_element(By.CSS_SELECTOR, 'g.frame[data-name="right"]').click()
    rects = svg_rects(chromium)
    assert rects["right (100 events, 25.00%) [prog]"] == pytest.approx(1180, abs=1)
    assert rects["main (400 events, 100.00%) [prog]"] == pytest.approx(1180, abs=1)
    assert rects["left (300 events, 75.00%) [prog]"] == 0          # display: none
    chromium.find_element(By.ID, "unzoom").click()
    rects = svg_rects(chromium)
    assert rects["left (300 events, 75.00%) [prog]"] == pytest.approx(885, abs=1)
    chromium.find_element(By.ID, "search").click()
    prompt = chromium.switch_to.alert
    prompt.send_keys("^le")
    prompt.accept()
    assert chromium.find_element(By.ID, "matched").text == "Matched: 100.0%"
    painted = chromium.execute_script(
        "return [...document.querySelectorAll('g.frame')].filter("
        "g => g.querySelector('rect').getAttribute('fill') === arguments[0])"
        ".map(g => g.getAttribute('data-name'))", "rgb(230,0,230)")
    assert painted == ["left", "leaf", "leaf"]
    keep_screenshot(chromium, "flamegraph_svg_search")
    chromium.find_element(By.ID, "search").click()             # Reset Search
    assert chromium.find_element(By.ID, "matched").text == ""


# --- from a real run ------------------------------------------------------------------

@pytest.fixture(scope="module")
def branches():
    return build("branches", flags=FP)


def count_to_file(path, *args):
    """`ustack count -f FORMAT ARGS…` with its stdout in `path` (the
    traced programs print nothing)."""
    with open(path, "w") as out:
        res = run_ustack("count", *args, stdout=out)
    assert res.returncode == 0, res.stderr
    return path


def count_branches(branches, fmt: str, path):
    return count_to_file(path, "-f", fmt, f"uprobe:{branches}:leaf",
                         "-c", f"{branches} 300 100")


def column(driver) -> list:
    """(name, kind) of the leftmost column of frames, root first."""
    return [(f["name"], f["kind"]) for f in sorted(frames(driver), key=lambda f: f["y"])
            if f["x"] == 0]


@pytest.mark.kernel
def test_real_run_html(chromium, branches, tmp_path):
    """`ustack count -f html` of branches: the known chain main -> left ->
    leaf (300) and main -> right -> leaf (100) with the right widths, zoom
    and search work, nothing is fetched."""
    open_page(chromium, count_branches(branches, "html", tmp_path / "branches.html"))
    check_branches(chromium, "branches")
    names = [name for name, _ in column(chromium)]
    assert names[:2] == ["all", "branches"]
    assert names[-3:] == ["main", "left", "leaf"]
    keep_screenshot(chromium, "flamegraph_branches")
    check_zoom(chromium)
    check_search(chromium)
    assert network_requests(chromium) == []


@pytest.mark.kernel
def test_svg_zoom_keeps_every_frame_of_the_clicked_subtree(chromium, tmp_path):
    """Widths that round badly to 0.1 px (the drawn right edge of p1's
    child c7 fell past p1's, and c7 was hidden on a click on p1): clicking any frame shows its whole subtree, children
    and grandchildren alike, and hides every frame outside it but its callers."""
    counts = [33, 60, 28, 33, 54, 59, 43, 13, 20, 19, 38, 57]
    stacks = [counted("main", f"p{i % 3}", f"c{i}", f"g{i}", count=n)
              for i, n in enumerate(counts)]
    path = tmp_path / "odd.svg"
    write(stack_report("svg"), path, stacks)
    chromium.get(f"file://{path}")
    shown = """
        return [...document.querySelectorAll('g.frame')]
            .filter(g => g.style.display !== 'none').map(g => g.getAttribute('data-name'))"""
    subtree = {f"p{p}": [n for i in range(p, len(counts), 3) for n in (f"c{i}", f"g{i}")]
               for p in range(3)}
    subtree.update({f"c{i}": [f"g{i}"] for i in range(len(counts))})
    callers = {f"c{i}": [f"p{i % 3}"] for i in range(len(counts))}
    for clicked, below in subtree.items():
        chromium.execute_script(
            "document.querySelector(`g.frame[data-name=\"${arguments[0]}\"]`)"
            ".dispatchEvent(new MouseEvent('click'))", clicked)
        want = ["all", "prog", "main", clicked] + callers.get(clicked, []) + below
        assert sorted(chromium.execute_script(shown)) == sorted(want), clicked


def test_real_run_svg(chromium, branches, tmp_path):
    path = count_branches(branches, "svg", tmp_path / "branches.svg")
    text = path.read_text()
    assert "<title>leaf (300 events, 75.00%) [branches]</title>" in text
    assert "<title>leaf (100 events, 25.00%) [branches]</title>" in text
    chromium.get(f"file://{path}")
    rects = svg_rects(chromium)
    assert (rects["left (300 events, 75.00%) [branches]"]
            / rects["right (100 events, 25.00%) [branches]"]) == pytest.approx(3, rel=0.01)
    keep_screenshot(chromium, "flamegraph_branches_svg")


@pytest.mark.kernel
def test_real_run_kernel_frames(chromium, tmp_path):
    """`--kernel`: the kernel's frames stand above the `--` separator, in
    the kernel's colour; libc's write below it in the libraries'."""
    chain = build("chain", flags=FP)
    open_page(chromium, count_to_file(tmp_path / "kernel.html", "-f", "html", "--kernel",
                                      "syscall:write", "-c", f"{chain} 100 write"))
    col = column(chromium)
    cut = col.index(("--", "separator"))
    assert col[cut - 1] == ("write", "lib")
    assert one(chromium, "write")["module"] == "libc.so.6"
    assert [kind for _, kind in col[cut + 1:]] == ["kernel"] * (len(col) - cut - 1)
    assert len(col) - cut - 1 >= 2
    assert ("main", "user") in col and one(chromium, "--")["samples"] == 100
    keep_screenshot(chromium, "flamegraph_kernel")


@pytest.mark.kernel
def test_real_run_go_runtime(chromium, tmp_path):
    """A Go program: runtime.* frames are the Go runtime's kind, main.*
    the user's code."""
    gochain = build_go("gochain")
    open_page(chromium, count_to_file(tmp_path / "go.html", "-f", "html",
                                      f"uprobe:{gochain}:main.d", "-c", f"{gochain} 50"))
    assert column(chromium) == [
        ("all", "root"), ("gochain", "process"), ("runtime.goexit.abi0", "go"),
        ("runtime.main", "go"), ("main.main", "user"), ("main.a", "user"),
        ("main.b", "user"), ("main.(*T).c", "user"), ("main.d", "user")]
    assert one(chromium, "main.d")["samples"] == 50


@pytest.mark.kernel
def test_real_runs_diff(chromium, branches, tmp_path):
    """Two runs through the Python API: A calls leaf 300 times via left and
    100 via right, B the other way round; B's widths, right red, left blue."""
    import ustack
    runs = []
    for n, m in ((300, 100), (100, 300)):
        opts = ustack.Options(command="count", events=[f"uprobe:{branches}:leaf"],
                              cmdline=f"{branches} {n} {m}")
        with ustack.Session(opts) as run:
            runs.append(run.counts())
    open_page(chromium, write(DiffFlameGraphReport(), tmp_path / "diff.html", runs[1], runs[0]))
    left, right = one(chromium, "left"), one(chromium, "right")
    assert (left["before"], left["after"], right["before"], right["after"]) == (300, 100, 100, 300)
    assert right["width"] / left["width"] == pytest.approx(3, rel=0.01)
    assert rgb(right["colour"])[0] == 255 and rgb(left["colour"])[2] == 255
    assert rgb(one(chromium, "main")["colour"]) == (235, 235, 235)     # 100% in both
    keep_screenshot(chromium, "flamegraph_branches_diff")
