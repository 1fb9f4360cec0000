// v8_mix.js [MS]: twelve JS functions of unequal weight, run for MS
// milliseconds (default 4000): string building, array sorting, object
// maps, closures, math, JSON, a regexp, recursion. Some are small enough
// for TurboFan to inline into their caller, as in real programs.
function fib(n) { return n < 2 ? n : fib(n - 1) + fib(n - 2); }
function mathWork(n) { let s = 0; for (let i = 1; i < n; i++) s += Math.sqrt(i) * Math.sin(i); return s; }
function buildString(n) { let s = ""; for (let i = 0; i < n; i++) s += String.fromCharCode(97 + i % 26); return s.length; }
function sortNumbers(n) { const a = []; for (let i = 0; i < n; i++) a.push((i * 7919) % 1009); a.sort((x, y) => x - y); return a[0]; }
function mapObjects(n) { const m = new Map(); for (let i = 0; i < n; i++) m.set("k" + (i % 500), i); return m.size; }
function jsonRoundTrip(n) { const o = []; for (let i = 0; i < n; i++) o.push({ i, s: "v" + i }); return JSON.parse(JSON.stringify(o)).length; }
function regexpScan(n) { const text = "abc123def456ghi789".repeat(n); return (text.match(/\d+/g) || []).length; }
function closures(n) { const fs = []; for (let i = 0; i < n; i++) fs.push(() => i * 2); let s = 0; for (const f of fs) s += f(); return s; }
function typedArrays(n) { const a = new Float64Array(n); for (let i = 0; i < n; i++) a[i] = i * 0.5; let s = 0; for (let i = 0; i < n; i++) s += a[i]; return s; }
function objectAlloc(n) { let last = null; for (let i = 0; i < n; i++) last = { a: i, b: [i, i + 1], c: { d: i } }; return last.a; }
function split(n) { return "a,b,c,d,e,f,g,h".repeat(n).split(",").length; }
function round(k) {
  return fib(20) + mathWork(30000 * k) + buildString(20000) + sortNumbers(20000) + mapObjects(30000)
    + jsonRoundTrip(3000) + regexpScan(2000) + closures(20000) + typedArrays(50000 * k)
    + objectAlloc(40000) + split(3000);
}
function main(ms) { let t = 0; const end = Date.now() + ms; let k = 1; while (Date.now() < end) { t += round(k); k = 3 - k; } return t; }
console.log(main(Number(process.argv[2] || 4000)) > 0 ? "ok" : "no");
