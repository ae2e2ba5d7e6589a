// cluster_dq dashboard: live sizes (server-sent events), confirmations. Times are the
// server's, in UTC and labelled so (cluster_dq/dashboard/times.py): never rewritten here.
// Plain JavaScript, no dependencies: works offline.
(function () {
  "use strict";

  function fmtRate(v) {
    return v === null || v === undefined ? "\u2014" : v.toFixed(1) + "/s";
  }

  function fmtDuration(ms) {
    if (ms === null || ms === undefined) return "\u2014";
    if (ms < 1000) return ms + " ms";
    if (ms < 120000) return (ms / 1000).toFixed(1) + " s";
    if (ms < 7200000) return (ms / 60000).toFixed(1) + " min";
    return (ms / 3600000).toFixed(1) + " h";
  }

  function apply(event) {
    var data;
    try { data = JSON.parse(event.data); } catch (e) { return; }
    (data.queues || []).forEach(function (row) {
      var key = row.ns + "/" + row.q;
      document.querySelectorAll('[data-queue="' + key + '"]').forEach(function (box) {
        ["ready", "delayed", "reserved", "dead"].forEach(function (state) {
          box.querySelectorAll('[data-size="' + state + '"]').forEach(function (el) {
            var target = el.querySelector("a") || el;
            target.textContent = String(row[state]);
          });
        });
        ["published", "delivered", "acked"].forEach(function (kind) {
          box.querySelectorAll('[data-rate="' + kind + '"]').forEach(function (el) {
            el.textContent = fmtRate(row[kind + "_rate"]);
          });
        });
        box.querySelectorAll("[data-lateness]").forEach(function (el) {
          el.textContent = fmtDuration(row.lateness_ms);
        });
        box.querySelectorAll("[data-paused]").forEach(function (el) {
          el.setAttribute("data-paused", row.paused ? "true" : "false");
          el.textContent = row.paused ? "paused" : "";
        });
      });
    });
    document.body.setAttribute("data-live-at", String(data.at_ms));
  }

  function live() {
    var box = document.querySelector("[data-events]");
    if (!box || !window.EventSource) return;
    var source = new EventSource(box.getAttribute("data-events"));
    source.addEventListener("sizes", apply);
    source.addEventListener("bye", function () { source.close(); });
    window.addEventListener("pagehide", function () { source.close(); });
  }

  function confirmations() {
    document.querySelectorAll("[data-confirm]").forEach(function (button) {
      button.addEventListener("click", function (e) {
        if (!window.confirm(button.getAttribute("data-confirm"))) e.preventDefault();
      });
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    confirmations();
    live();
  });
})();
