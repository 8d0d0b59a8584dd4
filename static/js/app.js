// Small behaviours shared by every page: confirmations (fixed or filled from the form), copy buttons, CSV link follows filters,
// proportional widths.
(function () {
  "use strict";
  document.addEventListener("submit", function (event) {
    var form = event.target;
    var question = form.getAttribute && form.getAttribute("data-confirm");
    var template = form.getAttribute && form.getAttribute("data-confirm-template");
    if (template) {  // "{version}" -> the form's current value (a ticked checkbox: its data-note)
      question = template.replace(/\{(\w+)\}/g, function (_, name) {
        var field = form.elements[name];
        if (!field) return "";
        if (field.type === "checkbox") return field.checked ? (field.getAttribute("data-note") || "") : "";
        return field.value;
      });
    }
    if (question && !window.confirm(question)) {
      event.preventDefault();
    }
  }, true);

  document.addEventListener("click", function (event) {
    var button = event.target.closest && event.target.closest("button[data-copy]");
    if (!button) return;
    var text = document.getElementById(button.getAttribute("data-copy")).textContent;
    var done = function () { button.textContent = "Copied"; setTimeout(function () { button.textContent = "Copy"; }, 1500); };
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(text).then(done);
    } else {
      var area = document.createElement("textarea");
      area.value = text; document.body.appendChild(area); area.select();
      document.execCommand("copy"); area.remove(); done();
    }
  });

  // Proportional widths (the traffic split) come as data-flex: the CSP forbids style="" in markup,
  // so they are set here, on the page and on every part htmx swaps in.
  function applyFlex(root) {
    if (root.matches && root.matches("[data-flex]")) root.style.flex = root.getAttribute("data-flex");
    if (root.querySelectorAll) {
      root.querySelectorAll("[data-flex]").forEach(function (el) { el.style.flex = el.getAttribute("data-flex"); });
    }
  }
  if (window.htmx) {
    htmx.onLoad(applyFlex);
  } else {
    document.addEventListener("DOMContentLoaded", function () { applyFlex(document); });
  }

  // A predict key just created (shown once): kept for this tab only, so the try-it form on the
  // model's version pages can fill it in.
  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("[data-remember-key]").forEach(function (el) {
      try { sessionStorage.setItem("mmc-predict-key:" + el.getAttribute("data-remember-key"), el.textContent.trim()); } catch (e) { /* storage disabled */ }
    });
  });

  document.addEventListener("htmx:afterSwap", function () {
    var table = document.getElementById("audit-table");
    var link = document.getElementById("csv-link");
    if (table && link) link.setAttribute("href", table.getAttribute("data-csv"));
  });
})();
