"""PHP, Perl and Ruby frames in the stacks a mode's own program unwinds
(offcpu, latency, memleak): the same passes (bpf/php.h, perl.h, ruby.h)
and maps (bpf_php, bpf_perl, bpf_ruby) as the unwinder's, made for a
counter that has UnwindObjects, whose rows find the interpreters."""
from __future__ import annotations

from .bpf_perl import PerlMaps, PerlObjects
from .bpf_php import PhpMaps, PhpObjects
from .bpf_ruby import RubyMaps, RubyObjects


def add_script_runtimes(counter, owned, *, php: bool, perl: bool, ruby: bool) -> None:
    """counter.php, .perl and .ruby for the runtimes asked for, their
    maps kept in `owned`; each registers with counter.objects (slot_of)."""
    if php:
        counter.php = PhpObjects(owned.map(PhpMaps()), objects=counter.objects)
    if perl:
        counter.perl = PerlObjects(owned.map(PerlMaps()), objects=counter.objects)
    if ruby:
        counter.ruby = RubyObjects(owned.map(RubyMaps()), objects=counter.objects)


def script_maps(counter) -> dict:
    """The maps its program names for the passes counter runs."""
    named: dict = {}
    for runtime in (counter.php, counter.perl, counter.ruby):
        if runtime is not None:
            named.update(runtime.maps.named())
    return named


def script_options(counter, prefix: str) -> dict:
    """The option bits (PREFIX_PHP, _PERL, _RUBY) of the passes it runs."""
    return {f"{prefix}_PHP": counter.php is not None,
            f"{prefix}_PERL": counter.perl is not None,
            f"{prefix}_RUBY": counter.ruby is not None}
