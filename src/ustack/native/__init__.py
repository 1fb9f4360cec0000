"""Bindings to C libraries through ctypes (libdw, libelf, libdeflate, the
dynamic loader): with kernel/, the only place ctypes appears. Each binding
loads its library on first use and answers None where it is missing, so
ustack falls back to its Python readers."""
