"""`ustack top`'s table from known stacks: what a row counts (self, total
once per sample however deep the recursion, an interpreter's frames), and
the text it is drawn as."""
from __future__ import annotations

from ustack.model import Frame, Stack, StackCount
from ustack.report.top import FunctionTable, format_header, format_rows


def counted(n: int, *frames: Frame) -> StackCount:
    return StackCount("prog", 7, Stack(tuple(frames)), n, "profile:hz:99")


def native(name: str, module: str = "prog") -> Frame:
    return Frame(0x1000, module, name)


def python(name: str, line: int = 3) -> Frame:
    return Frame(0, "app.py", name, file="/srv/app.py", line=line, kind="python")


def test_recursion_counts_once_and_self_goes_to_the_leaf():
    table = FunctionTable()
    table.refresh([counted(10, native("f"), native("f"), native("f"), native("main")),
                   counted(5, native("g"), native("main"), native("_start"))])
    assert format_rows(table, "self", None, None) == [
        "    PID COMMAND          %SELF %TOTAL     SELF    TOTAL  FUNCTION",
        "      7 prog             66.7%  66.7%       10       10  f [prog]",
        "      7 prog             33.3%  33.3%        5        5  g [prog]",
        "      7 prog              0.0% 100.0%        0       15  main [prog]",
        "      7 prog              0.0%  33.3%        0        5  _start [prog]",
    ]
    # equal totals: the caller (_start, no self samples) above its callee g
    assert [r[0][3] for r in table.rows("total")] == ["main", "f", "_start", "g"]


def test_a_python_stack_gives_its_self_time_to_the_innermost_python_function():
    """The interpreter's C frames below a Python frame are its work (as
    py-spy top counts it); lines of one function make one row."""
    table = FunctionTable()
    table.refresh([
        counted(8, native("long_add", "python3.11"), native("_PyEval_EvalFrameDefault",
                "python3.11"), python("leaf", 3), python("main", 9), native("main", "python3.11")),
        counted(2, python("leaf", 4), python("main", 9), native("main", "python3.11"))])
    rows = format_rows(table, "self", 3, None)
    assert [row[24:] for row in rows[1:]] == [
        "100.0% 100.0%       10       10  leaf (app.py) [python]",
        "  0.0% 100.0%        0       10  main (app.py) [python]",
        "  0.0% 100.0%        0       10  main [python3.11]",
    ]


def test_percentages_are_the_last_refresh_and_counts_the_run():
    table = FunctionTable()
    table.refresh([counted(30, native("f"))])
    table.refresh([counted(1, native("f")), counted(3, native("g"))])
    assert format_rows(table, "self", None, 80) == [
        "    PID COMMAND          %SELF %TOTAL     SELF    TOTAL  FUNCTION",
        "      7 prog             75.0%  75.0%        3        3  g [prog]",
        "      7 prog             25.0%  25.0%       31       31  f [prog]",
    ]
    assert format_header("PID 7", table, 2, "bpf", 2.4, "self") == [
        "ustack top: PID 7", "samples 4 (total 34), lost 2; backend bpf; 2 s; sorted by self"]
    table.refresh([])
    assert format_rows(table, "self", 1, None)[1][24:] == "     -      -       31       31  f [prog]"


def test_each_process_has_its_rows():
    """Two pythons running the same function: a row each, named by PID and
    command, so which one is hot is seen."""
    table = FunctionTable()
    table.refresh([StackCount("python3", 11, Stack((python("spin"),)), 9, "profile:hz:99"),
                   StackCount("gunicorn", 12, Stack((python("spin"),)), 1, "profile:hz:99")])
    assert format_rows(table, "self", None, None)[1:] == [
        "     11 python3          90.0%  90.0%        9        9  spin (app.py) [python]",
        "     12 gunicorn         10.0%  10.0%        1        1  spin (app.py) [python]",
    ]


def test_sorts_by_function_and_by_pid():
    table = FunctionTable()
    table.refresh([StackCount("b", 20, Stack((native("zeta"), native("main"))), 5, "e"),
                   StackCount("a", 10, Stack((native("alpha"), native("main"))), 1, "e")])
    assert [(r[0][0], r[0][3]) for r in table.rows("function")] == [
        (10, "alpha"), (10, "main"), (20, "main"), (20, "zeta")]
    assert [(r[0][0], r[0][3]) for r in table.rows("pid")] == [
        (10, "alpha"), (10, "main"), (20, "zeta"), (20, "main")]   # each pid's hottest first


def test_a_narrow_terminal_keeps_the_function():
    """Columns go, the function stays: at 40 columns PID, %SELF and the
    function; at 30, %SELF and the function."""
    table = FunctionTable()
    table.refresh([counted(3, native("handle_request"), native("main"))])
    assert format_rows(table, "self", None, 40) == [
        "    PID  %SELF  FUNCTION",
        "      7 100.0%  handle_request [prog]",
        "      7   0.0%  main [prog]",
    ]
    assert format_rows(table, "self", 1, 30)[1] == "100.0%  handle_request [prog]"
