"""Safe parsing: one bounded YAML loader for job specs, depth/NUL caps on every JSON body, short
error messages, and a runner that refuses a data YAML asking for a download."""

import json

import pytest
from rest_framework.test import APIClient

from training import safe_yaml
from training.runner.dataset import UnsafeDataYaml, check_data_yaml

# The alias bomb: six levels of nine aliases each, ~300 bytes, 9**6 strings expanded.
ALIAS_BOMB = "a: &a ['lol','lol','lol','lol','lol','lol','lol','lol','lol']\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [" + ",".join([f"*{chr(97 + i)}"] * 9) + "]\n" for i in range(6)
) + "image: *g\n"


def test_alias_bomb_is_refused_before_expansion():
    assert len(ALIAS_BOMB) < 400
    with pytest.raises(safe_yaml.UnsafeYamlError, match="not allowed"):
        safe_yaml.load(ALIAS_BOMB)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("a: &x 1\n", "anchors and aliases"),
        ("[" * 5000 + "]" * 5000, "nested deeper"),
        ("{a: " * 50 + "1" + "}" * 50, "nested deeper"),
        ("x: " + "y" * (safe_yaml.MAX_BYTES + 1), "larger than"),
        ("a: !!python/object/apply:os.system ['true']", "not valid YAML"),
        ("a: 'b\x00c'", "NUL"),
        ("a: '\x8b'", "not valid YAML"),  # a control character: PyYAML's reader refuses it first
    ],
)
def test_loader_refuses(text, words):
    with pytest.raises(safe_yaml.UnsafeYamlError, match=words) as refused:
        safe_yaml.load(text)
    assert len(str(refused.value)) < 600


def test_loader_reads_an_ordinary_spec():
    assert safe_yaml.load("task_name: t\nyolo: {model: yolov8n.yaml, epochs: 3}\n") == {
        "task_name": "t", "yolo": {"model": "yolov8n.yaml", "epochs": 3}
    }


@pytest.fixture
def owner_api(people, inventory, settings):
    settings.GPUBOOK_DATA_ROOTS = ["/data/{team}"]
    client = APIClient()
    client.force_authenticate(people["owner"])
    return client


@pytest.mark.django_db
def test_alias_bomb_through_the_api_is_a_small_400(owner_api):
    response = owner_api.post("/api/v1/jobs/", {"spec_yaml": ALIAS_BOMB}, format="json")
    assert response.status_code == 400
    assert response.json()["code"] == "invalid_spec" and "alias" in response.json()["detail"]
    assert len(response.content) < 2000


@pytest.mark.django_db
def test_error_messages_quote_at_most_80_characters_of_a_value(owner_api):
    huge = "x" * 50_000
    response = owner_api.post(
        "/api/v1/jobs/", {"spec": {"team": "vision", "image": huge, "task_name": "t", "priority": huge}}, format="json"
    )
    assert response.status_code == 400
    body = response.json()
    assert body["code"] == "invalid_spec"
    assert "x" * 81 not in response.content.decode()
    assert len(response.content) < 4000


@pytest.mark.django_db
@pytest.mark.parametrize(
    "raw",
    [
        "[" * 100_000 + "]" * 100_000,  # RecursionError inside json.loads
        json.dumps({"spec": json.loads("[" * 40 + "]" * 40)}),  # past the depth cap
        json.dumps({"spec_yaml": "task_name: a\x00b"}),  # NUL in a value
        json.dumps({"spec\x00": 1}),  # NUL in a key
        '{"spec": NaN}',
    ],
)
def test_json_bodies_are_capped(owner_api, raw):
    response = owner_api.generic("POST", "/api/v1/jobs/", raw, content_type="application/json")
    assert response.status_code == 400, response.content
    assert response.json()["code"] == "malformed_request"


def test_runner_refuses_a_data_yaml_with_a_download_entry(tmp_path):
    marker = tmp_path / "ran"
    data = tmp_path / "data.yaml"
    data.write_text(f"path: {tmp_path}\ntrain: images/train\nval: images/val\nnames: {{0: a}}\n"
                    f"download: |\n  open({str(marker)!r}, 'w').write('x')\n")
    with pytest.raises(UnsafeDataYaml, match="download"):
        check_data_yaml(data)
    assert not marker.exists()


def test_runner_accepts_an_ordinary_data_yaml(tmp_path):
    data = tmp_path / "data.yaml"
    data.write_text(f"path: {tmp_path}\ntrain: images/train\nval: images/val\nnames: {{0: a}}\n")
    check_data_yaml(data)  # no exception
