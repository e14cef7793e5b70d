/* gpubook booking calendar: EventCalendar (resource timeline) + htmx partials.
 *
 * The server decides everything: this script only shows the feed, refuses selections that
 * are plainly busy or past (a courtesy; the booking service checks again), and loads the
 * booking form / details panel as htmx partials.
 *
 * Times: the feed sends floating wall-clock strings in the user's zone (their profile's, not
 * the browser's). EventCalendar hands such times to callbacks as Date objects whose *local*
 * fields (getHours() …) hold that wall clock, so everything here reads and builds Dates by
 * their local fields and never by their absolute value.
 */
(function () {
  "use strict";

  const config = JSON.parse(document.getElementById("calendar-config").textContent);
  const root = document.getElementById("calendar");
  const panel = document.getElementById("panel");
  const statusLine = document.getElementById("calendar-status");
  const loadedAt = Date.now();

  function pad(n) {
    return String(n).padStart(2, "0");
  }

  function floating(date) {
    return (
      date.getFullYear() + "-" + pad(date.getMonth() + 1) + "-" + pad(date.getDate()) +
      "T" + pad(date.getHours()) + ":" + pad(date.getMinutes()) + ":" + pad(date.getSeconds())
    );
  }

  function parseFloating(text) {
    const [day, time] = text.split("T");
    const [y, m, d] = day.split("-").map(Number);
    const [hh, mm, ss] = time.split(":").map(Number);
    return new Date(y, m - 1, d, hh, mm, ss || 0);
  }

  // The user's wall clock now: the server's reading at page load plus the time since.
  function nowWallClock() {
    return new Date(parseFloating(config.now).getTime() + (Date.now() - loadedAt));
  }

  function currentSlotStart() {
    const now = nowWallClock();
    const minutes = now.getHours() * 60 + now.getMinutes();
    const floored = minutes - (minutes % config.slotMinutes);
    return new Date(now.getFullYear(), now.getMonth(), now.getDate(), Math.floor(floored / 60), floored % 60);
  }

  function say(text, tone) {
    statusLine.textContent = text || "";
    statusLine.dataset.tone = tone || "";
  }

  let refusedDuringDrag = "";
  root.addEventListener(
    "pointerdown",
    function () {
      refusedDuringDrag = "";
      say("");
    },
    true
  );

  // One fetch per visible range feeds both the resources and the events.
  let cache = { key: null, promise: null };
  function load(info) {
    const start = floating(info.start);
    const end = floating(info.end);
    const key = start + "|" + end;
    if (cache.key !== key) {
      const url = config.feedUrl + "?" + new URLSearchParams({ start: start, end: end });
      cache = {
        key: key,
        promise: fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } }).then(
          function (response) {
            if (!response.ok) throw new Error("feed " + response.status);
            return response.json();
          }
        ),
      };
      cache.promise.catch(function () {
        cache = { key: null, promise: null };
        say("Could not load the calendar. Reload the page to try again.", "error");
      });
    }
    return cache.promise;
  }

  function gpuIdsOf(resource) {
    if (!resource) return [];
    const props = resource.extendedProps || {};
    if (props.gpus) return props.gpus.map(String); // a node's row: all its GPUs
    return [String(resource.id)];
  }

  // Why a selection cannot be booked, or "" when it looks free.
  function refusal(info) {
    const gpus = gpuIdsOf(info.resource);
    if (!gpus.length) return "Choose a GPU row.";
    if (info.start < currentSlotStart()) return "That time has passed; pick a slot from now on.";
    for (const event of calendar.getEvents()) {
      const props = event.extendedProps || {};
      if (props.kind === "dst-repeated") continue;
      if (!(event.start < info.end && event.end > info.start)) continue;
      const hit = (event.resourceIds || []).some(function (id) {
        return gpus.includes(String(id));
      });
      if (!hit) continue;
      if (props.kind === "maintenance") return "That GPU is in maintenance then.";
      if (props.kind === "dst-skipped") return "That hour does not exist (the clocks go forward).";
      return "That slot is already booked" + (props.team ? " by " + props.team : "") + ".";
    }
    return "";
  }

  function openPanel(url) {
    htmx.ajax("GET", url, { target: "#panel", swap: "innerHTML" });
  }

  function showInPanel(title, lines) {
    panel.replaceChildren();
    const section = document.createElement("section");
    const head = document.createElement("div");
    head.className = "panel-head";
    const heading = document.createElement("h2");
    heading.textContent = title;
    const close = document.createElement("button");
    close.type = "button";
    close.className = "icon-button";
    close.dataset.closePanel = "";
    close.setAttribute("aria-label", "Close");
    close.textContent = "×";
    head.append(heading, close);
    section.append(head);
    for (const line of lines) {
      const p = document.createElement("p");
      p.textContent = line;
      section.append(p);
    }
    panel.append(section);
    panel.hidden = false;
  }

  function span(event) {
    const fmt = function (d) {
      return pad(d.getHours()) + ":" + pad(d.getMinutes());
    };
    const day = event.start.toLocaleDateString("en-GB", { weekday: "short", day: "numeric", month: "short" });
    return day + ", " + fmt(event.start) + "–" + fmt(event.end);
  }

  const calendar = EventCalendar.create(root, {
    view: config.view === "day" ? "resourceTimelineDay" : "resourceTimelineWeek",
    date: config.date,
    timeZone: config.offset,
    locale: "en-GB",
    firstDay: 1,
    headerToolbar: { start: "prev,next today", center: "title", end: "resourceTimelineDay,resourceTimelineWeek" },
    buttonText: function (text) {
      return Object.assign(text, { today: "Today", resourceTimelineDay: "Day", resourceTimelineWeek: "Week" });
    },
    views: {
      resourceTimelineDay: { slotDuration: "00:30", slotWidth: 36, slotLabelInterval: "01:00" },
      // The week fits the width (an overview); the day view is where precise dragging happens.
      resourceTimelineWeek: {
        slotDuration: "03:00",
        slotWidth: Math.max(16, Math.floor((root.clientWidth - 250) / 56)),
        snapDuration: "00:30",
        slotLabelInterval: "06:00",
        slotLabelFormat: { hour: "2-digit", hour12: false },
      },
    },
    slotLabelFormat: { hour: "2-digit", minute: "2-digit", hour12: false },
    eventTimeFormat: { hour: "2-digit", minute: "2-digit", hour12: false },
    dayHeaderFormat: { weekday: "short", day: "numeric", month: "short" },
    nowIndicator: true,
    scrollTime: pad(Math.max(0, nowWallClock().getHours() - 2)) + ":00:00",
    resources: function (info) {
      return load(info).then(function (feed) { return feed.resources; });
    },
    refetchResourcesOnNavigate: true,
    eventSources: [{ events: function (info) { return load(info).then(function (feed) { return feed.events; }); } }],
    editable: false,
    selectable: true,
    selectMinDistance: 4,
    selectBackgroundColor: "rgba(37, 99, 235, 0.25)",
    selectConstraint: function (info) {
      const why = refusal(info);
      if (why) {
        refusedDuringDrag = why;
        say(why, "warning");
      }
      return !why;
    },
    select: function (info) {
      // A drag that touched a busy or past slot books nothing, not even its free part.
      const why = refusedDuringDrag || refusal(info);
      refusedDuringDrag = "";
      if (why) {
        say(why + " Nothing was booked.", "warning");
        calendar.unselect();
        return;
      }
      say("");
      const params = new URLSearchParams({ start: floating(info.start), end: floating(info.end) });
      for (const id of gpuIdsOf(info.resource)) params.append("gpu", id);
      openPanel(config.bookUrl + "?" + params);
    },
    unselectAuto: false,
    eventClick: function (info) {
      const props = info.event.extendedProps || {};
      if (props.kind === "booking") {
        openPanel(config.detailUrl.replace("{id}", props.reservation));
      } else if (props.kind === "busy") {
        showInPanel("Busy", ["Booked by team " + props.team + ".", span(info.event)]);
      } else if (props.kind === "maintenance") {
        showInPanel("Maintenance", [props.reason, span(info.event)]);
      }
    },
    eventDidMount: function (info) {
      const label = info.event.title + " — " + span(info.event);
      info.el.setAttribute("title", label);
      const props = info.event.extendedProps || {};
      if (props.kind === "booking" || props.kind === "busy" || props.kind === "maintenance") {
        info.el.setAttribute("aria-label", label);
        info.el.setAttribute("role", "button");
        info.el.tabIndex = 0;
        info.el.addEventListener("keydown", function (e) {
          if (e.key === "Enter" || e.key === " ") {
            e.preventDefault();
            info.el.click();
          }
        });
      }
    },
    datesSet: function (info) {
      const view = info.view.type === "resourceTimelineDay" ? "day" : "week";
      const url = new URL(window.location.href);
      url.searchParams.set("view", view);
      url.searchParams.set("date", floating(info.start).slice(0, 10));
      window.history.replaceState(null, "", url);
    },
  });

  function closePanel() {
    panel.hidden = true;
    panel.replaceChildren();
    calendar.unselect();
  }

  document.addEventListener("click", function (e) {
    if (e.target.closest("[data-close-panel]")) closePanel();
  });
  document.addEventListener("keydown", function (e) {
    if (e.key === "Escape" && !panel.hidden) closePanel();
  });
  document.body.addEventListener("htmx:afterSwap", function (e) {
    if (e.detail.target === panel) {
      panel.hidden = false;
      const heading = panel.querySelector("h2");
      if (heading) {
        heading.tabIndex = -1;
        heading.focus();
      }
    }
  });
  document.body.addEventListener("reservations-changed", function () {
    cache = { key: null, promise: null };
    calendar.unselect();
    calendar.refetchEvents();
  });

  window.gpubookCalendar = calendar; // for the browser tests and the console
})();
