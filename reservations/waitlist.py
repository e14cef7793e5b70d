"""The waitlist: a user who finds a slot taken asks to hear when it frees (`notify`) or to have
it booked for them (`book`). A sweep, run each scheduler tick, checks the waiting entries in
the order they were made (first come, first served): a freed slot is offered to the oldest
entry first, and an auto-book goes through `services.reservation_create` under exactly the
rules of a booking made by hand. Entries expire at the slot's start. Level-triggered: running
the sweep twice changes nothing more."""

import datetime as dt

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from config.errors import Conflict, DomainError, ErrorCode, NotFound
from gpus.models import Gpu
from notifications import links
from notifications.models import EventType
from notifications.services import notice_emit
from reservations import selectors, services
from reservations.api import path_id
from reservations.models import Membership, Team, WaitlistEntry
from reservations.serializers import MAX_ID, AwareDateTimeField

MAX_WAITING_PER_USER = 20


def _slot_is_free(entry: WaitlistEntry) -> bool:
    return selectors.free_windows(gpu_ids=entry.gpu_ids, start=entry.start, end=entry.end) == [(entry.start, entry.end)]


def waitlist_join(
    *, user: AbstractBaseUser, team: Team, gpu_ids: list[int], start: dt.datetime, end: dt.datetime, mode: str,
    now: dt.datetime, note: str = "",
) -> WaitlistEntry:
    """Wait for a slot that is taken now. A free slot is refused: book it instead."""
    if mode not in WaitlistEntry.Mode.values:
        raise DomainError(ErrorCode.INVALID_MODE, f"`mode` is one of {', '.join(WaitlistEntry.Mode.values)}.")
    if end <= start or start <= now:
        raise DomainError(ErrorCode.INVALID_RANGE, "Wait only for a future slot whose end is after its start.")
    if not user.is_superuser and not Membership.objects.filter(user=user, team=team).exists():
        raise NotFound(ErrorCode.UNKNOWN_TEAM, f"No team with id {team.pk}.")
    ids = sorted(set(gpu_ids))
    nodes = set(Gpu.objects.filter(pk__in=ids).values_list("node_id", flat=True))
    if len(nodes) != 1 or Gpu.objects.filter(pk__in=ids).count() != len(ids):
        raise DomainError(ErrorCode.INVALID_GPUS, "Choose existing GPUs of one node.")
    entry = WaitlistEntry(user=user, team=team, gpu_ids=ids, start=start, end=end, mode=mode, note=note,
                          created_at=now)
    if _slot_is_free(entry):
        raise Conflict(ErrorCode.SLOT_FREE, "That slot is free now: book it instead of waiting.")
    if WaitlistEntry.objects.filter(user=user, state=WaitlistEntry.State.WAITING).count() >= MAX_WAITING_PER_USER:
        raise Conflict(ErrorCode.TOO_MANY_WAITING, f"You already wait for {MAX_WAITING_PER_USER} slots.")
    entry.save()
    return entry


def waitlist_leave(*, entry_id: int, actor: AbstractBaseUser, now: dt.datetime) -> WaitlistEntry:
    entry = WaitlistEntry.objects.filter(pk=entry_id, user=actor).first()
    if entry is None:
        raise NotFound(ErrorCode.NOT_FOUND, f"No waitlist entry #{entry_id}.")
    WaitlistEntry.objects.filter(pk=entry.pk, state=WaitlistEntry.State.WAITING).update(
        state=WaitlistEntry.State.CANCELLED, decided_at=now
    )
    entry.refresh_from_db()
    return entry


def _slot_payload(entry: WaitlistEntry) -> dict:
    gpus = Gpu.objects.filter(pk__in=entry.gpu_ids).select_related("node").order_by("index")
    return {"slot": {"node": gpus[0].node.name if gpus else "", "gpus": [g.index for g in gpus],
                     "gpu_ids": entry.gpu_ids, "start": entry.start.isoformat(), "end": entry.end.isoformat()},
            "waitlist_entry": entry.pk, "url": links.calendar_url()}


def _decide(entry: WaitlistEntry, *, state: str, now: dt.datetime, **fields) -> bool:
    """Compare-and-set from waiting: a second sweep running at once never decides twice."""
    return WaitlistEntry.objects.filter(pk=entry.pk, state=WaitlistEntry.State.WAITING).update(
        state=state, decided_at=now, **fields
    ) == 1


