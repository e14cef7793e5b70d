"""The API docs work offline and the OpenAPI schema is exact: real responses of the real API,
successes and refusals, validate against the schema's own response shapes."""

import datetime as dt
import re

import jsonschema
import pytest
import yaml
from django.contrib.staticfiles import finders
from rest_framework.test import APIClient

from training.models import TrainingImage

H = dt.timedelta(hours=1)


@pytest.fixture
def schema(db):
    response = APIClient().get("/api/schema/")
    assert response.status_code == 200
    return yaml.safe_load(response.content)


@pytest.mark.django_db
@pytest.mark.parametrize("page", ["/api/docs/", "/api/redoc/"])
def test_docs_pages_load_only_the_apps_own_static_files(client, page):
    html = client.get(page).content.decode()
    sources = re.findall(r"""(?:src|href)=["']([^"']+)["']""", html)
    scripts = [s for s in sources if s.endswith(".js")]
    assert scripts, html
    for source in sources:
        assert not source.startswith(("http:", "https:", "//")), f"{page} loads {source} from outside"
    for script in scripts:
        relative = script.removeprefix("/static/")
        assert finders.find(relative), f"{script} is not among the app's static files"


def test_every_operation_documents_the_error_shape_and_typed_ids(schema):
    errors = 0
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            for status in ("400", "404", "429"):
                assert operation["responses"][status]["content"]["application/json"]["schema"] == {
                    "$ref": "#/components/schemas/Error"
                }, (method, path, status)
                errors += 1
            if method in {"post", "patch", "put", "delete"}:
                assert "409" in operation["responses"], (method, path)
            for parameter in operation.get("parameters", []):
                if parameter["in"] == "path":
                    assert parameter["schema"]["type"] == "integer" and parameter["schema"]["minimum"] == 1, path
    assert errors > 60
    assert schema["components"]["schemas"]["Error"]["required"] == ["code", "detail"]


def test_date_times_enums_and_required_fields(schema):
    components = schema["components"]["schemas"]
    for name in ("start", "end", "created_at"):
        assert components["Reservation"]["properties"][name]["format"] == "date-time"
    assert components["ReservationCreateRequest"]["properties"]["start"]["format"] == "date-time"
    assert set(components["ReservationCreateRequest"]["required"]) == {"gpus", "start", "end", "team"}
    assert set(components["Reservation"]["required"]) >= {"id", "status", "start", "end", "gpus"}
    assert components["ReservationStatusEnum"]["enum"] == ["pending", "confirmed", "active", "completed",
                                                          "cancelled", "released"]
    listing = {p["name"]: p["schema"] for p in schema["paths"]["/api/v1/reservations/"]["get"]["parameters"]}
    assert listing["from"] == {"type": "string", "format": "date-time"}
    assert "pending" in listing["status"]["enum"]
    availability = schema["paths"]["/api/v1/nodes/{id}/availability/"]["get"]["responses"]["200"]
    assert availability["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/Availability"}


def openapi_to_jsonschema(node):
    """OpenAPI 3.0's `nullable` is not JSON Schema; everything else used here is."""
    if isinstance(node, list):
        return [openapi_to_jsonschema(item) for item in node]
    if not isinstance(node, dict):
        return node
    converted = {key: openapi_to_jsonschema(value) for key, value in node.items() if key != "nullable"}
    if node.get("nullable"):
        return {"anyOf": [converted, {"type": "null"}]}
    return converted


@pytest.fixture
def conforms(schema):
    components = openapi_to_jsonschema(schema["components"]["schemas"])

    def check(response, path: str, method: str) -> None:
        declared = schema["paths"][path][method]["responses"]
        assert str(response.status_code) in declared, (path, method, response.status_code, response.content)
        shape = declared[str(response.status_code)]["content"]["application/json"]["schema"]
        jsonschema.validate(
            response.json(),
            {**openapi_to_jsonschema(shape), "components": {"schemas": components}},
            format_checker=jsonschema.FormatChecker(),
        )

    return check


