"""Demangling (objfile/demangle.py) against binutils' c++filt, which knows
C++ (Itanium), Rust legacy and Rust v0, on every function symbol of real
binaries: cxx_throw.cpp built by g++, and a small Rust program built by
rustc with both manglings. ustack prints Rust names the way Rust's own
backtraces do, so c++filt's crate disambiguators (`core[c1f1…]`), const
generic types (`<10: usize>`) and the legacy hash (`::h0123…`) are taken
out of the oracle's text. End to end: traces show demangled names, probes
take the names people write, --no-demangle shows the linker's."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from helpers import (_cached, _run_build, build_cxx, fail_one_line, ok, parse_trace,
                     run_ustack)

from ustack.objfile.demangle import demangle, plain_name
from ustack.objfile.elf import ElfImage

# legacy: rsdemo::Wrap<T>::show; v0: <rsdemo::Wrap<alloc::vec::Vec<u64>>>::show
SHOW = r"<?rsdemo::Wrap<.*>>?::show"
RUSTC = shutil.which("rustc") or "/root/.cargo/bin/rustc"
RUST_SRC = """\
pub struct Wrap<T>(pub T);
impl<T: std::fmt::Debug> Wrap<T> {
    #[inline(never)]
    pub fn show(&self) -> usize { leaf(format!("{:?}", self.0).len() as u64) as usize }
}
#[inline(never)]
pub fn leaf(n: u64) -> u64 { std::hint::black_box(n) + 1 }
fn main() {
    let n: u64 = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(1);
    for i in 0..n { Wrap(vec![i]).show(); }
}
"""


def cxxfilt(names: list) -> list:
    if shutil.which("c++filt") is None:
        pytest.skip("c++filt is not installed (binutils): it is the oracle")
    out = subprocess.run(["c++filt"], input="\n".join(names) + "\n",
                         capture_output=True, text=True, check=True).stdout
    return out.split("\n")[:len(names)]


def function_symbols(binary) -> list:
    out = subprocess.run(["nm", "--defined-only", str(binary)], capture_output=True,
                         text=True, check=True).stdout
    return sorted({p[2] for p in (l.split() for l in out.splitlines())
                   if len(p) == 3 and p[1] in "Tt"})


def as_rust_prints(text: str) -> str:
    text = re.sub(r"\[[0-9a-f]+\]", "", text)             # crate disambiguators
    text = re.sub(r"(<-?\d+): \w+>", r"\1>", text)       # const generic types
    return re.sub(r"::h[0-9a-f]{16}$", "", text)          # legacy hash


def build_rust(mangling: str) -> Path:
    if not Path(RUSTC).exists():
        pytest.skip(f"rustc is not installed ({RUSTC} missing)")
    version = subprocess.run([RUSTC, "--version"], capture_output=True, text=True).stdout
    out, tmp = _cached("\0".join([RUST_SRC, version, mangling]), "rsdemo")
    if out.exists():
        return out
    src = tmp.parent / f"rsdemo-{tmp.stem.rsplit('.', 1)[-1]}.rs"
    src.write_text(RUST_SRC)
    # legacy is the default mangling; asking for it by name is unstable
    flags = ["-C", "symbol-mangling-version=v0"] if mangling == "v0" else []
    try:
        return _run_build([RUSTC, "-O", "-g", "-C", "force-frame-pointers=yes",
                           "--crate-name", "rsdemo", *flags, "-o", str(tmp), str(src)],
                          tmp, out)
    finally:
        src.unlink(missing_ok=True)


@pytest.fixture(scope="module")
def cxx():
    return build_cxx("cxx_throw", ("-O2", "-g", "-fno-omit-frame-pointer"))


# --- names against c++filt ----------------------------------------------------------

def test_cxx_names_like_cxxfilt(cxx):
    names = [n for n in function_symbols(cxx) if n.startswith("_Z")]
    assert "_Z4leafl" in names
    assert [demangle(n) for n in names] == cxxfilt(names)
    libstdcxx = [n for n in function_symbols("/usr/lib/x86_64-linux-gnu/libstdc++.so.6")
                 if n.startswith("_Z")] if Path("/usr/lib/x86_64-linux-gnu/libstdc++.so.6").exists() else []
    assert [demangle(n) for n in libstdcxx] == cxxfilt(libstdcxx)


@pytest.mark.parametrize("mangling", ["legacy", "v0"])
def test_rust_names_like_cxxfilt(mangling):
    prog = build_rust(mangling)
    prefix = "_R" if mangling == "v0" else "_ZN"
    names = [n for n in function_symbols(prog) if n.startswith(prefix)]
    assert len(names) > (100 if mangling == "v0" else 5)   # std itself is v0
    ours = [demangle(n) for n in names]
    assert ours == [as_rust_prints(t) for t in cxxfilt(names)]
    assert {"rsdemo::leaf", "rsdemo::main"} <= set(ours)
    assert any(re.fullmatch(SHOW, n) for n in ours), ours


def test_names_left_alone():
    """Names that are not mangled, or not validly, come back as they are
    (as c++filt leaves them); a clone suffix is named as c++filt names it."""
    for name in ["main", "_start", "runtime.main", "_Zgarbage", "_RNvXYZ"]:
        assert demangle(name) == name
    assert demangle("_ZN3foo3barEv.cold") == "foo::bar() [clone .cold]"
    assert plain_name("ns::f(long) const") == "ns::f"
    assert plain_name("leaf(long) [clone .cold]") == "leaf(long) [clone .cold]"
    assert plain_name("std::vector<int, std::allocator<int> >::push_back(int const&)") == \
        "std::vector<int, std::allocator<int> >::push_back"


def test_probe_names(cxx):
    image = ElfImage.open(cxx)
    (leaf,) = image.find("leaf")
    assert leaf.name == "_Z4leafl"
    assert image.find("leaf(long)") == image.find("_Z4leafl") == [leaf]
    assert {s.name for s in image.match("f*(long)")} == {"_Z2f1l", "_Z2f2l"}


# --- end to end ------------------------------------------------------------------

@pytest.mark.kernel
@pytest.mark.parametrize("mangling", ["legacy", "v0"])
def test_trace_rust(mangling):
    prog = build_rust(mangling)
    res = ok(run_ustack("trace", f"uprobe:{prog}:rsdemo::leaf", "-c", f"{prog} 1"))
    (rec,) = parse_trace(res.stdout)
    names = [f["func"] for f in rec["frames"] if f["module"] == "rsdemo"]
    assert names[0] == "rsdemo::leaf", res.stdout
    assert re.fullmatch(SHOW, names[1]), res.stdout
    assert "rsdemo::main" in names
    raw = ok(run_ustack("trace", "--no-demangle", f"uprobe:{prog}:rsdemo::leaf",
                        "-c", f"{prog} 1"))
    (rec,) = parse_trace(raw.stdout)
    first = rec["frames"][0]["func"]
    assert first.startswith("_R" if mangling == "v0" else "_ZN") and demangle(first) == "rsdemo::leaf"


@pytest.mark.kernel
def test_trace_cxx_demangled(cxx):
    res = ok(run_ustack("trace", f"uprobe:{cxx}:leaf", "-c", f"{cxx} 1"))
    (rec,) = parse_trace(res.stdout)
    names = [f["func"] for f in rec["frames"] if f["module"] == cxx.name]
    assert names[:4] == cxxfilt(["_Z4leafl", "_Z2f2l", "_Z2f1l", "main"]), res.stdout
    raw = ok(run_ustack("trace", "--no-demangle", f"uprobe:{cxx}:leaf", "-c", f"{cxx} 1"))
    (rec,) = parse_trace(raw.stdout)
    assert [f["func"] for f in rec["frames"]][:4] == ["_Z4leafl", "_Z2f2l", "_Z2f1l", "main"]


def test_ambiguous_plain_name_is_refused(tmp_path):
    if shutil.which("g++") is None:
        pytest.skip("g++ is not installed")
    src = tmp_path / "over.cpp"
    src.write_text("int f(int a) { return a; }\nint f(long a) { return a + 1; }\n"
                   "int main() { return f(1) + f(2L); }\n")
    prog = tmp_path / "over"
    subprocess.run(["g++", "-O0", "-o", str(prog), str(src)], check=True)
    msg = fail_one_line(run_ustack("trace", f"uprobe:{prog}:f", "-c", str(prog)))
    assert msg == (f"ustack: 'f' is ambiguous in {prog}: f(int), f(long); "
                   "probe one by its full name")
    # `ustack list` shows demangled names, and takes them in globs
    res = run_ustack("list", str(prog), "f(*)")
    assert res.returncode == 0, res.stderr
    assert [l.split(None, 3)[-1] for l in res.stdout.splitlines()[1:]] == ["f(int)", "f(long)"]
