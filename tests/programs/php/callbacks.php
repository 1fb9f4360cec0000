<?php
// Builtins calling back into PHP: each callback runs in an executor call
// of its own (zend_call_function -> execute_ex), inside the builtin's C
// frame. cmp() asks getrusage() once per comparison: a syscall to trace.
function cmp($x, $y) {
    getrusage();
    return $x <=> $y;
}

function sorter() {
    $a = [3, 1, 2];
    usort($a, 'cmp');
    return $a;
}

class K {
    static function run() {
        return array_map(fn($v) => sorter(), [1]);
    }
}

K::run();
