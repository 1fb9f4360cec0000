// goargs [N]: main.work(i, 100+i, -5-i, i%2 == 0) called N times (default 3),
// for arguments by name from Go's DWARF (register ABI: AX, BX, CX, DI) and
// $argN in stripped binaries. Waits for a line on stdin first when
// started with "-" as its second argument, as the C programs do.
package main

import (
	"bufio"
	"os"
	"strconv"
)

var sink int64

//go:noinline
func work(i int, count int64, delta int32, even bool) int64 {
	if even {
		sink += int64(delta)
	}
	return int64(i) + count
}

func main() {
	n := 3
	if len(os.Args) > 1 {
		if v, err := strconv.Atoi(os.Args[1]); err == nil {
			n = v
		}
	}
	if len(os.Args) > 2 && os.Args[2] == "-" {
		if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
			os.Exit(4)
		}
	}
	for i := 0; i < n; i++ {
		sink += work(i, int64(100+i), int32(-5-i), i%2 == 0)
	}
}
