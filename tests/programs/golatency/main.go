// golatency OUT G N: G goroutines, each making N calls of main.work, each
// call in a goroutine of its own. main.work's frame is larger than a new
// goroutine's stack (its entry grows the stack through runtime.morestack,
// which runs the function's start again), then it recurses deeply (the
// stack is copied again, several times) and sleeps (the goroutine parks and
// may resume on another thread) for 4.2 ms or 17 ms, alternately (near the
// bottom of a log2 bucket: a Go call may be descheduled between its own
// clock and its RET for a ms or more on a loaded machine): every
// call moves its stack, and may change threads, between entry and return.
// Each call times itself and the program writes to OUT, in ustack
// latency's bucket labels (log2 of milliseconds):
//   calls C
//   [4ms, 8ms) N1
//   [16ms, 32ms) N2
// Exit status 0; 3 if a call returned a wrong value.
package main

import (
	"fmt"
	"math/bits"
	"os"
	"strconv"
	"sync"
	"time"
)

var sleeps = []time.Duration{4200 * time.Microsecond, 17 * time.Millisecond}

//go:noinline
func grow(n int) int {
	var buf [96]byte
	buf[n%96] = byte(n)
	if n == 0 {
		return 0
	}
	return grow(n-1) + int(buf[n%96]&1)
}

// work times itself from its first statement to its last: inside the
// window a latency probe sees (entry to RET), so only a few instructions
// at either end are not measured by both.
//go:noinline
func work(i int, took *time.Duration) int {
	start := time.Now()
	var pad [12 << 10]byte // more than a new goroutine's 8 KiB stack
	pad[i%len(pad)] = 1
	r := grow(2000) // ~250 KiB of frames: the stack is copied on the way
	time.Sleep(sleeps[i%len(sleeps)])
	r += int(pad[i%len(pad)])
	*took = time.Since(start)
	return r
}

func label(d time.Duration) string {
	ms := uint64(d / time.Millisecond)
	if ms == 0 {
		return "[0, 1ms)"
	}
	b := bits.Len64(ms) // ms in [2^(b-1), 2^b)
	return fmt.Sprintf("[%dms, %dms)", 1<<(b-1), 1<<b)
}

func main() {
	g, _ := strconv.Atoi(os.Args[2])
	n, _ := strconv.Atoi(os.Args[3])
	want := grow(2000) + 1
	var mu sync.Mutex
	counts := map[string]int{}
	bad := false
	var wg sync.WaitGroup
	for w := 0; w < g; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; i < n; i++ {
				done := make(chan struct{})
				var took time.Duration
				var r int
				go func(i int) {
					r = work(i, &took)
					close(done)
				}(w + i)
				<-done
				mu.Lock()
				counts[label(took)]++
				bad = bad || r != want
				mu.Unlock()
			}
		}(w)
	}
	wg.Wait()
	f, err := os.Create(os.Args[1])
	if err != nil {
		os.Exit(2)
	}
	fmt.Fprintf(f, "calls %d\n", g*n)
	for l, c := range counts {
		fmt.Fprintf(f, "%s %d\n", l, c)
	}
	f.Close()
	if bad {
		os.Exit(3)
	}
}
