"""The `ustack` command: parses arguments and hands them to the command
that runs them (ustack.commands: one module per subcommand)."""
from __future__ import annotations

import functools
import gc
import os
import sys
from importlib import import_module


def _argparse_without_gettext():
    """argparse, without the gettext it imports only to translate its words:
    importing gettext compiles a regular expression (~1 ms of every run),
    and ustack speaks English (see below). The stand-in is seen by
    argparse's import alone: a gettext imported later is the real one."""
    if "argparse" in sys.modules or "gettext" in sys.modules:
        import argparse
        return argparse
    stand_in = type(sys)("gettext")
    stand_in.gettext = str
    stand_in.ngettext = lambda singular, plural, n: singular if n == 1 else plural
    sys.modules["gettext"] = stand_in
    try:
        import argparse
    finally:
        del sys.modules["gettext"]
    return argparse


argparse = _argparse_without_gettext()

from .commands import arguments as a    # noqa: E402 (argparse first, as above)
from .interrupt import Interrupted
from .model import UstackError

# subcommand -> (what adds its parser, the module of ustack.commands whose
# main(args) runs it); --help lists them in this order. A new subcommand is
# a builder in commands/arguments.py, a module with main(args), and a line here.
COMMANDS = {
    "trace": (a.add_trace, "run"), "count": (a.add_count, "run"),
    "profile": (a.add_profile, "run"), "top": (a.add_top, "top"),
    "offcpu": (a.add_offcpu, "offcpu"),
    "symbolize": (a.add_symbolize, "symbolize"),
    "funccount": (a.add_funccount, "run"), "latency": (a.add_latency, "latency"),
    "memleak": (a.add_memleak, "memleak"), "list": (a.add_list, "list"),
    "dump": (a.add_dump, "dump"),
    "record": (a.add_record, "record"), "report": (a.add_report, "report"),
    "archive": (a.add_archive, "record"),
}


# ustack speaks English, and so does its argparse: each of argparse's
# words was asked of gettext, which searched the locale directories for a
# catalogue Python ships none of (importing locale: ~1.7 ms of every run)
argparse._ = str
argparse.ngettext = lambda singular, plural, n: singular if n == 1 else plural


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kw):
        # no abbreviations: `--comm` must not be taken for `--command`
        super().__init__(*args, allow_abbrev=False, **kw)

    def error(self, message):             # one line, not usage + message
        raise UstackError(f"{message} (see `{self.prog} --help`)")

    def _get_formatter(self):
        # argparse makes a formatter for every add_argument, and one left
        # to find its width imports shutil (with bz2 and lzma: ~1.5 ms);
        # the width is asked of the terminal once
        return self.formatter_class(prog=self.prog, width=_help_width())


@functools.lru_cache(maxsize=1)
def _help_width() -> int:
    """The terminal's columns as argparse would find them, less its margin."""
    try:
        columns = int(os.environ.get("COLUMNS", 0))
    except ValueError:
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns
        except (AttributeError, ValueError, OSError):
            columns = 80
    return (columns or 80) - 2


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole command line, or with `only` the one subcommand a run
    names: building them all costs ~8 ms of start-up (argparse and
    gettext), for a --help that lists them."""
    parser = _Parser(prog="ustack",
                     description="User-space call stacks of Linux processes.")
    from . import __version__
    parser.add_argument("--version", action="version", version=f"ustack {__version__}")
    sub = parser.add_subparsers(dest="cmd", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for name, (add, _module) in COMMANDS.items():
        if only is None or name == only:
            add(sub)
    return parser


def _run(args) -> int:
    module = import_module(f".commands.{COMMANDS[args.cmd][1]}", __package__)
    _collect_from_here()
    return module.main(args)


# Young objects between two collections of the command's: a run makes
# few cycles, and at CPython's 700 a one-hit trace collected 4 times while
# it set up and named its stack (~0.8 ms)
YOUNG_OBJECTS = 20_000


def _collect_from_here() -> None:
    """The cyclic garbage collector back on (entry() turned it off), with
    what exists now set aside for good: the modules and classes just
    imported live as long as the process, and collecting while they were
    made walked them again and again (~5 ms of a one-hit run's CPU)."""
    if not gc.isenabled():
        gc.freeze()
        gc.set_threshold(YOUNG_OBJECTS, *gc.get_threshold()[1:])
        gc.enable()


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    named = argv[0] if argv and argv[0] in COMMANDS else None
    try:
        args = build_parser(named).parse_args(argv)
        return _run(args)
    except UstackError as e:
        print(f"ustack: {e}", file=sys.stderr)
        return 130 if isinstance(e, Interrupted) else 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


def entry() -> None:
    """The `ustack` command (its console script and `python -m ustack`):
    main(), then out at once. Tearing the interpreter down, freeing every
    module and object one by one, took ~15 ms after the report was out;
    the outputs are flushed and the line answers saved first, which is all
    of it that matters."""
    gc.disable()                            # until the command's imports are done
    try:
        status = main()
    except SystemExit as e:                 # --help, --version: argparse's exit
        status = e.code if isinstance(e.code, int) else (e.code is not None)
    memos = sys.modules.get("ustack.objfile.line_memo")    # if names were asked
    if memos is not None:
        memos.save_all()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (BrokenPipeError, OSError):
            pass
    os._exit(status)


if __name__ == "__main__":
    entry()
