// The plan page's JavaScript (page_model.h): plain ES5-level code, no
// library, reading the page's own JSON data block. Kept short: the figures
// are drawn in C++ (plan_svg.cc); the script only shows tooltips and
// reports errors.
#include "server/viewer/page_model.h"

namespace hsap::viewer::internal {

// Placed right after <pre id="errors">: every later script error, console
// error, unhandled rejection and Content-Security-Policy violation (a
// blocked fetch) lands in it, so a headless browser's DOM dump shows them.
const char kErrorScript[] = R"JS(
(function () {
  var pre = document.getElementById('errors');
  function report(msg) {
    pre.hidden = false;
    pre.textContent += msg + '\n';
  }
  window.addEventListener('error', function (e) {
    report('error: ' + (e.message || e) + (e.filename ? ' at ' + e.filename + ':' + e.lineno : ''));
  });
  window.addEventListener('unhandledrejection', function (e) {
    report('unhandled rejection: ' + e.reason);
  });
  document.addEventListener('securitypolicyviolation', function (e) {
    report('blocked by the page policy: ' + e.violatedDirective + ' ' + e.blockedURI);
  });
  var original = console.error;
  console.error = function () {
    report('console.error: ' + Array.prototype.join.call(arguments, ' '));
    return original.apply(console, arguments);
  };
})();
)JS";

