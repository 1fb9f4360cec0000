import java.lang.management.ManagementFactory;
import java.lang.management.ThreadMXBean;

// JavaMix [SECONDS]: a mix of methods of different weights, called from a
// few callers, for SECONDS of its CPU time (default 4); the second half
// also runs methods never called before (compiled while it is profiled).
// Prints "started" at once, "ok" at the end.
public class JavaMix {
    static double roots(int n) {
        double s = 0;
        for (int i = 0; i < n; i++) { s += Math.sqrt(i + s); }
        return s;
    }
    static long hashes(int n) {
        long h = 1125899906842597L;
        for (int i = 0; i < n; i++) { h = 31 * h + (i ^ (h >>> 7)); }
        return h;
    }
    static double sines(int n) {
        double s = 0;
        for (int i = 0; i < n; i++) { s += Math.sin(i * 0.001); }
        return s;
    }
    static int text(int n) {
        StringBuilder b = new StringBuilder();
        for (int i = 0; i < n / 8; i++) { b.append(i % 10); }
        return b.toString().hashCode();
    }
    static long sorts(int n) {
        int[] a = new int[n / 4];
        for (int i = 0; i < a.length; i++) { a[i] = (i * 7919) % 1009; }
        java.util.Arrays.sort(a);
        return a[a.length / 2];
    }
    // the second half's
    static double lateLogs(int n) {
        double s = 0;
        for (int i = 1; i < n; i++) { s += Math.log(i); }
        return s;
    }
    static long lateMix(int n) {
        long h = 7;
        for (int i = 0; i < n; i++) { h = h * 1103515245L + 12345L + (h >>> 11); }
        return h;
    }
    static double work(int round, boolean late) {
        double t = roots(3000) + hashes(20000) + sines(600) + text(4000);
        if (round % 2 == 0) { t += sorts(8000); }
        if (late) { t += lateLogs(1500) + lateMix(20000); }
        return t;
    }
    public static void main(String[] args) {
        double seconds = args.length > 0 ? Double.parseDouble(args[0]) : 4;
        System.out.println("started");
        System.out.flush();
        ThreadMXBean cpu = ManagementFactory.getThreadMXBean();
        long start = cpu.getCurrentThreadCpuTime();
        long half = start + (long) (seconds * 0.5e9), end = start + (long) (seconds * 1e9);
        double t = 0;
        boolean late = false;
        for (int round = 1; round % 16 != 0 || (late = cpu.getCurrentThreadCpuTime() >= half)
                && cpu.getCurrentThreadCpuTime() < end || !late; round++) {
            t += work(round, late);
        }
        System.out.println(t != 0 ? "ok" : "no");
    }
}
