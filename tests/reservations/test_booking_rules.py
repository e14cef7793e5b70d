"""Booking rules through the service: overlap, grid, validation, permissions, audit."""

import datetime as dt

import pytest

from config.errors import Conflict, DomainError, NotFound, NotPermitted
from gpus.models import Gpu, MaintenanceWindow
from reservations.models import AuditEntry, Reservation, ReservationGpu
from reservations.services import (
    reservation_cancel,
    reservation_create,
    reservation_release,
    reservation_reschedule,
    reservations_advance,
)
from tests.support import book

UTC = dt.UTC
NOW = dt.datetime(2026, 6, 1, 8, 0, tzinfo=UTC)
H = dt.timedelta(hours=1)


@pytest.mark.django_db
class TestOverlap:
    def test_touching_slots_are_allowed(self, people, inventory):
        start = NOW + 2 * H
        book(people["owner"], people["vision"], inventory["a"][:1], start, start + H, now=NOW)
        after = book(people["owner"], people["vision"], inventory["a"][:1], start + H, start + 2 * H, now=NOW)
        before = book(people["owner"], people["vision"], inventory["a"][:1], start - H, start, now=NOW)
        assert {after.status, before.status} == {Reservation.Status.CONFIRMED}

    @pytest.mark.parametrize(
        ("offset_start", "offset_end"),
        [(0, 1), (-0.5, 0.5), (0.5, 1.5), (-1, 2), (0.5, 1)],
        ids=["same", "overlaps-start", "overlaps-end", "contains", "inside"],
    )
    def test_any_overlap_on_a_shared_gpu_is_refused(self, people, inventory, offset_start, offset_end):
        start = NOW + 4 * H
        existing = book(people["owner"], people["vision"], inventory["a"][:2], start, start + H, now=NOW)
        with pytest.raises(Conflict) as refused:
            book(people["outsider"], people["nlp"], inventory["a"][1:3], start + offset_start * H, start + offset_end * H, now=NOW)
        assert refused.value.code == "slot_conflict"
        (conflict,) = refused.value.extra["conflicts"]
        assert conflict["gpus"] == [inventory["a"][1].pk]
        assert conflict["start"] == existing.start.isoformat()
        # another team's booking is shown as busy time only, not who booked it
        assert "user" not in conflict and "team" not in conflict

    def test_conflict_names_own_team_bookings(self, people, inventory):
        start = NOW + 4 * H
        existing = book(people["owner"], people["vision"], inventory["a"][:1], start, start + H, now=NOW)
        with pytest.raises(Conflict) as refused:
            book(people["teammate"], people["vision"], inventory["a"][:1], start, start + H, now=NOW)
        (conflict,) = refused.value.extra["conflicts"]
        assert conflict["reservation"] == existing.pk and conflict["user"] == "alice"

    def test_other_gpus_of_the_same_node_are_fine(self, people, inventory):
        start = NOW + 2 * H
        book(people["owner"], people["vision"], inventory["a"][:2], start, start + H, now=NOW)
        other = book(people["outsider"], people["nlp"], inventory["a"][2:], start, start + H, now=NOW)
        assert other.gpu_count == 2

    def test_cancelled_booking_frees_the_slot(self, people, inventory):
        start = NOW + 2 * H
        first = book(people["owner"], people["vision"], inventory["a"][:1], start, start + H, now=NOW)
        reservation_cancel(reservation_id=first.pk, actor=people["owner"], now=NOW)
        again = book(people["outsider"], people["nlp"], inventory["a"][:1], start, start + H, now=NOW)
        assert again.pk != first.pk


