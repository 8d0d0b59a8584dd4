// Try it: build a v2 JSON request from the form and send it with fetch(); show what comes back.
(function () {
  "use strict";
  var form = document.getElementById("try-form");
  if (!form) return;
  var out = document.getElementById("try-response");
  var status = document.getElementById("try-status");
  // A protected endpoint: fill in a key created in this tab (app.js remembered it); else paste.
  var keyField = document.getElementById("try-key");
  if (keyField && !keyField.value) {
    try {
      keyField.value = sessionStorage.getItem("mmc-predict-key:" + keyField.getAttribute("data-model")) || "";
    } catch (e) { /* storage disabled: the user pastes the key */ }
  }

  function show(text, isError) {
    out.hidden = false;
    out.textContent = text;
    out.className = "response mono" + (isError ? " response-error" : "");
  }

  form.addEventListener("submit", function (event) {
    event.preventDefault();
    var inputs = [];
    var fields = form.querySelectorAll("fieldset.tensor");
    for (var i = 0; i < fields.length; i++) {
      var f = fields[i];
      var name = f.getAttribute("data-name");
      var shape = f.querySelector(".shape").value.split(",").map(function (s) { return parseInt(s.trim(), 10); });
      if (shape.some(isNaN)) { show("Shape of " + name + " must be comma-separated integers.", true); return; }
      var data;
      try { data = JSON.parse(f.querySelector(".data").value); } catch (e) {
        show("Data of " + name + " is not valid JSON: " + e.message, true); return;
      }
      inputs.push({ name: name, shape: shape, datatype: f.getAttribute("data-datatype"), data: data });
    }
    var headers = { "Content-Type": "application/json" };
    var key = keyField ? keyField.value.trim() : "";
    if (key) headers["Authorization"] = "Bearer " + key;
    status.textContent = "Sending…";
    var started = performance.now();
    fetch(form.getAttribute("data-infer-url"), { method: "POST", headers: headers, body: JSON.stringify({ inputs: inputs }) })
      .then(function (response) {
        return response.text().then(function (text) {
          var ms = Math.round(performance.now() - started);
          var pretty = text;
          try {
            pretty = JSON.stringify(JSON.parse(text), null, 2);
          } catch (e) {
            if (/^\s*</.test(text)) {  // an HTML page: nothing answers /v2 at this address
              pretty = "HTTP " + response.status + " " + response.statusText + ": this address answered with " +
                "an HTML page, not a v2 response. Is serving mounted at /v2 here (mmc start, or mmc-serve " +
                "behind the same host)?";
            }
          }
          status.textContent = "HTTP " + response.status + " in " + ms + " ms";
          show(pretty, !response.ok);
        });
      })
      .catch(function (e) { status.textContent = "Request failed"; show(String(e), true); });
  });
})();
