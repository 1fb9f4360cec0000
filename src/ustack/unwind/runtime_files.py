"""Whose runtime an object file may be, by its name alone: the cheap test
asked of every object a run loads, before the runtime's module is even
imported (unwind/NAME_runtime.py reads the file to be sure). A run that
maps no file of a runtime never imports or builds anything of it."""
from __future__ import annotations

import os


def may_be(runtime: str, path: str) -> bool:
    """Whether the file at `path` may be an object of `runtime` ("python",
    "v8", "php", "perl", "ruby"), judged by its name."""
    return _TESTS[runtime](file_name(path))


def file_name(path: str) -> str:
    """The name of the file at `path`. A file of a process in a container
    is opened through the process and held open (kernel/proc_root.py):
    its path here is /proc/self/fd/N, and the name is the held file's."""
    if path.startswith("/proc/self/fd/"):
        try:
            path = os.readlink(path)
        except OSError:
            pass
    return os.path.basename(path)


def _python(base: str) -> bool:
    # python3.X, libpython3.X.so, an embedding named after it
    return "python" in base


def _node(base: str) -> bool:
    # node, nodejs, node20, libnode.so.NN
    return base.startswith("node") or base.startswith("libnode.")


def _php(base: str) -> bool:
    # php, php8.2, php-fpm8.2, php-cgi8.2, libphp8.2.so
    return "php" in base


def _perl(base: str) -> bool:
    return base.startswith("perl") or base.startswith("libperl.")


def _ruby(base: str) -> bool:
    return base.startswith("libruby") or base.startswith("ruby")


_TESTS = {"python": _python, "v8": _node, "php": _php, "perl": _perl, "ruby": _ruby}
