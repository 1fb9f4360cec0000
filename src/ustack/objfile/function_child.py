"""The child that builds an object's functions (objfile/function_builder.py
started it through objfile/builders.py) and writes them to the image
cache, where the run reads them: `python -m ustack.objfile.function_child
PATH` for one big object, or `python -m ustack.objfile.function_child
--jobs` for the run's long-lived one, fed objects one at a time
(builder_child.serve)."""
from __future__ import annotations

import sys


def build(args: list) -> None:
    """The functions of the object at args[0] built into the image cache,
    under that object's builder lock."""
    from ..model import UstackError
    from . import builder_child
    from .elf import ElfImage
    with builder_child.building(("functions", args[0])):
        try:
            ElfImage.open(args[0]).symbols.functions    # parsed, and the cache written
        except UstackError:
            pass
        finally:        # what a child of its own returns by ending
            ElfImage.clear_cache()


def main() -> None:
    from ..model import UstackError
    from . import builder_child
    from .elf import ElfImage
    if sys.argv[1:] == ["--jobs"]:
        builder_child.serve(build)
        return
    builder_child.become_builder(("functions", sys.argv[1]))
    try:
        ElfImage.open(sys.argv[1]).symbols.functions    # parsed, and the cache written
    except UstackError:
        sys.exit(1)


if __name__ == "__main__":
    main()