@pytest.mark.django_db
def test_real_responses_conform(conforms, people, inventory, future_day):
    anonymous = APIClient()
    conforms(anonymous.get("/api/v1/reservations/"), "/api/v1/reservations/", "get")  # 401
    token = anonymous.post("/api/v1/auth/token/", {"username": "alice", "password": "pw-alice"}, format="json")
    conforms(token, "/api/v1/auth/token/", "post")
    refused = anonymous.post("/api/v1/auth/token/", {"username": "alice", "password": "no"}, format="json")
    assert refused.status_code == 400
    conforms(refused, "/api/v1/auth/token/", "post")

    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {token.json()['token']}")
    gpu = inventory["a"][0].pk
    start = future_day + 9 * H
    body = {"gpus": [gpu], "team": people["vision"].pk, "start": start.isoformat(), "end": (start + 2 * H).isoformat()}
    created = api.post("/api/v1/reservations/", body, format="json")
    assert created.status_code == 201
    conforms(created, "/api/v1/reservations/", "post")
    conflict = api.post("/api/v1/reservations/", body, format="json")
    assert conflict.status_code == 409
    conforms(conflict, "/api/v1/reservations/", "post")
    invalid = api.post("/api/v1/reservations/", {**body, "start": "tomorrow"}, format="json")
    assert invalid.status_code == 400
    conforms(invalid, "/api/v1/reservations/", "post")
    conforms(api.get("/api/v1/reservations/", {"mine": "true"}), "/api/v1/reservations/", "get")
    conforms(api.get("/api/v1/reservations/999/"), "/api/v1/reservations/{id}/", "get")  # 404
    window = {"from": future_day.isoformat(), "to": (future_day + 24 * H).isoformat()}
    conforms(api.get(f"/api/v1/gpus/{gpu}/availability/", window), "/api/v1/gpus/{id}/availability/", "get")
    conforms(api.get(f"/api/v1/nodes/{inventory['node_a'].pk}/availability/", window),
             "/api/v1/nodes/{id}/availability/", "get")
    conforms(api.get("/api/v1/gpus/"), "/api/v1/gpus/", "get")
    conforms(api.get("/api/v1/teams/"), "/api/v1/teams/", "get")
    cancelled = api.post(f"/api/v1/reservations/{created.json()['id']}/cancel/", {}, format="json")
    conforms(cancelled, "/api/v1/reservations/{id}/cancel/", "post")

    TrainingImage.objects.get_or_create(name="yolo", tag="v8n-cu118")
    spec = {"task_name": "x", "image": "yolo:v8n-cu118", "team": "vision", "command": ["python", "t.py"]}
    job = api.post("/api/v1/jobs/", {"spec": spec}, format="json")
    assert job.status_code == 201, job.json()
    conforms(job, "/api/v1/jobs/", "post")
    bad_job = api.post("/api/v1/jobs/", {"spec": {**spec, "command": "rm -rf /"}}, format="json")
    assert bad_job.status_code == 400
    conforms(bad_job, "/api/v1/jobs/", "post")
    conforms(api.get("/api/v1/jobs/", {"state": "queued"}), "/api/v1/jobs/", "get")
    conforms(api.get(f"/api/v1/jobs/{job.json()['id']}/runs/", {"offset": 0}), "/api/v1/jobs/{id}/runs/", "get")


