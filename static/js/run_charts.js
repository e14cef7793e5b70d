// Loss and mAP curves of a run, drawn from the JSON the page carries; redrawn after each
// htmx refresh of the live part of the page.
(function () {
  "use strict";
  var LOSSES = ["box_loss", "cls_loss", "dfl_loss", "val_box_loss", "val_cls_loss", "val_dfl_loss"];
  var QUALITY = ["mAP50", "mAP50-95"];
  var LAYOUT = {margin: {t: 36, r: 12, b: 40, l: 48}, height: 280, font: {size: 12},
                xaxis: {title: {text: "epoch"}, tickformat: "d"}, legend: {orientation: "h", y: -0.25}};

  function traces(series, names) {
    return names.filter(function (name) {
      return (series[name] || []).some(function (value) { return value !== null; });
    }).map(function (name) {
      return {x: series.epochs, y: series[name], name: name, mode: "lines+markers",
              line: {dash: name.indexOf("val_") === 0 ? "dot" : "solid"}};
    });
  }

  // A tune job: fitness per iteration and the best so far (training/tuning.py tune_series).
  function drawTune(series) {
    var traces = [
      {x: series.iterations, y: series.fitness, name: "fitness", mode: "lines+markers"},
      {x: series.iterations, y: series.best, name: "best so far", mode: "lines", line: {dash: "dot"}}
    ];
    if ((series["mAP50-95"] || []).some(function (value) { return value !== null && value !== undefined; })) {
      traces.push({x: series.iterations, y: series["mAP50-95"], name: "mAP50-95", mode: "markers"});
    }
    var layout = Object.assign({}, LAYOUT, {title: {text: "Tune: fitness per iteration"},
                                            xaxis: {title: {text: "iteration"}, tickformat: "d"}});
    Plotly.react("chart-tune", traces, layout, {displayModeBar: false, responsive: true});
  }

  function draw() {
    if (typeof Plotly === "undefined") { return; }
    var tune = document.getElementById("tune-series");
    if (tune) { drawTune(JSON.parse(tune.textContent)); }
    var data = document.getElementById("run-series");
    if (!data) { return; }
    var series = JSON.parse(data.textContent);
    Plotly.react("chart-loss", traces(series, LOSSES), Object.assign({title: {text: "Losses"}}, LAYOUT),
                 {displayModeBar: false, responsive: true});
    Plotly.react("chart-map", traces(series, QUALITY), Object.assign({title: {text: "mAP"}}, LAYOUT),
                 {displayModeBar: false, responsive: true});
  }

  window.addEventListener("load", draw);
  document.addEventListener("htmx:afterSwap", draw);
}());
