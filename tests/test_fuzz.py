"""Fuzz: random and mutated event specs and options through the real CLI
parser, and corrupt inputs (ELF files, .eh_frame, .gopclntab, .debug_line,
ftrace text, /proc maps files, recordings, perf maps) through the readers
and commands that take them. Every case must end within its time limit,
raise nothing but model.UstackError (which the CLI prints as one line) and
print no traceback.

Cases are drawn from a seeded RNG: the seed is in every failure message;
USTACK_FUZZ_SEED=N replays (or explores) another one. Most cases call the
parsing functions or `cli.main` in this process (fast); a sample goes
through the real `ustack` command. Runs started by in-process cases end at
attaching a pid that cannot exist (pid_max); a case that would start a
command or trace the whole system fails instead."""
from __future__ import annotations

import contextlib
import io
import os
import random
import shutil
import signal
from pathlib import Path

import pytest

from helpers import FP, O2_NOFP, build, build_go, run_ustack, ustack_env

from ustack import cli
from ustack.capture.ftrace_text import UserStackLines
from ustack.kernel import procfs
from ustack.model import UstackError
from ustack.objfile.dwarf_lines import LineTable
from ustack.objfile.elf import ElfImage
from ustack.objfile.gopclntab import go_table
from ustack.probes.events import resolve_probes
from ustack.probes.spec import parse_event
from ustack.symbols.perfmap import PerfMap
from ustack.target import process
from ustack.unwind.cfi import UnwindTable

SEED = int(os.environ.get("USTACK_FUZZ_SEED", "14"))
# damaged objects put through list, list -v, trace by name and symbolize;
# USTACK_FUZZ_OBJECTS=1000 for the long run (bench/damaged_objects.py)
OBJECTS = int(os.environ.get("USTACK_FUZZ_OBJECTS", "150"))
# a case's time limit, far above any honest one: of the CPU time it used
# (a case never waits for anything, and the suite's parallel workers share
# the CPUs), and of the clock for a case blocked for good
CASE_S = 10
CASE_WALL_S = 60
FIXTURES = Path(__file__).resolve().parent / "fixtures"
with open("/proc/sys/kernel/pid_max") as _f:
    NO_PID = int(_f.read())      # pids are below pid_max: this one never exists
# no cache: a corrupt copy must be parsed, not its original's cached result
NO_CACHE = "/dev/null/ustack-fuzz-cache"


def rng(name: str) -> random.Random:
    """Each test its own stream, so one test's cases do not shift another's."""
    return random.Random(f"{SEED}:{name}")


class CaseTimeout(BaseException):
    """A case ran past CASE_S (BaseException: no `except Exception` eats it)."""


@contextlib.contextmanager
def time_limit(what: str):
    def expire(signum, frame):
        limit = f"{CASE_S} s of CPU time" if signum == signal.SIGPROF else f"{CASE_WALL_S} s"
        raise CaseTimeout(f"seed {SEED}: no end within {limit}: {what}")
    old = {sig: signal.signal(sig, expire) for sig in (signal.SIGPROF, signal.SIGALRM)}
    signal.setitimer(signal.ITIMER_PROF, CASE_S)       # this process's CPU time
    signal.setitimer(signal.ITIMER_REAL, CASE_WALL_S)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.setitimer(signal.ITIMER_REAL, 0)
        for sig, handler in old.items():
            signal.signal(sig, handler)


def survives(what: str, fn, *args):
    """fn(*args) under the time limit: its result, or the UstackError it
    raised (a one-line message); anything else fails with the seed."""
    with time_limit(what):
        try:
            return fn(*args)
        except UstackError as e:
            assert "\n" not in str(e).strip(), f"seed {SEED}: {what}: {e!r}"
            return e
        except Exception as e:
            raise AssertionError(f"seed {SEED}: {what}: {type(e).__name__}: {e}") from e


@pytest.fixture(autouse=True)
def fuzz_env(monkeypatch, tmp_path):
    """No disk cache; relative paths (report -o, archive) land in tmp_path;
    nothing a case runs may start a command or a system-wide run."""
    monkeypatch.setenv("USTACK_CACHE_DIR", NO_CACHE)
    monkeypatch.chdir(tmp_path)

    def refuse(*args, **kw):
        raise AssertionError(f"seed {SEED}: a fuzz case would start a run: {args}")
    for name in ("launch", "everything"):
        monkeypatch.setattr(process, name, refuse)
    from ustack.target import traced_command
    monkeypatch.setattr(traced_command, "launch_traced", refuse)
    print(f"fuzz seed {SEED} (USTACK_FUZZ_SEED=N to replay another)")


