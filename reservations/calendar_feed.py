"""Reads behind the booking pages: the calendar's events feed, the user's reservation list,
quota bars and the details of one booking. Like selectors.py, every function takes what it
needs as keyword arguments, never writes, and returns plain data the templates and the
calendar script can render.

Times for the calendar are *floating* wall-clock strings in the viewer's time zone
("2026-03-29T01:30:00", no offset). EventCalendar only knows fixed UTC offsets, so giving it
offsets would put every event after a DST change an hour off; wall-clock strings converted
here, per event, with the real zone rules, are right on both sides of the change. The hour a
spring-forward skips and the hour a fall-back repeats are marked with their own events.
"""

import dataclasses
import datetime as dt
import zoneinfo
from collections.abc import Callable

from django.contrib.auth.models import AbstractBaseUser
from django.db import connection
from django.db.models import CharField, Func, Q, Value

from gpus.models import Gpu, MaintenanceWindow
from reservations import selectors
from reservations.models import Membership, Reservation, ReservationGpu, Team

UTC = dt.UTC
# More about the bookings a viewer sees in full, from apps reservations may not import
# (DESIGN.md): training registers the job each booking will run (training/apps.py). Each
# provider takes the feed's range (start=, end=) and returns {reservation id: {"label": text
# for the title, **props}} for the bookings in it; the feed keeps only those it shows in full.
booking_details: list[Callable[..., dict[int, dict]]] = []
# Team colours: dark enough for white text (WCAG AA contrast ≥ 4.5:1 against #fff).
TEAM_PALETTE_SIZE = 8
MAX_FEED_RANGE = dt.timedelta(days=42)


def floating(value: dt.datetime, tz: zoneinfo.ZoneInfo) -> str:
    """Wall-clock time in `tz`, ISO-8601 without an offset (what the calendar displays)."""
    return value.astimezone(tz).replace(tzinfo=None).isoformat(timespec="seconds")


class WallClockText(Func):
    """A timestamp as wall-clock text in an IANA zone, worked out by PostgreSQL (same zone
    rules as Python's). Turning 4,000 timestamps into Python datetimes and back costs more
    than the rest of the feed together; this returns the strings the calendar needs."""

    output_field = CharField()
    arg_joiner = " AT TIME ZONE "
    template = "to_char(%(expressions)s, 'YYYY-MM-DD\"T\"HH24:MI:SS')"


def _memoized_floating(tz: zoneinfo.ZoneInfo):
    cache: dict[dt.datetime, str] = {}

    def convert(value: dt.datetime) -> str:
        text = cache.get(value)
        if text is None:
            text = cache[value] = floating(value, tz)
        return text

    return convert


def team_colour_class(team_id: int) -> str:
    return f"team-c{team_id % TEAM_PALETTE_SIZE}"


def dst_changes(*, start: dt.datetime, end: dt.datetime, tz: zoneinfo.ZoneInfo) -> list[dict]:
    """The offset changes of `tz` inside [start, end): for each, the wall-clock span that is
    skipped (clocks forward) or repeated (clocks back). Found by probing every hour, which is
    exact for every zone whose changes fall on the hour or half hour."""
    changes = []
    cursor = start.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
    previous = cursor.astimezone(tz).utcoffset()
    while cursor < end:
        following = cursor + dt.timedelta(minutes=30)
        offset = following.astimezone(tz).utcoffset()
        if offset != previous:
            wall_at_change = following.astimezone(tz).replace(tzinfo=None)
            delta = offset - previous
            if delta > dt.timedelta(0):  # forward: the wall clock skips (change - delta) … change
                span = {"kind": "skipped", "start": wall_at_change - delta, "end": wall_at_change}
            else:  # back: the wall clock repeats change … change + |delta|
                span = {"kind": "repeated", "start": wall_at_change, "end": wall_at_change - delta}
            changes.append({**span, "at": following})
            previous = offset
        cursor = following
    return changes


def _viewer_team_ids(user: AbstractBaseUser) -> set[int]:
    # one query: the viewer's memberships
    return set(Membership.objects.filter(user=user).values_list("team_id", flat=True))


