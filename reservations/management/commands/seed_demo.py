import datetime as dt
import random

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from config.errors import DomainError
from gpus.discovery import DiscoveredGpu, DiscoveredNode
from gpus.models import Gpu
from gpus.services import inventory_register
from reservations import services, timegrid
from reservations.models import Membership, Reservation, Team, UserProfile

DEMO_PASSWORD = "gpubook-demo"  # noqa: S105 — the documented demo login, never a real secret
DEMO_NOTE_PREFIX = "demo: "
DEMO_JOB_NAME = "demo: shapes detector"
DEMO_PURPOSES = ["yolov8n sweep", "detector fine-tune", "ablation", "eval run"]


class Command(BaseCommand):
    help = "Create demo nodes, GPUs, teams, users and a week of bookings (idempotent)."

    def add_arguments(self, parser):
        parser.add_argument(
            "--i-know",
            action="store_true",
            help="seed even with DEBUG=false (it creates admin / gpubook-demo: never on a real server)",
        )

    def handle(self, *args, **options):
        # The demo logins have a published password: a production database must never get them.
        if not settings.DEBUG and not options["i_know"]:
            raise CommandError(
                "seed_demo creates users with the published password 'gpubook-demo' and refuses to run "
                "with DEBUG=false. Use DEBUG=true (make run), or pass --i-know on a throwaway instance."
            )
        now = timezone.now()
        for name, model, memory in [("gpu-a", "NVIDIA A100-SXM4-80GB", 81920), ("gpu-b", "NVIDIA L40S", 46068)]:
            inventory_register(
                node=DiscoveredNode(
                    name=name,
                    gpus=tuple(DiscoveredGpu(index=i, model_name=model, memory_mib=memory) for i in range(4)),
                )
            )
        vision, _ = Team.objects.get_or_create(
            slug="vision",
            defaults={
                "name": "vision",
                "monthly_gpu_hours": 2000,
                "user_daily_cap_gpu_hours": 96,
                "time_zone": "Europe/Berlin",
            },
        )
        nlp, _ = Team.objects.get_or_create(
            slug="nlp", defaults={"name": "nlp", "monthly_gpu_hours": 1200, "time_zone": "America/New_York"}
        )
        users = {}
        for username, team, role, zone in [
            ("alice", vision, Membership.Role.MEMBER, "Europe/Berlin"),
            ("bob", vision, Membership.Role.MANAGER, "Europe/Berlin"),
            ("carol", nlp, Membership.Role.MEMBER, "America/New_York"),
        ]:
            users[username] = self._user(username, email=f"{username}@example.com")
            Membership.objects.get_or_create(user=users[username], team=team, defaults={"role": role})
            UserProfile.objects.get_or_create(user=users[username], defaults={"time_zone": zone})
        admin = self._user("admin", email="admin@example.com", superuser=True)
        UserProfile.objects.get_or_create(user=admin)

        if not Reservation.objects.filter(note__startswith=DEMO_NOTE_PREFIX).exists():
            made = self._week_of_bookings(now=now, users=users, teams={"vision": vision, "nlp": nlp})
            self.stdout.write(f"created {made} demo bookings")
        self._demo_job(now=now, user=users["alice"])
        self.stdout.write("Demo logins (password gpubook-demo): alice, bob (vision manager), carol (nlp), admin")

    def _demo_job(self, *, now: dt.datetime, user) -> None:
        """A short YOLO training on the synthetic dataset, queued for idle GPUs: `make run`
        trains it for real (on the CPU where there is no GPU)."""
        from django.core.management import call_command

        from training.management.commands.make_demo_dataset import demo_dataset_root
        from training.models import TrainingJob
        from training.services import job_submit

        if TrainingJob.objects.filter(name=DEMO_JOB_NAME).exists():
            return
        data_yaml = demo_dataset_root() / "data.yaml"
        if not data_yaml.exists():
            call_command("make_demo_dataset", stdout=self.stdout)
        job_submit(
            user=user, now=now,
            document={
                "task_name": DEMO_JOB_NAME, "image": "yolo:v8n-cu118", "team": "vision", "priority": "medium",
                # About a minute on two CPU cores, and enough epochs for a real mAP.
                "yolo": {"model": "yolov8n.yaml", "data": str(data_yaml), "epochs": 30, "imgsz": 128, "batch": 8},
                "estimated_duration": "10m",
            },
        )
        self.stdout.write(f"queued the demo training job {DEMO_JOB_NAME!r}")

    def _user(self, username: str, *, email: str, superuser: bool = False):
        user_model = get_user_model()
        user, created = user_model.objects.get_or_create(
            username=username, defaults={"email": email, "is_superuser": superuser, "is_staff": superuser}
        )
        if created:
            user.set_password(DEMO_PASSWORD)
            user.save()
        return user

    def _week_of_bookings(self, *, now: dt.datetime, users: dict, teams: dict) -> int:
        """A plausible week: daytime blocks of 2–6 h on one to four GPUs of a node."""
        chooser = random.Random(20261129)  # fixed seed: the same demo every time
        gpus_by_node: dict[int, list[int]] = {}
        for gpu_id, node_id in Gpu.objects.values_list("pk", "node_id"):
            gpus_by_node.setdefault(node_id, []).append(gpu_id)
        first_slot = timegrid.ceil_to_slot(now, slot_minutes=30)
        made = 0
        for day in range(7):
            for _ in range(6):
                username = chooser.choice(["alice", "bob", "carol"])
                team = teams["nlp"] if username == "carol" else teams["vision"]
                node_gpus = gpus_by_node[chooser.choice(sorted(gpus_by_node))]
                count = chooser.choice([1, 1, 2, 4])
                start = first_slot + dt.timedelta(days=day, hours=chooser.randrange(0, 20))
                try:
                    services.reservation_create(
                        user=users[username],
                        team=team,
                        gpu_ids=chooser.sample(node_gpus, count),
                        start=start,
                        end=start + dt.timedelta(hours=chooser.choice([2, 3, 4, 6])),
                        note=DEMO_NOTE_PREFIX + chooser.choice(DEMO_PURPOSES),
                        now=now,
                    )
                    made += 1
                except DomainError:
                    continue  # collided with an earlier demo booking: fine, the week is still busy
        return made
