"""Booking pages (server-rendered, htmx). Each view parses, calls one service or read, and
renders; the booking rules live in services.py and are checked there on every submit.

Every page needs a login except the iCal feed, whose secret token is its credential. Pages
show times in the viewer's zone (UserProfile.time_zone, made on first visit). A request from
htmx gets a partial; the same URL without htmx gets a whole page, so every action also works
without JavaScript.
"""

import datetime as dt
import functools
import hashlib
import json
import re
import zoneinfo

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.views import redirect_to_login
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme, urlencode
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from django_htmx.http import HttpResponseClientRedirect, trigger_client_event

from config.errors import DomainError, ErrorCode
from config.scheduling import policy_from_settings
from gpus.models import Gpu
from reservations import calendar_feed, ical, placement, profile_services, selectors, services
from reservations.forms import BookingForm, ProfileForm, RescheduleForm, parse_local_or_aware
from reservations.models import Reservation

CHANGED_EVENT = "reservations-changed"
ISO_DATETIME = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:\d{2})")


def page(view):
    """Login required; the viewer's profile on `request.profile` (made on first visit). Their
    zone, `request.viewer_zone`, comes from reservations.middleware like every page's."""

    @functools.wraps(view)
    def wrapper(request: HttpRequest, *args, **kwargs) -> HttpResponse:
        if not request.user.is_authenticated:
            if request.htmx:  # a partial must not swap the login page into a panel
                back = request.htmx.current_url_abs_path or reverse("calendar")
                return HttpResponseClientRedirect(f"{settings.LOGIN_URL}?{urlencode({'next': back})}")
            return redirect_to_login(request.get_full_path())
        if getattr(request, "profile", None) is None:
            request.profile = profile_services.profile_get_or_create(user=request.user)
            request.viewer_zone = zoneinfo.ZoneInfo(request.profile.time_zone)
        with timezone.override(request.viewer_zone):
            return view(request, *args, **kwargs)

    return wrapper


# --- presenting errors in words ------------------------------------------------------------


def _day(value: dt.datetime) -> str:
    return f"{value:%a} {value.day} {value:%b}"


def _when(start: dt.datetime, end: dt.datetime, tz: zoneinfo.ZoneInfo) -> str:
    start, end = start.astimezone(tz), end.astimezone(tz)
    if start.date() == end.date():
        return f"{_day(start)}, {start:%H:%M}–{end:%H:%M} {end.tzname()}"
    return f"{_day(start)} {start:%H:%M} – {_day(end)} {end:%H:%M} {end.tzname()}"


def _localize_times(text: str, tz: zoneinfo.ZoneInfo) -> str:
    """Service messages carry ISO times in UTC; show them in the viewer's zone."""

    def replace(match: re.Match) -> str:
        value = dt.datetime.fromisoformat(match.group(0).replace("Z", "+00:00")).astimezone(tz)
        return f"{_day(value)} {value:%H:%M} {value.tzname()}"

    return ISO_DATETIME.sub(replace, text)


def describe_error(error: DomainError, *, tz: zoneinfo.ZoneInfo) -> dict:
    """A refusal from a service as a sentence (and, for a conflict, one line per booking hit)."""
    if error.code != "slot_conflict":
        return {"code": error.code, "message": _localize_times(error.detail, tz), "items": []}
    conflicts = error.extra.get("conflicts", [])
    gpu_ids = {gpu_id for item in conflicts for gpu_id in item["gpus"]}
    labels = {
        gpu.pk: (gpu.node.name, gpu.index) for gpu in Gpu.objects.filter(pk__in=gpu_ids).select_related("node")
    }
    items = []
    for item in conflicts:
        names = [labels.get(gpu_id, ("?", gpu_id)) for gpu_id in item["gpus"]]
        node = names[0][0] if names else "?"
        which = ", ".join(str(index) for _, index in names)
        gpu_word = "GPU" if len(names) == 1 else "GPUs"
        start = dt.datetime.fromisoformat(item["start"])
        end = dt.datetime.fromisoformat(item["end"])
        who = f"{item['team']} ({item['user']})" if "team" in item else "another team"
        items.append(f"{node} {gpu_word} {which} is booked {_when(start, end, tz)} by {who}.")
    count = len(conflicts)
    message = (
        "That time is already taken: it collides with "
        + ("an existing booking." if count == 1 else f"{count} existing bookings.")
        + " Pick another time or other GPUs."
    )
    return {"code": error.code, "message": message, "items": items}


# --- calendar ------------------------------------------------------------------------------


