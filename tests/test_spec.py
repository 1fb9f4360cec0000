"""parse_event: bpftrace spellings -> ProbeSpec, and its error messages."""
import pytest

from ustack.model import ProbeSpec, UstackError
from ustack.probes.spec import parse_event

EXPECTED = "expected e.g. syscall:write, uprobe:/bin/ls:main, profile:hz:99"


@pytest.mark.parametrize("text, fields", [
    ("syscall:write", dict(kind="syscall", group="syscalls", name="write")),
    ("syscall:*", dict(kind="syscall", group="syscalls", name="*")),
    ("syscall:read*", dict(kind="syscall", group="syscalls", name="read*")),
    ("  syscall:write\n", dict(kind="syscall", group="syscalls", name="write")),
    ("tracepoint:syscalls:sys_enter_write",
     dict(kind="tracepoint", group="syscalls", name="sys_enter_write")),
    ("t:sched:sched_switch", dict(kind="tracepoint", group="sched", name="sched_switch")),
    ("tracepoint:sched:sched_*", dict(kind="tracepoint", group="sched", name="sched_*")),
    ("uprobe:/bin/ls:main", dict(kind="uprobe", path="/bin/ls", function="main")),
    ("u:libc:malloc", dict(kind="uprobe", path="libc", function="malloc")),
    ("uprobe:/bin/x:f+0x1a", dict(kind="uprobe", path="/bin/x", function="f", offset=0x1a)),
    ("uprobe:/bin/x:f+12", dict(kind="uprobe", path="/bin/x", function="f", offset=12)),
    ("uprobe:/bin/x:0x4011a0", dict(kind="uprobe", path="/bin/x", address=0x4011a0)),
    ("uprobe:/bin/x:0x1000+4", dict(kind="uprobe", path="/bin/x", address=0x1004)),
    ("uretprobe:/bin/x:f", dict(kind="uretprobe", path="/bin/x", function="f")),
    ("ur:/bin/x:f*", dict(kind="uretprobe", path="/bin/x", function="f*")),
    # C++: PATH ends at the first ':', the function keeps its '::'
    ("uprobe:/opt/app:ns::Klass::run+0x8",
     dict(kind="uprobe", path="/opt/app", function="ns::Klass::run", offset=8)),
    # '+' that is not followed by a number belongs to the name
    ("uprobe:/opt/app:ns::operator+", dict(kind="uprobe", path="/opt/app", function="ns::operator+")),
    ("uprobe:/opt/app:operator++", dict(kind="uprobe", path="/opt/app", function="operator++")),
    ("uprobe:/opt/app:a+b+0x10", dict(kind="uprobe", path="/opt/app", function="a+b", offset=16)),
    # Go names
    ("uprobe:/go/bin:main.(*T).Method",
     dict(kind="uprobe", path="/go/bin", function="main.(*T).Method")),
    ("uprobe:/go/bin:net/http.(*conn).serve+0x20",
     dict(kind="uprobe", path="/go/bin", function="net/http.(*conn).serve", offset=0x20)),
    ("profile:hz:99", dict(kind="profile", hz=99)),
    ("profile:997", dict(kind="profile", hz=997)),
])
def test_parse(text, fields):
    spec = parse_event(text)
    assert spec == ProbeSpec(text=text.strip(), **fields)


@pytest.mark.parametrize("text, why", [
    ("", "no probe type"),
    ("write", "no probe type"),
    ("kprobe:do_sys_open", "unknown probe type 'kprobe'"),
    ("syscall:", "missing or invalid syscall name"),
    ("syscall:a:b", "missing or invalid syscall name"),
    ("syscall:wr ite", "missing or invalid syscall name"),
    ("tracepoint:sched", "need GROUP:NAME after the probe type"),
    ("tracepoint:sched:", "need GROUP:NAME after the probe type"),
    ("tracepoint:a:b:c", "need GROUP:NAME after the probe type"),
    ("uprobe:/bin/ls", "need uprobe:PATH:FUNCTION"),
    ("uprobe:/bin/ls:", "need uprobe:PATH:FUNCTION"),
    ("uprobe::main", "need uprobe:PATH:FUNCTION"),
    ("uretprobe:/bin/ls", "need uretprobe:PATH:FUNCTION"),
    ("uprobe:/bin/ls:+4", "missing function name before '+'"),
    ("uretprobe:/bin/ls:main+4", "a uretprobe takes no +OFFSET"),
    ("profile:hz:0", "the frequency must be a positive number of Hz"),
    ("profile:hz:-5", "the frequency must be a positive number of Hz"),
    ("profile:hz:", "the frequency must be a positive number of Hz"),
    ("profile:hz:fast", "the frequency must be a positive number of Hz"),
    ("profile:", "the frequency must be a positive number of Hz"),
    ("profile:ms:10", "unknown profile unit 'ms' (only hz)"),
])
def test_malformed(text, why):
    with pytest.raises(UstackError) as e:
        parse_event(text)
    assert str(e.value) == f"malformed event '{text.strip()}': {why}; {EXPECTED}"


# --- fetch-args ------------------------------------------------------------------

def test_fetch_args_parsed():
    s = parse_event("uprobe:/bin/x:f %di %si:u32 +0(%si):string $stack0 $comm len=%si:u64")
    assert s.function == "f" and s.path == "/bin/x"
    assert s.args == (("arg1", "%di", ""), ("arg2", "%si", "u32"),
                      ("arg3", "+0(%si)", "string"), ("arg4", "$stack0", ""),
                      ("comm", "$comm", ""), ("len", "%si", "u64"))
    assert parse_event("uretprobe:/bin/x:f $retval").args == (("retval", "$retval", ""),)


def test_fetch_args_go_and_c_registers():
    from ustack.probes.fetchargs import kernel_fetch_args
    args = parse_event("uprobe:/bin/x:f $arg1 n=+8($arg2):u32").args
    assert kernel_fetch_args(args, True, "e") == ("arg1=%ax", "n=+8(%bx):u32")
    assert kernel_fetch_args(args, False, "e") == ("arg1=%di", "n=+8(%si):u32")


@pytest.mark.parametrize("text, why", [
    ("uprobe:/bin/x:f %di:u7", "unknown type 'u7' (u8…u64, s8…s64, x8…x64, string, "
                               "char, TYPE[N], bN@O/S)"),
    ("uprobe:/bin/x:f 1x=%di", "'1x' is not a valid argument name"),
    ("uprobe:/bin/x:f a=%di a=%si", "the name 'a' is used twice"),
    ("uprobe:/bin/x:f ustk_ip=%ip", "the name 'ustk_ip' is reserved"),
    ("uprobe:/bin/x:f $arg10", "$arg10: arguments are $arg1…$arg9"),
])
def test_fetch_args_errors(text, why):
    with pytest.raises(UstackError) as e:
        parse_event(text)
    word = text.split()[-1]
    assert str(e.value) == f"bad fetch-arg '{word}' in '{text}': {why}"
