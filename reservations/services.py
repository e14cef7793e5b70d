"""Booking rules. Every write to reservations goes through these functions.

The recipe for every change (STYLE.md habit 2): one transaction → take the locks once, in a
fixed order (user row, team row, then one advisory lock per GPU in ascending id) → re-check
overlap and quota with the caller's `now` → write. On PostgreSQL the exclusion constraint on
reservations_reservationgpu is the last word; its violation becomes the same friendly
conflict error as our own check. On SQLite the connection opens IMMEDIATE transactions, which
serialize the whole check-then-insert.
"""

import dataclasses
import datetime as dt
import json
from collections.abc import Sequence

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, OperationalError, connection, transaction

from config.batch import insert, instance_from_json
from config.errors import Conflict, DomainError, ErrorCode, NotFound, NotPermitted
from gpus.metrics import count_booking_conflict
from gpus.models import Gpu
from notifications import services as notices
from reservations import selectors, timegrid
from reservations.models import AuditEntry, Reservation, ReservationGpu, Team

# Namespace for pg_advisory_xact_lock(int, int): (this constant, gpu id).
GPU_LOCK_NAMESPACE = 7_100_001
# PostgreSQL SQLSTATEs that mean "another transaction got there first".
EXCLUSION_VIOLATION = "23P01"
RETRYABLE_SQLSTATES = {"40P01", "40001"}
LOCK_NOT_AVAILABLE = "55P03"  # lock_timeout passed


def _slot_minutes() -> int:
    return settings.GPUBOOK_SLOT_MINUTES


def _snapshot(reservation: Reservation) -> dict:
    return {
        "status": reservation.status,
        "start": reservation.start.isoformat(),
        "end": reservation.end.isoformat(),
        "gpus": sorted(row.gpu_id for row in reservation.booked.all()),
        "team": reservation.team_id,
        "note": reservation.note,
    }


def _audit(
    *,
    actor: AbstractBaseUser | None,
    at: dt.datetime,
    action: str,
    reservation: Reservation,
    before: dict | None,
    after: dict | None,
) -> None:
    insert([AuditEntry(
        actor=actor if actor is not None and actor.is_authenticated else None,
        at=at,
        action=action,
        reservation=reservation,
        team_id=reservation.team_id,
        before=before,
        after=after,
    )])


def _lock_booking(*, user_id: int, team_id: int, gpu_ids: Sequence[int]) -> Team | None:
    """Bound the lock waits (`_limit_lock_waits`) and take the booking locks once, in the one
    fixed order every booking uses: user row, team row, one advisory lock per GPU in ascending
    id. One statement (issue #19): PostgreSQL evaluates a select list left to right, and each
    uncorrelated subquery runs when its column is reached, so the order holds. It also returns
    the team's row as locked (newer than any read before the lock: its quota may have changed
    meanwhile); None where there is no such statement, and the caller reads the row itself.
    Only inside a transaction: outside one, each lock would be released as soon as it was taken."""
    if not connection.in_atomic_block:
        raise RuntimeError("booking locks must be taken inside transaction.atomic()")
    if connection.vendor != "postgresql":
        return None  # SQLite: the IMMEDIATE transaction already holds the database write lock
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT set_config('lock_timeout', %s, true),"
            " (SELECT 1 FROM auth_user WHERE id = %s FOR UPDATE),"
            " (SELECT row_to_json(team) FROM reservations_team AS team WHERE id = %s FOR UPDATE),"
            " (SELECT count(pg_advisory_xact_lock(%s, gpu)) FROM unnest(%s::int[]) AS gpu)",
            [_lock_timeout(), user_id, team_id, GPU_LOCK_NAMESPACE, sorted(set(gpu_ids))],
        )
        team_row = cursor.fetchone()[2]
    if team_row is None:
        return None
    return instance_from_json(Team, json.loads(team_row) if isinstance(team_row, str) else team_row)


def _lock_timeout() -> str:
    return f"{settings.GPUBOOK_BOOKING_LOCK_TIMEOUT_MS}ms"


def _limit_lock_waits() -> None:
    """No change waits for a lock longer than GPUBOOK_BOOKING_LOCK_TIMEOUT_MS (the rest of
    this transaction only): a stuck holder turns into "busy, try again", not a hung request."""
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT set_config('lock_timeout', %s, true)", [_lock_timeout()])


