// goinline [N]: main.main -> main.top -> main.mid -> main.inner -> main.leaf,
// N times (default 3). mid and inner are small enough for the compiler to
// inline them into top (the call sites are marked CALL-MID and CALL-INNER),
// so a pc in top can stand for three functions. leaf is never inlined:
// a uprobe on it sees top's return address inside the inlined inner.
package main

import (
	"os"
	"strconv"
)

var counter int

//go:noinline
func leaf(i int) int {
	counter++
	return i * 2
}

func inner(i int) int {
	return leaf(i) + 1 // CALL-LEAF
}

func mid(i int) int {
	return inner(i) + 2 // CALL-INNER
}

//go:noinline
func top(i int) int {
	return mid(i) + 3 // CALL-MID
}

func main() {
	n := 3
	if len(os.Args) > 1 {
		if v, err := strconv.Atoi(os.Args[1]); err == nil {
			n = v
		}
	}
	for i := 0; i < n; i++ {
		top(i)
	}
	if counter != n {
		os.Exit(3)
	}
}
