"""Reading object files (ELF symbols, segments, bytes). A base layer like
`model` and `kernel`: every stage may use it, it imports no stage."""
