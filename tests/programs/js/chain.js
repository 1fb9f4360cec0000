// chain.js [MS]: outer() -> middle() -> leaf() for MS milliseconds (default
// 1500), each level doing work of its own, so samples land in all three.
function leaf(n) { let s = 0; for (let i = 0; i < n; i++) { s += Math.sqrt(i) * i % 7; } return s; }
function middle(n) { let s = 0; for (let i = 0; i < 8; i++) { s += leaf(n) % 3; } return s; }
function outer(ms) { let t = 0; const end = Date.now() + ms; while (Date.now() < end) { t += middle(4000); } return t; }
console.log(outer(Number(process.argv[2] || 1500)) > 0 ? "ok" : "no");
