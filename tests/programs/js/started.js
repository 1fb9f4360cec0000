// started.js [MS]: calls.js's work, once this process has written its pid
// to ./ready (beside this script): the signal that node has started and its
// loop is about to run.
require("fs").writeFileSync(require("path").join(__dirname, "ready"), String(process.pid));
require("./calls.js");