def _offset_string(now: dt.datetime, tz: zoneinfo.ZoneInfo) -> str:
    minutes = int(now.astimezone(tz).utcoffset().total_seconds() // 60)
    sign = "+" if minutes >= 0 else "-"
    return f"{sign}{abs(minutes) // 60:02d}:{abs(minutes) % 60:02d}"


def _parse_date(value: str | None, default: dt.date) -> dt.date:
    try:
        return dt.date.fromisoformat(value) if value else default
    except ValueError:
        return default


@require_GET
@page
def calendar_page(request: HttpRequest) -> HttpResponse:
    now = timezone.now()
    view = "day" if request.GET.get("view") == "day" else "week"
    day = _parse_date(request.GET.get("date"), now.astimezone(request.viewer_zone).date())
    config = {
        "feedUrl": reverse("calendar-events"),
        "bookUrl": reverse("booking-new"),
        "detailUrl": reverse("booking-detail", args=[0]).replace("/0/", "/{id}/"),
        "view": view,
        "date": day.isoformat(),
        "timeZone": request.profile.time_zone,
        "offset": _offset_string(now, request.viewer_zone),
        "now": calendar_feed.floating(now, request.viewer_zone),
        "slotMinutes": settings.GPUBOOK_SLOT_MINUTES,
    }
    return render(
        request,
        "reservations/calendar.html",
        {
            "config": config,
            "quota_bars": calendar_feed.quota_bars(user=request.user, now=now),
            "legend_teams": calendar_feed.team_legend(),
            "nav": "calendar",
        },
    )


@require_GET
@page
def calendar_events(request: HttpRequest) -> JsonResponse:
    """The calendar's feed for [start, end): times without an offset are the viewer's wall clock."""
    start = parse_local_or_aware(request.GET.get("start", ""), request.viewer_zone)
    end = parse_local_or_aware(request.GET.get("end", ""), request.viewer_zone)
    if start is None or end is None:
        return JsonResponse(
            {"code": ErrorCode.INVALID_RANGE, "detail": "Give `start` and `end` as ISO-8601 date-times."}, status=400
        )
    # Years near the ends of Python's calendar overflow in zone arithmetic; nobody books there.
    if end <= start or end - start > calendar_feed.MAX_FEED_RANGE or not 1970 <= start.year <= end.year <= 9000:
        return JsonResponse(
            {"code": ErrorCode.INVALID_RANGE,
             "detail": "`end` must be after `start`, at most 42 days later."}, status=400
        )
    feed = calendar_feed.calendar_feed(
        user=request.user, start=start, end=end, tz=request.viewer_zone, now=timezone.now()
    )
    response = JsonResponse(feed)
    # The ETag covers what the calendar draws, not the clock reading in "now" (the page has its
    # own), so ConditionalGetMiddleware answers a repeated request with 304 until a booking changes.
    shown = json.dumps({key: value for key, value in feed.items() if key != "now"}, sort_keys=True, default=str)
    response["ETag"] = f'"{hashlib.sha256(shown.encode()).hexdigest()[:32]}"'
    return response


@require_GET
@page
def quota_bars_partial(request: HttpRequest) -> HttpResponse:
    bars = calendar_feed.quota_bars(user=request.user, now=timezone.now())
    return render(request, "reservations/_quota_bars.html", {"quota_bars": bars})


# --- booking -------------------------------------------------------------------------------


def _booking_form(request: HttpRequest, data=None, initial=None, node_id: int | None = None) -> BookingForm:
    gpus = calendar_feed.gpus_for_form()
    if node_id is not None:
        gpus = [gpu for gpu in gpus if gpu.node_id == node_id] or gpus
    return BookingForm(
        data,
        initial=initial,
        teams=selectors.teams_visible_to(user=request.user).order_by("name"),
        gpus=gpus,
        tz=request.viewer_zone,
        slot_minutes=settings.GPUBOOK_SLOT_MINUTES,
    )


def _initial_from_query(request: HttpRequest) -> tuple[dict, int | None]:
    """Prefill from a calendar selection (?gpu=…&start=…&end=…, wall clock) or plain fields."""
    params = request.GET
    initial: dict = {}
    gpu_ids = [int(value) for value in params.getlist("gpu") if value.isdigit()]
    node_id = None
    if gpu_ids:
        initial["gpus"] = gpu_ids
        node_id = Gpu.objects.filter(pk=gpu_ids[0]).values_list("node_id", flat=True).first()
    start = parse_local_or_aware(params.get("start", ""), request.viewer_zone)
    end = parse_local_or_aware(params.get("end", ""), request.viewer_zone)
    if start is not None:
        local_start = start.astimezone(request.viewer_zone)
        initial.update(date=local_start.date(), start_time=local_start.time())
        if end is not None and end > start:
            local_end = end.astimezone(request.viewer_zone)
            initial["end_time"] = local_end.time()
            if local_end.date() != local_start.date():
                initial["end_date"] = local_end.date()
    teams = list(selectors.user_team_roles(user=request.user))
    if len(teams) == 1:
        initial["team"] = teams[0]
    return initial, node_id


def _render_booking(request: HttpRequest, form: BookingForm, *, error: dict | None = None, node_id=None):
    context = {"form": form, "error": error, "node_id": node_id, "nav": "book"}
    template = "reservations/_booking_form.html" if request.htmx else "reservations/book.html"
    return render(request, template, context)


@require_http_methods(["GET", "POST"])
@page
def booking_new(request: HttpRequest) -> HttpResponse:
    if request.method == "GET":
        initial, node_id = _initial_from_query(request)
        return _render_booking(request, _booking_form(request, initial=initial, node_id=node_id), node_id=node_id)

    node_id = request.POST.get("node")
    node_id = int(node_id) if node_id and node_id.isdigit() else None
    form = _booking_form(request, data=request.POST, node_id=node_id)
    if not form.is_valid():
        return _render_booking(request, form, node_id=node_id)
    values = form.cleaned_data
    try:
        gpu_ids = values["gpus"]
        if values["count"] is not None:
            gpu_ids = placement.choose_booking_gpus(
                gpu_count=values["count"], start=values["start"], end=values["end"], now=timezone.now(),
                policy=policy_from_settings(),
            ).gpu_ids
        reservation = services.reservation_create(
            user=request.user,
            team=values["team"],
            gpu_ids=gpu_ids,
            start=values["start"],
            end=values["end"],
            note=values["note"],
            now=timezone.now(),
        )
    except DomainError as error:
        response = _render_booking(request, form, error=describe_error(error, tz=request.viewer_zone), node_id=node_id)
        if request.htmx and error.code == "slot_conflict":
            # The calendar was out of date: let it show what the slot collided with.
            trigger_client_event(response, CHANGED_EVENT, {"conflict": True})
        return response
    if request.htmx:
        reservation = calendar_feed.reservation_for_viewer(user=request.user, reservation_id=reservation.pk)
        response = render(request, "reservations/_booking_done.html", {"reservation": reservation})
        return trigger_client_event(response, CHANGED_EVENT, {"reservation": reservation.pk})
    messages.success(request, f"Booked: reservation #{reservation.pk}.")
    return redirect("booking-detail", reservation.pk)


# --- my reservations and one reservation ----------------------------------------------------


@require_GET
@page
def my_reservations(request: HttpRequest) -> HttpResponse:
    now = timezone.now()
    lists = calendar_feed.user_reservations(user=request.user, now=now)
    rows = {
        name: [(r, calendar_feed.reservation_actions(user=request.user, reservation=r, now=now)) for r in items]
        for name, items in lists.items()
    }
    return render(
        request,
        "reservations/my_reservations.html",
        {"upcoming": rows["upcoming"], "past": rows["past"], "nav": "mine", "now": now},
    )


def _load_visible(request: HttpRequest, reservation_id: int) -> Reservation:
    reservation = calendar_feed.reservation_for_viewer(user=request.user, reservation_id=reservation_id)
    if reservation is None:
        raise Http404("No such reservation.")
    return reservation


def _render_detail(request: HttpRequest, reservation: Reservation, *, error: dict | None = None, form=None):
    now = timezone.now()
    actions = calendar_feed.reservation_actions(user=request.user, reservation=reservation, now=now)
    if form is None:
        form = RescheduleForm(
            initial={
                "start": reservation.start.astimezone(request.viewer_zone).strftime("%Y-%m-%dT%H:%M"),
                "end": reservation.end.astimezone(request.viewer_zone).strftime("%Y-%m-%dT%H:%M"),
            },
            tz=request.viewer_zone,
            slot_minutes=settings.GPUBOOK_SLOT_MINUTES,
        )
    context = {
        "reservation": reservation,
        "actions": actions,
        "error": error,
        "form": form,
        "gpus": list(reservation.gpus.all()),
        "next": _safe_next(request),
    }
    if request.htmx:
        return render(request, "reservations/_reservation_panel.html", context)
    return render(request, "reservations/reservation_detail.html", {**context, "nav": "mine"})


@require_GET
@page
def reservation_detail(request: HttpRequest, reservation_id: int) -> HttpResponse:
    return _render_detail(request, _load_visible(request, reservation_id))


def _safe_next(request: HttpRequest) -> str:
    target = request.POST.get("next") or request.GET.get("next") or ""
    if target and url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()}):
        return target
    return ""


