// waits.js [MS]: loop() calls nap() for MS milliseconds (default 1000);
// nap() blocks its thread 5 ms in Atomics.wait: time off the CPU under JS
// frames.
const cell = new Int32Array(new SharedArrayBuffer(4));
function nap() { Atomics.wait(cell, 0, 0, 5); }
function loop(ms) { const end = Date.now() + ms; while (Date.now() < end) nap(); }
loop(Number(process.argv[2] || 1000));