def run_main(argv: list) -> tuple:
    """`ustack ARGV…` in this process: (exit status, stdout, stderr), judged:
    no traceback, and a failure is one `ustack: …` line (warnings before it
    are `ustack: …` lines too)."""
    out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="surrogateescape")
    err = io.StringIO()
    what = f"ustack {' '.join(map(repr, argv))}"
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), \
            time_limit(what):
        try:
            status = cli.main([str(a) for a in argv])
        except SystemExit as e:              # --help, --version
            status = e.code
        except Exception as e:
            raise AssertionError(f"seed {SEED}: {what}: {type(e).__name__}: {e}") from e
    out.flush()
    text = out.buffer.getvalue().decode("utf-8", "replace")
    judge(what, status, err.getvalue())
    return status, text, err.getvalue()


def judge(what: str, status, err: str) -> None:
    assert "Traceback" not in err, f"seed {SEED}: {what}:\n{err}"
    if status not in (0, None):
        lines = err.splitlines()
        assert lines and all(l.startswith("ustack: ") for l in lines), \
            f"seed {SEED}: {what}: exit {status} without a one-line error:\n{err}"


# -- mutation ------------------------------------------------------------------

NASTY = ["", " ", ":", "::", "+", "-", "0", "00", "0x", "0x0", "010", "-1",
         "99999999999999999999", "1e309", "nan", "*", "?", "[", "]", "!", "=",
         "%", "$", "@", "\t", "é", "\x7f", "a b", "/", "//", "..", "'", '"',
         "\\", "\udcff", "-" * 3, "x" * 300]


def mutate_text(r: random.Random, text: str, rounds: int = 3) -> str:
    """Characters inserted, removed, replaced or repeated, or a piece of a
    nasty string spliced in."""
    for _ in range(r.randint(1, rounds)):
        i = r.randint(0, len(text))
        op = r.randrange(5)
        if op == 0:
            text = text[:i] + r.choice(NASTY) + text[i:]
        elif op == 1 and text:
            text = text[:i] + text[i + r.randint(1, 4):]
        elif op == 2 and text:
            text = text[:i] + chr(r.randrange(32, 127)) + text[i + 1:]
        elif op == 3:
            text = text[:i] + text[i:i + r.randint(1, 6)] * r.randint(2, 4) + text[i:]
        else:
            text = r.choice(NASTY) + text if r.random() < 0.5 else text + r.choice(NASTY)
    return text


def flip_bytes(r: random.Random, data: bytes, start: int = 0, end=None,
               count: int = 8) -> bytes:
    """`count` random bytes in data[start:end] set to random values (or
    to 0x00/0xff, which reach limits more often)."""
    buf = bytearray(data)
    end = len(buf) if end is None else end
    for _ in range(r.randint(1, count)):
        i = r.randrange(start, end)
        buf[i] = r.choice((r.randrange(256), 0, 0xff, buf[i] ^ (1 << r.randrange(8))))
    return bytes(buf)


def corrupt(r: random.Random, data: bytes, start: int = 0, end=None) -> bytes:
    """A bit-flipped, truncated, or chunk-shuffled copy of data[start:end]
    inside data."""
    end = len(data) if end is None else end
    op = r.randrange(4)
    if op == 0 or end - start < 16:
        return flip_bytes(r, data, start, end)
    if op == 1:                                    # truncated inside the range
        return data[:r.randint(start, end)]
    if op == 2:                                    # a run of bytes zeroed or 0xff
        i = r.randrange(start, end - 8)
        n = r.randint(1, min(64, end - i))
        return data[:i] + bytes([r.choice((0, 0xff))]) * n + data[i + n:]
    i, j = sorted(r.randrange(start, end) for _ in range(2))   # a chunk moved
    chunk = data[i:j][:256]
    k = r.randrange(start, end)
    return (data[:k] + chunk + data[k:])[:len(data)] if r.random() < 0.5 else \
        data[:i] + data[i + len(chunk):k] + chunk + data[k:]


def write_copy(directory: Path, name: str, data: bytes) -> Path:
    path = directory / name
    path.write_bytes(data)
    path.chmod(0o755)
    return path


# -- event specs and options ------------------------------------------------------

@pytest.fixture(scope="module")
def chain():
    return build("chain", flags=FP)


