# Two ithreads each run a() -> b() -> Work::c(), which spins, ARGV[0]
# times (-1: until killed) while the main thread waits to join them;
# "ready" once both run.
use strict;
use warnings;
use threads;
use threads::shared;

package Work;

sub c {
    my $x = 0;
    for my $i (1 .. 20000) { $x += $i * 2 }
    return $x;
}

package main;

sub b { return Work::c() }

sub a {
    my ($n, $running) = @_;
    { lock($$running); $$running++; cond_signal($$running); }
    while ($n--) { b() }
    return 0;
}

$| = 1;
my $n = $ARGV[0] // -1;
my $running :shared = 0;
my @workers = map { threads->create(\&a, $n, \$running) } 1 .. 2;
{ lock($running); cond_wait($running) while $running < 2; }
print "ready\n";
$_->join for @workers;
