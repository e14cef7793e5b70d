"""The sampler over NVML (pynvml, from the `nvidia-ml-py` package).

Its boundary is the handful of pynvml functions it calls; tests replace exactly those. Every
figure is read on its own: a GPU that cannot report its power (many consumer cards) still
reports its utilization, and a GPU that fails entirely (fallen off the bus) is skipped for
that sample while the others are read. Where NVML is absent the sampler says so once and
reports nothing: it never makes numbers up.
"""

import dataclasses
import logging

logger = logging.getLogger(__name__)
MIB = 1024 * 1024


@dataclasses.dataclass(frozen=True)
class Reading:
    """One raw sample of one GPU, in Prometheus base units; None where NVML could not say."""

    index: int
    uuid: str
    utilization: float | None = None  # ratio 0–1
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    temperature_celsius: float | None = None
    power_watts: float | None = None


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlSampler:
    """Holds NVML open between samples (nvmlInit is slow); `close()` shuts it down."""

    def __init__(self) -> None:
        self._open = False
        self._unavailable_reason: str | None = None
        self._said_unavailable = False

    @property
    def available(self) -> bool:
        return self._ensure_open()

    @property
    def unavailable_reason(self) -> str | None:
        return self._unavailable_reason

    def _ensure_open(self) -> bool:
        if self._open:
            return True
        try:
            import pynvml

            pynvml.nvmlInit()
        except Exception as error:  # ImportError, NVMLError_LibraryNotFound, DriverNotLoaded, …
            self._unavailable_reason = f"NVML is not available on this host ({error})"
            if not self._said_unavailable:
                logger.warning("%s: no GPU telemetry will be reported from here.", self._unavailable_reason)
                self._said_unavailable = True
            return False
        self._open = True
        self._unavailable_reason = None
        return True

    def sample(self) -> list[Reading]:
        """One reading per GPU that answered; [] where NVML is absent or failed as a whole."""
        if not self._ensure_open():
            return []
        import pynvml

        try:
            count = pynvml.nvmlDeviceGetCount()
        except pynvml.NVMLError as error:
            logger.warning("NVML could not count the GPUs (%s); reopening next time.", error)
            self.close()
            return []
        readings = []
        for index in range(count):
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
            except pynvml.NVMLError as error:  # e.g. GPU is lost: skip it, keep the others
                logger.warning("NVML: GPU %s did not answer (%s); skipped in this sample.", index, error)
                continue
            readings.append(_read_device(pynvml, handle, index=index, uuid=uuid))
        return readings

    def close(self) -> None:
        if not self._open:
            return
        self._open = False
        try:
            import pynvml

            pynvml.nvmlShutdown()
        except Exception:  # shutting down a broken NVML must never raise out of the agent
            logger.debug("nvmlShutdown failed", exc_info=True)


def _read_device(pynvml, handle, *, index: int, uuid: str) -> Reading:
    def attempt(read):
        try:
            return read()
        except pynvml.NVMLError as error:
            logger.debug("NVML: GPU %s: %s", index, error)
            return None

    utilization = attempt(lambda: pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)
    memory = attempt(lambda: pynvml.nvmlDeviceGetMemoryInfo(handle))
    temperature = attempt(lambda: pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU))
    power_mw = attempt(lambda: pynvml.nvmlDeviceGetPowerUsage(handle))
    return Reading(
        index=index,
        uuid=uuid,
        utilization=None if utilization is None else max(0.0, min(1.0, float(utilization) / 100.0)),
        memory_used_bytes=None if memory is None else int(memory.used),
        memory_total_bytes=None if memory is None else int(memory.total),
        temperature_celsius=None if temperature is None else float(temperature),
        power_watts=None if power_mw is None else float(power_mw) / 1000.0,
    )