def random_spec(r: random.Random, chain) -> str:
    kind = r.choice(["syscall", "tracepoint", "t", "uprobe", "u", "uretprobe", "ur",
                     "profile", "p", "kprobe", "usdt", ""])
    path = r.choice([str(chain), "/bin/true", "libc", "true", "chain", "/nonexistent",
                     "/etc/passwd", "/proc/self/exe", "", "a b", str(chain) + "/"])
    func = r.choice(["d", "c", "main", "d+4", "d+0x4", "d+010", "0x1130", "01230",
                     "main+99999", "d+-1", "+4", "operator+", "nosuch", "d*", "[cd]",
                     "", "0", "0x", "x" * 200, "d::e", "_start"])
    if kind.startswith("u"):
        spec = f"{kind}:{path}:{func}"
        if r.random() < 0.3:
            spec += " " + " ".join(r.choice(["%di", "%si:u32", "len=%dx:s64", "$arg1",
                                             "$arg9", "+8(%sp):u8", "@", "=%di", "%zz",
                                             "+(%di)", "$retval", "x=", ":u32"])
                                   for _ in range(r.randint(1, 3)))
    elif kind in ("profile", "p"):
        spec = f"{kind}:{r.choice(['hz', 'ms', 's', ''])}:{r.choice(['99', '0', '-1', '1e3', 'x', '999999999999'])}"
    elif kind in ("tracepoint", "t"):
        spec = f"{kind}:{r.choice(['sched', 'syscalls', 'nosuch', '*', ''])}:" \
               f"{r.choice(['sched_switch', 'sys_enter_write', 'x*', '', '*'])}"
    else:
        spec = f"{kind}:{r.choice(['write', 'read', 'nosuch', '*', 'w?ite', '', '[rw]*'])}"
    return mutate_text(r, spec, 2) if r.random() < 0.5 else spec


def test_event_specs_parse_or_say_why(chain):
    """parse_event, then resolution against the real binaries, syscall and
    tracepoint lists (resolution reads tracefs: root only)."""
    r = rng("specs")
    for i in range(150):
        spec = random_spec(r, chain)
        parsed = survives(f"parse_event({spec!r})", parse_event, spec)
        if isinstance(parsed, UstackError) or os.geteuid() != 0:
            continue
        if parsed.kind in ("uprobe", "uretprobe") and parsed.path == "libc" \
                and any(c in (parsed.function or "") for c in "*?["):
            continue                 # a glob over all of libc: slow, not fuzz
        survives(f"resolve_probes({spec!r})", resolve_probes, [parsed], None, [])


OPTION_POOL = {
    "trace": ["-d", "--buffer-pages", "--unwind", "--stack-size", "--backend",
              "-f", "-o", "--lines", "--inlines", "--no-demangle", "--debug-dir"],
    "count": ["-d", "--buffer-pages", "--unwind", "--stack-size", "--backend", "-f",
              "-o", "-P", "--offsets", "--kernel", "--stack-storage-size", "--record",
              "--lines", "--inlines"],
    "profile": ["-F", "-d", "--unwind", "--backend", "-f", "-o", "--kernel",
                "--record", "--stack-size", "-P", "--offsets"],
    "top": ["-F", "-d", "--unwind", "--backend", "--sort", "-n", "--stack-size"],
    "funccount": ["-i", "-d", "-o", "--backend"],
    "record": ["-F", "-o", "--raw-stacks", "--archive", "--kernel", "--backend",
               "--unwind", "--stack-size", "-d"],
}
VALUES = {
    "-d": ["1", "0", "-1", "nan", "inf", "1e309", "abc", "", "0.001"],
    "-F": ["99", "0", "-5", "1e3", "x", "100000000"],
    "-i": ["1", "0", "-1", "nan", "x"],
    "--buffer-pages": ["0", "1", "3", "64", "-8", "1048576", "x"],
    "--unwind": ["auto", "fp", "dwarf", "frame-pointer", ""],
    "--stack-size": ["0", "7", "8", "100", "65528", "65536", "1e3", "-1"],
    "--backend": ["auto", "perf", "bpf", "tracefs", "ebpf", ""],
    "-f": ["text", "folded", "html", "svg", "pprof", "speedscope", "json",
           "perf-script", "jsonl", "csv", ""],
    "-o": ["out.html", "out.pb.gz", "out.speedscope.json", "out.folded", "out.svg",
           "nodir/out.txt", ".", "out", "", "out.perf-script"],
    "--stack-storage-size": ["0", "-1", "1", "1000000000", "x"],
    "--record": ["rec.ustack", "", "nodir/rec", "."],
    "--debug-dir": [".", "/nonexistent", ""],
    "--sort": ["self", "total", "name", ""],
    "-n": ["1", "0", "-3", "x"],
}
STRAY = ["--", "-", "--pi", "--comm", "-x", "--help", "--version", "--nosuch",
         "-dd", "--duration=", "-F=99", "-o=", "---", "-P-"]


def safe_token(token: str) -> bool:
    """A token that cannot name -c/--command or -p/--pid (the run's -p is
    placed by the case itself), alone or among bundled short options."""
    if token.startswith("--"):
        return token[2:].split("=")[0] not in ("command", "pid")
    if token.startswith("-") and len(token) > 1 and not token[1].isdigit():
        return "c" not in token and "p" not in token
    return True