def _describe_conflicts(rows: list[ReservationGpu], *, viewer_team_ids: set[int], is_admin: bool) -> list[dict]:
    """Conflicts by reservation; other teams' bookings show only time and GPU, not who."""
    by_reservation: dict[int, dict] = {}
    for row in rows:
        reservation = row.reservation
        entry = by_reservation.get(reservation.pk)
        if entry is None:
            visible = is_admin or reservation.team_id in viewer_team_ids
            entry = {
                "start": reservation.start.isoformat(),
                "end": reservation.end.isoformat(),
                "gpus": [],
            }
            if visible:
                entry.update(
                    reservation=reservation.pk,
                    team=reservation.team.name,
                    user=reservation.user.get_username(),
                )
            by_reservation[reservation.pk] = entry
        entry["gpus"].append(row.gpu_id)
    return list(by_reservation.values())


def _raise_conflict(rows: list[ReservationGpu], *, user: AbstractBaseUser) -> None:
    conflicts = _describe_conflicts(
        rows,
        viewer_team_ids=set(selectors.user_team_roles(user=user)),
        is_admin=user.is_superuser,
    )
    spans = ", ".join(f"GPU {','.join(map(str, item['gpus']))} {item['start']}–{item['end']}" for item in conflicts)
    raise Conflict(
        ErrorCode.SLOT_CONFLICT,
        f"The requested time collides with {len(conflicts)} existing booking(s): {spans}.",
        conflicts=conflicts,
    )


def _validate_times(*, start: dt.datetime, end: dt.datetime) -> tuple[dt.datetime, dt.datetime]:
    """Check the range and return it in UTC. Converting matters: Python subtracts two times
    of the same zone by wall clock, which would mis-measure a booking over a DST change."""
    if not (timegrid.is_aware(start) and timegrid.is_aware(end)):
        raise DomainError(ErrorCode.NAIVE_DATETIME, "Start and end need a UTC offset or time zone.")
    start, end = start.astimezone(dt.UTC), end.astimezone(dt.UTC)
    if end <= start:
        raise DomainError(ErrorCode.INVALID_RANGE, "The end must be after the start.")
    slot = _slot_minutes()
    if not (timegrid.is_on_grid(start, slot_minutes=slot) and timegrid.is_on_grid(end, slot_minutes=slot)):
        raise DomainError(
            ErrorCode.OFF_GRID, f"Start and end must be on the {slot}-minute slot grid (e.g. :00 or :30)."
        )
    return start, end


def _validate_team_rules(
    *, team: Team, start: dt.datetime, end: dt.datetime, now: dt.datetime, check_start: bool
) -> None:
    if check_start:
        current_slot = timegrid.floor_to_slot(now, slot_minutes=_slot_minutes())
        if start < current_slot:
            raise DomainError(ErrorCode.PAST_SLOT, "That slot has already begun or passed.")
        if team.min_notice_minutes and start < now + dt.timedelta(minutes=team.min_notice_minutes):
            raise DomainError(
                ErrorCode.TOO_SOON, f"{team.name} bookings need {team.min_notice_minutes} minutes' notice."
            )
        # Compared as a duration (no date arithmetic), so any value the column holds is safe.
        if start - now > dt.timedelta(days=min(team.max_days_ahead, dt.timedelta.max.days)):
            raise DomainError(
                ErrorCode.TOO_FAR_AHEAD, f"{team.name} may book at most {team.max_days_ahead} days ahead."
            )
    if team.max_booking_hours and end - start > dt.timedelta(hours=team.max_booking_hours):
        raise DomainError(ErrorCode.TOO_LONG, f"A {team.name} booking may last at most {team.max_booking_hours} hours.")


