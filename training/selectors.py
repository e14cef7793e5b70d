from django.contrib.auth.models import AbstractBaseUser
from django.db.models import QuerySet

from reservations.models import Team
from training.models import Run, TrainingJob


def jobs_visible_to(*, user: AbstractBaseUser) -> QuerySet[TrainingJob]:
    jobs = TrainingJob.objects.select_related("team", "user", "image")
    if user.is_superuser:
        return jobs
    return jobs.filter(team__in=Team.objects.filter(memberships__user=user))


def runs_visible_to(*, user: AbstractBaseUser) -> QuerySet[Run]:
    runs = Run.objects.select_related("job")
    if user.is_superuser:
        return runs
    return runs.filter(job__team__in=Team.objects.filter(memberships__user=user))
