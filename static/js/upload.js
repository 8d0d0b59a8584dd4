// Upload with a real progress bar: XMLHttpRequest PUTs the file to the REST API's raw upload
// endpoint (session auth + CSRF header), then the versions table is refreshed and keeps polling
// until validation ends.
(function () {
  "use strict";
  var form = document.getElementById("upload-form");
  if (!form) return;
  var csrf = document.querySelector('meta[name="csrf-token"]').getAttribute("content");
  var bar = document.getElementById("upload-progress");
  var row = document.getElementById("upload-progress-row");
  var percent = document.getElementById("upload-percent");
  var result = document.getElementById("upload-result");
  var button = document.getElementById("upload-button");

  function say(text, isError) {
    // a fresh element: any earlier upload's htmx poll ends with the one it was polling from
    var fresh = document.createElement("p");
    fresh.id = "upload-result";
    fresh.setAttribute("role", "status");
    fresh.setAttribute("aria-live", "polite");
    document.getElementById("upload-result").replaceWith(fresh);
    result = fresh;
    result.textContent = text;
    result.className = isError ? "error" : "ok";
  }

  // The status line follows the version: htmx polls its partial until ready or failed.
  function followStatus(number) {
    var url = form.getAttribute("data-status-url").replace("/0/", "/" + number + "/");
    if (window.htmx) {
      htmx.ajax("GET", url, { target: "#upload-result", swap: "outerHTML" });
    }
  }

  function refreshRows() {
    if (window.htmx) {
      htmx.ajax("GET", form.getAttribute("data-rows-url"), { target: "#versions", swap: "outerHTML" });
    }
  }

  form.addEventListener("submit", function (event) {
    event.preventDefault();
    var file = document.getElementById("id_file").files[0];
    if (!file) { say("Choose an ONNX file first.", true); return; }
    var metadata = document.getElementById("id_metadata").value.trim();
    if (metadata) {
      try { JSON.parse(metadata); } catch (e) { say("Metadata is not valid JSON: " + e.message, true); return; }
    }
    var metrics = {};
    var pairs = document.getElementById("id_metrics").value.split(/[,\n]/);
    for (var i = 0; i < pairs.length; i++) {
      var pair = pairs[i].trim();
      if (!pair) continue;
      var at = pair.indexOf("=");
      var value = at > 0 ? Number(pair.slice(at + 1).trim()) : NaN;
      if (at <= 0 || pair.slice(at + 1).trim() === "" || !isFinite(value)) {
        say("Metric “" + pair + "” is not NAME=NUMBER (e.g. auc=0.91).", true);
        return;
      }
      metrics[pair.slice(0, at).trim()] = value;
    }
    var lineage = {};
    ["run_url", "git_commit", "dataset"].forEach(function (key) {
      var v = document.getElementById("id_" + key).value.trim();
      if (v) lineage[key] = v;
    });
    var url = form.getAttribute("data-upload-url") + "?filename=" + encodeURIComponent(file.name);
    if (metadata) url += "&metadata=" + encodeURIComponent(metadata);
    if (Object.keys(metrics).length) url += "&metrics=" + encodeURIComponent(JSON.stringify(metrics));
    if (Object.keys(lineage).length) url += "&lineage=" + encodeURIComponent(JSON.stringify(lineage));

    var xhr = new XMLHttpRequest();
    xhr.open("PUT", url);
    xhr.setRequestHeader("Content-Type", "application/octet-stream");
    xhr.setRequestHeader("X-CSRFToken", csrf);
    xhr.setRequestHeader("Accept", "application/json");
    row.hidden = false;
    bar.value = 0;
    percent.textContent = "0%";
    button.disabled = true;
    say("Uploading " + file.name + "…", false);
    xhr.upload.onprogress = function (e) {
      if (!e.lengthComputable) return;
      var p = Math.round((e.loaded / e.total) * 100);
      bar.value = p;
      percent.textContent = p + "%";
    };
    xhr.onload = function () {
      button.disabled = false;
      var body = {};
      try { body = JSON.parse(xhr.responseText); } catch (e) { body = {}; }
      if (xhr.status === 201 || xhr.status === 200) {
        bar.value = 100;
        percent.textContent = "100% uploaded";
        say(xhr.status === 201
          ? "Uploaded as version " + body.number + "; validating…"
          : (body.detail || "Already uploaded as version " + body.number + "."), false);
        form.reset();
        refreshRows();
        if (body.number) followStatus(body.number);
      } else {
        percent.textContent = "failed";
        say("Upload failed (" + xhr.status + "): " + (body.detail || body.error || xhr.statusText), true);
      }
    };
    xhr.onerror = function () {
      button.disabled = false;
      percent.textContent = "failed";
      say("Upload failed: network error.", true);
    };
    xhr.send(file);
  });
})();
