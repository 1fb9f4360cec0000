"""A real container for the tests: a rootfs made here (ct_app, its library
ct_lib and the C runtime it needs), run by podman from an image imported
from that rootfs (no registry), or, where podman cannot run, by
`unshare --pid --mount --fork` + chroot into it. `RUNTIME` says which.

The rootfs holds what the host does not: the program at /opt/ustack-ct/
(absent on the host), and ct_lib at the same path as a different host copy
(other names, another build-id)."""
from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
import uuid
from pathlib import Path

import pytest

from helpers import PROGRAMS, _tool

APP_PATH = "/opt/ustack-ct/bin/ct_app"     # inside the container only
LIB_NAME = "libct.so"
IMAGE = "localhost/ustack-test-ct"
# Debian's podman: crun refuses this VM's hybrid cgroups and the default
# rlimits; runc with explicit limits runs
PODMAN = ["podman", "--runtime", "runc"]
PODMAN_RUN = ["run", "--rm", "-i", "--network", "none",
              "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=4096:4096"]


def _gcc(*args) -> None:
    subprocess.run([_tool("gcc"), "-O0", "-g", "-fno-omit-frame-pointer", *map(str, args)],
                   check=True, capture_output=True)


def _copy_runtime(root: Path) -> None:
    """The C runtime ct_app links: libc and the dynamic linker, as files."""
    for path in ("/lib/x86_64-linux-gnu/libc.so.6", "/lib64/ld-linux-x86-64.so.2"):
        dest = root / path.lstrip("/")
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(os.path.realpath(path), dest)
        dest.chmod(0o755)


class Rootfs:
    """`lib_path`: ct_lib's path, the same inside and on the host (the
    host's copy differs; under /var/tmp, so that /tmp may be a link).
    `tmp_link`: make the container's /tmp a symlink to this absolute path
    (which, followed from the host, is the host's). close() removes the
    host's copy."""

    def __init__(self, base: Path, tmp_link: str = ""):
        self.root = base / "rootfs"
        self.host_lib = Path(f"/var/tmp/ustack-ct-{uuid.uuid4().hex[:12]}") / LIB_NAME
        self.lib_path = str(self.host_lib)
        inner_lib = self.root / self.lib_path.lstrip("/")
        inner_lib.parent.mkdir(parents=True)
        self.host_lib.parent.mkdir(parents=True)
        _gcc("-shared", "-fPIC", "-o", inner_lib, PROGRAMS / "ct_lib.c")
        _gcc("-shared", "-fPIC", "-DHOST_COPY", "-o", self.host_lib, PROGRAMS / "ct_lib.c")
        app = self.root / APP_PATH.lstrip("/")
        app.parent.mkdir(parents=True)
        _gcc("-o", app, PROGRAMS / "ct_app.c", f"-I{PROGRAMS}", f"-L{inner_lib.parent}",
             "-lct", f"-Wl,-rpath,{os.path.dirname(self.lib_path)}")
        _copy_runtime(self.root)
        if tmp_link:
            (self.root / "tmp").symlink_to(tmp_link)
        else:
            (self.root / "tmp").mkdir()
            (self.root / "tmp").chmod(0o1777)

    def close(self) -> None:
        shutil.rmtree(self.host_lib.parent, ignore_errors=True)


def _podman_works(image: str) -> bool:
    if shutil.which("podman") is None or shutil.which("runc") is None:
        return False
    res = subprocess.run([*PODMAN, *PODMAN_RUN, image, APP_PATH, "0"],
                         input="go\n", capture_output=True, text=True, timeout=60)
    return res.returncode == 0 and "done" in res.stdout