def waitlist_run_once(*, now: dt.datetime) -> dict[str, int]:
    """One sweep: expire what has begun, then offer freed slots to the oldest entries first."""
    done = {"expired": 0, "notified": 0, "booked": 0, "failed": 0}
    done["expired"] = WaitlistEntry.objects.filter(state=WaitlistEntry.State.WAITING, start__lte=now).update(
        state=WaitlistEntry.State.EXPIRED, decided_at=now, outcome="the slot began"
    )
    for entry in WaitlistEntry.objects.filter(state=WaitlistEntry.State.WAITING).select_related("team", "user"):
        if not _slot_is_free(entry):
            continue
        if entry.mode == WaitlistEntry.Mode.NOTIFY:
            with transaction.atomic():
                if _decide(entry, state=WaitlistEntry.State.NOTIFIED, now=now, outcome="told the slot is free"):
                    notice_emit(event_type=EventType.WAITLIST_SLOT_FREE, team_id=None, payload=_slot_payload(entry),
                                recipients=[entry.user_id], now=now, dedupe_key=f"waitlist-{entry.pk}-free")
                    done["notified"] += 1
            continue
        try:
            booked = services.reservation_create(
                user=entry.user, team=entry.team, gpu_ids=entry.gpu_ids, start=entry.start, end=entry.end,
                note=entry.note or "booked from the waitlist", now=now,
            )
        except DomainError as refused:
            if refused.code in {"slot_conflict", "busy"}:
                continue  # taken again in between: keep waiting
            with transaction.atomic():
                if _decide(entry, state=WaitlistEntry.State.FAILED, now=now, outcome=refused.detail[:500]):
                    notice_emit(event_type=EventType.WAITLIST_FAILED, team_id=None,
                                payload={**_slot_payload(entry), "reason": refused.detail}, recipients=[entry.user_id],
                                now=now, dedupe_key=f"waitlist-{entry.pk}-failed")
                    done["failed"] += 1
            continue
        with transaction.atomic():
            _decide(entry, state=WaitlistEntry.State.BOOKED, now=now, reservation=booked,
                    outcome=f"booked as #{booked.pk}")
            notice_emit(event_type=EventType.WAITLIST_BOOKED, team_id=None,
                        payload={**_slot_payload(entry), "reservation_id": booked.pk,
                                 "url": links.reservation_url(booked.pk)}, recipients=[entry.user_id],
                        now=now, dedupe_key=f"waitlist-{entry.pk}-booked")
        done["booked"] += 1
    return done


# --- API ----------------------------------------------------------------------------------------


class WaitlistJoinSerializer(serializers.Serializer):
    gpus = serializers.ListField(child=serializers.IntegerField(min_value=1, max_value=MAX_ID), min_length=1,
                                 max_length=64)
    team = serializers.IntegerField(min_value=1, max_value=MAX_ID)
    start = AwareDateTimeField()
    end = AwareDateTimeField()
    mode = serializers.ChoiceField(choices=WaitlistEntry.Mode.choices)
    note = serializers.CharField(max_length=500, required=False, allow_blank=True, default="")


class WaitlistEntrySerializer(serializers.ModelSerializer):
    class Meta:
        model = WaitlistEntry
        fields = ["id", "team", "gpu_ids", "start", "end", "mode", "state", "note", "reservation", "outcome",
                  "created_at", "decided_at"]


class WaitlistViewSet(mixins.ListModelMixin, viewsets.GenericViewSet):
    """Your waitlist entries, newest first."""

    serializer_class = WaitlistEntrySerializer

    def get_queryset(self):
        return WaitlistEntry.objects.filter(user=self.request.user).order_by("-created_at", "-id")

    @extend_schema(request=WaitlistJoinSerializer, responses={201: WaitlistEntrySerializer})
    def create(self, request):
        data = WaitlistJoinSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        values = data.validated_data
        team = Team.objects.filter(pk=values["team"]).first()
        if team is None:
            raise NotFound(ErrorCode.UNKNOWN_TEAM, f"No team with id {values['team']}.")
        entry = waitlist_join(user=request.user, team=team, gpu_ids=values["gpus"], start=values["start"],
                              end=values["end"], mode=values["mode"], note=values["note"], now=timezone.now())
        return Response(WaitlistEntrySerializer(entry).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses={200: WaitlistEntrySerializer})
    @action(detail=True, methods=["post"])
    def leave(self, request, pk=None):
        entry = waitlist_leave(entry_id=path_id(pk), actor=request.user, now=timezone.now())
        return Response(WaitlistEntrySerializer(entry).data)