def _after_change(request: HttpRequest, reservation_id: int, done: str) -> HttpResponse:
    if request.htmx:
        response = _render_detail(request, _load_visible(request, reservation_id))
        return trigger_client_event(response, CHANGED_EVENT, {"reservation": reservation_id, "done": done})
    messages.success(request, done)
    return redirect(_safe_next(request) or reverse("booking-detail", args=[reservation_id]))


def _refused(request: HttpRequest, reservation_id: int, error: DomainError, form=None) -> HttpResponse:
    reservation = _load_visible(request, reservation_id)
    return _render_detail(request, reservation, error=describe_error(error, tz=request.viewer_zone), form=form)


@require_POST
@page
def reservation_cancel(request: HttpRequest, reservation_id: int) -> HttpResponse:
    try:
        services.reservation_cancel(
            reservation_id=reservation_id, actor=request.user, now=timezone.now(), reason="cancelled in the calendar"
        )
    except DomainError as error:
        if error.code == ErrorCode.NOT_FOUND:
            raise Http404(error.detail) from None
        return _refused(request, reservation_id, error)
    return _after_change(request, reservation_id, f"Reservation #{reservation_id} cancelled.")


@require_POST
@page
def reservation_release(request: HttpRequest, reservation_id: int) -> HttpResponse:
    try:
        services.reservation_release(
            reservation_id=reservation_id, actor=request.user, now=timezone.now(), reason="released early by the user"
        )
    except DomainError as error:
        if error.code == ErrorCode.NOT_FOUND:
            raise Http404(error.detail) from None
        return _refused(request, reservation_id, error)
    return _after_change(request, reservation_id, f"Reservation #{reservation_id} released; the rest is free again.")


