# loader() requires Spin.pm, whose top level spins in Spin::go():
# SPIN_ROUNDS calls of it
use strict;
use warnings;
use FindBin;
use lib $FindBin::Bin;

sub loader {
    require Spin;
}

loader();
