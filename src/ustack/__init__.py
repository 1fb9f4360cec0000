"""ustack: user-space call stacks of Linux processes."""
__version__ = "0.1.0"