def calendar_feed(
    *, user: AbstractBaseUser, start: dt.datetime, end: dt.datetime, tz: zoneinfo.ZoneInfo, now: dt.datetime
) -> dict:
    """Resources (GPUs grouped by node) and events (bookings, maintenance, DST marks) for
    [start, end), as EventCalendar reads them.

    Who sees what: the viewer's own bookings and their teams' in full (who, note, status);
    other teams' bookings only as busy time with the team's name. Admins see everything.
    Five queries at most: memberships, GPUs, booked rows, the jobs of the bookings shown in
    full (`booking_details`), maintenance (+ its GPU list when some window lists GPUs).
    """
    is_admin = user.is_superuser
    team_ids = set() if is_admin else _viewer_team_ids(user)

    gpu_rows = list(  # query: every GPU with its node's name
        Gpu.objects.order_by("node__name", "index").values_list(
            "pk", "node_id", "node__name", "index", "model_name", "memory_mib", "state"
        )
    )
    resources: list[dict] = []
    node_children: dict[int, list[str]] = {}
    for gpu_id, node_id, node_name, index, model_name, memory_mib, state in gpu_rows:
        if node_id not in node_children:
            node_children[node_id] = []
            # The node's own row: dragging across it books all of the node's GPUs.
            resources.append(
                {
                    "id": f"node-{node_id}",
                    "title": node_name,
                    "children": [],
                    "extendedProps": {"node": node_id, "gpus": node_children[node_id]},
                }
            )
        node_children[node_id].append(str(gpu_id))
        label = f"GPU {index} · {model_name.removeprefix('NVIDIA ')} · {memory_mib // 1024} GiB"
        if state != Gpu.State.ACTIVE:
            label += f" ({state})"
        resources[-1]["children"].append(
            {"id": str(gpu_id), "title": label, "extendedProps": {"node": node_id, "index": index, "state": state}}
        )

    if connection.vendor == "postgresql":
        start_column = WallClockText("reservation__start", Value(tz.key))
        end_column = WallClockText("reservation__end", Value(tz.key))
        wall_clock = str  # already wall-clock text
    else:
        start_column, end_column = "reservation__start", "reservation__end"
        wall_clock = _memoized_floating(tz)  # bookings share a few hundred slot edges a week
    # query: booked GPU rows overlapping the range, with their reservation, team and booker
    booked = (
        ReservationGpu.objects.filter(occupies=True, start__lt=end, end__gt=start)
        .order_by("reservation__start", "reservation_id", "gpu_id")
        .values_list(
            "reservation_id",
            "gpu_id",
            start_column,
            end_column,
            "reservation__status",
            "reservation__team_id",
            "reservation__team__name",
            "reservation__user_id",
            "reservation__user__username",
            "reservation__note",
        )
    )
    events: list[dict] = []
    by_reservation: dict[int, dict] = {}
    busy_count = 0
    for reservation_id, gpu_id, r_start, r_end, status, team_id, team_name, user_id, username, note in booked:
        event = by_reservation.get(reservation_id)
        if event is not None:
            event["resourceIds"].append(str(gpu_id))
            continue
        mine = user_id == user.pk
        visible = is_admin or mine or team_id in team_ids
        classes = [team_colour_class(team_id), f"st-{status}"]
        if visible:
            who = "You" if mine else username
            title = f"{who} · {team_name}" + (f" · {note}" if note else "")
            event_id = f"r{reservation_id}"
            props = {"kind": "booking", "reservation": reservation_id, "team": team_name, "user": username,
                     "status": status, "mine": mine}
            classes.append("is-mine" if mine else "is-team")
        else:
            busy_count += 1
            title = f"{team_name} · busy"
            event_id = f"busy{busy_count}"  # no reservation id: other teams' bookings stay opaque
            props = {"kind": "busy", "team": team_name}
            classes.append("is-busy")
        event = {
            "id": event_id,
            "resourceIds": [str(gpu_id)],
            "start": wall_clock(r_start),
            "end": wall_clock(r_end),
            "title": title,
            "classNames": classes,
            "extendedProps": props,
        }
        by_reservation[reservation_id] = event
        events.append(event)
    shown_in_full = {rid for rid, event in by_reservation.items() if event["extendedProps"]["kind"] == "booking"}
    for provider in booking_details if shown_in_full else ():  # query: one per provider
        for reservation_id, details in provider(start=start, end=end).items():
            if reservation_id not in shown_in_full:
                continue  # another team's booking stays anonymous busy time
            event = by_reservation[reservation_id]
            event["title"] += f" · {details['label']}"
            event["extendedProps"].update({key: value for key, value in details.items() if key != "label"})

    windows = list(  # query: maintenance windows overlapping the range
        MaintenanceWindow.objects.filter(start__lt=end, end__gt=start).values_list(
            "pk", "node_id", "start", "end", "reason"
        )
    )
    listed: dict[int, list[str]] = {}
    if windows:
        # query (only when there are windows): the GPUs each window lists; none listed = whole node
        through = MaintenanceWindow.gpus.through.objects.filter(maintenancewindow_id__in=[w[0] for w in windows])
        for window_id, gpu_id in through.values_list("maintenancewindow_id", "gpu_id"):
            listed.setdefault(window_id, []).append(str(gpu_id))
    for window_id, node_id, w_start, w_end, reason in windows:
        events.append(
            {
                "id": f"m{window_id}",
                "resourceIds": listed.get(window_id) or node_children.get(node_id, []),
                "start": floating(w_start, tz),
                "end": floating(w_end, tz),
                "title": f"Maintenance · {reason}",
                "classNames": ["ev-maintenance"],
                "extendedProps": {"kind": "maintenance", "reason": reason},
            }
        )

    all_gpus = [gpu for children in node_children.values() for gpu in children]
    for change in dst_changes(start=start, end=end, tz=tz):
        skipped = change["kind"] == "skipped"
        events.append(
            {
                "id": f"dst{change['at'].timestamp():.0f}",
                "resourceIds": all_gpus,
                "start": change["start"].isoformat(timespec="seconds"),
                "end": change["end"].isoformat(timespec="seconds"),
                "title": (
                    "Clocks go forward: this hour does not exist"
                    if skipped
                    else "Clocks go back: this hour happens twice"
                ),
                "display": "background",
                "classNames": ["ev-dst", f"dst-{change['kind']}"],
                "extendedProps": {"kind": f"dst-{change['kind']}"},
            }
        )
    return {"resources": resources, "events": events, "now": floating(now, tz)}