JOB_SPECS = [  # (spec, accepted by the API's validator); the data root is the default's own
    ({"task_name": "x", "image": "yolo:v8n-cu118", "team": "vision", "command": ["python", "t.py"]}, True),
    ({"task_name": "d", "image": "yolo:v8n-cu118", "team": "vision", "priority": "high", "timeout": "4h",
      "resources": {"gpu": 2, "memory": "32Gi", "cpu": 8},
      "yolo": {"model": "yolov8n.yaml", "data": "shapes/data.yaml", "epochs": 3, "batch": -1,
               "extra": {"lr0": 0.01, "optimizer": "AdamW", "cache": "ram", "freeze": [0, 1]}, "export": ["onnx"]}},
     True),
    ({"task_name": "t", "image": "yolo:v8n-cu118", "user": "vision",
      "yolo": {"model": "w/best.pt", "data": "d.yaml"}, "tune": {"iterations": 3, "space": {"lr0": [0.001, 0.1]}}},
     True),
    ({"task_name": "s", "image": "yolo:v8n-cu118", "user": "vision",
      "command": "yolo train data=d.yaml model=yolov8s.pt epochs=2"}, True),
    ({"task_name": "x", "image": "yolo:v8n-cu118", "team": "vision", "command": "rm -rf /"}, False),
    ({"task_name": " ", "image": "yolo:v8n-cu118", "team": "vision", "command": ["t"]}, False),
    ({"task_name": "x", "image": "nope:1", "team": "vision", "command": ["t"]}, False),
    ({"task_name": "x", "image": "yolo:v8n-cu118", "team": "vision", "command": ["t"], "gpus": 1}, False),
    ({"task_name": "x", "image": "yolo:v8n-cu118", "team": "vision", "command": ["t"],
      "yolo": {"model": "yolov8n.yaml", "data": "d.yaml"}}, False),
    ({"task_name": "x", "image": "yolo:v8n-cu118", "team": "vision", "resources": {"gpu": 5},
      "yolo": {"model": "yolov8n.yaml", "data": "d.yaml"}}, False),
    ({"task_name": "x", "image": "yolo:v8n-cu118", "team": "vision", "timeout": "0m", "command": ["t"]}, False),
    ({"task_name": "x", "image": "yolo:v8n-cu118", "team": "vision",
      "yolo": {"model": "yolov8n.yaml", "data": "/etc/data.yaml"}}, False),
    ({"task_name": "x", "image": "yolo:v8n-cu118", "team": "vision",
      "yolo": {"model": "yolov8n.yaml", "data": "d.yaml", "batch": 0, "extra": {"lr0": "big"}}}, False),
    ({"task_name": "x", "image": "yolo:v8n-cu118", "team": "vision",
      "yolo": {"model": "yolov8n.yaml", "data": "d.yaml"}, "tune": {"iterations": 0}}, False),
]


@pytest.mark.django_db
@pytest.mark.parametrize(("spec", "valid"), JOB_SPECS)
def test_the_job_spec_schema_says_what_the_validator_says(people, inventory, spec, valid):
    """The `spec` schema a team member is served (their teams, the catalog, the largest node's
    4 GPUs) accepts what job_submit's validator accepts and refuses what it refuses."""
    from tests.support import client_for
    from training.jobspec import JobSpecError, parse_job_spec
    from training.seed_style import normalize_submitted
    from training.services import allowed_images, data_roots_for, largest_node_gpu_count

    served = yaml.safe_load(client_for(people["owner"], api=True).get("/api/schema/").content)
    components = openapi_to_jsonschema(served["components"]["schemas"])
    assert components["JobSpecRequest"]["properties"]["team"]["enum"] == ["vision"]
    schema = {"$ref": "#/components/schemas/JobSpecRequest", "components": {"schemas": components}}
    try:
        parse_job_spec(normalize_submitted(spec), allowed_images=set(allowed_images()),
                       data_roots=data_roots_for(people["vision"]), max_gpus=largest_node_gpu_count())
        accepted = True
    except JobSpecError:
        accepted = False
    assert accepted == valid
    assert jsonschema.Draft7Validator(schema).is_valid(spec) == valid


@pytest.mark.django_db
def test_unknown_api_paths_answer_in_the_error_shape_even_with_a_session(people):
    """A fuzzer's malformed id (`/waitlist/0.5/leave/`) misses every route; with a session cookie
    Django's CSRF page (HTML 403) used to answer instead of the API's JSON 404."""
    from django.test import Client

    browser = Client(enforce_csrf_checks=True)
    browser.force_login(people["owner"])
    response = browser.post("/api/v1/waitlist/0.5/leave/")
    assert response.status_code == 404 and response.json() == {"code": "not_found", "detail": "Not found."}
