// gochain [N] [write]: main.main -> main.a -> main.b -> (*main.T).c -> main.d,
// with main.d called N times (default 3). With "write", main.d makes exactly
// one write(2) to stdout per call (syscall.Write, not os.Stdout, so no
// poller or buffering is involved); tests redirect stdout to /dev/null.
package main

import (
	"os"
	"strconv"
	"syscall"
)

var counter int64
var doWrite bool
var buf = []byte("x")

type T struct{ n int }

//go:noinline
func d(i int) int {
	counter++
	if doWrite {
		syscall.Write(1, buf)
	}
	return i
}

//go:noinline
func (t *T) c() int {
	sum := 0
	for i := 0; i < t.n; i++ {
		sum += d(i)
	}
	return sum + 1
}

//go:noinline
func b(n int) int {
	t := &T{n: n}
	return t.c() + 1
}

//go:noinline
func a(n int) int { return b(n) + 1 }

func main() {
	n := 3
	if len(os.Args) > 1 {
		v, err := strconv.Atoi(os.Args[1])
		if err != nil {
			os.Exit(2)
		}
		n = v
	}
	doWrite = len(os.Args) > 2 && os.Args[2] == "write"
	a(n)
	if counter != int64(n) {
		os.Exit(3)
	}
}
