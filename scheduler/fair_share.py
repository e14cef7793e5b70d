"""Fair-share arithmetic: decayed usage of teams and users against their shares.

Rule: usage is GPU-seconds decayed exponentially with `Policy.fair_share_half_life_s`
(finished runs from `Snapshot.usage`, plus the runs holding GPUs now, counted from their
start; backfill runs at `usage_factor`). A team's ratio is its fraction of all recent
usage divided by its fraction of all shares; a user's ratio is the user's fraction of all
recent usage divided by an equal split of the team's share among the team's known users.
The score mixes both (`user_weight`): 1.0 means "using exactly what you are entitled to",
lower ranks higher. Usage is floored at one hour of the whole cluster so that a nearly idle
cluster does not turn one short run into a huge ratio.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from scheduler.instants import to_seconds
from scheduler.policy import HOUR_S, Policy
from scheduler.snapshot import Id, Run, RunKind, TeamAccount, Usage


@dataclass(slots=True)
class FairShare:
    team_usage: dict[Id, float]
    user_usage: dict[tuple[Id, Id], float]
    team_share_fraction: dict[Id, float]
    users_per_team: dict[Id, int]
    total_usage: float
    user_weight: float

    def score(self, team: Id, user: Id, extra_usage: float) -> float:
        """Fair-share score of (team, user) if they had used `extra_usage` more."""
        share = self.team_share_fraction[team]
        team_ratio = (self.team_usage.get(team, 0.0) + extra_usage) / self.total_usage / share
        user_share = share / self.users_per_team[team]
        user_ratio = (
            (self.user_usage.get((team, user), 0.0) + extra_usage) / self.total_usage / user_share
        )
        return (1.0 - self.user_weight) * team_ratio + self.user_weight * user_ratio


def decay_factor(age_s: float, half_life_s: float) -> float:
    return 0.5 ** (max(age_s, 0.0) / half_life_s)


def decayed_gpu_seconds(
    previous_gpu_s: float, previous_as_of_s: float, now_s: float, half_life_s: float
) -> float:
    """Decay a usage value from `previous_as_of_s` to `now_s` (helper for adapters)."""
    return previous_gpu_s * decay_factor(now_s - previous_as_of_s, half_life_s)


def compute_fair_share(
    *,
    usage: tuple[Usage, ...],
    runs: tuple[Run, ...],
    queued_users: Iterable[tuple[Id, Id]],
    teams: tuple[TeamAccount, ...],
    now_s: float,
    policy: Policy,
    total_gpus: int,
) -> FairShare:
    half_life_s = policy.fair_share_half_life_s
    team_usage: dict[Id, float] = {}
    user_usage: dict[tuple[Id, Id], float] = {}
    users: dict[Id, set[Id]] = {}
    # The additions are inlined (a plan visits every usage record and run here); each is
    # `decay_factor` / the run's charge, in the same order, so the sums are the same floats.
    for record in usage:
        team, user = record.team, record.user
        as_of = record.as_of
        age_s = now_s - (as_of if as_of.__class__ is float else to_seconds(as_of))
        gpu_s = record.gpu_seconds * 0.5 ** ((age_s if age_s > 0.0 else 0.0) / half_life_s)
        team_usage[team] = team_usage.get(team, 0.0) + gpu_s
        key = (team, user)
        user_usage[key] = user_usage.get(key, 0.0) + gpu_s
        members = users.get(team)
        if members is None:
            users[team] = {user}
        else:
            members.add(user)
    usage_factor = policy.usage_factor
    backfill = RunKind.BACKFILL
    for run in runs:
        factor = usage_factor if run.kind == backfill else 1.0
        started = run.started_at
        elapsed_s = now_s - (started if started.__class__ is float else to_seconds(started))
        gpu_s = len(run.gpu_ids) * (elapsed_s if elapsed_s > 0.0 else 0.0) * factor
        team, user = run.team, run.user
        team_usage[team] = team_usage.get(team, 0.0) + gpu_s
        key = (team, user)
        user_usage[key] = user_usage.get(key, 0.0) + gpu_s
        members = users.get(team)
        if members is None:
            users[team] = {user}
        else:
            members.add(user)
    for team, user in queued_users:
        users.setdefault(team, set()).add(user)

    shares: dict[Id, float] = {team: policy.default_team_share for team in users}
    for account in teams:
        shares[account.team] = (
            account.share if account.share is not None else policy.default_team_share
        )
    share_total = sum(shares.values()) or 1.0
    # A team with share 0 still gets a tiny fraction, so it ranks last instead of dividing by 0.
    team_share_fraction = {
        team: max(share / share_total, 1e-9) for team, share in shares.items()
    }
    return FairShare(
        team_usage=team_usage,
        user_usage=user_usage,
        team_share_fraction=team_share_fraction,
        users_per_team={team: max(len(members), 1) for team, members in users.items()},
        total_usage=max(sum(team_usage.values()), total_gpus * HOUR_S, 1.0),
        user_weight=policy.user_weight,
    )