def _check_reads(
    *,
    reads: selectors.BookingReads,
    team: Team,
    user: AbstractBaseUser,
    node_id: int,
    gpu_ids: Sequence[int],
    start: dt.datetime,
    end: dt.datetime,
    exclude_reservation_id: int | None,
) -> selectors.QuotaPosition:
    """Refuse what the locked reads forbid: maintenance, another booking in the way, any
    calendar month (team time zone) this booking touches going over quota — booked + backfill
    charged + wanted — or any day over the per-user daily cap. Returns the quota position of
    the month the booking starts in (for the quota-crossing notice, without asking again).
    The details of a refusal are read only when there is one."""
    if reads.in_maintenance:
        window = selectors.maintenance_overlapping(node_id=node_id, gpu_ids=gpu_ids, start=start, end=end)[0]
        raise DomainError(
            ErrorCode.MAINTENANCE,
            f"The node is in maintenance {window.start.isoformat()}–{window.end.isoformat()}: {window.reason}.",
        )
    if reads.in_the_way:
        _raise_conflict(
            selectors.conflicting_bookings(
                gpu_ids=gpu_ids, start=start, end=end, exclude_reservation_id=exclude_reservation_id
            ),
            user=user,
        )
    gpu_count = len(gpu_ids)
    for position in reads.months:
        wanted = gpu_count * timegrid.overlap_seconds(start, end, position.month_start, position.month_end)
        if position.used_gpu_s + wanted > position.quota_gpu_s:
            remaining = position.remaining_gpu_hours
            raise Conflict(
                ErrorCode.QUOTA_EXCEEDED,
                f"{team.name} has {remaining:.1f} of {team.monthly_gpu_hours} GPU-hours left in "
                f"{position.month}; this booking needs {wanted / 3600:.1f}.",
                month=position.month,
                remaining_gpu_hours=round(remaining, 2),
                requested_gpu_hours=round(wanted / 3600, 2),
                quota_gpu_hours=team.monthly_gpu_hours,
                backfill_gpu_hours=round(position.backfill_gpu_hours, 2),
            )
    for day_start, day_end, used in reads.days:
        cap_seconds = team.user_daily_cap_gpu_hours * 3600
        wanted = gpu_count * timegrid.overlap_seconds(start, end, day_start, day_end)
        if used + wanted > cap_seconds:
            remaining = max(0, cap_seconds - used) / 3600
            day = day_start.astimezone(team.tzinfo).date().isoformat()
            raise Conflict(
                ErrorCode.DAILY_CAP_EXCEEDED,
                f"You have {remaining:.1f} of your {team.user_daily_cap_gpu_hours} daily GPU-hours "
                f"in {team.name} left on {day}.",
                day=day,
                remaining_gpu_hours=round(remaining, 2),
            )
    return reads.months[0]


def _check_booking(
    *,
    team: Team,
    user: AbstractBaseUser,
    booker_id: int,
    node_id: int,
    gpu_ids: Sequence[int],
    start: dt.datetime,
    end: dt.datetime,
    now: dt.datetime,
    exclude_reservation_id: int | None,
    also=None,
) -> tuple[selectors.QuotaPosition, list[list[dict]]]:
    """Under the booking locks (`team` is the row read there): read (one round trip) and
    check. Returns the quota position of the month the booking starts in and the rows of
    `also` (reads the caller needs next, sent along)."""
    reads = selectors.booking_reads(
        team=team, user_id=booker_id, node_id=node_id, gpu_ids=gpu_ids, start=start, end=end, now=now,
        exclude_reservation_id=exclude_reservation_id, also=also,
    )
    position = _check_reads(
        reads=reads, team=team, user=user, node_id=node_id, gpu_ids=gpu_ids, start=start, end=end,
        exclude_reservation_id=exclude_reservation_id,
    )
    return position, reads.also


class _ConstraintRefused(Exception):
    """PostgreSQL's exclusion constraint refused a write our check let through (a booking
    that slipped past it). The transaction is aborted; `_retrying` describes the conflict
    after the rollback, so the happy path needs no savepoint around the write."""

    def __init__(self, *, user: AbstractBaseUser, gpu_ids: Sequence[int], start: dt.datetime, end: dt.datetime,
                 reservation_id: int) -> None:
        super().__init__("exclusion constraint")
        self.user, self.gpu_ids, self.start, self.end, self.reservation_id = user, gpu_ids, start, end, reservation_id


