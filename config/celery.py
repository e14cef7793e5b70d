"""The Celery app (production mode): a worker runs the tasks, beat ticks reconcile.

    celery -A config worker -l info
    celery -A config beat -l info
"""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("gpubook")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
