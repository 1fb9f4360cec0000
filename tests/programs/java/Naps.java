// Naps [N]: main() -> outer() -> middle() -> nap(), which sleeps 2 ms in
// Thread.sleep, 4 naps per outer() call, N calls (default 100); prints
// "ok" at the end. Where a Java thread waits, for offcpu: each method is
// its own frame when run with CompileCommand dontinline,Naps::*.
public class Naps {
    static void nap(int ms) throws InterruptedException { Thread.sleep(ms); }
    static void middle(int ms) throws InterruptedException {
        for (int i = 0; i < 2; i++) { nap(ms); }
    }
    static void outer(int ms) throws InterruptedException {
        for (int i = 0; i < 2; i++) { middle(ms); }
    }
    public static void main(String[] args) throws InterruptedException {
        int n = args.length > 0 ? Integer.parseInt(args[0]) : 100;
        for (int i = 0; i < n; i++) { outer(2); }
        System.out.println("ok");
    }
}
