"""Approvals: bookings of teams that require a manager's yes. Approving is the existing
`services.reservation_approve`; rejecting lives here, with the managers' page, so the booking
services stay as they are. A rejected booking becomes cancelled, its GPUs free, nothing charged,
and the reason goes to the booker."""

import datetime as dt

from django.contrib import messages
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST

from config.errors import Conflict, DomainError, ErrorCode, NotFound, NotPermitted
from notifications import services as notices
from reservations import selectors, services
from reservations.models import AuditEntry, Membership, Reservation, ReservationGpu
from reservations.views import page

REASON_MAX = 180


def pending_for_manager(*, user: AbstractBaseUser) -> QuerySet[Reservation]:
    """Bookings waiting for this user's decision: pending, not yet begun, in a team they manage
    (every team for an admin). Oldest request first: first come, first decided."""
    waiting = Reservation.objects.filter(status=Reservation.Status.PENDING).select_related("team", "user", "node")
    if not user.is_superuser:
        waiting = waiting.filter(
            team__memberships__user=user, team__memberships__role=Membership.Role.MANAGER
        )
    return waiting.prefetch_related("booked__gpu").order_by("created_at", "id")


def reservation_reject(*, reservation_id: int, actor: AbstractBaseUser, reason: str, now: dt.datetime) -> Reservation:
    """Turn down a booking that waits for approval. A reason is required: the booker reads it."""
    reason = " ".join((reason or "").split())
    if not reason:
        raise DomainError(ErrorCode.REASON_REQUIRED, "Say why the booking is rejected; the booker will read it.")
    if len(reason) > REASON_MAX:
        raise DomainError(ErrorCode.REASON_TOO_LONG, f"Keep the reason under {REASON_MAX} characters.")
    reservation = selectors.reservations_visible_to(user=actor).filter(pk=reservation_id).first()
    if reservation is None:
        raise NotFound(ErrorCode.NOT_FOUND, f"No reservation #{reservation_id}.")
    if not selectors.user_can_manage_team(user=actor, team_id=reservation.team_id):
        raise NotPermitted(ErrorCode.NOT_PERMITTED, "Only a team manager or an admin may reject bookings.")
    with transaction.atomic():
        locked = Reservation.objects.select_for_update().select_related("team", "user", "node").get(pk=reservation_id)
        if locked.status != Reservation.Status.PENDING:
            raise Conflict(ErrorCode.NOT_PENDING, "This booking is not waiting for approval.")
        before = {"status": locked.status}
        locked.status = Reservation.Status.CANCELLED
        locked.release_reason = f"rejected: {reason}"[:200]
        locked.updated_at = now
        locked.save(update_fields=["status", "release_reason", "updated_at"])
        ReservationGpu.objects.filter(reservation=locked).update(occupies=False)
        AuditEntry.objects.create(
            actor=actor, at=now, action="reject", reservation=locked, team_id=locked.team_id,
            before=before, after={"status": locked.status, "reason": reason},
        )
        notices.notify_reservation_rejected(reservation=locked, reason=reason, decided_by=actor.get_username(), now=now)
    return locked


# --- the managers' page ---------------------------------------------------------------------


@page
def approvals_page(request: HttpRequest) -> HttpResponse:
    waiting = list(pending_for_manager(user=request.user))
    manages = request.user.is_superuser or Membership.objects.filter(
        user=request.user, role=Membership.Role.MANAGER
    ).exists()
    return render(request, "reservations/approvals.html", {
        "nav": "approvals", "waiting": waiting, "manages": manages, "now": timezone.now(), "reason_max": REASON_MAX,
    })


def _decide(request: HttpRequest, reservation_id: int, decide) -> HttpResponse:
    try:
        decide()
    except DomainError as error:
        if error.code == "not_found":
            raise Http404(error.detail) from None
        messages.error(request, f"#{reservation_id}: {error.detail}")
    return redirect("approvals")


@require_POST
@page
def approve(request: HttpRequest, reservation_id: int) -> HttpResponse:
    def decide():
        services.reservation_approve(reservation_id=reservation_id, actor=request.user, now=timezone.now())
        messages.success(request, f"Booking #{reservation_id} approved; the booker has been told.")

    return _decide(request, reservation_id, decide)


@require_POST
@page
def reject(request: HttpRequest, reservation_id: int) -> HttpResponse:
    def decide():
        reservation_reject(
            reservation_id=reservation_id, actor=request.user, reason=request.POST.get("reason", ""), now=timezone.now()
        )
        messages.success(request, f"Booking #{reservation_id} rejected; the booker has been told why.")

    return _decide(request, reservation_id, decide)
