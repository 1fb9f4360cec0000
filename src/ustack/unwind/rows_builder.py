"""The child that builds a big object's CFI table and in-kernel rows
(unwind/tables.for_image started it through objfile/builders.py) and
writes both to the cache, where the run reads them:
`python -m ustack.unwind.rows_builder PATH [DEBUG_DIR ...]`."""
from __future__ import annotations

import sys


def main() -> None:
    from ..model import UstackError
    from ..objfile import builders
    from ..objfile.elf import ElfImage
    from . import tables
    builders.become_builder(("rows", sys.argv[1], *sys.argv[2:]))
    try:
        tables.for_image(ElfImage.open(sys.argv[1]), tuple(sys.argv[2:]))
    except UstackError:
        sys.exit(1)


if __name__ == "__main__":
    main()
