// spin.js [MS]: outer() calls inner() for MS milliseconds of CPU time (default 1500):
// hot JS frames for `node --perf-basic-prof`, whose stacks run through V8's
// builtins (code in node's text without CFI) down to main and _start.
function inner(n) { let s = 0; for (let i = 0; i < n; i++) { s += Math.sqrt(i) * i % 7; } return s; }
// the CPU time (ms) the process used since `start`: it works as long
// however loaded the machine is, and a profile sees as many samples
function cpuMs(start) { const d = process.cpuUsage(start); return (d.user + d.system) / 1000; }
function outer(ms) { let t = 0; const start = process.cpuUsage(); while (cpuMs(start) < ms) { t += inner(20000); } return t; }
console.log(outer(Number(process.argv[2] || 1500)) > 0 ? "ok" : "no");
