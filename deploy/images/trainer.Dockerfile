# syntax=docker/dockerfile:1
# The gpubook trainer image: CUDA + PyTorch (from the base image), pinned Ultralytics and the
# ONNX stack, and the training runner. Build from the repository root with build.sh, which
# passes the arguments for each catalog tag (yolo:v8n-cu118, yolo:v8x-cu118, yolo:v10l-cu121).
#
#   docker build -f deploy/images/trainer.Dockerfile \
#     --build-arg BASE_IMAGE=pytorch/pytorch:2.7.1-cuda11.8-cudnn9-runtime \
#     --build-arg MODEL=yolov8n --build-arg CUDA=cu118 -t yolo:v8n-cu118 .
#
# The context is filtered by trainer.Dockerfile.dockerignore (BuildKit): only the runner and
# requirements-training.txt are sent, never .venv.

ARG BASE_IMAGE=pytorch/pytorch:2.7.1-cuda11.8-cudnn9-runtime
FROM ${BASE_IMAGE}

# What the catalog tag stands for. The model is a label only: the job spec names the model
# (a model YAML, or weights on a mounted volume); nothing is downloaded at run time.
ARG MODEL=yolov8n
ARG CUDA=cu118
ARG UID=10001

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    YOLO_OFFLINE=1

# tini as PID 1 forwards SIGTERM to the runner (a Python PID 1 without a handler would ignore
# it). libgl1/libglib2.0-0: opencv-python (not headless), which Ultralytics pulls in, needs them.
RUN apt-get update \
 && apt-get install -y --no-install-recommends tini libgl1 libglib2.0-0 \
 && rm -rf /var/lib/apt/lists/*

# The training pins (ultralytics, onnx, onnxslim, onnxruntime) come from
# requirements-training.txt; torch and torchvision stay those of the base image, which is
# the build for this tag's CUDA (constraints keep pip from replacing them).
COPY requirements-training.txt /tmp/requirements-training.txt
RUN python -c "import sys; assert sys.version_info >= (3, 11), 'the runner needs Python >= 3.11'" \
 && grep -vE '^(torch|torchvision)([=<>!~ ]|$)' /tmp/requirements-training.txt > /tmp/requirements.txt \
 && pip freeze | grep -iE '^(torch|torchvision)==' > /tmp/constraints.txt \
 && pip install -c /tmp/constraints.txt -r /tmp/requirements.txt \
 && pip check \
 && rm /tmp/requirements-training.txt /tmp/requirements.txt /tmp/constraints.txt

RUN useradd --uid "${UID}" --create-home --shell /usr/sbin/nologin runner
WORKDIR /app
# training/__init__.py must stay free of Django imports: the runner package sits under it.
COPY training/__init__.py training/__init__.py
COPY training/runner/ training/runner/
ENV PYTHONPATH=/app HOME=/home/runner

USER ${UID}:${UID}
# Build matplotlib's font cache as the runtime user, and prove the runner starts.
RUN python -c "import matplotlib.font_manager" \
 && python -m training.runner --help > /dev/null

LABEL org.opencontainers.image.title="gpubook trainer" \
      org.opencontainers.image.description="Ultralytics YOLO training runner (python -m training.runner)" \
      org.gpubook.model="${MODEL}" \
      org.gpubook.cuda="${CUDA}"

# Exec form: tini is PID 1 and the runner its only child. No "-g": the runner, not its
# DataLoader workers, gets the signal (it moves them out of its process group anyway).
ENTRYPOINT ["/usr/bin/tini", "--", "python", "-m", "training.runner"]
CMD ["--spec", "/spec/spec.json"]