def random_argv(r: random.Random, chain) -> list:
    cmd = r.choice(list(OPTION_POOL))
    rest = []
    if cmd == "funccount":
        rest.append(mutate_text(r, f"{chain}:d*", 1) if r.random() < 0.5 else
                    r.choice([f"{chain}:*", "libc:mem*", "nosuch:x", "", ":"]))
    elif cmd not in ("profile", "top"):
        rest += [random_spec(r, chain) for _ in range(r.randint(0 if cmd == "record" else 1, 2))]
    for _ in range(r.randint(0, 5)):
        opt = r.choice(OPTION_POOL[cmd])
        rest.append(opt)
        if opt in VALUES:
            rest.append(r.choice(VALUES[opt]))
    if r.random() < 0.3:
        rest.insert(r.randint(0, len(rest)), r.choice(STRAY))
    if r.random() < 0.4 and rest:
        i = r.randrange(len(rest))
        rest[i] = mutate_text(r, rest[i], 2)
    if r.random() < 0.2 and len(rest) > 1:
        r.shuffle(rest)
    return [cmd, "-p", str(NO_PID)] + [t for t in rest if safe_token(t)]


def test_options_through_the_cli_parser(chain):
    r = rng("options")
    for _ in range(120):
        run_main(random_argv(r, chain))


@pytest.mark.kernel
def test_a_sample_through_the_ustack_command(chain, tmp_path):
    """Mutated command lines in the real process; a few with -c, so the
    probes are resolved and placed (these runs are real)."""
    r = rng("cli")
    env = dict(ustack_env(), USTACK_CACHE_DIR=NO_CACHE)
    argvs = [random_argv(r, chain) for _ in range(5)]
    for backend, func in (("perf", "c+1"), ("bpf", "0x1"), ("tracefs", "d")):
        argvs.append(["count", f"uprobe:{chain}:{func}", "-c", f"{chain} 2",
                      "--backend", backend])
    for argv in argvs:
        res = run_ustack(*argv, timeout=60, env=env, cwd=tmp_path)
        judge(f"ustack {argv}", res.returncode, res.stderr)


# -- corrupt ELF files ----------------------------------------------------------------

def elf_sections(path) -> dict:
    """name -> (file offset, size) of the sections of an intact file."""
    from elftools.elf.elffile import ELFFile
    with open(path, "rb") as f:
        elf = ELFFile(f)
        return {s.name: (s["sh_offset"], s["sh_size"]) for s in elf.iter_sections()}


def header_ranges(path) -> list:
    """(start, end) of the ELF header, program headers and section headers."""
    from elftools.elf.elffile import ELFFile
    with open(path, "rb") as f:
        h = ELFFile(f).header
    return [(0, 64), (h.e_phoff, h.e_phoff + h.e_phnum * h.e_phentsize),
            (h.e_shoff, h.e_shoff + h.e_shnum * h.e_shentsize)]


def read_everything(path: Path, addrs) -> None:
    """What the readers of an ELF file give: symbols, CFI, lines."""
    image = ElfImage.open(str(path))
    for a in addrs:
        image.lookup(a)
        image.file_offset(a)
    table, _found = UnwindTable.for_image(image)
    for a in addrs:
        table.lookup(a)
    lines = LineTable.for_image(image)
    if lines is not None:
        for a in addrs:
            lines.locate(a)


def function_addresses(path) -> list:
    image = ElfImage.open(str(path))
    return sorted({a for s in image.functions for a in (s.address, s.address + 3)})


def test_corrupt_elf_files(chain, tmp_path):
    r = rng("elf")
    data = chain.read_bytes()
    heads = header_ranges(chain)
    addrs = function_addresses(chain)
    trace = tmp_path / "trace.txt"
    for i in range(70):
        if r.random() < 0.5:                          # headers: where parsing starts
            start, end = r.choice(heads)
            bad = corrupt(r, data, start, min(end, len(data)))
        else:
            bad = corrupt(r, data)
        copy = write_copy(tmp_path, f"elf{i}", bad)
        survives(f"readers of elf{i}", read_everything, copy, addrs)
        run_main(["list", copy, *(["d*"] if i % 2 else [])])
        trace.write_text(f" => {copy}[+0x{r.choice(addrs) & 0xfff:x}]\n"
                         f" =>  <{r.choice(addrs):016x}>\n")
        run_main(["symbolize", trace, "--binary", copy])


def corrupt_section(r, data: bytes, section) -> bytes:
    off, size = section
    return corrupt(r, data, off, off + size) if r.random() < 0.7 else \
        flip_bytes(r, data, off, off + size, count=3)