def _under_constraint(
    write,
    *,
    user: AbstractBaseUser,
    gpu_ids: Sequence[int],
    start: dt.datetime,
    end: dt.datetime,
    reservation_id: int,
) -> None:
    """Run `write`; if PostgreSQL's exclusion constraint rejects it, the caller answers with
    the same conflict error our check gives (see `_ConstraintRefused`)."""
    try:
        write()
    except IntegrityError as error:
        if getattr(error.__cause__, "sqlstate", None) != EXCLUSION_VIOLATION:
            raise
        raise _ConstraintRefused(
            user=user, gpu_ids=gpu_ids, start=start, end=end, reservation_id=reservation_id
        ) from error


def _retrying(operation, *, locks_bound_waits: bool = False):
    """Run `operation` in a fresh transaction with a bounded lock wait, again if PostgreSQL
    chose it as a deadlock or serialization victim: such an error is another booking
    winning, never the caller's fault. A lock wait that times out is "busy, try again".
    `locks_bound_waits`: the operation starts with `_lock_booking`, which bounds the waits
    in its own statement."""
    attempts = 3
    for attempt in range(1, attempts + 1):
        try:
            with transaction.atomic():
                if not locks_bound_waits:
                    _limit_lock_waits()
                return operation()
        except _ConstraintRefused as refused:  # rolled back now: the winner's booking is visible
            rows = selectors.conflicting_bookings(
                gpu_ids=refused.gpu_ids, start=refused.start, end=refused.end,
                exclude_reservation_id=refused.reservation_id,
            )
            _raise_conflict(rows, user=refused.user)
        except OperationalError as error:
            sqlstate = getattr(error.__cause__, "sqlstate", None)
            if sqlstate == LOCK_NOT_AVAILABLE:
                raise Conflict(
                    ErrorCode.BUSY, "Another change holds these GPUs or this team right now; please try again.",
                    retry_after_s=1,
                ) from error
            if sqlstate not in RETRYABLE_SQLSTATES:
                raise
            if attempt == attempts:
                raise Conflict(ErrorCode.BUSY, "The booking system is busy; please try again.") from error
    raise AssertionError("unreachable")


def _counting_refusals(operation, *, now: dt.datetime):
    """`_retrying` of an operation that starts with `_lock_booking`, counting conflict and
    quota refusals for /metrics. The count is written after the booking's transaction has
    rolled back, or it would roll back with it."""
    try:
        return _retrying(operation, locks_bound_waits=True)
    except Conflict as refusal:
        count_booking_conflict(code=refusal.code, now=now)
        raise


def _resolve_gpus(gpus: list[Gpu], gpu_ids: Sequence[int]) -> list[Gpu]:
    """Check the GPUs read for `gpu_ids` (selectors.booking_gpus) name one node's bookable GPUs."""
    if not gpu_ids:
        raise DomainError(ErrorCode.NO_GPUS, "Choose at least one GPU.")
    missing = sorted(set(gpu_ids) - {gpu.pk for gpu in gpus})
    if missing:
        raise DomainError(ErrorCode.UNKNOWN_GPU, f"No GPU with id {', '.join(map(str, missing))}.", gpus=missing)
    if len({gpu.node_id for gpu in gpus}) > 1:
        raise DomainError(ErrorCode.MULTIPLE_NODES, "All GPUs of one booking must be on the same node.")
    unavailable = [gpu for gpu in gpus if gpu.state != Gpu.State.ACTIVE]
    if unavailable:
        names = ", ".join(f"{gpu} ({gpu.get_state_display().lower()})" for gpu in unavailable)
        raise DomainError(ErrorCode.GPU_UNAVAILABLE, f"Not bookable now: {names}.")
    return gpus


def _booker_targets(*, user_id: int, team_id: int):
    """Who a notice to the booker goes to (`notices.delivery_targets_query`), read with the
    booking check (`selectors.booking_reads`' `also`)."""
    return notices.delivery_targets_query(recipients=[user_id], team_id=team_id)


def _remember_booked(reservation: Reservation, rows: list[ReservationGpu]) -> None:
    """Put the rows just written where `reservation.booked.all()` finds them (as
    prefetch_related would), so the audit snapshot, the notice and the API's answer do not
    read back what this request wrote."""
    booked = reservation.booked.all()
    booked._result_cache = rows
    booked._prefetch_done = True
    reservation._prefetched_objects_cache = {"booked": booked}


