"""The numbers a user can override on the command line, in one place: the
CLI shows them in --help, the captures use them when not told otherwise."""

DEFAULT_BUFFER_PAGES = 1024        # perf/ftrace ring buffer pages per CPU (4 MiB)
# A stack copy per sample (8 KiB by default) fills buffers 100x faster than
# a callchain: 32 MiB per CPU holds a burst of ~4000 samples.
DWARF_BUFFER_PAGES = 8192
BPF_BUFFER_PAGES = 256             # in-kernel counting: only tracking records
DEFAULT_STACK_SIZE = 8192          # user stack bytes copied per sample
MAX_STACK_SIZE = 65528             # the kernel's limit (u16 record size)
DEFAULT_STACK_STORAGE = 16384      # BPF stack map entries, bcc's default
DEFAULT_PROFILE_HZ = 49            # profile -F, and record without an EVENT
DEFAULT_RECORDING = "ustack.data"  # record -o / report FILE, as perf.data is perf's
# How long a report of a recording may wait, in all, for debug files asked
# of debuginfod servers (a live run never waits: its events would be lost).
REPORT_DEBUGINFOD_WAIT_S = 60.0
