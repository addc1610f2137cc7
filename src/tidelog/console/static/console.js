// tidelog console: the live tail (server-sent events), value tabs, and uPlot charts.
// Pages are server-rendered; this only adds what HTML alone cannot do.
(function () {
  "use strict";
  var source = null;
  var retry = null;
  var searching = null;
  var MAX_ROWS = 1000;
  var RETRY_MS = 2000;
  var RETRY_MAX_MS = 30000;
  var MAX_FAILURES = 6;  // in a row, no event between: about a minute and a half of trying
  var failures = 0;

  function stopTail() {
    if (source) { source.close(); source = null; }
    if (retry) { clearTimeout(retry); retry = null; }
  }

  var unhidden = null;  // a search step waiting for its tab to be shown again

  function stopSearch() {
    if (searching) { clearTimeout(searching); searching = null; }
    if (unhidden) { document.removeEventListener("visibilitychange", unhidden); unhidden = null; }
  }

  // The live tail. Each event's id is the tail's cursor (where the server goes on from), so a
  // tail that reconnects, by a new stream opened here when the console's stream broke or it
  // answered with an error page, neither repeats nor skips a row. Failures in a row (no event
  // between) wait twice as long each time; after MAX_FAILURES the tail stops and says why
  // (an error page does not mend itself: a session that expired, an access withdrawn, a
  // stream deleted).
  function openTail(button, status, cursor) {
    var src = button.dataset.src + (cursor ? "&cursor=" + encodeURIComponent(cursor) : "");
    var last = cursor;
    var following = function () { failures = 0; status.textContent = "following new messages…"; };
    source = new EventSource(src);
    source.onmessage = function (event) {
      last = event.lastEventId || last;
      following();
      var rows = document.getElementById("rows");
      var empty = document.getElementById("empty");
      if (empty) empty.remove();
      rows.insertAdjacentHTML("afterbegin", event.data);
      while (rows.rows.length > MAX_ROWS) rows.deleteRow(rows.rows.length - 1);
    };
    source.addEventListener("idle", function (event) {
      last = event.lastEventId || last;
      following();
    });
    source.addEventListener("trouble", function () {
      failures = 0;  // the console answers: it is the server behind it that is out of reach
      status.textContent = "reconnecting… (the server cannot be reached; the tail goes on from where it was once it can)";
    });
    source.addEventListener("end", function () {  // past `until`: nothing can come any more
      stopTail();
      status.textContent = "tail ended: no message can come after the time range's end (until).";
      button.textContent = "▶ Live tail";
    });
    source.addEventListener("failure", function (event) {
      stopTail();
      status.textContent = "tail stopped: " + event.data;
      button.textContent = "▶ Live tail";
    });
    source.onerror = function () {
      if (source) { source.close(); source = null; }  // retried here, with a growing wait
      failures += 1;
      if (failures >= MAX_FAILURES) {
        stopTail();
        failures = 0;
        status.textContent = "tail stopped: the console did not answer it " + MAX_FAILURES +
          " times in a row (it may be down, your session may have expired, or the stream is " +
          "gone). Reload the page, and sign in again if asked.";
        button.textContent = "▶ Live tail";
        return;
      }
      var wait = Math.min(RETRY_MS * Math.pow(2, failures - 1), RETRY_MAX_MS);
      status.textContent = "reconnecting… (try " + (failures + 1) + " of " + MAX_FAILURES +
        " in " + Math.round(wait / 1000) + " s)";
      retry = setTimeout(function () { retry = null; openTail(button, status, last); }, wait);
    };
    source.onopen = function () { status.textContent = "following new messages…"; };
  }

  function setupTail(root) {
    var button = root.querySelector("#tail");
    if (!button) return;
    var status = root.querySelector("#tail-status");
    button.addEventListener("click", function () {
      if (source || retry) {
        stopTail();
        button.textContent = "▶ Live tail";
        status.textContent = "";
        return;
      }
      stopSearch();  // a search going on would leave the page, and the tail with it
      failures = 0;
      button.textContent = "■ Stop tail";
      status.textContent = "following new messages…";
      openTail(button, status, "");
    });
  }

  // A search that ran out of its budget with nothing found goes on by itself (the server said
  // where from, and how far it may go) until the user stops it; not while its tab is hidden
  // (each step scans up to a million messages on the server for a page nobody looks at).
  function setupSearch(root) {
    stopSearch();
    var notice = root.querySelector("#budget[data-go-on]");
    if (!notice) return;
    var goOn = function () {
      searching = null;
      if (document.hidden) {
        unhidden = function () {
          if (document.hidden) return;
          stopSearch();
          goOn();
        };
        document.addEventListener("visibilitychange", unhidden);
        return;
      }
      window.location.replace(notice.dataset.goOn);
    };
    searching = setTimeout(goOn, 200);
    var stop = notice.querySelector("#stop-search");
    stop.addEventListener("click", function () {
      stopSearch();
      notice.removeAttribute("data-go-on");
      document.getElementById("search-going").textContent = "Stopped.";
    });
  }

  function setupTabs(root) {
    root.querySelectorAll(".tabs button").forEach(function (tab) {
      tab.addEventListener("click", function () {
        root.querySelectorAll(".tabs button").forEach(function (b) { b.classList.remove("on"); });
        root.querySelectorAll("pre.tab").forEach(function (p) { p.hidden = true; });
        tab.classList.add("on");
        document.getElementById("tab-" + tab.dataset.tab).hidden = false;
      });
    });
  }

  // Charts read in UTC on a 24-hour clock, as the tables do (uPlot defaults to the browser's
  // zone and a 12-hour clock).
  function utc(seconds) { return uPlot.tzDate(new Date(seconds * 1e3), "Etc/UTC"); }
  function pad(n) { return (n < 10 ? "0" : "") + n; }
  function clock(seconds, decimals) {
    var d = new Date(seconds * 1e3);
    var text = pad(d.getUTCHours()) + ":" + pad(d.getUTCMinutes()) + ":" + pad(d.getUTCSeconds());
    if (decimals) text += (seconds % 1).toFixed(decimals).slice(1);
    return text;
  }
  function ticks(u, splits) {  // tenths or hundredths of a second when the ticks are that close
    var step = splits.length > 1 ? splits[1] - splits[0] : 1;
    var decimals = step >= 1 ? 0 : step >= 0.1 ? 1 : 2;
    return splits.map(function (s) { return clock(s, decimals); });
  }
  function when(seconds) {
    return new Date(seconds * 1e3).toISOString().slice(0, 10) + " " + clock(seconds) + " UTC";
  }

  function drawChart(el) {
    if (typeof uPlot === "undefined" || el.dataset.drawn) return;
    var data = JSON.parse(el.textContent);
    el.textContent = "";
    el.dataset.drawn = "1";
    var xs, series = [{ label: "time (UTC)", value: function (u, v) { return v == null ? "" : when(v); } }], columns;
    if (el.dataset.chart === "rate") {
      xs = data.t;
      columns = [data.rate];
      series.push({ label: el.dataset.series, stroke: "#2b6cb0", width: 2 });
    } else {
      var names = Object.keys(data), times = {};
      names.forEach(function (n) { data[n].t.forEach(function (t) { times[t] = 1; }); });
      xs = Object.keys(times).map(Number).sort(function (a, b) { return a - b; });
      var palette = ["#2b6cb0", "#c05621", "#2f855a", "#6b46c1", "#b83280", "#718096"];
      columns = names.map(function (n, i) {
        var at = {};
        data[n].t.forEach(function (t, j) { at[t] = data[n].lag[j]; });
        series.push({ label: n, stroke: palette[i % palette.length], width: 2 });
        return xs.map(function (t) { return t in at ? at[t] : null; });
      });
    }
    if (xs.length < 2) {
      el.innerHTML = '<p class="muted">Collecting samples; reload in a few seconds.</p>';
      return;
    }
    new uPlot({ width: Math.min(el.clientWidth || 800, 900), height: 220, series: series, tzDate: utc,
                axes: [{ values: ticks }, { size: 60 }], scales: { y: { range: function (u, lo, hi) { return [0, Math.max(hi, 1)]; } } } },
              [xs].concat(columns), el);
  }

  // Cancel on a confirmation goes back to the page it came from (a script, not a
  // javascript: link, which the Content-Security-Policy refuses); without scripts, its href.
  function setupBack(root) {
    root.querySelectorAll("a.back").forEach(function (link) {
      link.addEventListener("click", function (event) {
        if (history.length > 1) { event.preventDefault(); history.back(); }
      });
    });
  }

  // The filter form sends only the fields filled in: an empty one would only lengthen the URL.
  // Disabled fields are not sent (by the browser, nor by htmx); they come back at once.
  function setupFilters(root) {
    var form = root.querySelector("form#filters");
    if (!form) return;
    form.addEventListener("submit", function () {
      var emptied = [];
      form.querySelectorAll("input[name]").forEach(function (input) {
        if (input.value.trim() === "") { input.disabled = true; emptied.push(input); }
      });
      setTimeout(function () { emptied.forEach(function (i) { i.disabled = false; }); }, 0);
    }, true);
  }

  function setup(root) {
    setupTail(root);
    setupSearch(root);
    setupTabs(root);
    setupBack(root);
    setupFilters(root);
    root.querySelectorAll(".chart[data-chart]").forEach(drawChart);
  }

  document.addEventListener("DOMContentLoaded", function () { setup(document); });
  document.addEventListener("htmx:beforeSwap", function () { stopTail(); stopSearch(); });
  document.addEventListener("htmx:afterSettle", function () { setup(document); });
})();
