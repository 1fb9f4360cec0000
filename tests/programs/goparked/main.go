// goparked: main.main -> main.outer -> main.inner blocked in read(2) on
// stdin (syscall.Read: no poller), for `ustack dump`. Prints "line" for
// each line read; exits at the end of stdin.
package main

import (
	"os"
	"syscall"
)

var buf = make([]byte, 256)

//go:noinline
func inner() int {
	n, _ := syscall.Read(0, buf)
	return n
}

//go:noinline
func outer() int {
	total := 0
	for inner() > 0 {
		os.Stdout.WriteString("line\n")
		total++
	}
	return total
}

func main() {
	outer()
}
