# A Perl script that waits and allocates with a known call chain: a() ->
# b() -> Work::c(), which sleeps a millisecond (select in libc) and keeps
# a new 64 KiB string (malloc), ARGV[0] times. It starts once a line (or
# the end) comes on stdin, says "done" on stdout when the calls are over,
# and exits at the end of stdin (its blocks still held).
use strict;
use warnings;

package Work;

my @kept;

sub c {
    select(undef, undef, undef, 0.001);
    push @kept, "x" x 65536;
}

package main;

sub b { Work::c() }

sub a { b() for 1 .. $_[0] }

$| = 1;
my $go = <STDIN>;
a($ARGV[0] // 100);
print "done\n";
1 while <STDIN>;
