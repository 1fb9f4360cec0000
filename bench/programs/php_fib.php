<?php
// Recursive fib for argv[1] seconds: ~20 PHP frames deep, the PHP walk's
// counterpart of the Python walk's recursive fib (bench/php_frames.py).
function f(int $n): int {
    return $n < 2 ? $n : f($n - 1) + f($n - 2);
}

$end = microtime(true) + (float)($argv[1] ?? 2);
while (microtime(true) < $end) {
    f(18);
}
