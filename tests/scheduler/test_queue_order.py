"""Queue order: priority class, fair share (entry penalty, aging), urgent limit, tie-break.
Also: the lazy k-way merge gives exactly the full sort."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler import Policy, Priority, QueueOrder, TeamAccount, Usage
from scheduler.fair_share import compute_fair_share
from scheduler.policy import HOUR_S
from scheduler.queue_order import (
    CANDIDATE,
    CLASS_RANK,
    HIGH_RANK,
    OVER_QUOTA_RANK,
    order_queue,
)
from scheduler.quota import QuotaBook, QuotaStanding
from tests.scheduler.builders import job, run

NOW = 100_000.0
TOTAL_GPUS = 16


def ordered_ids(jobs, *, runs=(), usage=(), teams=(), now=NOW, policy=None):
    policy = policy or Policy()
    quota = QuotaBook(teams=tuple(teams), runs=list(runs), run_deadlines_s={}, now_s=now,
                      policy=policy)
    order, _ = order_queue(
        queued_jobs=tuple(jobs),
        runs=list(runs),
        fair_share=lambda users: compute_fair_share(
            usage=tuple(usage), runs=tuple(runs), queued_users=users, teams=tuple(teams),
            now_s=now, policy=policy, total_gpus=TOTAL_GPUS,
        ),
        quota=quota,
        classify=lambda queued: CANDIDATE,
        now_s=now,
        policy=policy,
    )
    return [queued.id for _, queued in order]


def test_priority_class_comes_first():
    jobs = [
        job(1, submitted_at=NOW - 10, priority=Priority.LOW),
        job(2, submitted_at=NOW - 5, priority=Priority.HIGH),
        job(3, submitted_at=NOW - 1, priority=Priority.URGENT),
        job(4, submitted_at=NOW - 20, priority=Priority.MEDIUM),
    ]
    assert ordered_ids(jobs) == [3, 2, 4, 1]


def test_less_recent_usage_ranks_higher():
    usage = [Usage("vision", "alice", 50 * HOUR_S, NOW), Usage("speech", "carol", HOUR_S, NOW)]
    jobs = [
        job(1, submitted_at=NOW - 10, team="vision", user="alice"),
        job(2, submitted_at=NOW - 5, team="speech", user="carol"),
    ]
    assert ordered_ids(jobs, usage=usage) == [2, 1]


def test_usage_decays_with_the_half_life():
    # Alice's usage is 4 half-lives old (1/16 left); Carol's is fresh and smaller.
    policy = Policy(fair_share_half_life_s=HOUR_S)
    usage = [
        Usage("vision", "alice", 80 * HOUR_S, NOW - 4 * HOUR_S),
        Usage("speech", "carol", 10 * HOUR_S, NOW),
    ]
    jobs = [job(1, team="vision", user="alice"), job(2, team="speech", user="carol")]
    assert ordered_ids(jobs, usage=usage, policy=policy) == [1, 2]


def test_running_runs_count_as_usage():
    runs = [run(5, (0, 1, 2, 3), started_at=NOW - 10 * HOUR_S, team="vision", user="alice")]
    jobs = [
        job(1, submitted_at=NOW - 10, team="vision", user="alice"),
        job(2, submitted_at=NOW - 5, team="speech", user="carol"),
    ]
    assert ordered_ids(jobs, runs=runs) == [2, 1]


def test_entry_penalty_interleaves_a_burst_with_other_users():
    burst = [job(number, submitted_at=NOW - 100 + number, estimate_s=HOUR_S, user="alice")
             for number in range(1, 6)]
    late = job(10, submitted_at=NOW - 10, estimate_s=HOUR_S, user="bob")
    order = ordered_ids([*burst, late])
    assert order[:2] == [1, 10]
    without_penalty = ordered_ids([*burst, late], policy=Policy(entry_penalty=0.0))
    assert without_penalty[-1] == 10


def test_aging_lets_an_old_job_of_a_heavy_user_through():
    usage = [Usage("vision", "alice", 30 * HOUR_S, NOW)]
    old = job(1, submitted_at=NOW - 48 * HOUR_S, team="vision", user="alice")
    fresh = job(2, submitted_at=NOW, team="speech", user="carol")
    assert ordered_ids([old, fresh], usage=usage) == [1, 2]
    no_aging = Policy(aging_per_hour=0.0, class_promotion_after_s=0.0)
    assert ordered_ids([old, fresh], usage=usage, policy=no_aging) == [2, 1]


def test_size_lanes_put_short_predicted_jobs_first():
    # 4 GPUs x 10 h is lane 9 above the 300 GPU-s base, 1 GPU x 10 min lane 1: 16 points
    # of score apart at weight 2, more than fair share and aging separate them here.
    long_job = job(1, 4, submitted_at=NOW - 600, estimate_s=10 * HOUR_S, user="alice")
    short_job = job(2, 1, submitted_at=NOW - 60, estimate_s=600.0, team="speech", user="carol")
    assert ordered_ids([long_job, short_job]) == [2, 1]
    assert ordered_ids([long_job, short_job], policy=Policy(size_lane_weight=0.0)) == [1, 2]
    # The long job is not starved: after a day it is promoted a class and passes.
    day_old = job(1, 4, submitted_at=NOW - 25 * HOUR_S, estimate_s=10 * HOUR_S, user="alice")
    assert ordered_ids([day_old, short_job]) == [1, 2]


def test_low_priority_is_promoted_after_waiting():
    low_old = job(1, submitted_at=NOW - 25 * HOUR_S, priority=Priority.LOW, user="bob")
    medium_new = job(2, submitted_at=NOW, priority=Priority.MEDIUM, user="carol")
    no_aging = Policy(aging_per_hour=0.0)
    assert ordered_ids([low_old, medium_new], policy=no_aging) == [1, 2]
    never_promoted = Policy(aging_per_hour=0.0, class_promotion_after_s=0.0)
    assert ordered_ids([low_old, medium_new], policy=never_promoted) == [2, 1]


def test_urgent_is_limited_per_team():
    policy = Policy(urgent_limit_per_team=2)
    jobs = [
        job(1, submitted_at=NOW - 30, priority=Priority.URGENT, team="vision"),
        job(2, submitted_at=NOW - 20, priority=Priority.URGENT, team="vision"),
        job(3, submitted_at=NOW - 10, priority=Priority.URGENT, team="vision"),
        job(4, submitted_at=NOW - 40, priority=Priority.HIGH, team="speech", user="carol"),
    ]
    order = ordered_ids(jobs, policy=policy)
    assert order[:2] == [1, 2]
    assert set(order[2:]) == {3, 4}
    # An urgent run already holding GPUs uses up one of the two.
    urgent_run = run(5, (0,), team="vision", priority=Priority.URGENT, started_at=NOW)
    assert ordered_ids(jobs, runs=[urgent_run], policy=policy)[0] == 1
    assert ordered_ids(jobs, runs=[urgent_run], policy=policy)[1] != 2


def test_ties_break_by_submit_time_then_id():
    jobs = [job(3, submitted_at=5.0, user="u"), job(2, submitted_at=5.0, user="v"),
            job(1, submitted_at=9.0, user="w")]
    policy = Policy(aging_per_hour=0.0)
    assert ordered_ids(jobs, policy=policy, now=10.0) == [2, 3, 1]


def test_fifo_ignores_priority_and_usage():
    jobs = [job(1, submitted_at=3.0, priority=Priority.URGENT),
            job(2, submitted_at=1.0, priority=Priority.LOW), job(3, submitted_at=2.0)]
    assert ordered_ids(jobs, policy=Policy(queue_order=QueueOrder.FIFO)) == [2, 3, 1]


def test_over_quota_team_allowed_by_admin_comes_last():
    teams = [TeamAccount("vision", quota_remaining_gpu_s=0.0, over_quota_allowed=True)]
    jobs = [job(1, submitted_at=0.0, team="vision", priority=Priority.HIGH),
            job(2, submitted_at=NOW, team="speech", user="carol", priority=Priority.LOW)]
    assert ordered_ids(jobs, teams=teams) == [2, 1]


# ----- the merge equals the full sort


def reference_order(jobs, *, usage, now, policy):
    """The rule of queue_order written as a plain sort over every job."""
    shares = compute_fair_share(
        usage=tuple(usage), runs=(), queued_users={(j.team, j.user) for j in jobs}, teams=(),
        now_s=now, policy=policy, total_gpus=TOTAL_GPUS,
    )
    quota = QuotaBook(teams=(), runs=[], run_deadlines_s={}, now_s=now, policy=policy)
    urgent_used: dict[str, int] = {}
    keys = []
    by_submit = sorted(jobs, key=lambda j: (j.submitted_at, j.id))
    ahead: dict[tuple[str, str], float] = {}
    for queued in by_submit:
        rank = CLASS_RANK[queued.priority]
        if queued.priority == Priority.URGENT:
            if urgent_used.get(queued.team, 0) < policy.urgent_limit_per_team:
                urgent_used[queued.team] = urgent_used.get(queued.team, 0) + 1
            else:
                rank = HIGH_RANK
        waited = max(now - queued.submitted_at, 0.0)
        if rank > HIGH_RANK:
            rank = max(HIGH_RANK, rank - int(waited // policy.class_promotion_after_s))
        if quota.standing(queued.team) == QuotaStanding.OVER_ALLOWED:
            rank = OVER_QUOTA_RANK
        user_key = (queued.team, queued.user)
        penalty = ahead.get(user_key, 0.0)
        estimate = queued.estimated_duration_s or policy.default_estimate_s
        gpu_s = queued.gpus_needed * estimate
        lane = 0
        while policy.size_lane_base_gpu_s * 2**lane < gpu_s:
            lane += 1
        score = shares.score(queued.team, queued.user, penalty) + (
            policy.size_lane_weight * lane
        ) - policy.aging_per_hour / HOUR_S * waited
        ahead[user_key] = penalty + queued.gpus_needed * estimate * policy.entry_penalty
        keys.append(((rank, score, queued.submitted_at, queued.id), queued.id))
    return [job_id for _, job_id in sorted(keys)]


queued_job = st.builds(
    lambda number, submitted, user, priority, gpus, estimate: job(
        number, gpus, submitted_at=float(submitted), team=user[0], user=user,
        priority=priority, estimate_s=estimate,
    ),
    st.integers(0, 10**6),
    st.integers(0, 4 * 86400),
    st.sampled_from(["ann", "abe", "bob", "bea", "cid"]),
    st.sampled_from(list(Priority)),
    st.integers(1, 8),
    st.one_of(st.none(), st.floats(60, 86400)),
)


@settings(max_examples=150, deadline=None)
@given(
    jobs=st.lists(queued_job, max_size=40, unique_by=lambda queued: queued.id),
    usage_hours=st.dictionaries(st.sampled_from(["ann", "abe", "bob", "bea", "cid"]),
                                st.floats(0, 500), max_size=5),
)
def test_lazy_merge_equals_full_sort(jobs, usage_hours):
    now = 5 * 86400.0
    usage = [Usage(user[0], user, hours * HOUR_S, now - 3600) for user, hours in
             usage_hours.items()]
    policy = Policy()
    assert ordered_ids(jobs, usage=usage, now=now, policy=policy) == reference_order(
        jobs, usage=usage, now=now, policy=policy
    )
