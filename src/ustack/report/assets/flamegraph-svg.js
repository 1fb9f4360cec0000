/* ustack's SVG flame graph, interactive as flamegraph.pl's: click a frame
 * to zoom (its callers stay, full width), "Reset Zoom" to go back; "Search"
 * asks for a regular expression, paints the matching frames magenta and
 * shows their share at the bottom right ("Reset Search" clears it); the
 * bottom line names the frame under the mouse. Static without script.
 * Opened on its own in a browser, a graph taller than the window starts
 * scrolled to the bottom: the root and the widest frames, not empty space
 * above the deepest stacks (the SVG keeps flamegraph.pl's orientation,
 * root at the bottom, as tools that read it expect). */
(function () {
  "use strict";
  var svg = document.documentElement;
  var WIDTH = +svg.getAttribute("width"), XPAD = 10, CHAR = 12 * 0.59;
  var FULL = WIDTH - 2 * XPAD, MATCH = "rgb(230,0,230)";
  var frames = [], nodes = svg.querySelectorAll("g.frame");
  for (var i = 0; i < nodes.length; i++) {
    var g = nodes[i], rect = g.querySelector("rect");
    frames.push({ g: g, rect: rect, text: g.querySelector("text"),
                  name: g.getAttribute("data-name"), depth: +g.getAttribute("data-depth"),
                  /* where it is in the tree: its first sample and its samples,
                     exact (the drawn x and width are rounded to 0.1 px) */
                  start: +g.getAttribute("data-start"), value: +g.getAttribute("data-value"),
                  x: +rect.getAttribute("x"), w: +rect.getAttribute("width"),
                  fill: rect.getAttribute("fill") });
  }
  var details = svg.getElementById("details"), matchedText = svg.getElementById("matched");
  var resetZoom = svg.getElementById("unzoom"), searchButton = svg.getElementById("search");

  function place(f, x, w) {
    f.rect.setAttribute("x", x.toFixed(1));
    f.rect.setAttribute("width", w.toFixed(1));
    f.text.setAttribute("x", (x + 3).toFixed(1));
    var fits = Math.floor(w / CHAR), name = f.name;
    f.text.textContent = fits < 3 ? "" : name.length <= fits ? name : name.slice(0, fits - 2) + "..";
    f.g.style.display = "";
  }
  function zoom(c) {
    var scale = FULL / c.value, end = c.start + c.value;
    frames.forEach(function (f) {
      var fEnd = f.start + f.value;
      if (f.depth < c.depth) {
        /* one frame a row spans c's samples: its caller there */
        if (f.start <= c.start && fEnd >= end) place(f, XPAD, FULL);
        else f.g.style.display = "none";
      } else if (f.start >= c.start && fEnd <= end) {
        place(f, XPAD + (f.start - c.start) * scale, f.value * scale);
      } else {
        f.g.style.display = "none";
      }
    });
    resetZoom.style.opacity = c.depth === 0 ? "0" : "1";
  }
  function search(term) {
    var re = term ? new RegExp(term) : null, hits = [];
    frames.forEach(function (f) {
      var hit = re && re.test(f.name);
      f.rect.setAttribute("fill", hit ? MATCH : f.fill);
      if (hit) hits.push(f);
    });
    /* the share: the union of the matches' spans on the unzoomed graph */
    hits.sort(function (a, b) { return a.x - b.x || b.w - a.w; });
    var covered = 0, end = -1;
    hits.forEach(function (f) {
      if (f.x >= end - 0.01) { covered += f.w; end = f.x + f.w; }
    });
    matchedText.textContent = re ? "Matched: " + (100 * covered / FULL).toFixed(1) + "%" : "";
    searchButton.textContent = re ? "Reset Search" : "Search";
    searchButton.setAttribute("data-term", term || "");
  }
  frames.forEach(function (f) {
    f.g.addEventListener("click", function () { zoom(f); });
    f.g.addEventListener("mouseover", function () {
      details.textContent = "Function: " + f.g.querySelector("title").textContent;
    });
    f.g.addEventListener("mouseout", function () { details.textContent = " "; });
  });
  resetZoom.addEventListener("click", function () { if (frames.length) zoom(frames[0]); });
  searchButton.addEventListener("click", function () {
    if (searchButton.getAttribute("data-term")) { search(""); return; }
    var term = window.prompt("Enter a search term (regexp allowed, eg: ^ext4_)", "");
    if (!term) return;
    try {
      search(term);
    } catch (e) {
      matchedText.textContent = "Not a regular expression: " + term;
    }
  });
  /* the root and the widest frames in view when the page opens */
  if (window.scrollY === 0) window.scrollTo(0, svg.getBoundingClientRect().height);
})();
