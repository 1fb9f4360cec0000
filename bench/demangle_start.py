"""The first C++ name's cost: the cxxfilt package (its import runs
`ldconfig -p` twice, through ctypes.util.find_library, for libc and
libstdc++) against native/cxxabi.py (libstdc++ opened by its soname).
Each in a fresh process, alternated; wall time of import + one demangle.

    python bench/demangle_start.py [RUNS]"""
from __future__ import annotations

import os
import statistics
import subprocess
import sys

SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")
TIMED = ("import time; t = time.perf_counter(); {}; "
         "print((time.perf_counter() - t) * 1000)")
WAYS = {
    "cxxfilt (import + demangle)": "import cxxfilt; cxxfilt.demangle('_Z4leafl')",
    "native/cxxabi (import + demangle)":
        "from ustack.native.cxxabi import cxa_demangle; cxa_demangle(b'_Z4leafl')",
}


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    env = dict(os.environ, PYTHONPATH=SRC)
    times: dict = {way: [] for way in WAYS}
    for _ in range(runs):
        for way, code in WAYS.items():
            out = subprocess.run([sys.executable, "-c", TIMED.format(code)], env=env,
                                 capture_output=True, text=True, check=True).stdout
            times[way].append(float(out))
    for way, ms in times.items():
        print(f"| {way} | {statistics.median(ms):.1f} | {min(ms):.1f} | {max(ms):.1f} |")


if __name__ == "__main__":
    main()
