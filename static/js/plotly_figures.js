// Draws each server-built Plotly figure from its json_script data block. Served as a static
// file because the Content-Security-Policy allows no inline script.
(function () {
  "use strict";
  function draw() {
    document.querySelectorAll(".plotly-figure[data-figure]").forEach(function (element) {
      var block = document.getElementById(element.getAttribute("data-figure"));
      if (!block || typeof Plotly === "undefined") { return; }
      var figure = JSON.parse(block.textContent);
      Plotly.newPlot(element, figure.data || [], figure.layout || {}, figure.config || {});
    });
  }
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", draw);
  } else {
    draw();
  }
})();