def test_corrupt_eh_frame(tmp_path):
    r = rng("eh_frame")
    binary = build("chain", flags=("-O2", "-g", "-fomit-frame-pointer"))
    data = binary.read_bytes()
    sections = elf_sections(binary)
    addrs = function_addresses(binary)
    for i in range(45):
        name = r.choice([".eh_frame", ".eh_frame", ".eh_frame_hdr", ".debug_frame"])
        if name not in sections:
            name = ".eh_frame"
        copy = write_copy(tmp_path, f"cfi{i}", corrupt_section(r, data, sections[name]))

        def unwind_table():
            table, _ = UnwindTable.for_image(ElfImage.open(str(copy)))
            return [table.lookup(a + d) for a in addrs for d in (0, 1, 7)]
        survives(f"CFI of cfi{i} ({name} corrupt)", unwind_table)


def test_corrupt_debug_line(tmp_path):
    r = rng("debug_line")
    binary = build("chain", flags=("-O2", "-g", "-fno-omit-frame-pointer"))
    data = binary.read_bytes()
    sections = elf_sections(binary)
    addrs = function_addresses(binary)
    names = [n for n in (".debug_line", ".debug_line", ".debug_info", ".debug_abbrev",
                         ".debug_str", ".debug_line_str", ".debug_rnglists")
             if n in sections]
    for i in range(45):
        name = r.choice(names)
        copy = write_copy(tmp_path, f"lines{i}", corrupt_section(r, data, sections[name]))

        def locate():
            table = LineTable.for_image(ElfImage.open(str(copy)))
            return table and [table.locate(a) for a in addrs]
        survives(f"lines of lines{i} ({name} corrupt)", locate)
        if i % 5 == 0:
            trace = tmp_path / "t.txt"
            trace.write_text("".join(f" => {copy}[+0x{a & 0xfff:x}]\n" for a in addrs[:6]))
            run_main(["symbolize", trace, "--binary", copy, "--lines", "--inlines"])


