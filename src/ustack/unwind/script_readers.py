"""The ScriptLive of a run (unwind/script_live.py) with a reader for each
runtime whose names table the capture made active: the one place that
knows all three readers (ruby_live, php_live, perl_live), which
script_live itself does not import."""
from __future__ import annotations

from .script_live import ScriptLive


def live_runtimes(ruby_iseqs=None, php_functions=None, perl_subs=None) -> ScriptLive | None:
    """A ScriptLive for the runtimes whose names tables a capture made
    active (its stacks carry their words), or None when none is."""
    runtimes: list = []
    if ruby_iseqs is not None and ruby_iseqs.active and ruby_iseqs.live:
        from .ruby_live import RubyLive
        runtimes.append(RubyLive(ruby_iseqs))
    if php_functions is not None and php_functions.active:
        from .php_live import PhpLive
        runtimes.append(PhpLive(php_functions))
    if perl_subs is not None and perl_subs.active:
        from .perl_live import PerlLive
        runtimes.append(PerlLive(perl_subs))
    return ScriptLive(runtimes) if runtimes else None
