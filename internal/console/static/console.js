// Outflow console: live refresh of the overview, and confirmations.
// No framework, no build step. The server asks again (a confirmation page)
// when this script does not run.
(function () {
  "use strict";

  // Live refresh: swap in the fragment every 2s; a lost session reloads
  // the page, which sends the browser to /login.
  function refresh(el) {
    var url = el.getAttribute("data-refresh");
    setInterval(function () {
      if (document.hidden) { return; }
      fetch(url, { credentials: "same-origin", redirect: "manual" }).then(function (res) {
        if (res.type === "opaqueredirect" || res.status === 403 || res.status === 401) {
          window.location.reload();
          return null;
        }
        return res.ok ? res.text() : null;
      }).then(function (html) {
        if (html !== null && html !== undefined) { el.innerHTML = html; }
      }).catch(function () { /* the next tick tries again */ });
    }, 2000);
  }

  // Confirmation: a form (or the button that submits it) with
  // data-confirm asks in the browser and then sends confirm=yes, which
  // spares the confirmation page.
  function confirmOnSubmit(form) {
    form.addEventListener("submit", function (ev) {
      var btn = ev.submitter;
      // Without the button that submitted (an older browser), the message
      // could be another button's: let the server's page ask instead.
      if (!btn) { return; }
      var msg = btn.getAttribute("data-confirm") || form.getAttribute("data-confirm");
      if (!msg) { return; }
      if (!window.confirm(msg)) { ev.preventDefault(); return; }
      var old = form.querySelector("input[name=confirm]");
      if (old) { old.remove(); }
      var input = document.createElement("input");
      input.type = "hidden"; input.name = "confirm"; input.value = "yes";
      form.appendChild(input);
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("[data-refresh]").forEach(refresh);
    document.querySelectorAll("form[data-confirm]").forEach(confirmOnSubmit);
    // A journey looked up by message id marks that message's event, which
    // may be anywhere on its page: bring it into view, unless the address
    // names an element (#event-...) itself.
    var focus = document.querySelector("section.event[data-focus]");
    if (focus && !window.location.hash) { focus.scrollIntoView(); }
  });
}());