@pytest.mark.django_db
class TestValidation:
    @pytest.mark.parametrize(
        ("start", "end", "code"),
        [
            (NOW + 2 * H, NOW + 2 * H, "invalid_range"),
            (NOW + 3 * H, NOW + 2 * H, "invalid_range"),
            (NOW + 2 * H + dt.timedelta(minutes=10), NOW + 3 * H, "off_grid"),
            (NOW - H, NOW + H, "past_slot"),
            (dt.datetime(2026, 6, 1, 12), dt.datetime(2026, 6, 1, 13), "naive_datetime"),
            (NOW + dt.timedelta(days=90), NOW + dt.timedelta(days=90) + H, "too_far_ahead"),
        ],
    )
    def test_bad_times(self, people, inventory, start, end, code):
        with pytest.raises(DomainError) as refused:
            book(people["owner"], people["vision"], inventory["a"][:1], start, end, now=NOW)
        assert refused.value.code == code
        assert Reservation.objects.count() == 0

    def test_current_slot_may_still_be_booked(self, people, inventory):
        now = NOW + dt.timedelta(minutes=10)
        booked = book(people["owner"], people["vision"], inventory["a"][:1], NOW, NOW + H, now=now)
        assert booked.start == NOW

    def test_gpus_of_two_nodes(self, people, inventory):
        with pytest.raises(DomainError) as refused:
            book(people["owner"], people["vision"], [inventory["a"][0], inventory["b"][0]], NOW + H, NOW + 2 * H, now=NOW)
        assert refused.value.code == "multiple_nodes"

    def test_unknown_gpu(self, people, inventory):
        with pytest.raises(DomainError) as refused:
            reservation_create(user=people["owner"], team=people["vision"], gpu_ids=[999999],
                               start=NOW + H, end=NOW + 2 * H, now=NOW)
        assert refused.value.code == "unknown_gpu"

    def test_no_gpus(self, people, inventory):
        with pytest.raises(DomainError) as refused:
            book(people["owner"], people["vision"], [], NOW + H, NOW + 2 * H, now=NOW)
        assert refused.value.code == "no_gpus"

    def test_gpu_in_maintenance_state(self, people, inventory):
        gpu = inventory["a"][0]
        gpu.state = Gpu.State.MAINTENANCE
        gpu.save()
        with pytest.raises(DomainError) as refused:
            book(people["owner"], people["vision"], [gpu], NOW + H, NOW + 2 * H, now=NOW)
        assert refused.value.code == "gpu_unavailable"

    def test_maintenance_window_blocks_booking(self, people, inventory):
        MaintenanceWindow.objects.create(
            node=inventory["node_a"], start=NOW + 2 * H, end=NOW + 4 * H, reason="driver upgrade"
        )
        with pytest.raises(DomainError) as refused:
            book(people["owner"], people["vision"], inventory["a"][:1], NOW + 3 * H, NOW + 5 * H, now=NOW)
        assert refused.value.code == "maintenance" and "driver upgrade" in refused.value.detail
        # the same hours on another node are fine
        assert book(people["owner"], people["vision"], inventory["b"][:1], NOW + 3 * H, NOW + 5 * H, now=NOW).pk

    def test_maintenance_of_listed_gpus_only(self, people, inventory):
        window = MaintenanceWindow.objects.create(
            node=inventory["node_a"], start=NOW + 2 * H, end=NOW + 4 * H, reason="fan swap"
        )
        window.gpus.set([inventory["a"][0]])
        assert book(people["owner"], people["vision"], inventory["a"][1:2], NOW + 2 * H, NOW + 3 * H, now=NOW).pk
        with pytest.raises(DomainError):
            book(people["owner"], people["vision"], inventory["a"][:1], NOW + 2 * H, NOW + 3 * H, now=NOW)

    def test_team_rules(self, people, inventory):
        team = people["vision"]
        team.max_booking_hours, team.min_notice_minutes = 4, 120
        team.save()
        with pytest.raises(DomainError) as too_long:
            book(people["owner"], people["vision"], inventory["a"][:1], NOW + 3 * H, NOW + 8 * H, now=NOW)
        assert too_long.value.code == "too_long"
        with pytest.raises(DomainError) as too_soon:
            book(people["owner"], people["vision"], inventory["a"][:1], NOW + H, NOW + 2 * H, now=NOW)
        assert too_soon.value.code == "too_soon"

    def test_not_a_member(self, people, inventory):
        with pytest.raises(NotPermitted) as refused:
            book(people["outsider"], people["vision"], inventory["a"][:1], NOW + H, NOW + 2 * H, now=NOW)
        assert refused.value.code == "not_team_member"

    def test_approval_flow(self, people, inventory):
        from reservations.services import reservation_approve

        people["vision"].requires_approval = True
        people["vision"].save()
        pending = book(people["owner"], people["vision"], inventory["a"][:1], NOW + H, NOW + 2 * H, now=NOW)
        assert pending.status == Reservation.Status.PENDING
        with pytest.raises(NotPermitted):
            reservation_approve(reservation_id=pending.pk, actor=people["teammate"], now=NOW)
        approved = reservation_approve(reservation_id=pending.pk, actor=people["manager"], now=NOW)
        assert approved.status == Reservation.Status.CONFIRMED


