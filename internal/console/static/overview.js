// Outflow console: the overview's folds stay as the reader left them. The
// live refresh (console.js) replaces the overview's markup every few
// seconds, which would close an opened <details> each time: this remembers
// which are open, by id, and opens them again in the new markup.
(function () {
  "use strict";
  document.addEventListener("DOMContentLoaded", function () {
    var root = document.getElementById("overview");
    if (!root) { return; }
    var open = {};
    root.addEventListener("toggle", function (ev) {
      if (ev.target.id) { open[ev.target.id] = ev.target.open; }
    }, true);
    new MutationObserver(function () {
      Object.keys(open).forEach(function (id) {
        var el = document.getElementById(id);
        if (el && el.open !== open[id]) { el.open = open[id]; }
      });
    }).observe(root, { childList: true });
  });
}());
