import java.nio.ByteBuffer;
import java.util.ArrayList;

// Leaks [SECONDS]: main() -> outer() -> middle() -> leak(), which keeps a
// 4 KiB direct ByteBuffer (malloc'd by the JVM, never freed), 4 per
// outer() call, one call every 10 ms for SECONDS of the clock (default
// 600); prints "ready" before the first. For memleak: each method is its
// own frame when run with CompileCommand dontinline,Leaks::*.
public class Leaks {
    static final ArrayList<ByteBuffer> kept = new ArrayList<>();
    static void leak() { kept.add(ByteBuffer.allocateDirect(4096)); }
    static void middle() { for (int i = 0; i < 2; i++) { leak(); } }
    static void outer() { for (int i = 0; i < 2; i++) { middle(); } }
    public static void main(String[] args) throws InterruptedException {
        double seconds = args.length > 0 ? Double.parseDouble(args[0]) : 600;
        long end = System.nanoTime() + (long) (seconds * 1e9);
        System.out.println("ready");
        while (System.nanoTime() < end) {
            outer();
            Thread.sleep(10);
        }
        System.out.println("ok " + kept.size());
    }
}
