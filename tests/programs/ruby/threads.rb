# Two Ruby threads beside the main one, each running worker -> spin until
# it has used SECONDS of its own CPU (the first argument): the threads'
# frames are found through the VM's thread list.
def spin(n)
  x = 0
  i = 0
  while i < n
    x += i
    i += 1
  end
  x
end

def worker(seconds)
  start = Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID)
  spin(10_000) while Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID) - start < seconds
end

seconds = Float(ARGV[0] || "0.5")
threads = 2.times.map { Thread.new { worker(seconds) } }
worker(seconds)
threads.each(&:join)