def reservation_create(
    *,
    user: AbstractBaseUser,
    team: Team,
    gpu_ids: Sequence[int],
    start: dt.datetime,
    end: dt.datetime,
    now: dt.datetime,
    note: str = "",
) -> Reservation:
    """Book `gpu_ids` (one node) for [start, end) on behalf of `team`."""
    start, end = _validate_times(start=start, end=end)
    found, role = selectors.booking_gpus(gpu_ids=gpu_ids, user=user, team_id=team.pk)
    if not user.is_superuser and role is None:
        raise NotPermitted(ErrorCode.NOT_TEAM_MEMBER, f"You are not a member of {team.name}.")
    gpus = _resolve_gpus(found, gpu_ids)
    _validate_team_rules(team=team, start=start, end=end, now=now, check_start=True)
    node = gpus[0].node
    ids = [gpu.pk for gpu in gpus]

    def book() -> Reservation:
        # The team as it is under the lock: its quota may have changed meanwhile.
        locked_team = _lock_booking(user_id=user.pk, team_id=team.pk, gpu_ids=ids) or Team.objects.get(pk=team.pk)
        status = Reservation.Status.PENDING if locked_team.requires_approval else Reservation.Status.CONFIRMED
        # A confirmed booking's notice goes to its booker: addressed with the checks' reads.
        confirmed = status == Reservation.Status.CONFIRMED
        position_before, targets = _check_booking(
            team=locked_team, user=user, booker_id=user.pk, node_id=node.pk, gpu_ids=ids, start=start, end=end,
            now=now, exclude_reservation_id=None,
            also=_booker_targets if confirmed else None,
        )
        reservation = Reservation(
            user=user,
            team=locked_team,
            node=node,
            gpu_count=len(ids),
            start=start,
            end=end,
            status=status,
            note=note,
            created_at=now,
            updated_at=now,
        )
        insert([reservation])
        rows = [ReservationGpu(reservation=reservation, gpu=gpu, start=start, end=end) for gpu in gpus]
        _under_constraint(
            lambda: insert(rows),
            user=user,
            gpu_ids=ids,
            start=start,
            end=end,
            reservation_id=reservation.pk,
        )
        _remember_booked(reservation, rows)
        _audit(actor=user, at=now, action="create", reservation=reservation, before=None, after=_snapshot(reservation))
        notices.notify_reservation_confirmed(reservation=reservation, now=now, targets=targets or None)
        added = len(ids) * timegrid.overlap_seconds(
            start, end, position_before.month_start, position_before.month_end
        )
        notices.notify_quota_crossing(
            team=locked_team, booker_id=user.pk, now=now, before=position_before,
            after=dataclasses.replace(position_before, booked_gpu_s=position_before.booked_gpu_s + added),
        )
        return reservation

    return _counting_refusals(book, now=now)


def _load_for_change(*, reservation_id: int, actor: AbstractBaseUser) -> Reservation:
    reservation = Reservation.objects.select_related("team", "user").filter(pk=reservation_id).first()
    if reservation is None:
        raise NotFound(ErrorCode.NOT_FOUND, f"No reservation #{reservation_id}.")
    selectors.require_can_change(
        user=actor, obj=reservation, not_found=f"No reservation #{reservation_id}.",
        not_permitted="Only the booker, a team manager or an admin may change this booking.",
    )
    return reservation


def reservation_cancel(
    *, reservation_id: int, actor: AbstractBaseUser, now: dt.datetime, reason: str = ""
) -> Reservation:
    """Cancel a booking that has not begun; its GPU-hours are refunded in full."""
    reservation = _load_for_change(reservation_id=reservation_id, actor=actor)

    def cancel() -> Reservation:
        locked = Reservation.objects.select_for_update().get(pk=reservation.pk)
        if locked.status not in (Reservation.Status.PENDING, Reservation.Status.CONFIRMED):
            raise Conflict(
                ErrorCode.NOT_CANCELLABLE, f"A {locked.get_status_display().lower()} booking cannot be cancelled."
            )
        if locked.start <= now:
            raise Conflict(ErrorCode.ALREADY_STARTED, "This booking has begun; release it early instead.")
        before = _snapshot(locked)
        locked.status = Reservation.Status.CANCELLED
        locked.release_reason = reason
        locked.updated_at = now
        locked.save(update_fields=["status", "release_reason", "updated_at"])
        ReservationGpu.objects.filter(reservation=locked).update(occupies=False)
        _audit(actor=actor, at=now, action="cancel", reservation=locked, before=before, after=_snapshot(locked))
        notices.notify_reservation_cancelled(reservation=locked, now=now)
        return locked

    return _retrying(cancel)


