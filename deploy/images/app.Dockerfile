# syntax=docker/dockerfile:1
# The gpubook app image: one image for every process, chosen by the command.
#
#   web        gunicorn config.wsgi (static files served by WhiteNoise, collected at build)
#   worker     celery -A config worker          beat   celery -A config beat
#   scheduler  manage.py scheduler (the embedded loop)
#   gpu_agent  manage.py gpu_agent (telemetry of a GPU host)
#   migrate    manage.py migrate --no-input     manage ARGS  manage.py ARGS
#   anything else is run as given (exec), e.g. `python manage.py createsuperuser`.
#
# Build from the repository root (deploy/images/build.sh app, or `make images`):
#   docker build -f deploy/images/app.Dockerfile -t gpubook-app .
# No training stack: the Kubernetes executor runs trainer images (trainer.Dockerfile). For a
# single GPU server whose local executor trains in this container, build with
# --build-arg WITH_TRAINING=true (adds requirements-training.txt, about 6 GB); compose.yaml does.

FROM python:3.11-slim-bookworm

ARG UID=10001
ARG WITH_TRAINING=false

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    DJANGO_SETTINGS_MODULE=config.settings \
    GPUBOOK_VAR_DIR=/var/lib/gpubook \
    GPUBOOK_RUNS_DIR=/srv/gpubook/runs \
    STATIC_ROOT=/app/staticfiles \
    SECRET_KEY_MIN_LENGTH=50 \
    YOLO_OFFLINE=1

# tini as PID 1: SIGTERM reaches gunicorn/celery/the loop, and zombies of runs are reaped.
RUN apt-get update \
 && apt-get install -y --no-install-recommends tini \
 && rm -rf /var/lib/apt/lists/*

COPY requirements.txt requirements-training.txt /tmp/
RUN pip install -r /tmp/requirements.txt \
 && if [ "$WITH_TRAINING" = "true" ]; then pip install -r /tmp/requirements-training.txt; fi \
 && pip check \
 && rm /tmp/requirements.txt /tmp/requirements-training.txt

RUN useradd --uid "${UID}" --create-home --shell /usr/sbin/nologin gpubook \
 && install -d -o "${UID}" -g "${UID}" /var/lib/gpubook /srv/gpubook/runs /srv/gpubook/data

WORKDIR /app
# Filtered by app.Dockerfile.dockerignore: the code, templates and static sources only.
COPY . /app

# Hashed, gzip-compressed static files baked into the image (read-only at run time). The key
# exists only for this build step; the runtime refuses to start without a real one.
RUN SECRET_KEY=collectstatic-at-build-time-only-not-a-secret-0123456789abcdef \
    DEBUG=false GPUBOOK_VAR_DIR=/tmp/build-var \
    python manage.py collectstatic --no-input -v0 \
 && rm -rf /tmp/build-var \
 && python -m compileall -q /app

USER ${UID}:${UID}
EXPOSE 8000
VOLUME ["/var/lib/gpubook"]

LABEL org.opencontainers.image.title="gpubook" \
      org.opencontainers.image.description="gpubook web, Celery worker/beat, scheduler loop and gpu_agent"

# Exec form: tini is PID 1, the entrypoint execs the chosen process, which gets the signals.
ENTRYPOINT ["/usr/bin/tini", "--", "/app/deploy/images/app-entrypoint.sh"]
CMD ["web"]
