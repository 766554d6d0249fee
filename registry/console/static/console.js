// Live regions of the console's pages: re-read from the server when the configuration revision
// moves (server-sent events from /console/events) or, where a page asks (data-live-every, seconds),
// on a timer. Only elements marked data-live are replaced, and never one holding the focus, so a
// keyboard user never loses their place. Without JavaScript every page still works (plain links
// and forms); it only stops updating by itself.
(function () {
  "use strict";
  function refresh() {
    fetch(window.location.href, { credentials: "same-origin", headers: { Accept: "text/html", "X-Console-Refresh": "1" } })
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (html) {
        if (!html) { return; }
        var fresh = new DOMParser().parseFromString(html, "text/html");
        document.querySelectorAll("[data-live][id]").forEach(function (old) {
          var next = fresh.getElementById(old.id);
          if (next && !old.contains(document.activeElement)) { old.innerHTML = next.innerHTML; }
        });
        document.body.dataset.refreshed = String(Date.now());
      })
      .catch(function () { /* the control plane restarts: the next event or tick tries again */ });
  }
  var events = null, timer = null, seen = null;
  function listen() {
    events = new EventSource("/console/events");
    events.addEventListener("config", function (e) {
      if (seen !== null && e.data !== seen) { refresh(); }
      seen = e.data;
      document.body.dataset.revision = e.data;
    });
    var every = Number(document.body.dataset.liveEvery || 0);
    if (every > 0) { timer = window.setInterval(refresh, every * 1000); }
  }
  // A page left for another is closed as it goes: a page the browser keeps for "back" would otherwise
  // keep its event stream's connection, and browsers allow six to one host (HTTP/1.1): the next
  // page would wait for one. Shown again from that cache, it re-reads itself and listens again.
  window.addEventListener("pagehide", function () {
    if (events) { events.close(); events = null; }
    if (timer) { window.clearInterval(timer); timer = null; }
  });
  window.addEventListener("pageshow", function (e) {
    if (e.persisted && document.querySelector("[data-live]") && !events) { refresh(); listen(); }
  });
  document.addEventListener("DOMContentLoaded", function () {
    if (document.querySelector("[data-live]")) { listen(); }
  });
})();
