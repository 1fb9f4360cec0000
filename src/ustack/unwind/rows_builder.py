"""The child that builds big objects' CFI tables and in-kernel rows
(unwind/tables.for_image started it through objfile/builders.py) and
writes both to the cache, where the run reads them:
`python -m ustack.unwind.rows_builder PATH [DEBUG_DIR ...]` for one
object, or `python -m ustack.unwind.rows_builder --jobs` for the run's
long-lived one, fed objects one at a time (builder_child.serve)."""
from __future__ import annotations

import sys


def build(args: list) -> None:
    """The rows of the object at args[0] (args[1:]: its debug directories)
    built into the cache, under that object's builder lock."""
    from ..model import UstackError
    from ..objfile import builder_child
    from ..objfile.elf import ElfImage
    from . import tables
    with builder_child.building(("rows", *args)):
        try:
            tables.for_image(ElfImage.open(args[0]), tuple(args[1:]))
        except UstackError:
            pass
        finally:        # what a child of its own returns by ending (libLLVM's table: ~100 MB)
            from .cfi import UnwindTable
            UnwindTable.clear_cache()
            ElfImage.clear_cache()


def main() -> None:
    from ..model import UstackError
    from ..objfile import builder_child
    from ..objfile.elf import ElfImage
    from . import tables
    if sys.argv[1:] == ["--jobs"]:
        builder_child.serve(build)
        return
    builder_child.become_builder(("rows", sys.argv[1], *sys.argv[2:]))
    try:
        tables.for_image(ElfImage.open(sys.argv[1]), tuple(sys.argv[2:]))
    except UstackError:
        sys.exit(1)


if __name__ == "__main__":
    main()
