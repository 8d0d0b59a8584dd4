// Deployment page: weight sliders show their number as they move (mouse or arrow keys), and the
// plan fields are only offered when the automated analysis is ticked.
(function () {
  "use strict";
  function sync(slider) {
    var out = document.getElementById(slider.getAttribute("data-output"));
    if (out) out.textContent = slider.value + " %";
    slider.setAttribute("aria-valuetext", slider.value + " percent");
  }
  document.addEventListener("input", function (event) {
    if (event.target.matches && event.target.matches("input[type=range][data-output]")) sync(event.target);
  });
  function togglePlan() {
    var box = document.getElementById("canary-automated");
    var plan = document.getElementById("canary-plan");
    if (box && plan) plan.hidden = !box.checked;
  }
  document.addEventListener("change", function (event) {
    if (event.target.id === "canary-automated") togglePlan();
  });
  function init() {
    document.querySelectorAll("input[type=range][data-output]").forEach(sync);
    togglePlan();
  }
  // also after htmx redraws the controls (the endpoint changed under the page)
  if (window.htmx) htmx.onLoad(init);
  document.addEventListener("DOMContentLoaded", init);
})();
