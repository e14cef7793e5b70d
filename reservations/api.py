"""REST API views: parse, call one service or selector, render."""

import datetime as dt

from django.db.models import Prefetch
from django.shortcuts import get_object_or_404
from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response
from rest_framework.views import APIView

from config.errors import DomainError, ErrorCode, NotFound, NotPermitted
from config.scheduling import policy_from_settings
from gpus.models import Gpu, Node
from reservations import placement, selectors, services
from reservations.models import ReservationGpu
from reservations.serializers import (
    MAX_ID,
    AwareDateTimeField,
    BookingPlacementQuerySerializer,
    GpuSerializer,
    ReasonSerializer,
    ReservationCreateSerializer,
    ReservationSerializer,
    ReservationUpdateSerializer,
    TeamSerializer,
    booking_input,
)

MAX_AVAILABILITY_WINDOW = dt.timedelta(days=62)
DEFAULT_AVAILABILITY_WINDOW = dt.timedelta(days=1)


def _moment(params, name: str) -> dt.datetime | None:
    if not params.get(name):
        return None
    field = AwareDateTimeField()
    field.bind(name, None)  # its messages name the parameter
    return field.to_internal_value(params[name])


def _time_range(params, *, now: dt.datetime) -> tuple[dt.datetime, dt.datetime]:
    """`from` … `to`; without `from` from now, without `to` for a day."""
    start = _moment(params, "from") or now
    end = _moment(params, "to")
    if end is None:
        if start > dt.datetime.max.replace(tzinfo=dt.UTC) - DEFAULT_AVAILABILITY_WINDOW:
            raise DomainError(ErrorCode.INVALID_RANGE, "`from` is too far ahead.")
        end = start + DEFAULT_AVAILABILITY_WINDOW
    if end <= start:
        raise DomainError(ErrorCode.INVALID_RANGE, "`to` must be after `from`.")
    if end - start > MAX_AVAILABILITY_WINDOW:
        raise DomainError(ErrorCode.RANGE_TOO_LONG, "Ask for at most 62 days at a time.")
    return start, end


def _availability(gpu_ids: list[int], params) -> Response:
    start, end = _time_range(params, now=timezone.now())
    windows = selectors.free_windows(gpu_ids=gpu_ids, start=start, end=end)
    return Response(
        {
            "gpus": gpu_ids,
            "from": start.isoformat(),
            "to": end.isoformat(),
            "free": [{"start": a.isoformat(), "end": b.isoformat()} for a, b in windows],
        }
    )


availability_parameters = [
    OpenApiParameter("from", str, description="ISO-8601 with offset; now if left out"),
    OpenApiParameter("to", str, description="ISO-8601 with offset, at most 62 days after `from`; a day after "
                                            "`from` if left out"),
]


class GpuViewSet(viewsets.ReadOnlyModelViewSet):
    """The GPU inventory is shared infrastructure: every signed-in user may see it."""

    serializer_class = GpuSerializer
    queryset = Gpu.objects.select_related("node").order_by("node__name", "index")

    @extend_schema(parameters=availability_parameters)
    @action(detail=True)
    def availability(self, request, pk=None):
        gpu = self.get_object()
        return _availability([gpu.pk], request.query_params)


class NodeAvailabilityView(APIView):
    @extend_schema(parameters=availability_parameters)
    def get(self, request, pk: int):
        node = get_object_or_404(Node, pk=pk)
        gpu_ids = list(node.gpus.filter(state=Gpu.State.ACTIVE).values_list("pk", flat=True))
        return _availability(gpu_ids, request.query_params)


class ReservationViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    serializer_class = ReservationSerializer

    def get_queryset(self):
        queryset = (
            selectors.reservations_visible_to(user=self.request.user)
            .select_related("team", "user", "node")
            .prefetch_related(
                Prefetch("booked", queryset=ReservationGpu.objects.only("id", "gpu_id", "reservation_id"))
            )
            .order_by("start", "id")
        )
        params = self.request.query_params
        if self.action != "list":
            return queryset
        if "gpu" in params:
            queryset = queryset.filter(booked__gpu_id=_int_param(params, "gpu"))
        if "team" in params:
            queryset = queryset.filter(team_id=_int_param(params, "team"))
        if params.get("mine") in {"1", "true", "yes"}:
            queryset = queryset.filter(user=self.request.user)
        if "status" in params:
            queryset = queryset.filter(status=params["status"])
        if "from" in params:
            queryset = queryset.filter(end__gt=AwareDateTimeField().to_internal_value(params["from"]))
        if "to" in params:
            queryset = queryset.filter(start__lt=AwareDateTimeField().to_internal_value(params["to"]))
        return queryset

    @extend_schema(
        parameters=[
            OpenApiParameter("gpu", int),
            OpenApiParameter("team", int),
            OpenApiParameter("mine", bool),
            OpenApiParameter("status", str),
            OpenApiParameter("from", str),
            OpenApiParameter("to", str),
        ]
    )
    def list(self, request, *args, **kwargs):
        return super().list(request, *args, **kwargs)

    @extend_schema(request=ReservationCreateSerializer, responses={201: ReservationSerializer})
    def create(self, request):
        values = booking_input(request.data)
        if values is None:
            data = ReservationCreateSerializer(data=request.data)
            data.is_valid(raise_exception=True)
            values = data.validated_data
        team = selectors.team_by_id(team_id=values["team"])
        if team is None:
            raise DomainError(ErrorCode.UNKNOWN_TEAM, f"No team with id {values['team']}.")
        reservation = services.reservation_create(
            user=request.user,
            team=team,
            gpu_ids=values["gpus"],
            start=values["start"],
            end=values["end"],
            note=values["note"],
            now=timezone.now(),
        )
        # The service's object carries its team, user, node and GPU rows: nothing to read back.
        return Response(ReservationSerializer(reservation).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=ReservationUpdateSerializer, responses={200: ReservationSerializer})
    def partial_update(self, request, pk=None):
        data = ReservationUpdateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        if not data.validated_data:
            raise DomainError(ErrorCode.NOTHING_TO_CHANGE, "Send a new start, a new end, or both.")
        services.reservation_reschedule(
            reservation_id=path_id(pk), actor=request.user, now=timezone.now(), **data.validated_data
        )
        return Response(self._render(path_id(pk)))

    @extend_schema(request=ReasonSerializer, responses={200: ReservationSerializer})
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        reason = ReasonSerializer(data=request.data)
        reason.is_valid(raise_exception=True)
        services.reservation_cancel(
            reservation_id=path_id(pk),
            actor=request.user,
            now=timezone.now(),
            reason=reason.validated_data["reason"],
        )
        return Response(self._render(path_id(pk)))

    @extend_schema(request=ReasonSerializer, responses={200: ReservationSerializer})
    @action(detail=True, methods=["post"])
    def release(self, request, pk=None):
        reason = ReasonSerializer(data=request.data)
        reason.is_valid(raise_exception=True)
        services.reservation_release(
            reservation_id=path_id(pk),
            actor=request.user,
            now=timezone.now(),
            reason=reason.validated_data["reason"] or "released early by the user",
        )
        return Response(self._render(path_id(pk)))

    @extend_schema(request=None, responses={200: ReservationSerializer})
    @action(detail=True, methods=["post"])
    def approve(self, request, pk=None):
        services.reservation_approve(reservation_id=path_id(pk), actor=request.user, now=timezone.now())
        return Response(self._render(path_id(pk)))

    @extend_schema(request=ReasonSerializer, responses={200: ReservationSerializer})
    @action(detail=True, methods=["post"])
    def reject(self, request, pk=None):
        from reservations.approvals import reservation_reject  # the approvals room imports the page helpers

        reason = ReasonSerializer(data=request.data)
        reason.is_valid(raise_exception=True)
        reservation_reject(
            reservation_id=path_id(pk), actor=request.user, reason=reason.validated_data["reason"], now=timezone.now()
        )
        return Response(self._render(path_id(pk)))

    def _render(self, reservation_id: int) -> dict:
        reservation = get_object_or_404(self.get_queryset(), pk=reservation_id)
        return ReservationSerializer(reservation).data


def path_id(value: object) -> int:
    """An id from a URL path; anything else names no object."""
    try:
        number = int(str(value))
    except ValueError:
        number = 0
    if not 1 <= number <= MAX_ID:
        raise NotFound(ErrorCode.NOT_FOUND, "Not found.")
    return number


def _int_param(params, name: str) -> int:
    try:
        value = int(params[name])
    except ValueError:
        value = 0
    if not 1 <= value <= MAX_ID:
        raise DomainError(ErrorCode.INVALID_PARAMETER, f"`{name}` must be an integer id.")
    return value


class TeamViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """The caller's teams with this month's quota use; admins see all and may change quotas."""

    serializer_class = TeamSerializer

    def get_queryset(self):
        return selectors.teams_visible_to(user=self.request.user).order_by("name")

    def get_serializer_context(self):
        now = timezone.now()
        return {
            **super().get_serializer_context(),
            "roles": selectors.user_team_roles(user=self.request.user),
            "is_admin": self.request.user.is_superuser,
            "usage": lambda team: selectors.team_quota_position(team=team, now=now).as_dict(),
        }

    def partial_update(self, request, pk=None):
        team = self.get_object()  # first: a team the caller cannot see is a 404, not a 403
        if not request.user.is_superuser:
            raise NotPermitted(ErrorCode.NOT_PERMITTED, "Only admins may change team quotas.")
        data = TeamSerializer(team, data=request.data, partial=True, context=self.get_serializer_context())
        data.is_valid(raise_exception=True)
        services.team_update_settings(
            team_id=team.pk, actor=request.user, changes=data.validated_data, now=timezone.now()
        )
        team.refresh_from_db()
        return Response(TeamSerializer(team, context=self.get_serializer_context()).data)


class BookingPlacementView(APIView):
    """Before booking N GPUs: which GPUs of which node to book for the slot so that its start
    costs the running work least (`reservations.placement`). Nothing is booked; the
    answer's `gpus` go to `POST /api/v1/reservations/` as they are."""

    @extend_schema(parameters=[BookingPlacementQuerySerializer], responses={200: dict})
    def get(self, request):
        query = BookingPlacementQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        values = query.validated_data
        chosen = placement.choose_booking_gpus(
            gpu_count=values["gpus"], start=values["start"], end=values["end"], now=timezone.now(),
            policy=policy_from_settings(),
        )
        return Response({
            "node": chosen.node,
            "node_name": Node.objects.values_list("name", flat=True).get(pk=chosen.node),
            "gpus": list(chosen.gpu_ids),
            "start": values["start"].isoformat(),
            "end": values["end"].isoformat(),
            "lost_gpu_s": round(chosen.lost_gpu_s, 1),
            "restart_gpu_s": round(chosen.restart_gpu_s, 1),
            "at_risk_gpu_s": round(chosen.at_risk_gpu_s, 1),
        })