def test_corrupt_gopclntab(tmp_path):
    if shutil.which("go") is None:
        pytest.skip("go is not installed: no Go binary to corrupt")
    r = rng("gopclntab")
    binary = build_go("gochain", strip=True)
    data = binary.read_bytes()
    off, size = elf_sections(binary)[".gopclntab"]
    table = go_table(ElfImage.open(str(binary)))
    lo, hi = table.text_range
    pcs = [r.randrange(lo, hi) for _ in range(60)] + [lo, hi - 1, hi, lo - 1]
    for i in range(40):
        # the header and function table are small and read first: aim there often
        end = off + (min(size, 4096) if r.random() < 0.5 else size)
        copy = write_copy(tmp_path, f"go{i}", corrupt(r, data, off, end))

        def read_table():
            t = go_table(ElfImage.open(str(copy)))
            if t is None:
                return None
            for pc in pcs:
                f = t.find(pc)
                t.frames(pc)
                t.source(pc)
            for j in range(0, len(t), max(1, len(t) // 20)):
                t.sp_deltas(j)
            return f
        survives(f"pclntab of go{i}", read_table)


def test_corrupt_cfi_under_raw_address_probes(tmp_path):
    """A stripped binary's .eh_frame(_hdr) is all that proves a raw address:
    damaged, every address gives a probe or one line of refusal."""
    r = rng("probe_cfi")
    binary = tmp_path / "checksum"
    shutil.copy(build("checksum", flags=("-O2",)), binary)
    mix = ElfImage.open(str(binary)).find("mix")[0]
    os.system(f"strip -s {binary}")
    data = binary.read_bytes()
    sections = elf_sections(binary)
    addrs = [mix.address + d for d in range(0, mix.size, 3)] + [mix.address + mix.size]
    for i in range(40):
        name = r.choice([".eh_frame", ".eh_frame_hdr"])
        copy = write_copy(tmp_path, f"probe{i}", corrupt_section(r, data, sections[name]))
        for a in r.sample(addrs, 6):
            survives(f"uprobe:probe{i}:0x{a:x} ({name} corrupt)", resolve_probes,
                     [parse_event(f"uprobe:{copy}:0x{a:x}")])


class Resolved(UstackError):
    """Where a fuzzed `trace -c` ends once its probes are resolved: before
    any command starts."""


def damaged_object(r: random.Random, path, data: bytes) -> bytes:
    """A copy of an object damaged where its readers start (the headers),
    in the sections `list -v`, trace by name and `list` read (DWARF,
    .note.stapsdt, the symbol tables), or anywhere."""
    where = r.random()
    if where < 0.3:
        start, end = r.choice(header_ranges(path))
        return corrupt(r, data, start, min(end, len(data)))
    if where < 0.8:
        sections = elf_sections(path)
        name = r.choice(sorted(n for n in sections if n.startswith(
            (".debug", ".note", ".stapsdt", ".symtab", ".strtab", ".dynsym", ".dynstr",
             ".gopclntab"))))
        return corrupt_section(r, data, sections[name])
    return corrupt(r, data)


def test_damaged_objects_listed_traced_by_name_and_symbolized(tmp_path, monkeypatch):
    """OBJECTS damaged copies of a C program with DWARF (its parameters by
    name), a library with USDT notes and a Go program with DWARF, each
    through `list`, `list -v`, `trace -c CMD 'uprobe:COPY:FUNC NAME'` (up
    to its probes resolved) and `symbolize`: output or one `ustack: …`
    line, never a traceback."""
    def resolved(*args, **kw):
        raise Resolved("resolved")
    for name in ("launch", "everything"):
        monkeypatch.setattr(process, name, resolved)
    from ustack.target import traced_command
    monkeypatch.setattr(traced_command, "launch_traced", resolved)
    r = rng("objects")
    objects = [(build("args", flags=O2_NOFP), "mix", "buf"),
               (build("usdt_lib", flags=O2_NOFP, kind="shared"), "", ""),
               (build_go("goargs") if shutil.which("go") else None, "main.work", "count")]
    objects = [(path, path.read_bytes(), func, arg)
               for path, func, arg in objects if path is not None]
    trace = tmp_path / "trace.txt"
    for i in range(OBJECTS):
        path, data, func, arg = objects[i % len(objects)]
        copy = write_copy(tmp_path, f"obj{i}", damaged_object(r, path, data))
        run_main(["list", copy])
        run_main(["list", "-v", copy, *([func] if func and i % 2 else [])])
        if func:
            run_main(["trace", "-c", "/bin/true", f"uprobe:{copy}:{func} {arg}"])
        trace.write_text(f" => {copy}[+0x{r.randrange(0x1000, 0x2000):x}]\n")
        run_main(["symbolize", trace, "--binary", copy, "--lines", "--inlines"])


# -- corrupt text inputs --------------------------------------------------------------

def maps_text(chain) -> str:
    return (f"55d4a6c00000-55d4a6c01000 r--p 00000000 fe:01 1234   {chain}\n"
            f"55d4a6c01000-55d4a6c02000 r-xp 00001000 fe:01 1234   {chain}\n"
            "7f3c1a228000-7f3c1a37d000 r-xp 00028000 fe:01 5678   "
            "/usr/lib/x86_64-linux-gnu/libc.so.6\n"
            "7f3c1a400000-7f3c1a401000 r-xp 00000000 00:00 0 \n"
            "7ffd1c3e0000-7ffd1c3e2000 r-xp 00000000 00:00 0      [vdso]\n"
            "7ffd1c3e3000-7ffd1c3e4000 r-xp 00000000 00:00 0      /tmp/a b (deleted)\n")


def trace_text(chain) -> str:
    return ("# tracer: nop\n#\n"
            "           chain-4242    [001] ..... 100.000001: p_chain_d: (0x55d4a6c01139)\n"
            "           chain-4242    [001] ..... 100.000002: <user stack trace>\n"
            " =>  <000055d4a6c01139>\n"
            f" => {chain}[+0x1150]\n"
            f" => {chain}[+0x1170] <000055d4a6c01170>\n"
            " => /usr/lib/x86_64-linux-gnu/libc.so.6[+0x27249]\n"
            " =>  <00007ffd1c3e0800>\n"
            "           chain-4242    [001] ..... 100.000003: <stack trace>\n"
            " => __x64_sys_write\n"
            " => /deleted/lib (deleted)[+0x10]\n")


def mutate_lines(r: random.Random, text: str) -> str:
    lines = text.splitlines(keepends=True)
    for _ in range(r.randint(1, 4)):
        i = r.randrange(len(lines))
        op = r.randrange(4)
        if op == 0:
            lines[i] = mutate_text(r, lines[i], 3)
        elif op == 1:
            lines.insert(i, lines[r.randrange(len(lines))])
        elif op == 2 and len(lines) > 1:
            del lines[i]
        else:   # a field of hex digits made huge, empty or odd
            lines[i] = lines[i].replace(r.choice(["55d4a6c0", "7f3c1a", "0x11", "000"]),
                                        r.choice(["f" * 40, "", "g", "-1", "0x"]))
    return "".join(lines)


def test_corrupt_ftrace_text(chain, tmp_path):
    r = rng("ftrace")
    maps = tmp_path / "maps"
    maps.write_text(maps_text(chain))
    base = trace_text(chain).encode()
    for i in range(50):
        text = mutate_lines(r, base.decode()).encode("utf-8", "surrogateescape")
        if r.random() < 0.3:
            text = flip_bytes(r, text, count=4)      # invalid UTF-8, NULs, controls
        trace = tmp_path / f"trace{i}.txt"
        trace.write_bytes(text)
        lines = UserStackLines()
        survives(f"UserStackLines of trace{i}",
                 lambda: [lines.frame(l) for l in text.decode("utf-8", "replace").splitlines()])
        source = r.choice([["--maps", maps], ["--binary", chain], ["--maps", maps, "--lines"]])
        run_main(["symbolize", trace, *source])


def test_corrupt_maps_files(chain, tmp_path):
    r = rng("maps")
    trace = tmp_path / "trace.txt"
    trace.write_text(trace_text(chain))
    for i in range(45):
        text = mutate_lines(r, maps_text(chain))
        survives(f"parse_maps (lenient) of maps{i}", procfs.parse_maps, text, False)
        with time_limit(f"parse_maps of maps{i}"):
            try:
                procfs.parse_maps(text)
            except ValueError as e:       # strict: names the line that is not one
                assert "\n" not in str(e), f"seed {SEED}: maps{i}: {e!r}"
        path = tmp_path / f"maps{i}"
        raw = text.encode("utf-8", "surrogateescape")
        path.write_bytes(flip_bytes(r, raw, count=3) if r.random() < 0.3 else raw)
        run_main(["symbolize", trace, "--maps", path])


def test_corrupt_perf_maps(tmp_path):
    r = rng("perfmap")
    good = "".join(f"{0x7f0000001000 + 0x100 * i:x} {0x80:x} jit_fn_{i} [lua]\n"
                   for i in range(20))
    for i in range(40):
        text = mutate_lines(r, good).encode("utf-8", "surrogateescape")
        if r.random() < 0.3:
            text = flip_bytes(r, text, count=4)
        path = tmp_path / f"perf-{i}.map"
        path.write_bytes(text)
        warnings = []
        perf_map = PerfMap(str(path), owners=None, warn=warnings.append)
        survives(f"PerfMap of perf-{i}.map",
                 lambda: [perf_map.lookup(0x7f0000001000 + 0x40 * k) for k in range(50)])
        assert all("\n" not in w for w in warnings), f"seed {SEED}: {warnings}"


# -- corrupt recordings ------------------------------------------------------------------

def test_corrupt_recordings(tmp_path):
    r = rng("recordings")
    originals = sorted(FIXTURES.glob("*.ustack"))
    for f in FIXTURES.iterdir():                 # the recorded binaries, by name
        if not f.name.endswith(".ustack"):
            shutil.copy(f, tmp_path / f.name)
    for i in range(60):
        source = r.choice(originals)
        data = source.read_bytes()
        copy = tmp_path / f"rec{i}.ustack"
        copy.write_bytes(corrupt(r, data, r.choice((0, 0, 16)) if len(data) > 16 else 0))
        extra = r.choice([[], ["-f", "folded"], ["--as", "trace"], ["--as", "count"],
                          ["-f", "json"], ["--objects", tmp_path]])
        run_main(["report", copy, *extra])


# -- what the fuzz found, kept fixed ---------------------------------------------------------

def test_an_fde_past_the_end_of_the_address_space_is_left_out(tmp_path):
    """An FDE whose pc_begin wraps to just below 2**64 (so pc_begin +
    pc_range passes it) raised OverflowError while the table was built."""
    from elftools.elf.elffile import ELFFile
    binary = build("chain", flags=("-O2", "-g", "-fomit-frame-pointer"))
    data = bytearray(binary.read_bytes())
    with open(binary, "rb") as f:
        elf = ELFFile(f)
        eh = elf.get_section_by_name(".eh_frame")
        fde = next(e for e in elf.get_dwarf_info().EH_CFI_entries()
                   if type(e).__name__ == "FDE")
        assert fde.cie.augmentation_dict.get("FDE_encoding") == 0x1b   # pcrel sdata4
        field = fde.offset + 8                  # after length and CIE pointer
        file_at, vaddr_at = eh["sh_offset"] + field, eh["sh_addr"] + field
    data[file_at:file_at + 4] = (-16 - vaddr_at).to_bytes(4, "little", signed=True)
    copy = write_copy(tmp_path, "wrapped", bytes(data))
    main = ElfImage.open(str(binary)).find("main")[0].address
    table, _found = UnwindTable.for_image(ElfImage.open(str(copy)))
    assert table.lookup(main) is not None          # the other FDEs are kept


def test_a_nul_byte_in_a_trace_files_path(chain, tmp_path):
    """ftrace text naming `/tmp/a\\0b[+0x10]`: ValueError (embedded null
    byte) from os.stat; now an unnamed frame, like any file not found."""
    trace = tmp_path / "trace.txt"
    trace.write_bytes(b" => /tmp/a\0b[+0x10]\n")
    status, out, _err = run_main(["symbolize", trace, "--binary", chain])
    assert status == 0
    assert out == " => /tmp/a\0b[+0x10] : [unknown] [a\0b]\n"


def test_a_section_larger_than_the_file(tmp_path):
    """A section header whose sh_size is 2**62: the section's bytes were
    read into a buffer of that size (MemoryError)."""
    from elftools.elf.elffile import ELFFile
    binary = build("chain", flags=("-O2", "-g", "-fomit-frame-pointer"))
    data = bytearray(binary.read_bytes())
    with open(binary, "rb") as f:
        elf = ELFFile(f)
        index = next(i for i, s in enumerate(elf.iter_sections()) if s.name == ".eh_frame")
        header = elf.header.e_shoff + index * elf.header.e_shentsize
    data[header + 32:header + 40] = (1 << 62).to_bytes(8, "little")    # sh_size
    copy = write_copy(tmp_path, "huge", bytes(data))
    table, _found = UnwindTable.for_image(ElfImage.open(str(copy)))
    main = ElfImage.open(str(binary)).find("main")[0].address
    assert table.lookup(main) is not None      # the section's bytes, up to the end


def damaged_unit_header(path) -> bytes:
    """`path`'s bytes with its first DWARF unit's address size set to 0."""
    data = bytearray(path.read_bytes())
    off, _size = elf_sections(path)[".debug_info"]
    version = int.from_bytes(data[off + 4:off + 6], "little")
    data[off + (7 if version >= 5 else 10)] = 0       # after unit_type / abbrev offset
    return bytes(data)


def test_damaged_dwarf_lists_the_functions_and_says_so_once(tmp_path):
    """`list -v` of a file whose DWARF unit header is damaged: pyelftools
    asserted (AssertionError: 0, a traceback); now every function is
    listed, without parameters, and one line says why."""
    copy = write_copy(tmp_path, "args", damaged_unit_header(build("args", flags=O2_NOFP)))
    status, out, err = run_main(["list", "-v", copy, "mix"])
    assert (status, out) == (0, f"uprobe:{copy}:mix\n")
    assert err == (f"ustack: {copy}: its DWARF is damaged (AssertionError: 0): parameters "
                   "cannot be read from it (not shown for 1 function)\n")


def test_damaged_dwarf_refuses_an_argument_by_name_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(process, "launch", lambda *a, **k: pytest.fail("a command started"))
    copy = write_copy(tmp_path, "args", damaged_unit_header(build("args", flags=O2_NOFP)))
    status, _out, err = run_main(["trace", "-c", "/bin/true", f"uprobe:{copy}:mix buf"])
    assert (status, err) == (1, f"ustack: cannot fetch buf: {copy}: its DWARF is damaged "
                                "(AssertionError: 0): parameters cannot be read from it; "
                                "fetch by register instead: $arg1…$arg6 in the C ABI\n")


def test_a_usdt_note_whose_size_runs_past_its_section(tmp_path):
    """A note's descsz of 0xffffff00: pyelftools sought past the file
    (ValueError, a traceback from `list`)."""
    lib = build("usdt_lib", flags=O2_NOFP, kind="shared")
    data = bytearray(lib.read_bytes())
    off, _size = elf_sections(lib)[".note.stapsdt"]
    data[off + 4:off + 8] = (0xffffff00).to_bytes(4, "little")        # the first descsz
    copy = write_copy(tmp_path, "usdt_lib.so", bytes(data))
    status, _out, err = run_main(["list", copy])
    assert (status, err) == (1, f"ustack: {copy}: a damaged USDT note (its sizes run past "
                                ".note.stapsdt's end)\n")


def test_a_dwarf_section_larger_than_the_file_is_damage_not_a_memory_error(tmp_path):
    """.debug_info's sh_size set to 2**62: pyelftools read the section into
    a buffer of that size (MemoryError, a traceback from `list -v`)."""
    from elftools.elf.elffile import ELFFile
    binary = build("args", flags=O2_NOFP)
    data = bytearray(binary.read_bytes())
    with open(binary, "rb") as f:
        elf = ELFFile(f)
        index = next(i for i, s in enumerate(elf.iter_sections()) if s.name == ".debug_info")
        header = elf.header.e_shoff + index * elf.header.e_shentsize
    data[header + 32:header + 40] = (1 << 62).to_bytes(8, "little")    # sh_size
    copy = write_copy(tmp_path, "args", bytes(data))
    status, out, err = run_main(["list", "-v", copy, "mix"])
    assert (status, out) == (0, f"uprobe:{copy}:mix\n")
    assert err == (f"ustack: {copy}: its DWARF is damaged (ValueError: .debug_info runs "
                   "past the end of the file): parameters cannot be read from it (not "
                   "shown for 1 function)\n")
