// gonow [N]: main.main -> main.clock, which calls time.Now N times
// (default 2,000,000). time.Now reads the clock through the vDSO on the
// thread's system stack (g0): its frames above that switch live on the
// goroutine's stack, away from the stack pointer.
package main

import (
	"os"
	"strconv"
	"time"
)

//go:noinline
func clock(n int) int64 {
	var s int64
	for i := 0; i < n; i++ {
		s += time.Now().UnixNano() & 1
	}
	return s
}

func main() {
	n := 2000000
	if len(os.Args) > 1 {
		v, err := strconv.Atoi(os.Args[1])
		if err != nil {
			os.Exit(2)
		}
		n = v
	}
	if clock(n) == -1 {
		os.Exit(9)
	}
}
