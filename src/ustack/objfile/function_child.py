"""The child that builds a big object's functions (objfile/function_builder.py
started it through objfile/builders.py) and writes them to the image
cache, where the run reads them: `python -m ustack.objfile.function_child PATH`."""
from __future__ import annotations

import sys


def main() -> None:
    from ..model import UstackError
    from . import builder_child
    from .elf import ElfImage
    builder_child.become_builder(("functions", sys.argv[1]))
    try:
        ElfImage.open(sys.argv[1]).symbols.functions    # parsed, and the cache written
    except UstackError:
        sys.exit(1)


if __name__ == "__main__":
    main()
