"""Folding raw readings into one-minute buckets (pure; no Django).

A bucket is closed once a reading from a later minute arrives or `drain(now)` is asked for
minutes that have ended; only closed buckets leave the aggregator, so a minute is never
reported half-full twice. Means and maxima are taken per figure over the readings that had
that figure (a None is "not read", not zero).
"""

import dataclasses
import datetime as dt

from gpus.telemetry.nvml import Reading

FIGURES = ("utilization", "memory_used_bytes", "temperature_celsius", "power_watts")


def floor_minute(moment: dt.datetime) -> dt.datetime:
    return moment.astimezone(dt.UTC).replace(second=0, microsecond=0)


@dataclasses.dataclass
class _Accumulator:
    index: int
    uuid: str
    count: int = 0
    sums: dict = dataclasses.field(default_factory=dict)
    counts: dict = dataclasses.field(default_factory=dict)
    maxima: dict = dataclasses.field(default_factory=dict)
    memory_total_bytes: int | None = None

    def add(self, reading: Reading) -> None:
        self.count += 1
        for figure in FIGURES:
            value = getattr(reading, figure)
            if value is None:
                continue
            self.sums[figure] = self.sums.get(figure, 0.0) + value
            self.counts[figure] = self.counts.get(figure, 0) + 1
            self.maxima[figure] = max(self.maxima.get(figure, value), value)
        if reading.memory_total_bytes is not None:
            self.memory_total_bytes = reading.memory_total_bytes

    def bucket(self, minute: dt.datetime) -> dict:
        def mean(figure):
            return self.sums[figure] / self.counts[figure] if self.counts.get(figure) else None

        memory_mean = mean("memory_used_bytes")
        memory_max = self.maxima.get("memory_used_bytes")
        return {
            "index": self.index,
            "uuid": self.uuid,
            "minute": minute.isoformat(),
            "sample_count": self.count,
            "utilization_mean": mean("utilization"),
            "utilization_max": self.maxima.get("utilization"),
            "memory_used_bytes_mean": None if memory_mean is None else round(memory_mean),
            "memory_used_bytes_max": None if memory_max is None else int(memory_max),
            "memory_total_bytes": self.memory_total_bytes,
            "temperature_celsius_mean": mean("temperature_celsius"),
            "temperature_celsius_max": self.maxima.get("temperature_celsius"),
            "power_watts_mean": mean("power_watts"),
            "power_watts_max": self.maxima.get("power_watts"),
        }


class MinuteAggregator:
    def __init__(self) -> None:
        self._open: dict[tuple[dt.datetime, str], _Accumulator] = {}

    def add(self, readings: list[Reading], *, at: dt.datetime) -> None:
        minute = floor_minute(at)
        for reading in readings:
            key = (minute, reading.uuid or f"index:{reading.index}")
            accumulator = self._open.get(key)
            if accumulator is None:
                accumulator = self._open[key] = _Accumulator(index=reading.index, uuid=reading.uuid)
            accumulator.add(reading)

    def drain(self, *, now: dt.datetime) -> list[dict]:
        """The buckets of minutes that ended before `now`'s minute, oldest first."""
        current = floor_minute(now)
        closed = sorted(key for key in self._open if key[0] < current)
        return [self._open.pop(key).bucket(key[0]) for key in closed]

    def __len__(self) -> int:
        return len(self._open)