def reservation_reschedule(
    *,
    reservation_id: int,
    actor: AbstractBaseUser,
    now: dt.datetime,
    start: dt.datetime | None = None,
    end: dt.datetime | None = None,
) -> Reservation:
    """Move, shorten or extend a booking. A booking that has begun keeps its start and may
    not end before the current slot ends."""
    reservation = _load_for_change(reservation_id=reservation_id, actor=actor)
    new_start, new_end = _validate_times(start=start or reservation.start, end=end or reservation.end)

    def reschedule() -> Reservation:
        gpu_ids = list(ReservationGpu.objects.filter(reservation_id=reservation.pk).values_list("gpu_id", flat=True))
        locked_team = _lock_booking(user_id=reservation.user_id, team_id=reservation.team_id, gpu_ids=gpu_ids)
        locked = Reservation.objects.select_related("team").get(pk=reservation.pk)
        locked.team = locked_team or locked.team
        if locked.status not in Reservation.UPCOMING_OR_ACTIVE:
            raise Conflict(
                ErrorCode.NOT_CHANGEABLE, f"A {locked.get_status_display().lower()} booking cannot be changed."
            )
        begun = locked.start <= now
        if begun and new_start != locked.start:
            raise Conflict(ErrorCode.ALREADY_STARTED, "A booking that has begun cannot move its start.")
        if begun and new_end < timegrid.ceil_to_slot(now, slot_minutes=_slot_minutes()):
            raise DomainError(ErrorCode.PAST_SLOT, "The end cannot be before the current slot ends.")
        _validate_team_rules(team=locked.team, start=new_start, end=new_end, now=now, check_start=not begun)
        _check_booking(
            team=locked.team, user=actor, booker_id=locked.user_id, node_id=locked.node_id, gpu_ids=gpu_ids,
            start=new_start, end=new_end, now=now, exclude_reservation_id=locked.pk,
        )
        before = _snapshot(locked)
        locked.start, locked.end, locked.updated_at = new_start, new_end, now
        # An approval covered the old times only: moved by someone who cannot approve, an
        # upcoming booking of an approval team waits for a manager again (issue #14).
        back_to_pending = (
            locked.team.requires_approval and not begun and locked.status == Reservation.Status.CONFIRMED
            and not selectors.user_can_manage_team(user=actor, team_id=locked.team_id)
        )
        if back_to_pending:
            locked.status = Reservation.Status.PENDING
        locked.save(update_fields=["start", "end", "updated_at", "status"])
        _under_constraint(
            lambda: ReservationGpu.objects.filter(reservation=locked).update(start=new_start, end=new_end),
            user=actor,
            gpu_ids=gpu_ids,
            start=new_start,
            end=new_end,
            reservation_id=locked.pk,
        )
        _audit(actor=actor, at=now, action="reschedule", reservation=locked, before=before, after=_snapshot(locked))
        notices.notify_reservation_changed(reservation=locked, before=before, now=now)
        if back_to_pending:  # the managers decide again, as for a new booking
            notices.notify_reservation_awaiting_approval(reservation=locked, now=now)
        return locked

    return _counting_refusals(reschedule, now=now)


