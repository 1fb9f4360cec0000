"""Containers and whole-machine runs, with a real container
(tests/container.py: podman from an image imported from a rootfs made
here, else unshare + chroot; the runtime used is printed). In it, ct_app:
its binary's path does not exist on the host, its library ct_lib's host
copy at the same path is another build (host_copy_* names), and it names
its JIT code in its own /tmp under its namespace pid. Each test starts the
container before ustack and ends it after, so every stack is named while
its process lives (a live trace does the same)."""
from __future__ import annotations

import os
import select
import signal
import subprocess

import pytest

from container import APP_PATH, Rootfs, Runtime
from helpers import (finish, funcs, parse_counts, parse_trace, start_ustack, stop,
                     wait_tracing)

pytestmark = pytest.mark.kernel

# ct_app's stack at its getppid, innermost first (libc's start-up frames
# below main have no frame pointers: not judged)
CT_STACK = ["raw_getppid", "ct_lib_inner", "ct_lib_entry", "jitted_ct", "app_work", "main"]
CT_MODULES = ["libct.so", "libct.so", "libct.so", "JIT", "ct_app", "ct_app"]
CALLS = 3


@pytest.fixture(scope="module")
def runtime(tmp_path_factory):
    rt = Runtime(Rootfs(tmp_path_factory.mktemp("ct")))
    print(f"container runtime used: {rt.name}")
    yield rt
    rt.close()


def _run(runtime, *args, containers=1):
    """Start `containers` ct_apps, then ustack ARGS… (a count: '{pid}' and
    '{pid2}' in ARGS are the first and last container's host pids), let
    each make its CALLS calls, stop ustack, end the containers. Returns
    (stdout, stderr, ustack pid, the containers)."""
    cts = [runtime.start(CALLS) for _ in range(containers)]
    try:
        argv = [a.format(pid=cts[0].host_pid, pid2=cts[-1].host_pid) for a in args]
        us = start_ustack(*argv, stdout=subprocess.PIPE)
        try:
            wait_tracing(us)
            for ct in cts:
                ct.go()
            us.send_signal(signal.SIGINT)
            out, err = finish(us)
        finally:
            stop(us)
    finally:
        for ct in cts:
            ct.finish()
    assert us.returncode == 0, err
    return out, err, us.pid, cts


def _wait_until_seen(us) -> None:
    """Until a trace has printed the container's CALLS events (kept in
    us.seen), so that they are named while the container lives; a count
    needs no wait: its rings are drained at its end."""
    buf = b""
    fd = us.stdout.fileno()
    os.set_blocking(fd, False)
    deadline_polls = 600
    while buf.count(b"ct_lib_entry") < CALLS and deadline_polls:
        select.select([fd], [], [], 0.1)
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
            chunk = b""
        buf += chunk
        deadline_polls -= 1
    os.set_blocking(fd, True)
    us.seen = buf.decode()


def _ct_events(out: str, host_pid: int) -> list:
    return [e for e in parse_trace(out) if e["pid"] == host_pid]


def _assert_ct_trace(out: str, ct) -> None:
    events = _ct_events(out, ct.host_pid)
    assert len(events) == CALLS, out
    for e in events:
        assert e["comm"] == "ct_app" and e["nspid"] == ct.ns_pid, e
        assert funcs(e["frames"])[:6] == CT_STACK, out
        assert [f["module"] for f in e["frames"][:6]] == CT_MODULES, out


def _trace(runtime, *args):
    """`ustack trace ARGS…` ('{pid}': the container's host pid) while one
    ct_app makes its calls: (output, ustack pid, the container)."""
    ct = runtime.start(CALLS)
    try:
        argv = [a.format(pid=ct.host_pid) for a in args]
        us = start_ustack(*argv, stdout=subprocess.PIPE)
        try:
            wait_tracing(us)
            ct.go()
            _wait_until_seen(us)
            us.send_signal(signal.SIGINT)
            out, err = finish(us)
        finally:
            stop(us)
    finally:
        ct.finish()
    assert us.returncode == 0, err
    return us.seen + out, us.pid, ct


def test_pid_in_container_named_from_its_own_files(runtime):
    """-p HOSTPID: the binary absent on the host, the library whose host
    copy differs, the JIT map in the container's /tmp under its own pid:
    all named; the header shows both pids."""
    out, _uspid, ct = _trace(runtime, "trace", "syscall:getppid", "-p", "{pid}")
    _assert_ct_trace(out, ct)
    assert "host_copy" not in out
    if ct.ns_pid != ct.host_pid:
        assert f"ct_app {ct.host_pid}/{ct.host_pid} [ns {ct.ns_pid}/{ct.ns_pid}]" in out


def test_system_wide_trace_names_container_stacks(runtime):
    """No -p: the container's process (started before the run) is named
    from the files it maps, and ustack's own pid has no event."""
    out, uspid, ct = _trace(runtime, "trace", "syscall:getppid", "--backend", "perf")
    _assert_ct_trace(out, ct)
    assert "host_copy" not in out
    assert not [e for e in parse_trace(out) if e["pid"] == uspid]


