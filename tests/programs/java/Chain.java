import java.lang.management.ManagementFactory;
import java.lang.management.ThreadMXBean;

// Chain [SECONDS]: main() -> outer() -> middle() -> leaf() in a busy loop
// for SECONDS of its CPU time (default 2), each level doing work of its own; prints "ready"
// after its first 20,000 calls of outer(), then "ok" at the end.
public class Chain {
    static double leaf(int n) {
        double s = 0;
        for (int i = 0; i < n; i++) { s += Math.sqrt(i) * i % 7; }
        return s;
    }
    static double middle(int n) {
        double s = 0;
        for (int i = 0; i < 4; i++) { s += leaf(n) % 3; }
        return s;
    }
    static double outer(int n) {
        double t = 0;
        for (int i = 0; i < 4; i++) { t += middle(n) % 5; }
        return t;
    }
    public static void main(String[] args) {
        double seconds = args.length > 0 ? Double.parseDouble(args[0]) : 2;
        // the thread's CPU time, not the clock's: on a loaded machine it
        // still works as long, and a profile sees as many samples
        ThreadMXBean cpu = ManagementFactory.getThreadMXBean();
        long end = cpu.getCurrentThreadCpuTime() + (long) (seconds * 1e9);
        double t = 0;
        for (long calls = 1; calls % 16 != 0 || cpu.getCurrentThreadCpuTime() < end; calls++) {
            t += outer(100);
            if (calls == 20000) { System.out.println("ready"); }
        }
        System.out.println(t > 0 ? "ok" : "no");
    }
}
