"use strict";
(function () {
  var errors = document.getElementById("js-errors");
  window.addEventListener("error", function (e) {
    errors.hidden = false;
    errors.textContent += "script error: " + e.message + "\n";
  });
  var data = JSON.parse(document.getElementById("infertrace-data").textContent);

  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }
  function fmtNum(v, unit) {
    if (unit === "us") {
      if (v >= 1e6) return (v / 1e6).toFixed(3) + " s";
      if (v >= 1e3) return (v / 1e3).toFixed(2) + " ms";
      return v + " us";
    }
    if (unit === "bytes") {
      var u = ["B", "KiB", "MiB", "GiB", "TiB"], i = 0;
      while (v >= 1024 && i < u.length - 1) { v /= 1024; i++; }
      return v.toFixed(i ? 1 : 0) + " " + u[i];
    }
    return v + " " + unit;
  }

  // Sortable tables: click a header; numeric cells sort by data-v.
  document.querySelectorAll("table.sortable").forEach(function (table) {
    var heads = table.querySelectorAll("th");
    heads.forEach(function (th, col) {
      if (th.classList.contains("nosort")) return;
      th.tabIndex = 0;
      function sort() {
        var desc = th.getAttribute("aria-sort") !== "descending";
        heads.forEach(function (h) { h.removeAttribute("aria-sort"); });
        th.setAttribute("aria-sort", desc ? "descending" : "ascending");
        var body = table.tBodies[0];
        var rows = Array.prototype.slice.call(body.rows);
        rows.sort(function (a, b) {
          var x = a.cells[col], y = b.cells[col];
          var vx = x.dataset.v, vy = y.dataset.v, r;
          if (vx !== undefined && vy !== undefined) r = parseFloat(vx) - parseFloat(vy);
          else r = x.textContent.localeCompare(y.textContent);
          return desc ? -r : r;
        });
        rows.forEach(function (r) { body.appendChild(r); });
      }
      th.addEventListener("click", sort);
      th.addEventListener("keydown", function (e) { if (e.key === "Enter") sort(); });
    });
  });

  // Flame graphs (root on top): click to zoom, search to highlight.
  document.querySelectorAll(".flamebox").forEach(function (box) {
    var f = data.flames[parseInt(box.dataset.flame, 10)];
    var area = box.querySelector(".flame");
    var info = box.querySelector(".flame-info");
    var search = box.querySelector(".flame-search");
    var match = box.querySelector(".flame-match");
    var ROW = 17;
    // Parent links and x offsets from the pre-order [name, value, depth] list.
    var nodes = [], path = [];
    f.nodes.forEach(function (n) {
      var depth = n[2], parent = depth > 0 ? path[depth - 1] : null;
      var rec = { name: f.names[n[0]], v: n[1], depth: depth, parent: parent, x: parent ? parent.next : 0 };
      rec.next = rec.x;
      if (parent) parent.next += n[1];
      path[depth] = rec;
      path.length = depth + 1;
      nodes.push(rec);
    });
    var root = nodes[0];
    var focus = root;
    var term = "";
    function kind(name) {
      if (/_\[k\]$/.test(name)) return " k";
      if (name.charAt(0) === "[") return " ctx";
      if (/\.py:\d+/.test(name) || /\.py\)/.test(name)) return " py";
      return "";
    }
    function isAncestor(a, n) { for (var p = n; p; p = p.parent) if (p === a) return true; return false; }
    function draw() {
      area.textContent = "";
      var x0 = focus.x, w = focus.v, maxDepth = 0, frag = document.createDocumentFragment();
      var matched = 0, counted = [];
      nodes.forEach(function (n) {
        var hit = term && n.name.toLowerCase().indexOf(term) >= 0;
        if (hit && !counted.some(function (c) { return isAncestor(c, n); })) { counted.push(n); matched += n.v; }
        var inView = isAncestor(focus, n) || isAncestor(n, focus);
        if (!inView) return;
        var left = isAncestor(n, focus) && n !== focus ? 0 : (n.x - x0) / w;
        var width = isAncestor(n, focus) ? 1 : n.v / w;
        if (width < 0.001) return;
        var d = el("div", "fr" + kind(n.name) + (hit ? " hit" : "") + (isAncestor(n, focus) && n !== focus ? " dim" : ""), width > 0.02 ? n.name : "");
        d.style.left = (left * 100) + "%";
        d.style.width = (width * 100) + "%";
        d.style.top = (n.depth * ROW) + "px";
        var pct = (100 * n.v / f.total).toFixed(2);
        d.title = n.name + "\n" + fmtNum(n.v, f.unit) + " (" + pct + "% of all)";
        d.addEventListener("click", function () { focus = n; draw(); });
        d.addEventListener("mouseenter", function () { info.textContent = n.name + ": " + fmtNum(n.v, f.unit) + ", " + pct + "% of all"; });
        frag.appendChild(d);
        if (n.depth > maxDepth) maxDepth = n.depth;
      });
      area.appendChild(frag);
      area.style.height = ((maxDepth + 1) * ROW + 2) + "px";
      match.textContent = term ? "matched: " + (100 * matched / f.total).toFixed(2) + "% of all" : "";
    }
    search.addEventListener("input", function () { term = search.value.trim().toLowerCase(); draw(); });
    box.querySelector(".flame-reset").addEventListener("click", function () { focus = root; draw(); });
    draw();
  });

  // The timeline strip: one canvas per thread; drag to zoom.
  var strip = document.getElementById("strip");
  if (strip && data.strip) {
    var s = data.strip, view = [0, Math.max(1, s.window_us)];
    var colors = {};
    s.states.forEach(function (_, i) {
      var probe = el("span", "st-" + i);
      document.body.appendChild(probe);
      colors[i] = getComputedStyle(probe).backgroundColor;
      probe.remove();
    });
    var range = document.getElementById("strip-range");
    var tracks = s.threads.map(function (t) {
      var row = el("div", "track");
      var label = el("span", "label", "pid " + t.pid + " tid " + t.tid + " " + t.name);
      label.title = label.textContent + (t.bucket_us ? " (buckets of " + t.bucket_us + " us)" : "");
      var c = el("canvas");
      c.width = 900; c.height = 14;
      row.appendChild(label); row.appendChild(c);
      strip.appendChild(row);
      var start = null;
      c.addEventListener("mousedown", function (e) { start = e.offsetX; });
      c.addEventListener("mouseup", function (e) {
        if (start === null) return;
        var a = Math.min(start, e.offsetX), b = Math.max(start, e.offsetX);
        start = null;
        if (b - a < 3) return;
        var span = view[1] - view[0];
        view = [view[0] + span * a / c.clientWidth, view[0] + span * b / c.clientWidth];
        paint();
      });
      return { t: t, c: c };
    });
    function paint() {
      var span = view[1] - view[0];
      tracks.forEach(function (tr) {
        var ctx = tr.c.getContext("2d"), W = tr.c.width, iv = tr.t.intervals;
        ctx.clearRect(0, 0, W, tr.c.height);
        for (var i = 0; i + 2 < iv.length; i += 3) {
          var b = iv[i], e = b + iv[i + 1];
          if (e < view[0] || b > view[1]) continue;
          var x = (b - view[0]) / span * W, w = Math.max(0.5, (e - b) / span * W);
          ctx.fillStyle = colors[iv[i + 2]];
          ctx.fillRect(x, 0, w, tr.c.height);
        }
      });
      range.textContent = "showing " + (view[0] / 1e6).toFixed(3) + " s to " + (view[1] / 1e6).toFixed(3) + " s";
    }
    document.getElementById("strip-reset").addEventListener("click", function () { view = [0, Math.max(1, s.window_us)]; paint(); });
    paint();
  }
  // Printing shows the collapsed sections too.
  window.addEventListener("beforeprint", function () {
    document.querySelectorAll("details").forEach(function (d) { d.open = true; });
  });
  document.body.dataset.ready = "1";
})();