const char kPageScript[] = R"JS(
(function () {
  'use strict';
  var block = document.getElementById('plan-data');
  var data = block ? JSON.parse(block.textContent) : null;
  var tip = document.getElementById('tip');

  function fmtBytes(b) {
    if (b < 1024) return b.toFixed(0) + ' B';
    var units = ['KiB', 'MiB', 'GiB', 'TiB', 'PiB'], u = 0;
    b /= 1024;
    while (b >= 1024 && u < units.length - 1) { b /= 1024; u++; }
    return (b >= 100 ? b.toFixed(0) : b >= 10 ? b.toFixed(1) : b.toFixed(2)) + ' ' + units[u];
  }
  function fmtUs(us) {
    if (us < 1000) return us.toPrecision(3) + ' us';
    if (us < 1e6) return (us / 1e3).toPrecision(3) + ' ms';
    return (us / 1e6).toPrecision(3) + ' s';
  }
  function fmtCount(n) { return Math.round(n).toLocaleString('en-US'); }
  function num(el, key) { return parseFloat(el.getAttribute('data-' + key)); }
  // Sorted distinct integers as "0-3, 7 (5)".
  function spans(list) {
    list.sort(function (a, b) { return a - b; });
    var out = [], i = 0;
    while (i < list.length) {
      var j = i;
      while (j + 1 < list.length && list[j + 1] === list[j] + 1) j++;
      out.push(i === j ? String(list[i]) : list[i] + '-' + list[j]);
      i = j + 1;
    }
    return out.join(', ') + ' (' + list.length + ')';
  }
  function svgPoint(el, ev) {
    var svg = el.ownerSVGElement || el;
    var pt = svg.createSVGPoint();
    pt.x = ev.clientX;
    pt.y = ev.clientY;
    return pt.matrixTransform(svg.getScreenCTM().inverse());
  }
  // The last index i with arr[i * stride] <= v (arr sorted), or -1.
  function lastAtOrBelow(arr, stride, v) {
    var lo = 0, hi = arr.length / stride - 1, ans = -1;
    while (lo <= hi) {
      var mid = (lo + hi) >> 1;
      if (arr[mid * stride] <= v) { ans = mid; lo = mid + 1; } else { hi = mid - 1; }
    }
    return ans;
  }

  var handlers = {
    layout: function (g, p) {
      var t = Math.floor((p.x - num(g, 'x0')) / num(g, 'w') * data.total_tokens);
      if (t < 0 || t >= data.total_tokens) return null;
      var d = lastAtOrBelow(data.docs, 2, t);
      if (d < 0 || data.docs[2 * d + 1] <= t) return 'token ' + fmtCount(t) + ': no document';
      var b = data.docs[2 * d], e = data.docs[2 * d + 1];
      var ranks = {}, nodes = {};
      var o = Math.max(0, lastAtOrBelow(data.owners, 3, b));
      for (; o < data.owners.length / 3 && data.owners[3 * o] < e; o++) {
        if (data.owners[3 * o + 1] <= b) continue;
        var r = data.owners[3 * o + 2];
        ranks[r] = true;
        nodes[Math.floor(r / data.devices_per_node)] = true;
      }
      var keys = function (m) { return Object.keys(m).map(Number); };
      return 'document ' + d + ': tokens [' + fmtCount(b) + ', ' + fmtCount(e) + ')\n' +
          'length ' + fmtCount(e - b) + ', ' + (data.causal ? 'causal' : 'bidirectional') +
          (data.window >= 0 ? ', window ' + data.window : '') + '\n' +
          'ranks ' + spans(keys(ranks)) + '\nnodes ' + spans(keys(nodes));
    },
    load: function (g, p) {
      var i = Math.floor((p.x - num(g, 'x0')) / num(g, 'slot'));
      var row = data.rows[i];
      if (!row) return null;
      var f = row.fwd_recv_bytes, b = row.bwd_recv_bytes;
      return row.label + (data.row_level === 'rank' ? ' (node ' + row.first_node + ')' : '') +
          '\ntokens ' + fmtCount(row.tokens) +
          '\ncompute ' + fmtCount(row.head_area) + ' pairs x heads' +
          '\nforward received ' + fmtBytes(f[0] + f[1]) + ' (intra ' + fmtBytes(f[0]) +
          ', inter ' + fmtBytes(f[1]) + ')' +
          '\nexact-need lower bound ' + fmtBytes(row.lower_bound_recv_bytes) +
          '\nbackward received ' + fmtBytes(b[0] + b[1]) + ' (intra ' + fmtBytes(b[0]) +
          ', inter ' + fmtBytes(b[1]) + ')' +
          '\nmodeled fwd ' + fmtUs(row.fwd_us) + ', bwd ' + fmtUs(row.bwd_us);
    },
    matrix: function (g, p) {
      var n = num(g, 'n'), cell = num(g, 'cell');
      var i = Math.floor((p.y - num(g, 'y0')) / cell), j = Math.floor((p.x - num(g, 'x0')) / cell);
      if (i < 0 || j < 0 || i >= n || j >= n) return null;
      var m = data.traffic[g.getAttribute('data-key')];
      var v = m[g.getAttribute('data-dir')][i * n + j];
      return m.labels[i] + ' -> ' + m.labels[j] + (m.inter[i * n + j] ? ' (inter-node)' : ' (intra-node)') +
          '\n' + (g.getAttribute('data-dir') === 'fwd' ? 'forward ' : 'backward ') + fmtBytes(v);
    },
    timeline: function (g, p) {
      var tl = data.timeline[g.getAttribute('data-dir')];
      if (!tl) return null;
      var i = Math.floor((p.y - num(g, 'y0')) / num(g, 'rh'));
      var t = (p.x - num(g, 'x0')) / num(g, 'w') * num(g, 'xmax');
      var b = lastAtOrBelow(tl.bin_start_us, 1, t);
      if (i < 0 || i >= tl.cells.length || b < 0) return null;
      var c = tl.cells[i][b];
      var first = b * tl.stages_per_bin, last = Math.min(tl.num_stages, first + tl.stages_per_bin) - 1;
      return data.rows[i].label + (first === last ? ', stage ' + first : ', stages ' + first + '-' + last) +
          '\ntransfer ' + fmtUs(c[0]) + (c[0] > 0 ? (c[4] >= 0.5 ? ' (inter-node)' : ' (intra-node)') : '') +
          '\ncompute during transfer ' + fmtUs(c[1]) + '\ncompute after ' + fmtUs(c[2]) +
          (c[3] > 0 ? '\ndK/dV returns ' + fmtUs(c[3]) : '') +
          (c[5] > 0 ? '\ncompute during returns ' + fmtUs(c[5]) : '') +
          '\nslowest rank ' + fmtUs(tl.bin_us[b]);
    }
  };

  document.addEventListener('mousemove', function (ev) {
    var el = ev.target && ev.target.closest ? ev.target.closest('[data-hover],[data-tip]') : null;
    var text = null;
    if (el && el.hasAttribute('data-tip')) {
      text = el.getAttribute('data-tip');
    } else if (el && data && handlers[el.getAttribute('data-hover')]) {
      text = handlers[el.getAttribute('data-hover')](el, svgPoint(el, ev));
    }
    if (!text) { tip.hidden = true; return; }
    tip.textContent = text;
    tip.hidden = false;
    var x = ev.clientX + 14, y = ev.clientY + 14;
    if (x + tip.offsetWidth > window.innerWidth) x = ev.clientX - tip.offsetWidth - 8;
    if (y + tip.offsetHeight > window.innerHeight) y = ev.clientY - tip.offsetHeight - 8;
    tip.style.left = x + 'px';
    tip.style.top = y + 'px';
  });

  // How long the page took to open: navigation start to its first layout
  // after the load event.
  window.addEventListener('load', function () {
    document.body.getBoundingClientRect();
    var out = document.getElementById('load-ms');
    if (out) out.textContent = performance.now().toFixed(0);
    document.body.setAttribute('data-page-height', String(document.documentElement.scrollHeight));
    if (location.hash === '#hover-check') hoverCheck();
  });

  // With #hover-check in the address: moves the mouse over each figure
  // once and lists the first line of each read-out in a pre element, id
  // hover-check (the browser test reads it from the DOM).
  function hoverCheck() {
    var lines = [];
    var figures = document.querySelectorAll('[data-hover]');
    for (var k = 0; k < figures.length; k++) {
      var g = figures[k], box = g.getBoundingClientRect();
      var target = g.querySelector('rect,path') || g;
      target.dispatchEvent(new MouseEvent('mousemove', {
        bubbles: true, clientX: box.left + box.width * 0.3, clientY: box.top + box.height * 0.4
      }));
      lines.push(g.getAttribute('data-hover') + ': ' +
          (tip.hidden ? '(nothing)' : tip.textContent.split('\n')[0]));
    }
    var pre = document.createElement('pre');
    pre.id = 'hover-check';
    pre.textContent = lines.join('\n');
    document.body.appendChild(pre);
  }
})();
)JS";

}  // namespace hsap::viewer::internal
