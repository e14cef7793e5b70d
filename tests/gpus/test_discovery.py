"""discover_gpus: NVML where there is a driver, a declared inventory where there is none."""

import io

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from gpus.discovery import InventoryError, NvmlUnavailable, discover_local_gpus, load_inventory
from gpus.models import Gpu

INVENTORY = """
nodes:
  - name: gpu-a
    gpus:
      - {index: 0, model: "NVIDIA A100-SXM4-80GB", memory_mib: 81920, uuid: "GPU-1111"}
      - {index: 1, model: "NVIDIA A100-SXM4-80GB", memory_mib: 81920}
  - name: gpu-b
    gpus:
      - {index: 0, model: "NVIDIA L40S", memory_mib: 46068}
"""


def test_this_machine_has_no_nvml_and_says_so():
    # The real pynvml on a machine without an NVIDIA driver: the edge of the world, not a mock.
    with pytest.raises(NvmlUnavailable, match="NVML is not available"):
        discover_local_gpus()


@pytest.mark.django_db
def test_command_without_nvml_points_to_the_inventory():
    with pytest.raises(CommandError, match="--inventory"):
        call_command("discover_gpus", stdout=io.StringIO())
    assert Gpu.objects.count() == 0


@pytest.mark.django_db
def test_inventory_registers_and_updates(tmp_path):
    path = tmp_path / "gpus.yaml"
    path.write_text(INVENTORY)
    out = io.StringIO()
    call_command("discover_gpus", "--inventory", str(path), stdout=out)
    assert "gpu-a: 2 GPU(s) added, 0 updated" in out.getvalue()
    assert Gpu.objects.get(node__name="gpu-a", index=0).uuid == "GPU-1111"
    path.write_text(INVENTORY.replace("46068", "49152"))
    call_command("discover_gpus", "--inventory", str(path), stdout=io.StringIO())
    assert Gpu.objects.count() == 3 and Gpu.objects.get(node__name="gpu-b").memory_mib == 49152


@pytest.mark.parametrize(
    ("text", "problem"),
    [("nodes: 3", "`nodes` list"), ("nodes: [{gpus: []}]", "needs a `name`"),
     ("nodes: [{name: a, gpus: [{index: 0}]}]", "needs index, model and memory_mib"), ("nodes: [", "cannot read")],
)
def test_bad_inventory_names_the_problem(tmp_path, text, problem):
    path = tmp_path / "gpus.yaml"
    path.write_text(text)
    with pytest.raises(InventoryError, match=problem):
        load_inventory(path)