class Container:
    """A started ct_app: `host_pid`, `ns_pid` (what it calls itself),
    `go()` lets it work, `finish()` ends it (end of its stdin)."""

    def __init__(self, proc: subprocess.Popen, host_pid: int, ns_pid: int):
        self.proc, self.host_pid, self.ns_pid = proc, host_pid, ns_pid

    def go(self) -> None:
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline() == "done\n"

    def finish(self) -> None:
        if self.proc.stdin and not self.proc.stdin.closed:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class Runtime:
    """Runs ct_app of a Rootfs in a container: podman if it works here,
    else unshare + chroot. `name` says which."""

    def __init__(self, rootfs: Rootfs):
        self.rootfs = rootfs
        self.image = f"{IMAGE}:{uuid.uuid4().hex[:12]}"
        self.name = "unshare+chroot"
        # USTACK_TEST_RUNTIME=unshare: the fallback even where podman runs
        if os.environ.get("USTACK_TEST_RUNTIME") != "unshare" and shutil.which("podman"):
            tar = rootfs.root.parent / "rootfs.tar"
            with tarfile.open(tar, "w") as t:
                t.add(rootfs.root, arcname=".")
            made = subprocess.run(["podman", "import", str(tar), self.image],
                                  capture_output=True, text=True, timeout=120)
            if made.returncode == 0 and _podman_works(self.image):
                self.name = "podman"
        if self.name != "podman" and shutil.which("unshare") is None:
            pytest.skip("neither podman nor unshare can run a container here")

    def start(self, n: int = 1) -> Container:
        name = f"ustack-ct-{uuid.uuid4().hex[:8]}"
        if self.name == "podman":
            argv = [*PODMAN, *PODMAN_RUN, "--name", name, self.image, APP_PATH, str(n)]
        else:
            argv = ["unshare", "--pid", "--mount", "--fork", "chroot",
                    str(self.rootfs.root), APP_PATH, str(n)]
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                text=True)
        line = proc.stdout.readline()
        assert line.startswith("ready "), f"the container did not start: {line!r}"
        ns_pid = int(line.split()[1])
        if self.name == "podman":
            host_pid = int(subprocess.run(
                ["podman", "inspect", "--format", "{{.State.Pid}}", name],
                capture_output=True, text=True, check=True).stdout)
        else:
            host_pid = _descendant_running(proc.pid, APP_PATH)
        return Container(proc, host_pid, ns_pid)

    def close(self) -> None:
        if self.name == "podman":
            subprocess.run(["podman", "rmi", "-f", self.image], capture_output=True)
        self.rootfs.close()


def _descendant_running(pid: int, exe: str) -> int:
    """The process under `pid` (unshare -> chroot -> ct_app) whose
    executable ends with `exe` (a chroot: our path to it)."""
    todo = [pid]
    while todo:
        p = todo.pop()
        if os.readlink(f"/proc/{p}/exe").endswith(exe):
            return p
        for t in os.listdir(f"/proc/{p}/task"):
            with open(f"/proc/{p}/task/{t}/children") as f:
                todo += [int(c) for c in f.read().split()]
    raise AssertionError(f"no {exe} under pid {pid}")


class BoundRoot:
    """A container for an interpreter that the host has: its own mount and
    PID namespaces (`unshare`) and its own root (chroot), made of the
    host's /usr and /etc bound read-only and an /app directory of its own
    (the scripts, at a path the host does not have). run(argv) starts
    argv in it; the process's host pid is `host_pid(proc)`."""

    def __init__(self, base: Path):
        if shutil.which("unshare") is None:
            pytest.skip("unshare cannot make a container here")
        self.root = base / "root"
        for d in ("usr", "etc", "proc", "tmp", "app", "dev"):
            (self.root / d).mkdir(parents=True)
        for link, target in (("bin", "usr/bin"), ("lib", "usr/lib"), ("lib64", "usr/lib64")):
            (self.root / link).symlink_to(target)
        self.app = self.root / "app"        # /app inside

    def run(self, argv: list, **popen) -> subprocess.Popen:
        root = str(self.root)
        mounts = (f"mount --make-rprivate / && mount --rbind -o ro /usr {root}/usr && "
                  f"mount --bind -o ro /etc {root}/etc && mount -t proc proc {root}/proc && "
                  f'exec chroot {root} "$@"')
        return subprocess.Popen(["unshare", "--pid", "--mount", "--fork", "--kill-child", "sh", "-c", mounts,
                                 "sh", *argv], **popen)

    def host_pid(self, proc: subprocess.Popen, exe: str) -> int:
        """The host pid of the process under `proc` running `exe` (its
        path in the container)."""
        return _descendant_running(proc.pid, exe)
