"""Policy: queued runs never overspend a team's quota.

Rule: a team's quota left for backfill is its `quota_remaining_gpu_s` minus what its
backfill runs already holding GPUs may still consume until their deadlines (at
`usage_factor`). A queued job of a team with nothing left does not start, unless an admin
allows that team to run over quota, in which case it ranks below every other job. A job
that starts gets `must_end_by` no later than the moment its charge would exhaust what is
left, and that charge is booked at once, so several starts in one plan cannot overspend
together. So that one run cannot book a team's whole month, a run of a team with a quota
gets a lease: `must_end_by` at most `max(quota_lease_s, 2 × estimate)` after its start; a run
that reaches it checkpoints and is requeued, and restarts if the quota still allows.
Teams without a quota (None) are unlimited. Reserved runs were paid for at
booking time and are not charged here.
"""

from __future__ import annotations

from enum import StrEnum

from scheduler.instants import INFINITY
from scheduler.policy import Policy
from scheduler.snapshot import Id, Run, RunKind, TeamAccount


class QuotaStanding(StrEnum):
    WITHIN = "within"
    OVER_ALLOWED = "over_allowed"
    OVER_BLOCKED = "over_blocked"


class QuotaBook:
    def __init__(
        self,
        *,
        teams: tuple[TeamAccount, ...],
        runs: list[Run],
        run_deadlines_s: dict[Id, float],
        now_s: float,
        policy: Policy,
    ) -> None:
        self._usage_factor = policy.usage_factor
        self._lease_s = policy.quota_lease_s
        self._now_s = now_s
        self._remaining: dict[Id, float] = {}
        self._over_allowed: dict[Id, bool] = {}
        for account in teams:
            self._over_allowed[account.team] = account.over_quota_allowed
            if account.quota_remaining_gpu_s is not None:
                self._remaining[account.team] = account.quota_remaining_gpu_s
        # Only teams with a quota are charged for their runs; a replay without quotas (the
        # simulator's default) skips the pass over every run.
        for run in runs if self._remaining else ():
            if run.kind != RunKind.BACKFILL or run.team not in self._remaining:
                continue
            left_s = max(run_deadlines_s.get(run.id, INFINITY) - now_s, 0.0)
            self._remaining[run.team] -= len(run.gpu_ids) * left_s * self._usage_factor

    def standing(self, team: Id) -> QuotaStanding:
        if self._remaining.get(team, INFINITY) > 0:
            return QuotaStanding.WITHIN
        if self._over_allowed.get(team, False):
            return QuotaStanding.OVER_ALLOWED
        return QuotaStanding.OVER_BLOCKED

    def blocked_teams(self) -> set[Id]:
        """Teams whose queued jobs may not start now."""
        return {
            team for team in self._remaining if self.standing(team) == QuotaStanding.OVER_BLOCKED
        }

    def end_cap_s(self, team: Id, gpus: int, estimate_s: float) -> float:
        """Latest end a new run of `gpus` GPUs can have without overspending."""
        remaining = self._remaining.get(team, INFINITY)
        if (
            remaining == INFINITY
            or self._usage_factor <= 0
            or self.standing(team) == QuotaStanding.OVER_ALLOWED
        ):
            return INFINITY
        lease_s = max(self._lease_s, 2.0 * estimate_s)
        return self._now_s + min(remaining / (gpus * self._usage_factor), lease_s)

    def charge(self, team: Id, gpus: int, end_s: float) -> None:
        if team in self._remaining and self.standing(team) == QuotaStanding.WITHIN:
            self._remaining[team] -= gpus * max(end_s - self._now_s, 0.0) * self._usage_factor
