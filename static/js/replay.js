// Replay: send a captured request's inputs to another version (fetch, as Try it does) and show
// its answer beside the captured one, with how far they are apart.
(function () {
  "use strict";
  var form = document.getElementById("replay-form");
  if (!form) return;
  var body = JSON.parse(document.getElementById("replay-body").textContent);
  var captured = JSON.parse(document.getElementById("replay-captured").textContent);
  var select = document.getElementById("replay-against");
  var right = document.getElementById("replay-right");
  var status = document.getElementById("replay-status");
  var diff = document.getElementById("replay-diff");
  var button = document.getElementById("replay-run");
  var keyField = document.getElementById("try-key");
  if (keyField && !keyField.value) {
    try {
      keyField.value = sessionStorage.getItem("mmc-predict-key:" + keyField.getAttribute("data-model")) || "";
    } catch (e) { /* storage disabled: the user pastes the key */ }
  }

  function fmt(v) { return typeof v === "number" ? String(Number(v.toPrecision(6))) : String(v); }

  function text(outputs) {
    return outputs.map(function (t) {
      var data = t.data || [];
      var shown = data.slice(0, 40).map(fmt).join(", ");
      return t.name + "  " + t.datatype + " [" + t.shape.join(", ") + "]\n[" + shown +
        (data.length > 40 ? ", … (" + data.length + " values)" : "") + "]";
    }).join("\n");
  }

  function argmax(a) {
    var best = 0;
    for (var i = 1; i < a.length; i++) if (a[i] > a[best]) best = i;
    return best;
  }

  function compare(outputs) {
    var parts = [];
    outputs.forEach(function (t) {
      var c = captured[t.name];
      if (!c || !Array.isArray(t.data) || c.data.length !== t.data.length || typeof t.data[0] !== "number") return;
      var max = 0;
      for (var i = 0; i < t.data.length; i++) max = Math.max(max, Math.abs(t.data[i] - c.data[i]));
      var rows = t.shape.length >= 2 ? t.shape[0] : 1, width = t.data.length / rows, agree = 0;
      for (var r = 0; r < rows; r++) {
        if (argmax(t.data.slice(r * width, (r + 1) * width)) === argmax(c.data.slice(r * width, (r + 1) * width))) agree++;
      }
      parts.push(t.name + ": max |difference| " + fmt(max) + ", argmax agrees on " + agree + "/" + rows + " row" + (rows === 1 ? "" : "s"));
    });
    return parts.length ? parts.join("; ") : "No output to compare with the captured one.";
  }

  select.addEventListener("change", function () {
    document.getElementById("replay-against-label").textContent = select.value;
  });
  form.addEventListener("submit", function (event) {
    event.preventDefault();
    var version = select.value;
    var headers = { "Content-Type": "application/json" };
    var key = keyField ? keyField.value.trim() : "";
    if (key) headers["Authorization"] = "Bearer " + key;
    status.textContent = "Sending…";
    document.getElementById("replay-right-version").textContent = version;
    var started = performance.now();
    fetch(button.getAttribute("data-infer-base") + version + "/infer",
          { method: "POST", headers: headers, body: JSON.stringify(body) })
      .then(function (response) {
        return response.text().then(function (raw) {
          var ms = Math.round(performance.now() - started);
          status.textContent = "HTTP " + response.status + " in " + ms + " ms";
          var doc = null;
          try { doc = JSON.parse(raw); } catch (e) { /* not JSON: shown as it came */ }
          if (!response.ok || !doc || !doc.outputs) {
            right.textContent = doc && doc.error ? doc.error : raw.slice(0, 2000);
            right.className = "response mono response-error";
            diff.textContent = "";
            return;
          }
          right.className = "response mono";
          right.textContent = text(doc.outputs);
          diff.textContent = compare(doc.outputs);
        });
      })
      .catch(function (e) { status.textContent = "Request failed"; right.textContent = String(e); });
  });
})();
