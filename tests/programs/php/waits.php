<?php
// A PHP script that waits and allocates with a known call chain: main
// script -> a() -> b() -> Waiter::wait(), which sleeps a millisecond
// (usleep in libc) and keeps a new 64 KiB string, argv[1] times. It starts once a line (or the
// end) comes on stdin, says "done" on stdout when the calls are over, and
// exits at the end of stdin (its blocks still held).
class Waiter {
    public array $kept = [];

    public function wait(): void {
        usleep(1000);
        $this->kept[] = str_repeat("x", 65536);
    }
}

function b(Waiter $w): void {
    $w->wait();
}

function a(Waiter $w, int $times): void {
    for ($i = 0; $i < $times; $i++) {
        b($w);
    }
}

$w = new Waiter();
fgets(STDIN);
a($w, (int)($argv[1] ?? 100));
echo "done\n";
fflush(STDOUT);
stream_get_contents(STDIN);
