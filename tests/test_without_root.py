"""ustack run by a user without root: `profile -c` and `profile -p` of the
user's own processes give complete stacks (DWARF on copied stacks, through
frame-pointer-less code) exactly as the root runs do; `record`/`report`,
`list` and `dump -p` work too; what needs root is refused in one line that
names what is missing, before anything runs; the run writes nothing
outside the user's own directories (its cache is theirs).

The user is made for this module (useradd) and removed after; ustack runs
as that user through setpriv, with HOME and XDG_CACHE_HOME in a directory
of theirs. perf_event_paranoid is set to 2 where it is higher (Debian's 3
forbids users any perf event) and put back after."""
from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from helpers import (O2_NOFP, build, fail_one_line, gdb_backtrace, ok, parse_counts,
                     popen_ustack, program_frames, run_ustack, ustack_env, wait_until)

PARANOID = Path("/proc/sys/kernel/perf_event_paranoid")
# where a user may write besides their home (the world-writable directories)
SHARED_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run")
INSTEAD = "without root, ustack profiles your own processes (profile -p PID or -c CMD)"
LIBC_START = [("__libc_start_call_main", "libc.so.6"), ("__libc_start_main", "libc.so.6")]

pytestmark = pytest.mark.kernel


class User:
    def __init__(self, name: str):
        pw = pwd.getpwnam(name)
        self.name, self.uid, self.gid = name, pw.pw_uid, pw.pw_gid
        self.home = ""

    def command(self, *argv) -> list:
        """argv run as this user: no supplementary groups, no capabilities."""
        return ["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}",
                "--clear-groups", *map(str, argv)]

    def env(self) -> dict:
        env = dict(ustack_env(), HOME=self.home, XDG_CACHE_HOME=f"{self.home}/.cache")
        env.pop("USTACK_CACHE_DIR", None)
        return env

    def ustack(self, *args, **kw) -> subprocess.CompletedProcess:
        return run_ustack(*args, cmd=self.command(sys.executable, "-m", "ustack"),
                          env=self.env(), cwd=self.home, **kw)

    def popen_ustack(self, *args, **kw) -> subprocess.Popen:
        return popen_ustack(*args, cmd=self.command(sys.executable, "-m", "ustack"),
                            env=self.env(), cwd=self.home, text=True, **kw)

    def written_outside_home(self) -> list:
        """Files and directories of this user's outside their home."""
        res = subprocess.run(["find", *SHARED_DIRS, "-xdev", "-user", str(self.uid)],
                             capture_output=True, text=True)
        return [p for p in res.stdout.splitlines()
                if p != self.home and not p.startswith(self.home + "/")]


@pytest.fixture(scope="module")
def paranoid_2():
    """perf_event_paranoid at 2 at most (what lets a user sample their own
    processes), as it was afterwards."""
    old = PARANOID.read_text()
    if int(old) > 2:
        PARANOID.write_text("2")
    try:
        yield
    finally:
        PARANOID.write_text(old)


