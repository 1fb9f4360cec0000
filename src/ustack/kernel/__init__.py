"""The only package that talks to the kernel: perf_event_open, tracefs, procfs.

Every stage may use it, like `model`; it imports no stage."""