def test_system_wide_trace_unwound_in_the_kernel(runtime):
    """The default system-wide trace walks DWARF in the kernel: the
    container's objects (on podman's overlayfs, whose files the kernel
    knows by their layer's device) have their tables, and the JIT code,
    which has none, is walked through on its frame pointer, as the copy
    path does: the same whole stack, named from the container's files."""
    out, uspid, ct = _trace(runtime, "trace", "syscall:getppid")
    _assert_ct_trace(out, ct)
    for e in _ct_events(out, ct.host_pid):
        assert funcs(e["frames"])[-3:] == ["__libc_start_call_main", "__libc_start_main",
                                           "_start"], out
        assert e["notes"] == ["frame pointer used for code without a file (JIT?)"], out
    assert not [e for e in parse_trace(out) if e["pid"] == uspid]


def test_uprobe_on_container_path_with_container_pid(runtime):
    """uprobe:PATH:FUNC with PATH as the container sees it (absent on the
    host), resolved in --container-pid's root, system-wide: counted and
    named, with the pid both ways under -P."""
    out, _err, _uspid, (ct,) = _run(
        runtime, "count", "-P", f"uprobe:{APP_PATH}:app_work", "--container-pid", "{pid}")
    mine = [s for s in parse_counts(out) if s["pid"] == ct.host_pid]
    assert len(mine) == 1, out
    assert mine[0]["count"] == CALLS and mine[0]["comm"] == "ct_app"
    assert mine[0]["nspid"] == ct.ns_pid, out
    assert funcs(mine[0]["frames"])[:2] == ["app_work", "main"], out


def test_library_probe_hits_every_container_and_only_the_filtered(runtime):
    """A probe on the image's library hits each process that maps that
    file; -p keeps one of them, -p A,B both; the host's copy of the library
    (another file) is not probed."""
    lib = runtime.rootfs.lib_path
    out, _err, _uspid, cts = _run(runtime, "count", "-P", f"uprobe:{lib}:ct_lib_inner",
                                  "--container-pid", "{pid}", containers=2)
    by_pid = {s["pid"]: s for s in parse_counts(out)}
    for ct in cts:
        assert by_pid[ct.host_pid]["count"] == CALLS, out
        assert funcs(by_pid[ct.host_pid]["frames"])[:5] == CT_STACK[1:], out
    out, _err, _uspid, cts = _run(runtime, "count", "-P", f"uprobe:{lib}:ct_lib_inner",
                                  "-p", "{pid}", containers=2)
    assert [(s["pid"], s["count"]) for s in parse_counts(out)] == [(cts[0].host_pid, CALLS)]
    out, _err, _uspid, cts = _run(runtime, "count", "-P", f"uprobe:{lib}:ct_lib_inner",
                                  "-p", "{pid},{pid2}", "--container-pid", "{pid}",
                                  containers=2)
    assert sorted((s["pid"], s["count"]) for s in parse_counts(out)) == sorted(
        (ct.host_pid, CALLS) for ct in cts), out


def test_comm_and_tid_filters(runtime):
    """--comm and --tid keep only their threads' events, system-wide."""
    out, _err, _uspid, (ct,) = _run(runtime, "count", "-P", "syscall:getppid",
                                    "--backend", "perf", "--comm", "ct_app")
    assert {s["comm"] for s in parse_counts(out)} == {"ct_app"}, out
    assert sum(s["count"] for s in parse_counts(out) if s["pid"] == ct.host_pid) == CALLS
    out, _err, _uspid, (ct,) = _run(runtime, "count", "-T", "syscall:getppid",
                                    "--backend", "perf", "--tid", "{pid}")
    rows = parse_counts(out)
    assert [(s["pid"], s["tid"], s["count"]) for s in rows] == [
        (ct.host_pid, ct.host_pid, CALLS)], out


@pytest.fixture(scope="module")
def bait(tmp_path_factory):
    """A host directory holding a perf map that names every address
    BAIT_FROM_HOST: what a reader following the container's /tmp link
    out of its root would read."""
    d = tmp_path_factory.mktemp("bait")
    for ns_pid in range(1, 4):
        (d / f"perf-{ns_pid}.map").write_text("0 7fffffffffff BAIT_FROM_HOST\n")
    return d


def test_symlink_out_of_the_root_is_not_followed(tmp_path, bait):
    """The container's /tmp is a symlink to a host path: resolved in the
    container's root it leads nowhere, so the JIT frame stays unnamed and
    the host's file is never read."""
    rt = Runtime(Rootfs(tmp_path, tmp_link=str(bait)))
    try:
        print(f"container runtime used: {rt.name}")
        out, _uspid, ct = _trace(rt, "trace", "syscall:getppid", "-p", "{pid}")
    finally:
        rt.close()
    assert "BAIT_FROM_HOST" not in out
    events = _ct_events(out, ct.host_pid)
    assert len(events) == CALLS, out
    for e in events:
        assert funcs(e["frames"])[:6] == CT_STACK[:3] + ["[unknown]"] + CT_STACK[4:], out
