<?php
// A busy script whose call chain is known: main script -> a() -> b() ->
// Spinner::spin(), spinning until it has used argv[1] seconds of CPU
// (forever when 0), however busy the machine. With argv[2], its pid is
// written there once it is about to spin.
function cpu_seconds(): float {
    $u = getrusage();
    return $u["ru_utime.tv_sec"] + $u["ru_utime.tv_usec"] / 1e6
        + $u["ru_stime.tv_sec"] + $u["ru_stime.tv_usec"] / 1e6;
}

class Spinner {
    public function spin(float $until): int {
        $n = 0;
        while ($until == 0 || cpu_seconds() < $until) {
            for ($i = 0; $i < 2000; $i++) {
                $n = ($n + $i * $i) % 1000003;
            }
        }
        return $n;
    }
}

function b(float $until): int {
    return (new Spinner())->spin($until);
}

function a(float $until): int {
    return b($until);
}

$seconds = (float)($argv[1] ?? 1);
if (isset($argv[2])) {
    file_put_contents($argv[2], (string)getmypid());
}
a($seconds > 0 ? cpu_seconds() + $seconds : 0);