@pytest.mark.django_db
class TestChanges:
    def test_shorten_extend_and_move(self, people, inventory):
        start = NOW + 2 * H
        booking = book(people["owner"], people["vision"], inventory["a"][:2], start, start + 2 * H, now=NOW)
        blocker = book(people["outsider"], people["nlp"], inventory["a"][1:2], start + 3 * H, start + 4 * H, now=NOW)
        shorter = reservation_reschedule(reservation_id=booking.pk, actor=people["owner"], now=NOW, end=start + H)
        assert shorter.end == start + H
        assert set(ReservationGpu.objects.filter(reservation=booking).values_list("end", flat=True)) == {start + H}
        with pytest.raises(Conflict) as refused:
            reservation_reschedule(reservation_id=booking.pk, actor=people["owner"], now=NOW, end=start + 4 * H)
        assert refused.value.extra["conflicts"][0]["start"] == blocker.start.isoformat()
        moved = reservation_reschedule(
            reservation_id=booking.pk, actor=people["owner"], now=NOW, start=start + 6 * H, end=start + 7 * H
        )
        assert (moved.start, moved.end) == (start + 6 * H, start + 7 * H)

    def test_who_may_change(self, people, inventory):
        booking = book(people["owner"], people["vision"], inventory["a"][:1], NOW + 2 * H, NOW + 3 * H, now=NOW)
        with pytest.raises(NotPermitted):
            reservation_cancel(reservation_id=booking.pk, actor=people["teammate"], now=NOW)
        with pytest.raises(NotFound):  # outsiders do not learn the booking exists
            reservation_cancel(reservation_id=booking.pk, actor=people["outsider"], now=NOW)
        assert reservation_cancel(reservation_id=booking.pk, actor=people["manager"], now=NOW).status == "cancelled"
        other = book(people["owner"], people["vision"], inventory["a"][:1], NOW + 2 * H, NOW + 3 * H, now=NOW)
        assert reservation_cancel(reservation_id=other.pk, actor=people["admin"], now=NOW).status == "cancelled"

    def test_release_early_frees_the_rest(self, people, inventory):
        booking = book(people["owner"], people["vision"], inventory["a"][:1], NOW, NOW + 4 * H, now=NOW)
        reservations_advance(now=NOW + dt.timedelta(minutes=1))
        released = reservation_release(
            reservation_id=booking.pk, actor=people["owner"], now=NOW + dt.timedelta(minutes=70), reason="done"
        )
        assert released.status == Reservation.Status.RELEASED
        assert released.end == NOW + dt.timedelta(minutes=90)  # end of the current slot
        later = book(people["outsider"], people["nlp"], inventory["a"][:1], NOW + dt.timedelta(minutes=90), NOW + 3 * H, now=NOW + dt.timedelta(minutes=70))
        assert later.pk

    def test_started_booking_cannot_be_cancelled_or_moved(self, people, inventory):
        booking = book(people["owner"], people["vision"], inventory["a"][:1], NOW, NOW + 2 * H, now=NOW)
        with pytest.raises(Conflict) as refused:
            reservation_cancel(reservation_id=booking.pk, actor=people["owner"], now=NOW + H)
        assert refused.value.code == "already_started"
        with pytest.raises(Conflict):
            reservation_reschedule(reservation_id=booking.pk, actor=people["owner"], now=NOW + H,
                                   start=NOW + H, end=NOW + 3 * H)
        extended = reservation_reschedule(reservation_id=booking.pk, actor=people["owner"], now=NOW + H,
                                          end=NOW + 3 * H)
        assert extended.end == NOW + 3 * H

    def test_every_change_is_audited(self, people, inventory):
        booking = book(people["owner"], people["vision"], inventory["a"][:1], NOW + 2 * H, NOW + 3 * H, now=NOW)
        reservation_reschedule(reservation_id=booking.pk, actor=people["owner"], now=NOW, end=NOW + 4 * H)
        reservation_cancel(reservation_id=booking.pk, actor=people["manager"], now=NOW, reason="plans changed")
        entries = list(AuditEntry.objects.filter(reservation=booking).order_by("id"))
        assert [entry.action for entry in entries] == ["create", "reschedule", "cancel"]
        assert entries[1].before["end"] == (NOW + 3 * H).isoformat()
        assert entries[1].after["end"] == (NOW + 4 * H).isoformat()
        assert entries[2].actor == people["manager"] and entries[2].after["status"] == "cancelled"

    def test_advance_statuses(self, people, inventory):
        booking = book(people["owner"], people["vision"], inventory["a"][:1], NOW + H, NOW + 2 * H, now=NOW)
        assert reservations_advance(now=NOW + H) == {"activated": 1, "completed": 0}
        assert reservations_advance(now=NOW + H) == {"activated": 0, "completed": 0}
        assert reservations_advance(now=NOW + 2 * H) == {"activated": 0, "completed": 1}
        booking.refresh_from_db()
        assert booking.status == Reservation.Status.COMPLETED


@pytest.mark.django_db
def test_refusals_are_counted_for_metrics(people, inventory):
    from gpus.models import MonitoringValue

    start = NOW + 2 * H
    book(people["owner"], people["vision"], inventory["a"][:1], start, start + H, now=NOW)
    for _ in range(2):
        with pytest.raises(Conflict):
            book(people["outsider"], people["nlp"], inventory["a"][:1], start, start + H, now=NOW)
    counted = MonitoringValue.objects.filter(labels="code=slot_conflict").values_list("value", flat=True)
    assert list(counted) == [2.0]