@pytest.fixture(scope="module")
def account(paranoid_2):
    for tool in ("useradd", "userdel", "setpriv", "find"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed (needed to run ustack as another user)")
    name = f"ustack-t{os.getpid()}"
    made = subprocess.run(["useradd", "--system", "--no-create-home", "--home-dir",
                           "/nonexistent", "--shell", "/usr/sbin/nologin", name],
                          capture_output=True, text=True)
    assert made.returncode == 0, f"useradd failed: {made.stderr}"
    try:
        yield User(name)
    finally:
        subprocess.run(["userdel", name], capture_output=True)


@pytest.fixture
def user(account):
    """The user, with a fresh home of theirs (0700) for this test; the test
    checks at its end that they wrote nothing anywhere else."""
    home = tempfile.mkdtemp(prefix="ustack-home-", dir="/tmp")
    os.chown(home, account.uid, account.gid)
    account.home = home
    check = account.ustack("--version")
    assert check.returncode == 0, ("the user cannot run ustack: the checkout, its "
                                   f"venv and {sys.executable} must be readable by "
                                   f"others\n{check.stderr}")
    try:
        yield account
    finally:
        shutil.rmtree(home, ignore_errors=True)


def counts(res) -> list:
    """parse_counts with each stack's `(…)` note lines apart (`notes`)."""
    stacks = parse_counts(res.stdout)
    for s in stacks:
        s["notes"] = [f for f, m in s["frames"] if m is None and f.startswith("(")]
        s["frames"] = [fr for fr in s["frames"] if fr[0] not in s["notes"]]
    return stacks


def assert_unprivileged_header(res, user) -> None:
    first = res.stderr.splitlines()[0]
    assert first.endswith("[backend perf, unwind dwarf; without root: user space only, "
                          f"cache {user.home}/.cache/ustack]... Hit Ctrl-C to end."), first
    assert "Lost" not in res.stderr, res.stderr


def busy_stack(busy: Path) -> list:
    return [("spin_here", busy.name), ("work", busy.name), ("main", busy.name),
            *LIBC_START, ("_start", busy.name)]


def assert_busy_profile(res, busy: Path) -> None:
    """The stacks of `busy` at 999 Hz without frame pointers, as the root
    runs (test_e2e_dwarf) give them: spin_here's whole chain to _start."""
    want = gdb_backtrace(busy, [0.1], "spin_here")
    assert want[:3] == ["spin_here", "work", "main"], want
    stacks = counts(res)
    total = sum(s["count"] for s in stacks)
    assert total >= 300, f"{total} samples in 1 s at 999 Hz\n{res.stdout}"
    top = stacks[-1]
    assert top["frames"] == busy_stack(busy), res.stdout
    assert top["notes"] == [] and top["count"] >= 0.9 * total, res.stdout
    for s in stacks:                       # in spin_here: always the whole chain
        if ("spin_here", busy.name) in s["frames"]:
            names = [f for f, _m in s["frames"]]
            assert s["frames"][names.index("spin_here"):] == busy_stack(busy), s
            assert s["notes"] == [], s


@pytest.fixture(scope="module")
def busy() -> Path:
    return build("busy", flags=O2_NOFP)


# --- what works without root --------------------------------------------------------

def test_profile_command(user, busy):
    res = ok(user.ustack("profile", "-F", "999", "-c", f"{busy} 1"))
    assert_unprivileged_header(res, user)
    assert_busy_profile(res, busy)
    # the cache of symbols and unwind tables is the user's
    cached = list(Path(user.home, ".cache", "ustack").rglob("*"))
    assert any(p.is_file() for p in cached)
    assert all(p.stat().st_uid == user.uid for p in cached)
    assert user.written_outside_home() == []


def test_profile_frameless_chain(user):
    """main -> a -> b -> c -> d at -O2 without frame pointers: every sample
    in the chain is unwound whole, down to _start."""
    chain = build("chain", flags=O2_NOFP)
    assert gdb_backtrace(chain, [1], "d") == ["d", "c", "b", "a", "main"]
    res = ok(user.ustack("profile", "-F", "999", "-c", f"{chain} 200000000"))
    assert_unprivileged_header(res, user)
    below = [("main", chain.name), *LIBC_START, ("_start", chain.name)]
    whole = {name: [(f, chain.name) for f in "dcba"[i:]] + below
             for i, name in enumerate("dcba")}
    seen: dict = {}
    for s in counts(res):
        names = [f for f, _m in s["frames"]]
        if ("main", chain.name) not in s["frames"]:
            continue                     # start-up or exit, outside the chain
        leaf = program_frames(names, [m for _f, m in s["frames"]])[0]
        assert s["frames"] == whole[leaf], s
        assert s["notes"] == [], s
        seen[leaf] = seen.get(leaf, 0) + s["count"]
    total = sum(seen.values())
    assert seen.get("d", 0) + seen.get("c", 0) >= 0.9 * total and seen.get("d"), res.stdout
    assert user.written_outside_home() == []


def test_profile_own_process(user, busy):
    """-p of a process the user started: released once ustack says it is
    sampling, so every sample is of its work."""
    target = subprocess.Popen(user.command(busy, 1, "-"), stdin=subprocess.PIPE)
    try:
        run = user.popen_ustack("profile", "-F", "999", "-p", target.pid,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        header = run.stderr.readline()
        target.stdin.write(b"go\n")
        target.stdin.close()
        out, err = run.communicate(timeout=60)
    finally:
        if target.poll() is None:
            target.kill()
        target.wait()
    res = ok(subprocess.CompletedProcess(run.args, run.returncode, out, header + err))
    assert header.startswith(f"Tracing profile:hz:999 in PID {target.pid} "), header
    assert target.returncode == 0
    assert_unprivileged_header(res, user)
    assert_busy_profile(res, busy)
    assert user.written_outside_home() == []


def test_record_then_report(user, busy):
    data = f"{user.home}/run.data"
    rec = ok(user.ustack("record", "-o", data, "-F", "999", "-c", f"{busy} 1"))
    assert_unprivileged_header(rec, user)
    assert Path(data).stat().st_uid == user.uid
    res = user.ustack("report", data)
    assert res.returncode == 0 and res.stderr == "", res.stderr
    assert_busy_profile(res, busy)
    assert user.written_outside_home() == []


def test_list_and_dump(user, busy):
    listed = user.ustack("list", busy, "spin*")
    assert listed.returncode == 0, listed.stderr
    assert [line.split()[-1] for line in listed.stdout.splitlines()] == \
        ["FUNCTION", "spin_here"]
    parked = build("parked")
    target = subprocess.Popen(user.command(parked), stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: _all_in_read(target.pid), what="parked's threads in read(2)")
        res = user.ustack("dump", "-p", target.pid)
        out, _ = target.communicate("x\n", timeout=60)
    finally:
        if target.poll() is None:
            target.kill()
        target.wait()
    assert res.returncode == 0, res.stderr
    threads = [[line.split(" : ")[1].split("+0x")[0] for line in block.splitlines()[1:]]
               for block in res.stdout.strip().split("\n\n")]
    assert sorted(threads) == sorted([
        ["read", "main_inner", "main_outer", "main", "__libc_start_call_main",
         "__libc_start_main", "_start"],
        ["read", "side_inner", "side_outer", "side_start", "start_thread", "clone3"]]), \
        res.stdout
    assert target.returncode == 0 and out == "side 1\nmain 1\n", out
    assert user.written_outside_home() == []


def _all_in_read(pid: int) -> bool:
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
        return len(tasks) == 2 and all(
            Path(f"/proc/{pid}/task/{t}/syscall").read_text().split()[0] == "0"
            for t in tasks)
    except OSError:
        return False


# --- what needs root -------------------------------------------------------------------

REFUSED = {
    "uprobe": (["trace", "uprobe:{busy}:work"],
               "uprobes need root (CAP_SYS_ADMIN): uprobe:{busy}:work; " + INSTEAD),
    "usdt": (["trace", "usdt:{busy}:p:n"],
             "USDT probes need root (CAP_SYS_ADMIN): usdt:{busy}:p:n; " + INSTEAD),
    "syscall": (["count", "syscall:write"],
                "syscall events need root (CAP_SYS_ADMIN): syscall:write; " + INSTEAD),
    "tracepoint": (["trace", "tracepoint:sched:sched_switch"],
                   "tracepoints need root (CAP_SYS_ADMIN): tracepoint:sched:sched_switch; "
                   + INSTEAD),
    "bpf": (["profile", "--backend", "bpf"],
            "--backend bpf needs root (CAP_SYS_ADMIN); " + INSTEAD
            + ", on the perf backend (--backend auto or perf)"),
    "tracefs": (["count", "--backend", "tracefs", "profile:hz:99"],
                "--backend tracefs needs root (CAP_SYS_ADMIN); " + INSTEAD
                + ", on the perf backend (--backend auto or perf)"),
    "kernel": (["profile", "--kernel"],
               "--kernel needs root (CAP_SYS_ADMIN): kernel stacks are root's to see; "
               + INSTEAD),
    "offcpu": (["offcpu"], "offcpu needs root (CAP_SYS_ADMIN): it counts in the kernel "
               "with BPF on scheduler tracepoints; " + INSTEAD),
    "memleak": (["memleak"], "memleak needs root (CAP_SYS_ADMIN): it counts in the "
                "kernel with BPF on uprobes; " + INSTEAD),
    "latency": (["latency", "uprobe:{busy}:work"], "latency needs root (CAP_SYS_ADMIN): "
                "it counts in the kernel with BPF on uprobes; " + INSTEAD),
    "funccount": (["funccount", "{busy}:work"], "funccount needs root (CAP_SYS_ADMIN): "
                  "it counts in the kernel with BPF on uprobes; " + INSTEAD),
}


@pytest.mark.parametrize("what", REFUSED)
def test_refused_before_the_command_runs(user, busy, what):
    args, message = REFUSED[what]
    ran = Path(user.home, "ran")
    res = user.ustack(*(a.format(busy=busy) for a in args), "-c", f"touch {ran}")
    assert fail_one_line(res) == "ustack: " + message.format(busy=busy)
    assert not ran.exists()
    assert user.written_outside_home() == []


def test_buffer_larger_than_a_user_may_lock_refused(user):
    """The held command never runs: ustack gives up before its exec."""
    ran = Path(user.home, "ran")
    msg = fail_one_line(user.ustack("profile", "--buffer-pages", "1048576",
                                    "-c", f"touch {ran}"))
    assert msg.startswith("ustack: --buffer-pages 1048576 is more than a user without "
                          "root may lock here ("), msg
    assert msg.endswith(" per CPU: perf_event_mlock_kb and ulimit -l); take that or "
                        "less"), msg
    assert not ran.exists()
    assert user.written_outside_home() == []


def test_other_users_process_refused(user):
    assert fail_one_line(user.ustack("profile", "-p", "1")) == (
        "ustack: PID 1 belongs to another user: sampling it needs root (CAP_SYS_ADMIN); "
        "without root, ustack profiles your own processes")
    assert fail_one_line(user.ustack("dump", "-p", "1")) == (
        "ustack: PID 1 belongs to another user: dumping it needs root (CAP_SYS_ADMIN); "
        "without root, ustack dumps your own processes")


def test_every_process_refused(user):
    assert fail_one_line(user.ustack("profile", "-d", "1")) == (
        f"ustack: tracing every process needs root (CAP_SYS_ADMIN); {INSTEAD}")
    assert fail_one_line(user.ustack("profile", "-d", "1", "-p", f"{os.getpid()},1")) == (
        "ustack: -p with several PIDs traces every process and keeps theirs, which "
        f"needs root (CAP_SYS_ADMIN); {INSTEAD}, one PID at a time")


@pytest.fixture
def paranoid_3(paranoid_2):
    old = PARANOID.read_text()
    PARANOID.write_text("3")
    try:
        yield
    finally:
        PARANOID.write_text(old)


def test_paranoid_3_refused(user, paranoid_3):
    ran = Path(user.home, "ran")
    assert fail_one_line(user.ustack("profile", "-c", f"touch {ran}")) == (
        "ustack: perf_event_paranoid is 3: only root may sample processes here; set it "
        "to 2 or run as root (sysctl kernel.perf_event_paranoid=2)")
    assert not ran.exists()
