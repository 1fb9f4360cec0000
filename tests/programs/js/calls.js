// calls.js [MS]: first() -> second() -> third() for MS ms of CPU time
// (default 1500), each doing work of its own. Each body is too large for
// TurboFan to inline into its caller (its unused branch alone is over 460
// bytecode bytes), so node with default flags keeps the three as frames.
function third(n) {
  let s = 0;
  for (let i = 0; i < n; i++) { s += Math.sqrt(i) * i % 7; }
  if (n < 0) { s += n * 1 % 2; s += n * 2 % 3; s += n * 3 % 4; s += n * 4 % 5; s += n * 5 % 6; s += n * 6 % 7; s += n * 7 % 8; s += n * 8 % 9; s += n * 9 % 10; s += n * 10 % 11; s += n * 11 % 12; s += n * 12 % 13; s += n * 13 % 14; s += n * 14 % 15; s += n * 15 % 16; s += n * 16 % 17; s += n * 17 % 18; s += n * 18 % 19; s += n * 19 % 20; s += n * 20 % 21; s += n * 21 % 22; s += n * 22 % 23; s += n * 23 % 24; s += n * 24 % 25; s += n * 25 % 26; s += n * 26 % 27; s += n * 27 % 28; s += n * 28 % 29; s += n * 29 % 30; s += n * 30 % 31; s += n * 31 % 32; s += n * 32 % 33; s += n * 33 % 34; s += n * 34 % 35; s += n * 35 % 36; s += n * 36 % 37; s += n * 37 % 38; s += n * 38 % 39; s += n * 39 % 40; s += n * 40 % 41; s += n * 41 % 42; s += n * 42 % 43; s += n * 43 % 44; s += n * 44 % 45; s += n * 45 % 46; s += n * 46 % 47; s += n * 47 % 48; s += n * 48 % 49; s += n * 49 % 50; s += n * 50 % 51; s += n * 51 % 52; s += n * 52 % 53; s += n * 53 % 54; s += n * 54 % 55; s += n * 55 % 56; s += n * 56 % 57; s += n * 57 % 58; s += n * 58 % 59; s += n * 59 % 60; s += n * 60 % 61; }
  return s;
}
function second(n) {
  let s = 0;
  for (let i = 0; i < 8; i++) { s += third(n) % 3; }
  if (n < 0) { s += n * 1 % 2; s += n * 2 % 3; s += n * 3 % 4; s += n * 4 % 5; s += n * 5 % 6; s += n * 6 % 7; s += n * 7 % 8; s += n * 8 % 9; s += n * 9 % 10; s += n * 10 % 11; s += n * 11 % 12; s += n * 12 % 13; s += n * 13 % 14; s += n * 14 % 15; s += n * 15 % 16; s += n * 16 % 17; s += n * 17 % 18; s += n * 18 % 19; s += n * 19 % 20; s += n * 20 % 21; s += n * 21 % 22; s += n * 22 % 23; s += n * 23 % 24; s += n * 24 % 25; s += n * 25 % 26; s += n * 26 % 27; s += n * 27 % 28; s += n * 28 % 29; s += n * 29 % 30; s += n * 30 % 31; s += n * 31 % 32; s += n * 32 % 33; s += n * 33 % 34; s += n * 34 % 35; s += n * 35 % 36; s += n * 36 % 37; s += n * 37 % 38; s += n * 38 % 39; s += n * 39 % 40; s += n * 40 % 41; s += n * 41 % 42; s += n * 42 % 43; s += n * 43 % 44; s += n * 44 % 45; s += n * 45 % 46; s += n * 46 % 47; s += n * 47 % 48; s += n * 48 % 49; s += n * 49 % 50; s += n * 50 % 51; s += n * 51 % 52; s += n * 52 % 53; s += n * 53 % 54; s += n * 54 % 55; s += n * 55 % 56; s += n * 56 % 57; s += n * 57 % 58; s += n * 58 % 59; s += n * 59 % 60; s += n * 60 % 61; }
  return s;
}
function first(ms) {
  let t = 0;
  const start = process.cpuUsage();
  while (cpuMs(start) < ms) { t += second(4000); }
  if (ms < 0) { t += ms * 1 % 2; t += ms * 2 % 3; t += ms * 3 % 4; t += ms * 4 % 5; t += ms * 5 % 6; t += ms * 6 % 7; t += ms * 7 % 8; t += ms * 8 % 9; t += ms * 9 % 10; t += ms * 10 % 11; t += ms * 11 % 12; t += ms * 12 % 13; t += ms * 13 % 14; t += ms * 14 % 15; t += ms * 15 % 16; t += ms * 16 % 17; t += ms * 17 % 18; t += ms * 18 % 19; t += ms * 19 % 20; t += ms * 20 % 21; t += ms * 21 % 22; t += ms * 22 % 23; t += ms * 23 % 24; t += ms * 24 % 25; t += ms * 25 % 26; t += ms * 26 % 27; t += ms * 27 % 28; t += ms * 28 % 29; t += ms * 29 % 30; t += ms * 30 % 31; t += ms * 31 % 32; t += ms * 32 % 33; t += ms * 33 % 34; t += ms * 34 % 35; t += ms * 35 % 36; t += ms * 36 % 37; t += ms * 37 % 38; t += ms * 38 % 39; t += ms * 39 % 40; t += ms * 40 % 41; t += ms * 41 % 42; t += ms * 42 % 43; t += ms * 43 % 44; t += ms * 44 % 45; t += ms * 45 % 46; t += ms * 46 % 47; t += ms * 47 % 48; t += ms * 48 % 49; t += ms * 49 % 50; t += ms * 50 % 51; t += ms * 51 % 52; t += ms * 52 % 53; t += ms * 53 % 54; t += ms * 54 % 55; t += ms * 55 % 56; t += ms * 56 % 57; t += ms * 57 % 58; t += ms * 58 % 59; t += ms * 59 % 60; t += ms * 60 % 61; }
  return t;
}
// the CPU time (ms) the process used since `start`: a profile sees as many
// samples however loaded the machine is
function cpuMs(start) { const d = process.cpuUsage(start); return (d.user + d.system) / 1000; }
console.log(first(Number(process.argv[2] || 1500)) > 0 ? "ok" : "no");
