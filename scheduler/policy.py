"""Every tunable of the scheduler in one frozen `Policy`, with the reasons for the defaults.

The lead maps settings onto these fields; the simulator builds its three policies
(`fifo`, `reservations-only`, `gpubook`) from the same class, so the baselines run through
the very same `plan()` with features switched off.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

HOUR_S = 3600.0
DAY_S = 86400.0


class QueueOrder(StrEnum):
    # Submit time, then id; priorities and usage ignored (the baseline).
    FIFO = "fifo"
    # Priority class, then fair share with entry penalty and aging (gpubook).
    FAIR_SHARE = "fair_share"


@dataclass(frozen=True, slots=True)
class Policy:
    # Time a run gets between Stop and Kill to checkpoint. The YOLO runner finishes the
    # current batch and writes last.pt (a few hundred MB at most) on SIGTERM; 60 s covers
    # that on network storage with margin, while costing little idle time per slot edge.
    grace_s: float = 60.0

    # A reservation with no attached job and nothing running this long after its start is
    # released and refunded. Half a default slot: late enough for a person to attach a job.
    no_show_after_s: float = 15 * 60.0
    release_no_show: bool = True
    # Release the rest of a slot whose attached job has ended for good.
    release_early_finish: bool = True

    # Fair share: usage halves every 7 days (DESIGN default), so last month barely counts.
    fair_share_half_life_s: float = 7 * DAY_S
    # Queued (backfill) runs are charged at this fraction of their GPU-hours (DESIGN: idle
    # time is cheaper); applies to quota and fair-share usage alike.
    usage_factor: float = 0.5
    # Weight of the user's own ratio against the team's ratio in the fair-share score.
    user_weight: float = 0.5
    # Share of a team that has no account (or no share set), relative to those that do.
    default_team_share: float = 1.0
    # Entry penalty: this fraction of the estimated GPU-seconds of a user's earlier queued
    # jobs counts as that user's (and team's) usage when ranking the later ones, so a burst
    # of 100 submissions interleaves with other users instead of jumping them all.
    entry_penalty: float = 1.0
    # Aging: each hour of waiting lowers the fair-share score by this much (1.0 = the score
    # of a team using exactly its share), so a heavy user's job still starts within a day.
    aging_per_hour: float = 0.1
    # Aging across classes: after this long a job counts one priority class higher (never
    # urgent), so low-priority work cannot starve under a steady stream of high.
    class_promotion_after_s: float = DAY_S
    # Shortest predicted first, within fair share (size-class lanes): the score of a job
    # that could start now grows by this much per doubling of its predicted GPU-seconds
    # (estimate × GPUs) above `size_lane_base_gpu_s`, so short jobs pass long ones unless
    # aging or usage say otherwise; the job held for (EASY) is ranked without lanes. Mean
    # wait is dominated by short jobs stuck behind long ones; on philly (#15) this cut the
    # mean wait without bookings 5,120 → 3,863 s and the p95 34,615 → 14,043 s (weights
    # 0.5–4 and strict lanes all land within ~10 % of weight 2). 0 = off (before #15).
    size_lane_weight: float = 2.0
    size_lane_base_gpu_s: float = 300.0
    # Urgent jobs jump the queue, but only this many per team at a time (running + queued);
    # further urgent jobs of the team rank as high.
    urgent_limit_per_team: int = 2

    # Preemptible backfill: a checkpointable job whose estimate does not fit before the
    # next reservation may still start if it can run at least this long before it would be
    # stopped; shorter runs mostly pay restart overhead.
    min_preemptible_runtime_s: float = 15 * 60.0
    # A job preempted this many times only starts where its estimate fits (no thrashing).
    max_preemptions: int = 3
    # A job that cannot checkpoint loses all its work if a reservation stops it, and
    # estimates err (Philly: a user's next run is often several times the last two), so it
    # goes into a gap before a reservation only if the gap holds this multiple of its
    # estimate: a conservative quantile of the runtime instead of the mean. GPUs with no
    # reservation ahead take it whatever its estimate. 1.0 = trust the estimate; 3.0 cut
    # the work lost on philly by a quarter for 4 % more mean wait (BENCHMARKS.md, #15).
    non_checkpointable_gap_factor: float = 3.0
    # Such a job with no estimate at all (no history, no user estimate) goes only on GPUs
    # with no reservation ahead: the default estimate is a guess, and on the held-out ITP
    # trace (no history for anyone) day-long 32-GPU runs placed on it into 3-hour gaps were
    # most of the work lost. False = treat the default like any estimate (before #15 item 2).
    unknown_non_checkpointable_open_gpus_only: bool = True
    # Estimate used when a job has none and the estimator had no history (Philly mean-ish
    # is hours; one hour keeps unknown jobs off GPUs booked soon without locking them out).
    default_estimate_s: float = HOUR_S

    # Priority preemption (scheduler.priority_preemption): an urgent or high job that
    # cannot start may stop running backfill runs of a lower class, checkpointable ones
    # first, each only after it has run this long (shorter runs mostly pay restart cost).
    priority_preemption: bool = True
    min_runtime_before_preemption_s: float = 15 * 60.0
    # At most this many waiting urgent/high jobs are considered for preemption per plan.
    max_preempting_jobs_per_plan: int = 8

    # Queue relief (scheduler.queue_relief): once `relief_min_jobs` queued jobs have waited
    # this long with no room, the checkpointable backfill run whose GPUs start the most of
    # them checkpoints and is requeued, one at a time, each job at most once. 1 h / 4 jobs:
    # rows of the #15 matrix meeting every target 4 → 6 (seeds 1–4, and held out 5–8);
    # inf = off (the baselines).
    relief_after_s: float = HOUR_S
    relief_min_jobs: int = 4
    # Relief's disruption budget: its stops in the last `relief_budget_window_s` stay under
    # `relief_budget_share` of the jobs submitted to the queue in that window, plus
    # `relief_budget_extra`, so that relief cannot become a steady source of stops
    # whatever the workload (the #15 target allows 1 % of jobs). The two extra stops let a
    # quiet week's first bursts be relieved; without them (or with one) the budget binds
    # early in a burst and costs the ITP p95 it exists for. Matrix rows meeting every
    # target 6 → 7 on seeds 1–4, unchanged on 5–12 (BENCHMARKS.md, "Eleventh round").
    relief_budget_share: float = 0.01
    relief_budget_extra: int = 2
    relief_budget_window_s: float = 7 * DAY_S
    # Queue drain (scheduler.queue_drain): once the oldest job that needs a whole node has
    # waited this long, the fewest stoppable runs on one node checkpoint to empty it for that
    # job, and the node is kept for it `drain_hold_s`. The drain spends relief's budget but
    # leaves relief `drain_leaves_relief` of it. 1 h: matrix rows meeting every target +2 on
    # seeds 1–4, 5–8 and 9–12; 10 or 30 min spend the budget early and break ITP's 1 % of
    # jobs (BENCHMARKS.md, "Fourteenth round"). inf = off (the baselines).
    drain_after_s: float = HOUR_S
    drain_hold_s: float = 15 * 60.0
    drain_leaves_relief: int = 4

    # Longest a backfill run of a team with a quota may hold before it checkpoints and is
    # requeued (at least twice its estimate), so one run cannot book a team's whole month.
    quota_lease_s: float = DAY_S

    queue_order: QueueOrder = QueueOrder.FAIR_SHARE
    # True: any queued job that fits may start (backfill). False: strict order, the first
    # job that cannot start blocks all behind it (the FIFO baselines).
    backfill: bool = True
    # True: estimates decide placement (fit before the next reservation, else preemptible
    # backfill). False: jobs go on any idle GPU and are stopped when a reservation comes.
    use_estimates: bool = True
    # EASY-style protection: the first N jobs in order that cannot start get the node that
    # frees soonest held for them; later jobs use it only if estimated to finish before.
    backfill_protected_jobs: int = 1
    # The hold and placement agree, both ways. The hold is taken only on GPUs where the
    # held job could be placed when they free: a booking ahead must leave it the room
    # `place` asks (its estimate × the gap factor if it cannot checkpoint; no booking at all
    # if it has no estimate either); holding by the bare estimate kept nodes it could never
    # use idle for it under bookings (#15 matrix, seeds 1-2: 4 → 5 of 18 rows meet all; ITP
    # 0.95 / 20 % mean wait 2,437 → 2,026 s). And a job wider than a node may take held
    # nodes if it ends before the hold, as a job on one node may (helios 0.95 / 35 %: mean
    # wait 49,189 → 44,397 s; no other row moved). False = the textbook hold on the bare
    # estimate, held nodes closed to wide jobs (before #15's third round; the easy baseline).
    protect_as_placed: bool = True
    # At most this many queued jobs are tried per plan (Slurm's bf_max_job_test is 500):
    # bounds the plan's cost when thousands wait and the idle GPUs suit few of them.
    max_jobs_examined: int = 1000
    # Jobs needing more GPUs than a node has: False = never started (gpubook executors pin
    # a run to one node); True = placed on whole free nodes (the simulator's choice).
    allow_multi_node: bool = False


DEFAULT_POLICY = Policy()
