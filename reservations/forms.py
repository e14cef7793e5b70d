"""Page forms: they turn what a person typed, in their own time zone, into the aware UTC values
the services take. No booking rule lives here; a form only says "this is not a time"."""

import datetime as dt
import zoneinfo

from django import forms
from django.utils.dateparse import parse_datetime

from gpus.models import Gpu
from reservations.models import Team
from reservations.serializers import MAX_GPUS_PER_BOOKING


class LocalTimeError(ValueError):
    pass


def local_to_utc(wall_clock: dt.datetime, tz: zoneinfo.ZoneInfo) -> dt.datetime:
    """Read a wall-clock time in `tz`. A time that a spring-forward skips does not exist and is
    refused; a time a fall-back repeats means its first occurrence (fold=0)."""
    aware = wall_clock.replace(tzinfo=tz, fold=0)
    round_trip = aware.astimezone(dt.UTC).astimezone(tz).replace(tzinfo=None, fold=0)
    if round_trip != wall_clock.replace(tzinfo=None, fold=0):
        raise LocalTimeError(
            f"{wall_clock:%H:%M} on {wall_clock:%Y-%m-%d} does not exist in {tz.key}: the clocks skip that hour."
        )
    return aware.astimezone(dt.UTC)


def parse_local_or_aware(value: str, tz: zoneinfo.ZoneInfo) -> dt.datetime | None:
    """An ISO-8601 date-time; with an offset it is exact, without one it is wall-clock in `tz`."""
    try:
        parsed = parse_datetime(value.strip())
    except ValueError:
        return None
    if parsed is None:
        return None
    try:
        if parsed.tzinfo is not None:
            return parsed.astimezone(dt.UTC)
        try:
            return local_to_utc(parsed, tz)
        except LocalTimeError:
            # A range edge inside a skipped hour: the instant the clocks jump to is what is meant.
            return parsed.replace(tzinfo=tz, fold=0).astimezone(dt.UTC)
    except OverflowError:  # past the last representable instant once converted: not a time
        return None


def gpu_choices(gpus: list[Gpu]) -> list[tuple[str, list[tuple[int, str]]]]:
    """GPUs grouped by node, as Django's grouped choices."""
    groups: dict[str, list[tuple[int, str]]] = {}
    for gpu in gpus:
        label = f"GPU {gpu.index} · {gpu.model_name} · {gpu.memory_mib // 1024} GiB"
        if gpu.state != Gpu.State.ACTIVE:
            label += f" ({gpu.get_state_display().lower()})"
        groups.setdefault(gpu.node.name, []).append((gpu.pk, label))
    return list(groups.items())


class BookingForm(forms.Form):
    gpus = forms.TypedMultipleChoiceField(
        label="GPUs",
        coerce=int,
        required=False,  # or a count instead (clean says which is missing)
        widget=forms.CheckboxSelectMultiple,
        help_text="One or more GPUs of the same node.",
    )
    count = forms.IntegerField(
        required=False,
        min_value=1,
        max_value=MAX_GPUS_PER_BOOKING,
        label="Or any number of GPUs of one node",
        help_text="Instead of ticking GPUs: gpubook chooses them so that the booking's start stops the "
                  "least running work.",
        widget=forms.NumberInput(attrs={"placeholder": "e.g. 2"}),
    )
    team = forms.ModelChoiceField(queryset=Team.objects.none(), empty_label=None, label="On behalf of team")
    date = forms.DateField(widget=forms.DateInput(attrs={"type": "date"}), label="Date")
    start_time = forms.TimeField(label="Start", widget=forms.TimeInput(attrs={"type": "time"}, format="%H:%M"))
    end_time = forms.TimeField(label="End", widget=forms.TimeInput(attrs={"type": "time"}, format="%H:%M"))
    end_date = forms.DateField(
        required=False,
        label="End date",
        widget=forms.DateInput(attrs={"type": "date"}),
        help_text="Leave empty for the same day (or the next day when the end is not after the start).",
    )
    note = forms.CharField(
        required=False, max_length=500, label="Note", widget=forms.TextInput(attrs={"placeholder": "what it is for"})
    )

    def __init__(self, *args, teams, gpus: list[Gpu], tz: zoneinfo.ZoneInfo, slot_minutes: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.tz = tz
        self.fields["team"].queryset = teams
        self.fields["gpus"].choices = gpu_choices(gpus)
        step = str(slot_minutes * 60)
        self.fields["start_time"].widget.attrs["step"] = step
        self.fields["end_time"].widget.attrs["step"] = step

    def gpu_groups(self) -> list[tuple[str, list[tuple[int, str, bool]]]]:
        """The GPU checkboxes by node, each with whether it is ticked (for the template)."""
        chosen = {str(value) for value in (self["gpus"].value() or [])}
        return [
            (node_name, [(value, label, str(value) in chosen) for value, label in options])
            for node_name, options in self.fields["gpus"].choices
        ]

    def clean(self):
        cleaned = super().clean()
        if "gpus" in cleaned and "count" in cleaned:  # both parsed: say which is missing or extra
            if not cleaned["gpus"] and cleaned["count"] is None:
                self.add_error("gpus", "Choose at least one GPU. Or give how many you need.")
            elif cleaned["gpus"] and cleaned["count"] is not None:
                self.add_error("count", "Tick GPUs or give a number, not both.")
        day, start_time, end_time = cleaned.get("date"), cleaned.get("start_time"), cleaned.get("end_time")
        if day is None or start_time is None or end_time is None:
            return cleaned
        end_day = cleaned.get("end_date")
        if end_day is None:
            end_day = day if end_time > start_time else day + dt.timedelta(days=1)
        try:
            cleaned["start"] = local_to_utc(dt.datetime.combine(day, start_time), self.tz)
            cleaned["end"] = local_to_utc(dt.datetime.combine(end_day, end_time), self.tz)
        except LocalTimeError as error:
            raise forms.ValidationError(str(error)) from None
        return cleaned


class LocalDateTimeField(forms.CharField):
    """A wall-clock date-time (an <input type="datetime-local">), kept naive: the form reads
    it in the viewer's zone itself, so a skipped hour is refused rather than shifted."""

    widget = forms.DateTimeInput(attrs={"type": "datetime-local"})

    def to_python(self, value):
        value = super().to_python(value)
        if not value:
            return None
        try:
            parsed = parse_datetime(value.strip().replace(" ", "T"))
        except ValueError:
            parsed = None
        if parsed is None or parsed.tzinfo is not None:
            raise forms.ValidationError("Enter a date and time, e.g. 2026-07-14 09:30.")
        return parsed


class RescheduleForm(forms.Form):
    """New start and/or end, as wall-clock times in the viewer's zone."""

    start = LocalDateTimeField(required=False, label="Start")
    end = LocalDateTimeField(label="End")

    def __init__(self, *args, tz: zoneinfo.ZoneInfo, slot_minutes: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.tz = tz
        for name in ("start", "end"):
            self.fields[name].widget.attrs["step"] = str(slot_minutes * 60)

    def clean(self):
        cleaned = super().clean()
        try:
            for name in ("start", "end"):
                value = cleaned.get(name)
                cleaned[f"{name}_utc"] = local_to_utc(value, self.tz) if value is not None else None
        except LocalTimeError as error:
            raise forms.ValidationError(str(error)) from None
        return cleaned


class ProfileForm(forms.Form):
    time_zone = forms.ChoiceField(label="Time zone")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["time_zone"].choices = [(name, name) for name in sorted(zoneinfo.available_timezones())]
