# a() -> b() -> Work::c(), which spins; or with "sort", a() -> b() ->
# Work::d(), whose sort block calls Work::weigh() (a run loop of its own).
# The chain runs ARGV[0] times (-1: until killed); "ready" once running.
use strict;
use warnings;

package Work;

sub c {
    my $x = 0;
    for my $i (1 .. 20000) { $x += $i * 2 }
    return $x;
}

sub weigh {
    my $w = 0;
    for my $i (1 .. 200) { $w += $i }
    return $w;
}

sub d {
    my @sorted = sort { weigh() <=> weigh() or $a <=> $b } 1 .. 50;
    return scalar @sorted;
}

package main;

my $sorting = ($ARGV[1] // "") eq "sort";

sub b { return $sorting ? Work::d() : Work::c() }

sub a { return b() }

$| = 1;
my $n = $ARGV[0] // -1;
print "ready\n";
while ($n--) { a() }