@require_POST
@page
def reservation_reschedule(request: HttpRequest, reservation_id: int) -> HttpResponse:
    _load_visible(request, reservation_id)  # 404 before parsing for bookings the viewer cannot see
    form = RescheduleForm(request.POST, tz=request.viewer_zone, slot_minutes=settings.GPUBOOK_SLOT_MINUTES)
    if not form.is_valid():
        return _render_detail(request, _load_visible(request, reservation_id), form=form)
    try:
        services.reservation_reschedule(
            reservation_id=reservation_id,
            actor=request.user,
            now=timezone.now(),
            start=form.cleaned_data["start_utc"],
            end=form.cleaned_data["end_utc"],
        )
    except DomainError as error:
        if error.code == ErrorCode.NOT_FOUND:
            raise Http404(error.detail) from None
        return _refused(request, reservation_id, error, form=form)
    return _after_change(request, reservation_id, f"Reservation #{reservation_id} now runs as shown.")


# --- profile and iCal -----------------------------------------------------------------------


@require_http_methods(["GET", "POST"])
@page
def profile(request: HttpRequest) -> HttpResponse:
    form = ProfileForm(request.POST or None, initial={"time_zone": request.profile.time_zone})
    if request.method == "POST" and form.is_valid():
        try:
            profile_services.profile_update_time_zone(
                user=request.user, time_zone=form.cleaned_data["time_zone"], now=timezone.now()
            )
        except DomainError as error:
            form.add_error("time_zone", error.detail)
        else:
            messages.success(request, "Time zone saved.")
            return redirect("profile")
    feed_url = request.build_absolute_uri(reverse("ical-feed", args=[request.profile.calendar_token]))
    return render(request, "reservations/profile.html", {"form": form, "feed_url": feed_url, "nav": "profile"})


@require_POST
@page
def profile_calendar_token(request: HttpRequest) -> HttpResponse:
    profile_services.profile_regenerate_calendar_token(user=request.user, now=timezone.now())
    messages.success(request, "New calendar link made; the old link no longer works.")
    return redirect("profile")


@require_GET
def ical_feed(request: HttpRequest, token: str) -> HttpResponse:
    """No login: the secret token is the credential. An unknown token is a plain 404."""
    body = ical.ical_feed_for_token(
        token=token, now=timezone.now(), base_url=request.build_absolute_uri("/").rstrip("/")
    )
    if body is None:
        raise Http404("No such calendar.")
    response = HttpResponse(body, content_type="text/calendar; charset=utf-8")
    response["Content-Disposition"] = 'inline; filename="gpubook.ics"'
    response["Cache-Control"] = "private, max-age=300"
    response["Referrer-Policy"] = "no-referrer"
    return response
