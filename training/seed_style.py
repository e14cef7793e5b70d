"""Seed-style job files (`command: "yolo train …"`, `user: <team>`, relative data paths) made
into strict specs before validation. The rewriting is pure (training.jobspec); this module only
supplies what it needs from the database and settings."""

from typing import Any

from django.conf import settings

from config.errors import DomainError, ErrorCode
from reservations.models import Team
from training.jobspec import JobSpecError, normalize_seed_style


def team_data_root(slug: str) -> str | None:
    """The team's own data directory: the first configured root that is per team."""
    own = [root for root in settings.GPUBOOK_DATA_ROOTS if "{team}" in root]
    return own[0].replace("{team}", slug) if own else None


def normalize_submitted(document: Any) -> Any:
    try:
        return normalize_seed_style(
            document, is_team=lambda slug: Team.objects.filter(slug=slug).exists(), data_root_of=team_data_root
        )
    except JobSpecError as error:
        raise DomainError(ErrorCode.INVALID_SPEC, f"The job spec has {len(error.problems)} problem(s): {error}",
            problems=[{"field": field, "problem": problem} for field, problem in error.problems],
        ) from error
