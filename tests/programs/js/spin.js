// spin.js [MS]: outer() calls inner() for MS milliseconds (default 1500):
// hot JS frames for `node --perf-basic-prof`, whose stacks run through V8's
// builtins (code in node's text without CFI) down to main and _start.
function inner(n) { let s = 0; for (let i = 0; i < n; i++) { s += Math.sqrt(i) * i % 7; } return s; }
function outer(ms) { let t = 0; const end = Date.now() + ms; while (Date.now() < end) { t += inner(20000); } return t; }
console.log(outer(Number(process.argv[2] || 1500)) > 0 ? "ok" : "no");
