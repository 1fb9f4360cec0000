"""Old import path of the kernel-frame source, kept because bpf_session.py
imports KernelSymbols from here; new code imports symbols.kernel."""
from .kernel import KERNEL_MODULE, KernelSymbols  # noqa: F401
