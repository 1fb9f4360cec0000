"""ustack: user-space call stacks of Linux processes.

Scripts use the same stream the `ustack` command does:

    from ustack import Options, Session
    with Session(Options(command="trace", events=["syscall:write"],
                         cmdline="ls")) as run:
        for event in run.events():
            print(event.comm, [f.function for f in event.stack.frames])
"""

__version__ = "0.1.0"
__all__ = ["Options", "Session", "Event", "UstackError"]


def __getattr__(name: str):
    # lazy: `ustack --help` should not pay for importing every stage
    if name == "Options":
        from .options import Options
        return Options
    if name in ("Session", "Event"):
        from . import session
        return getattr(session, name)
    if name == "UstackError":
        from .model import UstackError
        return UstackError
    raise AttributeError(name)
