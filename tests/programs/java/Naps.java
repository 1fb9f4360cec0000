// Naps [N [wait]]: main() -> outer() -> middle() -> nap(), which sleeps 2 ms
// in Thread.sleep, 4 naps per outer() call, N calls (default 100); prints
// "ok" at the end. Where a Java thread waits, for offcpu: each method is
// its own frame when run with CompileCommand dontinline,Naps::*. With
// `wait`: prints "ready" and reads a line of stdin before the first nap,
// and after "ok" lives until stdin ends (a tool attached by -p sees every
// nap, and reads the JVM's memory until it is done).
public class Naps {
    static void nap(int ms) throws InterruptedException { Thread.sleep(ms); }
    static void middle(int ms) throws InterruptedException {
        for (int i = 0; i < 2; i++) { nap(ms); }
    }
    static void outer(int ms) throws InterruptedException {
        for (int i = 0; i < 2; i++) { middle(ms); }
    }
    public static void main(String[] args) throws InterruptedException, java.io.IOException {
        int n = args.length > 0 ? Integer.parseInt(args[0]) : 100;
        boolean wait = args.length > 1 && args[1].equals("wait");
        java.io.BufferedReader in = new java.io.BufferedReader(
            new java.io.InputStreamReader(System.in));
        if (wait) {
            System.out.println("ready");
            in.readLine();
        }
        for (int i = 0; i < n; i++) { outer(2); }
        System.out.println("ok");
        while (wait && in.readLine() != null) { }
    }
}
