// Outflow console: live refresh of the overview, and confirmations.
// No framework, no build step. The server asks again (a confirmation page)
// when this script does not run.
(function () {
  "use strict";

  // Live refresh: swap in the fragment 2s after the last answer came (never
  // a request while one waits: a slow database would have them pile up);
  // a lost session reloads the page, which sends the browser to /login.
  // When a refresh fails, the numbers on screen are old, and the page says
  // so, with their age, until one succeeds.
  function refresh(el) {
    var url = el.getAttribute("data-refresh");
    var lastGood = Date.now();
    function stale() {
      var at = el.querySelector("#overview-at");
      if (!at) { return; }
      at.className = "stale";
      at.textContent = "Stale: these numbers are " + Math.round((Date.now() - lastGood) / 1000) +
        "s old; the console could not refresh them (the database or the console is not answering).";
    }
    function tick() {
      if (document.hidden) { setTimeout(tick, 2000); return; }
      fetch(url, { credentials: "same-origin", redirect: "manual" }).then(function (res) {
        if (res.type === "opaqueredirect" || res.status === 403 || res.status === 401) {
          window.location.reload();
          return null;
        }
        return res.ok ? res.text() : undefined;
      }).then(function (html) {
        if (html === undefined) { stale(); } else if (html !== null) { el.innerHTML = html; lastGood = Date.now(); }
      }).catch(stale).then(function () { setTimeout(tick, 2000); });
    }
    setTimeout(tick, 2000);
  }

  // Confirmation: a form (or the button that submits it) with
  // data-confirm asks in the browser and then sends confirm=yes, which
  // spares the confirmation page. A button with data-confirm-selected asks
  // about the rows ticked: its {n} is their count ("3 dead letters", the
  // form's data-confirm-kind), its {target} what they belong to (" of
  // consumer sync-analytics", from each row's data-<data-confirm-target>).
  function selectedQuestion(form, template) {
    var kind = form.getAttribute("data-confirm-kind") || "row";
    var attr = form.getAttribute("data-confirm-target");
    var ticked = form.querySelectorAll("input[name=id]:checked");
    if (ticked.length === 0) { return null; }
    var counts = {}, names = [];
    ticked.forEach(function (box) {
      var tr = box.closest("tr");
      var v = attr && tr ? tr.getAttribute("data-" + attr) : null;
      if (v === null) { return; }
      if (!(v in counts)) { counts[v] = 0; names.push(v); }
      counts[v]++;
    });
    names.sort();
    var n = ticked.length.toLocaleString("en-US") + " " + kind + (ticked.length === 1 ? "" : "s");
    var target = "";
    if (names.length === 1) {
      target = " of " + attr + " " + names[0];
    } else if (names.length > 1) {
      target = " of " + attr + "s " + names.map(function (v) { return v + " (" + counts[v] + ")"; }).join(", ");
    }
    return template.replace("{n}", n).replace("{target}", target);
  }

  function confirmOnSubmit(form) {
    form.addEventListener("submit", function (ev) {
      var btn = ev.submitter;
      // Without the button that submitted (an older browser), the message
      // could be another button's: let the server's page ask instead.
      if (!btn) { return; }
      var msg = btn.getAttribute("data-confirm") || form.getAttribute("data-confirm");
      // A form whose question depends on a choice (the journey's replay:
      // to which consumer, how many events) takes it from the chosen
      // option.
      var choice = form.getAttribute("data-confirm-choice");
      if (choice && form.elements[choice]) {
        var opt = form.elements[choice].selectedOptions[0];
        msg = opt ? opt.getAttribute("data-confirm") : null;
        if (!msg) { return; } // nothing chosen: the browser's required check answers
      }
      var selected = btn.getAttribute("data-confirm-selected");
      if (selected) {
        msg = selectedQuestion(form, selected);
        if (msg === null) {
          ev.preventDefault();
          window.alert("Select at least one row (or use the button for all matching the filter).");
          return;
        }
      }
      if (!msg) { return; }
      if (!window.confirm(msg)) { ev.preventDefault(); return; }
      var old = form.querySelector("input[name=confirm]");
      if (old) { old.remove(); }
      var input = document.createElement("input");
      input.type = "hidden"; input.name = "confirm"; input.value = "yes";
      form.appendChild(input);
    });
  }

  // Select-all: a list's header checkbox (hidden without this script)
  // ticks or clears every row of the page, and shows when some are.
  function selectAll(box) {
    var table = box.closest("table");
    var rows = function () { return table.querySelectorAll("tbody input[type=checkbox][name=id]"); };
    box.hidden = false;
    box.addEventListener("change", function () {
      rows().forEach(function (r) { r.checked = box.checked; });
    });
    table.addEventListener("change", function (ev) {
      if (ev.target === box) { return; }
      var all = rows(), on = 0;
      all.forEach(function (r) { if (r.checked) { on++; } });
      box.checked = all.length > 0 && on === all.length;
      box.indeterminate = on > 0 && on < all.length;
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("[data-refresh]").forEach(refresh);
    document.querySelectorAll("form[data-confirm], form[data-confirm-kind], form[data-confirm-choice]").forEach(confirmOnSubmit);
    document.querySelectorAll("input.select-all").forEach(selectAll);
    // A list's filter applies as soon as a value is chosen (the Filter
    // button does it without the script).
    document.querySelectorAll("form.filter select").forEach(function (sel) {
      sel.addEventListener("change", function () { sel.form.submit(); });
    });
    // A journey looked up by message id marks that message's event, which
    // may be anywhere on its page: bring it into view, unless the address
    // names an element (#event-...) itself.
    var focus = document.querySelector("section.event[data-focus]");
    if (focus && !window.location.hash) { focus.scrollIntoView(); }
  });
}());
