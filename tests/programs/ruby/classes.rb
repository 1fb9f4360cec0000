# Methods of a nested class: <main> -> Outer::Inner.build (a singleton
# method) -> Outer::Inner#run, which spins until the process has used
# ARGV[0] seconds of CPU.
module Outer
  class Inner
    def self.build(seconds)
      new.run(seconds)
    end

    def run(seconds)
      x = 0
      x += 1 while Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID) < seconds
      x
    end
  end
end

Outer::Inner.build(Float(ARGV[0] || "1"))
