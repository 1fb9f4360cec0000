# required by requires.pl: its top level calls go(), which spins
package Spin;

sub go {
    my $x = 0;
    for my $i (1 .. 20000) { $x += $i * 2 }
    return $x;
}

go() for 1 .. ($ENV{SPIN_ROUNDS} // 1000);
1;
