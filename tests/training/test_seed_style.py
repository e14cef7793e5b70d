"""Seed-style job files: `command: "yolo train …"`, `user: <team>`, relative data paths."""

import pytest
from rest_framework.test import APIClient

from tests.security.tokens import token_for
from training.jobspec import JobSpecError, normalize_seed_style, parse_job_spec
from training.models import TrainingImage, TrainingJob

SEED_FILE = """\
task_name: pcb-defects
image: yolo:v8n-cu118
command: "yolo train data=pcb_defect.yaml model=yolov8s.pt epochs=100 imgsz=640"
user: vision
resources: {gpu: 1}
"""
TEAMS = {"vision", "nlp"}


def normalize(document):
    return normalize_seed_style(document, is_team=TEAMS.__contains__, data_root_of=lambda slug: f"/data/{slug}")


def test_yolo_train_command_becomes_yolo_fields():
    spec = normalize({"command": 'yolo train data=pcb.yaml "model=my weights.pt" epochs=100 imgsz=640 batch=-1 '
                                 "lr0=0.01 cos_lr=true", "user": "vision", "task_name": "x", "image": "i"})
    assert spec == {
        "task_name": "x", "image": "i", "team": "vision",
        "yolo": {"data": "/data/vision/pcb.yaml", "model": "/data/vision/my weights.pt", "epochs": 100,
                 "imgsz": 640, "batch": -1, "extra": {"lr0": 0.01, "cos_lr": True}},
    }
    parsed = parse_job_spec(spec, allowed_images={"i"}, data_roots=["/data/vision"], max_gpus=4)
    assert parsed.yolo.epochs == 100 and parsed.yolo.extra == {"lr0": 0.01, "cos_lr": True}


def test_same_validation_as_the_yolo_form():
    spec = normalize({"command": "yolo train data=../nlp/secret.yaml model=yolov8n.yaml epochs=0 rm=-rf",
                      "team": "vision", "task_name": "x", "image": "i"})
    with pytest.raises(JobSpecError) as refused:
        parse_job_spec(spec, allowed_images={"i"}, data_roots=["/data/vision"], max_gpus=4)
    fields = {field for field, _ in refused.value.problems}
    assert fields == {"yolo.data", "yolo.epochs", "yolo.extra.rm"}


@pytest.mark.parametrize(
    ("command", "problem"),
    [("yolo train data=a.yaml epochs", "expected key=value"), ("yolo train 'data=a.yaml", "cannot split"),
     ("yolo train epochs=3 epochs=4", "given twice")],
)
def test_malformed_yolo_command_names_the_command(command, problem):
    with pytest.raises(JobSpecError) as refused:
        normalize({"command": command, "team": "vision"})
    assert refused.value.problems[0][0] == "command" and problem in refused.value.problems[0][1]


def test_other_command_strings_are_refused_showing_the_argv_form():
    spec = normalize({"command": "python train.py --fast 'a b'", "team": "vision", "task_name": "x", "image": "i"})
    with pytest.raises(JobSpecError) as refused:
        parse_job_spec(spec, allowed_images={"i"}, data_roots=["/data/vision"], max_gpus=4)
    assert refused.value.problems == [
        ("command", 'must be a list of arguments, never a shell string (no shell runs it): write command: '
                    '["python", "train.py", "--fast", "a b"], or `yolo train key=value …`'),
    ]


def test_user_that_is_not_a_team_stays_a_problem():
    assert normalize({"user": "mallory"}) == {"user": "mallory"}  # parse_job_spec: "user: unknown field"
    assert normalize({"user": "vision", "team": "nlp"}) == {"user": "vision", "team": "nlp"}  # never guessed
    assert normalize(["not", "a", "mapping"]) == ["not", "a", "mapping"]


@pytest.mark.django_db
def test_the_seed_file_is_accepted_through_the_api(people, inventory, settings):
    settings.GPUBOOK_DATA_ROOTS = ["/data/{team}", "/data/shared"]
    TrainingImage.objects.get_or_create(name="yolo", tag="v8n-cu118")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token_for(people['owner'])}")
    response = client.post("/api/v1/jobs/", {"spec_yaml": SEED_FILE}, format="json")
    assert response.status_code == 201, response.json()
    job = TrainingJob.objects.get()
    assert job.team == people["vision"] and job.epochs_total == 100
    assert response.json()["spec"]["yolo"]["data"] == "/data/vision/pcb_defect.yaml"

    refused = client.post("/api/v1/jobs/", {"spec_yaml": SEED_FILE.replace("vision", "nlp")}, format="json")
    assert refused.status_code == 403 and refused.json()["code"] == "not_team_member"  # alice is not in nlp


@pytest.mark.django_db
def test_the_seed_file_gets_batch_advice_like_a_strict_spec(people, inventory, settings):
    """Found by schemathesis: advice answered no_advice for the file that submit accepts."""
    settings.GPUBOOK_DATA_ROOTS = ["/data/{team}", "/data/shared"]
    TrainingImage.objects.get_or_create(name="yolo", tag="v8n-cu118")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token_for(people['owner'])}")
    response = client.post("/api/v1/jobs/advice/", {"spec_yaml": SEED_FILE}, format="json")
    assert response.status_code == 200, response.json()
    assert response.json()["image"] == "yolo:v8n-cu118" and response.json()["epochs"] == 100


@pytest.mark.django_db
def test_control_characters_in_a_spec_are_a_400_not_a_500(people):
    """Found by schema fuzzing: YAML's reader refuses \x12 while the loader is being built."""
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token_for(people['owner'])}")
    response = client.post("/api/v1/jobs/", {"spec_yaml": "\x12 task_name: x"}, format="json")
    assert response.status_code == 400 and response.json()["code"] == "invalid_spec"
