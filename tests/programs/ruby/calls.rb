# A busy Ruby script with a known call chain: <main> -> a -> block in a ->
# b -> Worker#c, c spinning. Runs until it has used SECONDS of CPU (the
# first argument), so a loaded machine changes nothing but the wall time;
# says "ready" on stdout once the chain is running.
class Worker
  def c(n)
    x = 0
    i = 0
    while i < n
      x += i * i
      i += 1
    end
    x
  end
end

def b(w)
  w.c(20_000)
end

def a(w, seconds)
  loop do
    b(w)
    break if Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID) >= seconds
  end
end

w = Worker.new
b(w)
$stdout.write("ready\n")
$stdout.flush
a(w, Float(ARGV[0] || "1"))
