// Live updates without a build step: every element with data-poll is replaced by the
// server-rendered fragment at that URL every few seconds. Polling pauses while the page is
// hidden, and a failed fetch keeps what is shown.
(function () {
  "use strict";
  var PERIOD_MS = 2000;
  function refresh(element) {
    if (document.hidden) return;
    fetch(element.getAttribute("data-poll"), { credentials: "same-origin" })
      .then(function (response) { return response.ok ? response.text() : null; })
      .then(function (html) { if (html !== null) element.innerHTML = html; })
      .catch(function () {});
  }
  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("[data-poll]").forEach(function (element) {
      setInterval(function () { refresh(element); }, PERIOD_MS);
    });
  });
})();