@dataclasses.dataclass(frozen=True)
class QuotaBar:
    team: Team
    position: selectors.QuotaPosition


def quota_bars(*, user: AbstractBaseUser, now: dt.datetime) -> list[QuotaBar]:
    """This month's quota position of each team the user belongs to (admins: every team)."""
    teams = list(selectors.teams_visible_to(user=user).order_by("name"))
    positions = selectors.quota_positions(teams=teams, now=now)
    return [QuotaBar(team=team, position=positions[team.pk]) for team in teams]


def user_reservations(*, user: AbstractBaseUser, now: dt.datetime, past_days: int = 30) -> dict[str, list[Reservation]]:
    """The user's own bookings: upcoming and running ones, then those of the last `past_days`."""
    rows = (
        Reservation.objects.filter(user=user, end__gt=now - dt.timedelta(days=past_days))
        .select_related("team", "node")
        .prefetch_related("gpus")
        .order_by("start", "id")
    )
    upcoming, past = [], []
    for reservation in rows:
        live = reservation.status in Reservation.UPCOMING_OR_ACTIVE and reservation.end > now
        (upcoming if live else past).append(reservation)
    past.reverse()
    return {"upcoming": upcoming, "past": past}


def reservation_for_viewer(*, user: AbstractBaseUser, reservation_id: int) -> Reservation | None:
    """A booking the user may see in full (theirs, their teams', or any for admins)."""
    return (
        selectors.reservations_visible_to(user=user)
        .filter(Q(pk=reservation_id))
        .select_related("team", "node", "user")
        .prefetch_related("gpus")
        .first()
    )


def reservation_actions(*, user: AbstractBaseUser, reservation: Reservation, now: dt.datetime) -> dict[str, bool]:
    """Which buttons to offer. Only a hint for the page: the services decide again on submit."""
    may_change = selectors.can_change(user=user, obj=reservation)
    live = reservation.status in Reservation.UPCOMING_OR_ACTIVE and reservation.end > now
    begun = reservation.start <= now
    return {
        "cancel": may_change and live and not begun,
        "release": may_change and live and begun,
        "reschedule": may_change and live,
        "move_start": may_change and live and not begun,
    }


def team_legend() -> list[tuple[str, str]]:
    """Every team's name with its calendar colour (team names are public: the calendar shows
    other teams' busy time by name)."""
    return [(name, team_colour_class(pk)) for pk, name in Team.objects.order_by("name").values_list("pk", "name")]


def gpus_for_form() -> list[Gpu]:
    return list(Gpu.objects.select_related("node").order_by("node__name", "index"))
