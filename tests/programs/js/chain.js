// chain.js [MS]: outer() -> middle() -> leaf() for MS ms of CPU time (default
// 1500), each level doing work of its own, so samples land in all three.
function leaf(n) { let s = 0; for (let i = 0; i < n; i++) { s += Math.sqrt(i) * i % 7; } return s; }
function middle(n) { let s = 0; for (let i = 0; i < 8; i++) { s += leaf(n) % 3; } return s; }
// the CPU time (ms) the process used since `start`: it works as long
// however loaded the machine is, and a profile sees as many samples
function cpuMs(start) { const d = process.cpuUsage(start); return (d.user + d.system) / 1000; }
function outer(ms) { let t = 0; const start = process.cpuUsage(); while (cpuMs(start) < ms) { t += middle(4000); } return t; }
console.log(outer(Number(process.argv[2] || 1500)) > 0 ? "ok" : "no");
