# A Ruby script that waits and allocates with a known call chain: <main>
# -> a -> b -> Worker#c, where c sleeps a millisecond (ppoll in libc) and
# keeps a new 64 KiB string (malloc), ARGV[0] times. It starts once a
# line (or the end) comes on stdin, says "done" on stdout when the calls
# are over, and exits at the end of stdin (its blocks still held).
class Worker
  def initialize
    @kept = []
  end

  def c
    sleep(0.001)
    @kept << "x" * 65_536
  end
end

def b(w)
  w.c
end

def a(w, times)
  times.times { b(w) }
end

w = Worker.new
$stdin.gets
a(w, Integer(ARGV[0] || "100"))
$stdout.write("done\n")
$stdout.flush
$stdin.read
