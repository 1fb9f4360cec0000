/* ustack's interactive flame graph: draws the merged tree embedded in the
 * page (report/flametree.py flat_json) on one <canvas>, root at the top
 * (icicle): the root and the widest frames are what the page opens on,
 * however deep the graph and however short the window, right under the
 * controls; a deep graph only runs on downwards with its narrow frames.
 * Click zooms into a frame (its ancestors stay, full width), Esc or the
 * Reset button zooms out, the search box highlights matching frames and
 * shows their share of all samples. No network: everything is inline.
 *
 * window.flamegraph is a small read-only view of what is drawn (frames()
 * and state()), for scripts and the tests that check what a user sees. */
(function () {
  "use strict";

  var FRAME_H = 16;                 /* px per frame row, as flamegraph.pl */
  var FONT = '12px Verdana, "DejaVu Sans", sans-serif';
  var MIN_PX = 0.1;                 /* narrower frames are not drawn */
  var MATCH_COLOUR = "rgb(230,0,230)";

  var data = JSON.parse(document.getElementById("flamegraph-data").textContent);
  var tree = data.tree, S = tree.strings, KINDS = tree.kinds, raw = tree.nodes;
  var N = raw.length;
  var KIND = {}; KINDS.forEach(function (k, i) { KIND[k] = i; });

  /* --- the tree as arrays, in the page's preorder ----------------------- */
  var depth = new Int32Array(N), parent = new Int32Array(N);
  var after = new Float64Array(N), before = new Float64Array(N);
  var x0 = new Float64Array(N), width = new Float64Array(N);
  var maxDepth = 0, path = [];
  for (var i = 0; i < N; i++) {
    var d = raw[i][0];
    depth[i] = d; after[i] = raw[i][4]; before[i] = raw[i][5];
    path.length = d;
    parent[i] = d ? path[d - 1] : -1;
    path.push(i);
    if (d > maxDepth) maxDepth = d;
  }
  function name(i) { return S[raw[i][1]]; }
  function module(i) { return S[raw[i][2]]; }
  function kind(i) { return KINDS[raw[i][3]]; }
  function source(i) { return S[raw[i][6]]; }
  function inlined(i) { return raw[i][7] === 1; }

  /* rows[d]: the nodes of depth d, left to right (preorder keeps them so) */
  var rows = [];
  for (var r = 0; r <= maxDepth; r++) rows.push([]);
  for (i = 0; i < N; i++) rows[depth[i]].push(i);

  var diff = !!data.diff;
  var totalAfter = N ? after[0] : 0, totalBefore = N ? before[0] : 0;
  var widthsFrom = "after";

  /* x0/width in samples of the run whose widths are drawn */
  function layout() {
    var values = widthsFrom === "after" ? after : before;
    var next = new Float64Array(N);
    for (var i = 0; i < N; i++) {
      width[i] = values[i];
      var p = parent[i];
      if (p < 0) { x0[i] = 0; continue; }
      x0[i] = x0[p] + next[p];
      next[p] += values[i];
    }
  }

  /* --- colours ---------------------------------------------------------- */
  function hash(text) {                    /* FNV-1a, to [0, 1) */
    var h = 2166136261;
    for (var i = 0; i < text.length; i++) {
      h ^= text.charCodeAt(i);
      h = Math.imul(h, 16777619);
    }
    return (h >>> 0) / 4294967296;
  }
  /* kind -> [hue, saturation %, lightness %, label]: flamegraph.pl's
     conventions where it has them (warm user code, yellow libraries,
     orange kernel, aqua for a runtime) */
  var KIND_STYLE = {
    user: [8, 78, 60, "user code"],
    lib: [48, 80, 55, "libraries"],
    kernel: [28, 92, 55, "kernel"],
    go: [185, 55, 52, "Go runtime"],
    python: [215, 62, 62, "Python"],
    php: [245, 35, 62, "PHP"],
    perl: [270, 50, 64, "Perl"],
    ruby: [350, 60, 55, "Ruby"],
    js: [95, 58, 50, "JavaScript (JIT)"],
    java: [135, 55, 48, "Java (JIT)"],
    unknown: [0, 0, 72, "unknown"],
    separator: [0, 0, 55, "-- (kernel | user)"],
    note: [300, 35, 74, "unwinding note"],
    process: [220, 18, 74, "process"],
    root: [220, 10, 82, "all"]
  };
  function hsl(h, s, l) { return "hsl(" + h.toFixed(1) + "," + s + "%," + l.toFixed(1) + "%)"; }
  function kindColour(i) {
    var st = KIND_STYLE[kind(i)], v = hash(name(i));
    var l = st[2] + (v - 0.5) * 12 + (inlined(i) ? 14 : 0);
    return hsl(st[0] + (v - 0.5) * 16, inlined(i) ? st[1] * 0.6 : st[1], l);
  }
  /* modules ranked by their widest frame (in the run drawn first), hues
     spread by the golden angle so the big modules never look alike */
  var moduleRank = (function () {
    var widest = {}, rank = {};
    for (var i = 0; i < N; i++) {
      var m = module(i);
      if (m) widest[m] = Math.max(widest[m] || 0, after[i] || before[i]);
    }
    Object.keys(widest).sort(function (a, b) {
      return widest[b] - widest[a] || (a < b ? -1 : 1);
    }).forEach(function (m, k) { rank[m] = k; });
    return rank;
  })();
  function moduleHue(m) { return (20 + moduleRank[m] * 137.508) % 360; }
  function moduleColour(i) {
    var m = module(i);
    if (!m) return kindColour(i);
    var v = hash(name(i));
    return hsl(moduleHue(m), inlined(i) ? 35 : 60, 60 + (v - 0.5) * 12 + (inlined(i) ? 14 : 0));
  }
  var maxDelta = 0;
  function delta(i) {                      /* change of the share, B - A */
    return (totalAfter ? after[i] / totalAfter : 0) - (totalBefore ? before[i] / totalBefore : 0);
  }
  if (diff) for (i = 0; i < N; i++) maxDelta = Math.max(maxDelta, Math.abs(delta(i)));
  function diffColour(i) {                 /* red: grew, blue: shrank */
    var dl = delta(i), ratio = maxDelta ? Math.abs(dl) / maxDelta : 0;
    var c = Math.round(235 - 175 * ratio);
    if (dl > 0) return "rgb(255," + c + "," + c + ")";
    if (dl < 0) return "rgb(" + c + "," + c + ",255)";
    return "rgb(235,235,235)";
  }
  var colourMode = diff ? "diff" : "kind", colours = [];
  function paint() {
    var of = colourMode === "diff" ? diffColour : colourMode === "module" ? moduleColour : kindColour;
    colours = new Array(N);
    for (var i = 0; i < N; i++) colours[i] = of(i);
    legend();
  }

  /* --- numbers as people read them ---------------------------------------- */
  var unit = data.unit || "samples";
  function pct(part, whole) { return whole ? (100 * part / whole).toFixed(2) + "%" : "0%"; }
  function amount(n) {
    if (unit === "nanoseconds")        /* a time (offcpu) */
      return n >= 1e9 ? (n / 1e9).toFixed(6) + " s" : (n / 1e6).toFixed(3) + " ms";
    var text = n.toLocaleString("en-US") + " " + (n === 1 ? unit.replace(/s$/, "") : unit);
    if (data.frequency) text += " (" + (n / data.frequency).toFixed(3) + " s)";
    return text;
  }
  function escapeHtml(t) {
    return String(t).replace(/[&<>"]/g, function (c) {
      return { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" }[c];
    });
  }

  /* --- drawing ---------------------------------------------------------- */
  var canvas = document.getElementById("flamegraph");
  var ctx = canvas.getContext("2d");
  var cssWidth = 0, cssHeight = 0, charWidth = 7;
  var zoomed = 0;                          /* the node spanning the width */
  var matched = new Uint8Array(N), searching = false;
  var drawn = [];                          /* [node, x, y, w] of the last draw */

  function viewRange() { return [x0[zoomed], x0[zoomed] + width[zoomed]]; }

  var drawMs = 0;                          /* how long the last draw took */
  function draw() {
    var began = performance.now();
    drawFrames();
    drawMs = performance.now() - began;
  }
  function drawFrames() {
    var ratio = window.devicePixelRatio || 1;
    cssHeight = (maxDepth + 1) * FRAME_H + 2;
    canvas.style.height = cssHeight + "px";
    /* measured after the height is set: a tall graph brings a scrollbar */
    cssWidth = Math.max(canvas.clientWidth, 100);
    canvas.width = Math.round(cssWidth * ratio);
    canvas.height = Math.round(cssHeight * ratio);
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    ctx.clearRect(0, 0, cssWidth, cssHeight);
    ctx.font = FONT;
    ctx.textBaseline = "middle";
    charWidth = ctx.measureText("abcdefghijklmnopqrstuvwxyz_").width / 27;
    drawn = [];
    if (!N || !width[zoomed]) return;
    var range = viewRange(), start = range[0], end = range[1];
    var scale = cssWidth / (end - start);
    for (var d = 0; d <= maxDepth; d++) {
      var row = rows[d], y = d * FRAME_H;
      for (var k = firstAt(row, start); k < row.length; k++) {
        var i = row[k];
        if (x0[i] >= end) break;
        if (!width[i]) continue;
        var left = Math.max(x0[i], start), right = Math.min(x0[i] + width[i], end);
        var w = (right - left) * scale;
        if (w < MIN_PX) continue;
        var x = (left - start) * scale;
        ctx.fillStyle = searching && matched[i] ? MATCH_COLOUR : colours[i];
        ctx.fillRect(x, y, Math.max(w - 0.5, 0.5), FRAME_H - 1);
        drawn.push([i, x, y, w]);
        if (w > 3 * charWidth) label(name(i), x, y, w);
      }
    }
  }
  function label(text, x, y, w) {
    var fits = Math.floor((w - 6) / charWidth);
    if (fits < 3) return;
    if (text.length > fits) text = text.slice(0, fits - 2) + "..";
    ctx.fillStyle = "#000";
    ctx.fillText(text, x + 3, y + FRAME_H / 2);
  }
  /* first index in a row whose frame ends after `at` (binary search) */
  function firstAt(row, at) {
    var lo = 0, hi = row.length;
    while (lo < hi) {
      var mid = (lo + hi) >> 1, i = row[mid];
      if (x0[i] + width[i] <= at) lo = mid + 1; else hi = mid;
    }
    return lo;
  }
  /* the node drawn under a point of the canvas (CSS px), or -1 */
  function nodeAt(px, py) {
    var d = Math.floor(py / FRAME_H);
    if (d < 0 || d > maxDepth || !N || !width[zoomed]) return -1;
    var range = viewRange(), at = range[0] + px * (range[1] - range[0]) / cssWidth;
    var row = rows[d], k = firstAt(row, at);
    while (k < row.length && !width[row[k]]) k++;
    if (k >= row.length) return -1;
    var i = row[k];
    return x0[i] <= at && at < x0[i] + width[i] && at < range[1] ? i : -1;
  }

  /* --- zoom ------------------------------------------------------------- */
  var resetButton = document.getElementById("reset");
  function zoom(i) {
    zoomed = i > 0 && width[i] ? i : 0;
    resetButton.disabled = zoomed === 0;
    draw();
  }

  /* --- search ----------------------------------------------------------- */
  var searchBox = document.getElementById("search");
  var regexBox = document.getElementById("regex");
  var matchedText = document.getElementById("matched");
  var share = { samples: 0, percent: 0 };
  function search() {
    var text = searchBox.value, test = null;
    searchBox.classList.remove("invalid");
    if (text) {
      if (regexBox.checked) {
        try {
          var re = new RegExp(text);
          test = function (s) { return re.test(s); };
        } catch (e) {
          searchBox.classList.add("invalid");
        }
      } else {
        var lower = text.toLowerCase();
        test = function (s) { return s.toLowerCase().indexOf(lower) >= 0; };
      }
    }
    searching = !!test;
    /* the share: samples under a matching frame, each counted once (a match
       inside a matching frame adds nothing) */
    var covered = new Uint8Array(N), total = 0;
    for (var i = 0; i < N; i++) {
      matched[i] = test && test(name(i)) ? 1 : 0;
      var p = parent[i];
      covered[i] = p >= 0 && (covered[p] || matched[p]) ? 1 : 0;
      if (matched[i] && !covered[i]) total += width[i];
    }
    var all = N ? width[0] : 0;
    share = { samples: total, percent: all ? 100 * total / all : 0 };
    matchedText.textContent = searching
      ? "Matched: " + share.percent.toFixed(1) + "% (" + amount(total) + " of " + all.toLocaleString("en-US") + ")"
      : "";
    draw();
  }

  /* --- legend ----------------------------------------------------------- */
  function legend() {
    var box = document.getElementById("legend"), items = [];
    if (colourMode === "diff") {
      items = [["rgb(255,60,60)", "share grew from A to B"],
               ["rgb(60,60,255)", "share shrank"],
               ["rgb(235,235,235)", "unchanged"]];
      /* what vanished has no width in B: say so, and where to see it */
      var gone = 0;
      for (var j = 1; j < N; j++) if (!after[j] && before[j] && after[parent[j]]) gone++;
      if (gone && widthsFrom === "after")
        items.push(["transparent", gone + (gone === 1 ? " frame" : " frames") +
                    " only in A, not drawn: Widths \u201cfrom A\u201d shows them"]);
    } else if (colourMode === "module") {
      var mods = Object.keys(moduleRank).sort(function (a, b) {
        return moduleRank[a] - moduleRank[b];
      });
      items = mods.slice(0, 12).map(function (m) { return [hsl(moduleHue(m), 60, 60), m]; });
      if (mods.length > 12) items.push(["transparent", "… " + (mods.length - 12) + " more"]);
    } else {
      var present = {};
      for (i = 0; i < N; i++) present[kind(i)] = true;
      items = Object.keys(KIND_STYLE).filter(function (k) { return present[k]; })
        .map(function (k) { var st = KIND_STYLE[k]; return [hsl(st[0], st[1], st[2]), st[3]]; });
      var anyInlined = false;
      for (i = 0; i < N; i++) if (inlined(i)) { anyInlined = true; break; }
      if (anyInlined) items.push([hsl(8, 47, 74), "inlined (lighter, \"(inlined)\")"]);
    }
    box.innerHTML = items.map(function (it) {
      var swatch = it[0] === "transparent" ? ""    /* a remark, not a colour */
        : '<span class="swatch" style="background:' + it[0] + '"></span>';
      return '<span class="item">' + swatch + escapeHtml(it[1]) + "</span>";
    }).join("");
  }

  /* --- tooltip and the details line -------------------------------------- */
  var tooltip = document.getElementById("tooltip");
  var details = document.getElementById("details");
  function describe(i) {
    var all = width[0], rows = [];
    var where = module(i) ? module(i) : "";
    rows.push('<div class="name">' + escapeHtml(name(i)) + "</div>");
    if (where || kind(i) !== "user")
      rows.push('<div class="row">module: ' + escapeHtml(where || "—") + " (" +
                escapeHtml(KIND_STYLE[kind(i)][3]) + (inlined(i) ? ", inlined" : "") + ")</div>");
    if (source(i)) rows.push('<div class="row">source: ' + escapeHtml(source(i)) + "</div>");
    if (diff) {
      var dl = delta(i) * 100, cls = dl > 0 ? "grew" : dl < 0 ? "shrank" : "";
      rows.push('<div class="row">A (before): ' + amount(before[i]) + ", " + pct(before[i], totalBefore) + "</div>");
      rows.push('<div class="row">B (after): ' + amount(after[i]) + ", " + pct(after[i], totalAfter) + "</div>");
      rows.push('<div class="row ' + cls + '">change: ' + (dl >= 0 ? "+" : "") + dl.toFixed(2) +
                " points of share, " + (after[i] - before[i] >= 0 ? "+" : "") +
                (after[i] - before[i]).toLocaleString("en-US") + " " + unit + "</div>");
    } else {
      rows.push('<div class="row">' + amount(width[i]) + ", " + pct(width[i], all) + "</div>");
    }
    return rows.join("");
  }
  function detailsLine(i) {
    if (diff) return name(i) + " (A " + before[i] + ", B " + after[i] + ")";
    return name(i) + " (" + amount(width[i]) + ", " + pct(width[i], width[0]) + ")";
  }
  canvas.addEventListener("mousemove", function (e) {
    var i = nodeAt(e.offsetX, e.offsetY);
    if (i < 0) { tooltip.hidden = true; details.innerHTML = "&nbsp;"; return; }
    tooltip.innerHTML = describe(i);
    tooltip.hidden = false;
    var x = e.clientX + 14, y = e.clientY + 14;
    if (x + tooltip.offsetWidth > window.innerWidth) x = Math.max(0, e.clientX - tooltip.offsetWidth - 14);
    if (y + tooltip.offsetHeight > window.innerHeight) y = Math.max(0, e.clientY - tooltip.offsetHeight - 14);
    tooltip.style.left = x + "px";
    tooltip.style.top = y + "px";
    details.textContent = detailsLine(i);
  });
  canvas.addEventListener("mouseleave", function () { tooltip.hidden = true; });
  canvas.addEventListener("click", function (e) {
    var i = nodeAt(e.offsetX, e.offsetY);
    if (i >= 0) zoom(i);
  });

  /* --- controls ------------------------------------------------------------ */
  resetButton.addEventListener("click", function () { zoom(0); });
  document.addEventListener("keydown", function (e) {
    if (e.key === "Escape") zoom(0);
  });
  searchBox.addEventListener("input", search);
  regexBox.addEventListener("change", search);
  var colourSelect = document.getElementById("colours");
  if (diff) {
    var opt = document.createElement("option");
    opt.value = "diff"; opt.textContent = "by change (A \u2192 B)";
    colourSelect.insertBefore(opt, colourSelect.firstChild);
    colourSelect.value = "diff";
    document.getElementById("widths-control").hidden = false;
  }
  colourSelect.addEventListener("change", function () {
    colourMode = colourSelect.value; paint(); draw();
  });
  document.getElementById("widths").addEventListener("change", function (e) {
    widthsFrom = e.target.value;
    layout();
    legend();
    if (!width[zoomed]) zoomed = 0;
    zoom(zoomed);
    search();
  });
  window.addEventListener("resize", draw);

  /* --- a view for scripts and tests ---------------------------------------- */
  window.flamegraph = {
    /* the frames drawn, left to right per row from the root: name, module,
       kind, inlined, x/y/width/height in CSS px of the canvas, samples (of
       the drawn run; before/after for a diff), matched by the search */
    frames: function () {
      return drawn.map(function (f) {
        var i = f[0];
        return { name: name(i), module: module(i), kind: kind(i), inlined: inlined(i),
                 depth: depth[i], x: f[1], y: f[2], width: f[3], height: FRAME_H - 1,
                 samples: width[i], before: before[i], after: after[i],
                 matched: !!(searching && matched[i]), colour: searching && matched[i] ? MATCH_COLOUR : colours[i] };
      });
    },
    state: function () {
      return { zoomed: N ? name(zoomed) : null, total: N ? width[0] : 0,
               canvasWidth: cssWidth, canvasHeight: cssHeight, search: searchBox.value,
               matchedSamples: share.samples, matchedPercent: share.percent,
               colours: colourMode, widthsFrom: widthsFrom, diff: diff, drawMs: drawMs };
    }
  };

  layout();
  paint();
  draw();
})();
