// Mercator console: follows a run's log, status and attempts over server-sent
// events. The pages work without it (everything else is plain links and forms).
"use strict";
document.addEventListener("DOMContentLoaded", function () {
  var log = document.getElementById("log");
  if (!log || !log.dataset.src || !window.EventSource) {
    return;
  }
  var state = document.getElementById("log-state");
  var src = new EventSource(log.dataset.src);
  src.onmessage = function (e) {
    var atEnd = log.scrollTop + log.clientHeight >= log.scrollHeight - 4;
    log.appendChild(document.createTextNode(e.data + "\n"));
    if (atEnd) {
      log.scrollTop = log.scrollHeight;
    }
  };
  src.addEventListener("status", function (e) {
    var run = JSON.parse(e.data);
    document.getElementById("run-status").textContent = run.status;
    document.getElementById("run-stage").textContent = run.stage ? ": " + run.stage : "";
    if (run.attempts && run.attempts.length) {
      drawAttempts(document.getElementById("attempt-rows"), run.attempts);
    }
  });
  src.addEventListener("failure", function (e) {
    state.textContent = "The log could not be read: " + e.data;
  });
  src.addEventListener("end", function () {
    src.close();
    state.textContent = "The run ended; its log is complete.";
    log.dataset.done = "true";
  });
});

// drawAttempts replaces the attempts table's rows with the server's cells
// (text only: nothing the server sends is parsed as markup).
function drawAttempts(body, rows) {
  var next = document.createElement("tbody");
  next.id = body.id;
  rows.forEach(function (cells) {
    var tr = next.insertRow();
    cells.forEach(function (text, i) {
      var cell = document.createElement(i === 0 ? "th" : "td");
      if (i === 0) {
        cell.scope = "row";
      }
      cell.textContent = text;
      tr.appendChild(cell);
    });
  });
  body.replaceWith(next);
}
