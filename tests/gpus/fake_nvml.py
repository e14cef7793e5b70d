"""A fake NVML at the pynvml function boundary: the sampler calls these, nothing deeper."""

import dataclasses

import pynvml


@dataclasses.dataclass
class FakeGpu:
    uuid: str
    utilization_percent: int = 50
    memory_used: int = 8 * 1024**3
    memory_total: int = 80 * 1024**3
    temperature: int = 60
    power_mw: int = 250_000
    # name of a pynvml call → NVML error code it raises for this GPU
    failures: dict = dataclasses.field(default_factory=dict)


class FakeNvml:
    def __init__(self, gpus: list[FakeGpu]):
        self.gpus = gpus
        self.init_error: int | None = None
        self.count_error: int | None = None
        self.init_calls = 0
        self.shutdown_calls = 0

    def _fail(self, gpu: FakeGpu, call: str):
        if call in gpu.failures:
            raise pynvml.NVMLError(gpu.failures[call])

    def install(self, monkeypatch):
        def init():
            self.init_calls += 1
            if self.init_error is not None:
                raise pynvml.NVMLError(self.init_error)

        def shutdown():
            self.shutdown_calls += 1

        def count():
            if self.count_error is not None:
                raise pynvml.NVMLError(self.count_error)
            return len(self.gpus)

        def handle(index):
            gpu = self.gpus[index]
            self._fail(gpu, "handle")
            return gpu

        def uuid(gpu):
            self._fail(gpu, "uuid")
            return gpu.uuid

        def utilization(gpu):
            self._fail(gpu, "utilization")
            return type("Utilization", (), {"gpu": gpu.utilization_percent, "memory": 0})()

        def memory(gpu):
            self._fail(gpu, "memory")
            return type("Memory", (), {"used": gpu.memory_used, "total": gpu.memory_total,
                                       "free": gpu.memory_total - gpu.memory_used})()

        def temperature(gpu, sensor):
            assert sensor == pynvml.NVML_TEMPERATURE_GPU
            self._fail(gpu, "temperature")
            return gpu.temperature

        def power(gpu):
            self._fail(gpu, "power")
            return gpu.power_mw

        for name, function in {
            "nvmlInit": init, "nvmlShutdown": shutdown, "nvmlDeviceGetCount": count,
            "nvmlDeviceGetHandleByIndex": handle, "nvmlDeviceGetUUID": uuid,
            "nvmlDeviceGetUtilizationRates": utilization, "nvmlDeviceGetMemoryInfo": memory,
            "nvmlDeviceGetTemperature": temperature, "nvmlDeviceGetPowerUsage": power,
        }.items():
            monkeypatch.setattr(pynvml, name, function)
        return self
