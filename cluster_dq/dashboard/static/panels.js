// Loads the panels' fragments into the elements that name them (data-panel-src), and again
// every data-panel-refresh ms when asked. Plain JS, no library. A fragment that fails (an
// error page: 400, 404, 503…) is not put in the panel (it is a whole page, nav and all): the
// panel says why as text, or, when it already shows a fragment, keeps it and is marked. A panel
// with a form being filled in (a field in focus, or one changed from what it showed) is not
// refreshed until it is left as it was: a refresh would throw away what was typed.
(function () {
  "use strict";
  function reason(status, text) {
    var doc = new DOMParser().parseFromString(text, "text/html");
    var said = doc.getElementById("error-message");
    return (said && said.textContent.trim()) || "HTTP " + status;
  }
  function failed(el, why) {
    el.classList.add("panel-error");
    el.dataset.panelError = why;
    if (!el.dataset.panelLoaded) el.textContent = "could not load this panel: " + why;
    else el.title = "not refreshed: " + why;
  }
  function load(el) {
    fetch(el.dataset.panelSrc, { credentials: "same-origin", headers: { Accept: "text/html" } })
      .then(function (r) { return r.text().then(function (t) { return [r.ok, t, r.status]; }); })
      .then(function (got) {
        if (!got[0]) { failed(el, reason(got[2], got[1])); return; }
        el.innerHTML = got[1];  // the service's own fragment, escaped by its templates (UTC times)
        el.dataset.panelLoaded = String(Date.now());
        el.classList.remove("panel-error");
        delete el.dataset.panelError;
        el.removeAttribute("title");
      })
      .catch(function () { failed(el, "the dashboard did not answer"); });
  }
  function editing(el) {
    var focused = document.activeElement;
    if (focused && focused !== document.body && el.contains(focused) &&
        /^(INPUT|TEXTAREA|SELECT)$/.test(focused.tagName)) return true;
    return Array.prototype.some.call(el.querySelectorAll("input, textarea"), function (f) {
      return f.value !== f.defaultValue;
    });
  }
  function start() {
    document.querySelectorAll("[data-panel-src]").forEach(function (el) {
      if (el.dataset.panelStarted) return;
      el.dataset.panelStarted = "1";
      load(el);
      var every = parseInt(el.dataset.panelRefresh || "0", 10);
      if (every > 0) setInterval(function () { if (!editing(el)) load(el); }, every);
    });
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
