// goleaf [MS]: main.main -> main.work -> main.leaf for MS milliseconds
// (default 1000). leaf is a frameless leaf: it calls nothing and keeps
// nothing on the stack, so Go gives it no frame and rbp still holds work's
// while it runs: a frame-pointer walk from inside leaf skips work.
package main

import (
	"os"
	"strconv"
	"time"
)

//go:noinline
func leaf(n int) int {
	s := 0
	for i := 0; i < n; i++ {
		s += i ^ (s >> 3)
	}
	return s
}

//go:noinline
func work(ms int) int {
	deadline := time.Now().Add(time.Duration(ms) * time.Millisecond)
	t := 0
	for time.Now().Before(deadline) {
		t += leaf(1 << 16)
	}
	return t
}

func main() {
	ms := 1000
	if len(os.Args) > 1 {
		v, err := strconv.Atoi(os.Args[1])
		if err != nil {
			os.Exit(2)
		}
		ms = v
	}
	if work(ms) == 42 {
		os.Exit(9)
	}
}
