"""Links back to the pages a notice is about. One place, so the page URLs can move."""

from django.conf import settings


def base_url() -> str:
    return settings.GPUBOOK_BASE_URL.rstrip("/")


def reservation_url(reservation_id: int) -> str:
    return f"{base_url()}/reservations/{reservation_id}/"


def run_url(run_id: int) -> str:
    return f"{base_url()}/runs/{run_id}/"


def job_url(job_id: int) -> str:
    return f"{base_url()}/jobs/{job_id}/"


def team_url(team_id: int) -> str:
    # The calendar shows each team's quota bar; there is no team page yet.
    return f"{base_url()}/calendar/?team={team_id}"


def preferences_url() -> str:
    # Preferences are edited through the API for now; the profile page is where a form belongs.
    return f"{base_url()}/profile/"


def approvals_url() -> str:
    return f"{base_url()}/approvals/"


def calendar_url() -> str:
    return f"{base_url()}/calendar/"