def reservation_release(
    *,
    reservation_id: int,
    actor: AbstractBaseUser | None,
    now: dt.datetime,
    reason: str,
) -> Reservation:
    """End a booking early: it ends at the end of the current slot (or does not happen at all
    if it has not begun); the GPU-hours after that are refunded and bookable again.
    `actor=None` is the scheduler (no-show or early-finish release)."""
    if actor is not None:
        reservation = _load_for_change(reservation_id=reservation_id, actor=actor)
    else:
        reservation = Reservation.objects.filter(pk=reservation_id).first()
        if reservation is None:
            raise NotFound(ErrorCode.NOT_FOUND, f"No reservation #{reservation_id}.")

    def release() -> Reservation:
        locked = Reservation.objects.select_for_update().get(pk=reservation.pk)
        if locked.status not in Reservation.UPCOMING_OR_ACTIVE:
            raise Conflict(
                ErrorCode.NOT_RELEASABLE, f"A {locked.get_status_display().lower()} booking cannot be released."
            )
        before = _snapshot(locked)
        new_end = timegrid.ceil_to_slot(now, slot_minutes=_slot_minutes())
        if new_end <= locked.start:
            locked.status = Reservation.Status.CANCELLED  # nothing of it was used
            ReservationGpu.objects.filter(reservation=locked).update(occupies=False)
        else:
            locked.status = Reservation.Status.RELEASED
            locked.end = min(locked.end, new_end)
            ReservationGpu.objects.filter(reservation=locked).update(end=locked.end)
        locked.release_reason = reason
        locked.updated_at = now
        locked.save(update_fields=["status", "end", "release_reason", "updated_at"])
        _audit(actor=actor, at=now, action="release", reservation=locked, before=before, after=_snapshot(locked))
        notices.notify_reservation_released(reservation=locked, before=before, automatic=actor is None, now=now)
        return locked

    return _retrying(release)


def reservation_approve(*, reservation_id: int, actor: AbstractBaseUser, now: dt.datetime) -> Reservation:
    reservation = _load_for_change(reservation_id=reservation_id, actor=actor)
    if not selectors.user_can_manage_team(user=actor, team_id=reservation.team_id):
        raise NotPermitted(ErrorCode.NOT_PERMITTED, "Only a team manager or an admin may approve bookings.")

    def approve() -> Reservation:
        locked = Reservation.objects.select_for_update().get(pk=reservation.pk)
        if locked.status != Reservation.Status.PENDING:
            raise Conflict(ErrorCode.NOT_PENDING, "This booking is not waiting for approval.")
        before = _snapshot(locked)
        locked.status = Reservation.Status.CONFIRMED
        locked.updated_at = now
        locked.save(update_fields=["status", "updated_at"])
        _audit(actor=actor, at=now, action="approve", reservation=locked, before=before, after=_snapshot(locked))
        notices.notify_reservation_confirmed(reservation=locked, now=now)
        return locked

    return _retrying(approve)


def reservations_advance(*, now: dt.datetime) -> dict[str, int]:
    """Move statuses along the clock: confirmed → active at start, active/confirmed →
    completed at end. A conditional UPDATE each, so two ticks cannot disagree."""
    started = Reservation.objects.filter(status=Reservation.Status.CONFIRMED, start__lte=now, end__gt=now).update(
        status=Reservation.Status.ACTIVE, updated_at=now
    )
    finished = Reservation.objects.filter(
        status__in=(Reservation.Status.CONFIRMED, Reservation.Status.ACTIVE), end__lte=now
    ).update(status=Reservation.Status.COMPLETED, updated_at=now)
    return {"activated": started, "completed": finished}


TEAM_SETTINGS = (
    "monthly_gpu_hours",
    "user_daily_cap_gpu_hours",
    "max_booking_hours",
    "min_notice_minutes",
    "max_days_ahead",
    "requires_approval",
    "time_zone",
)


def team_update_settings(*, team_id: int, actor: AbstractBaseUser, changes: dict, now: dt.datetime) -> Team:
    """Admins change a team's quota and booking rules. Lowering a quota below what is already
    booked does not cancel anything; it only stops new bookings."""
    if not actor.is_superuser:
        raise NotPermitted(ErrorCode.NOT_PERMITTED, "Only admins may change team quotas.")
    unknown = sorted(set(changes) - set(TEAM_SETTINGS))
    if unknown:
        raise DomainError(ErrorCode.UNKNOWN_SETTING, f"Not a team setting: {', '.join(unknown)}.")
    with transaction.atomic():
        team = Team.objects.select_for_update().get(pk=team_id)
        before = {name: getattr(team, name) for name in changes}
        for name, value in changes.items():
            setattr(team, name, value)
        team.full_clean()
        team.save(update_fields=list(changes))
        AuditEntry.objects.create(actor=actor, at=now, action="team_settings", team=team, before=before, after=changes)
    return team
