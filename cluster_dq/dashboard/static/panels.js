// Loads the panels' fragments into the elements that name them (data-panel-src), and again
// every data-panel-refresh ms when asked. Plain JS, no library.
(function () {
  "use strict";
  function load(el) {
    fetch(el.dataset.panelSrc, { credentials: "same-origin", headers: { Accept: "text/html" } })
      .then(function (r) { return r.text().then(function (t) { return [r.ok, t]; }); })
      .then(function (got) {
        el.innerHTML = got[1];
        el.querySelectorAll("time[data-ms]").forEach(function (t) {
          var ms = Number(t.getAttribute("data-ms"));
          if (ms > 0) t.textContent = new Date(ms).toLocaleString();
        });
        el.dataset.panelLoaded = String(Date.now());
        el.classList.toggle("panel-error", !got[0]);
      })
      .catch(function () { el.classList.add("panel-error"); });
  }
  function start() {
    document.querySelectorAll("[data-panel-src]").forEach(function (el) {
      if (el.dataset.panelStarted) return;
      el.dataset.panelStarted = "1";
      load(el);
      var every = parseInt(el.dataset.panelRefresh || "0", 10);
      if (every > 0) setInterval(function () { load(el); }, every);
    });
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
