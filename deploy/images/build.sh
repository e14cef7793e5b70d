#!/usr/bin/env bash
# Build the app image and the trainer images of the catalog from the repository root.
#
#   deploy/images/build.sh                 # the app image and all trainer tags
#   deploy/images/build.sh app             # the app image only (gpubook-app:$APP_TAG)
#   deploy/images/build.sh yolo:v8n-cu118  # some tags
#   deploy/images/build.sh --dry-run       # print the docker commands only
#
# Environment: REGISTRY (prefix, e.g. "registry.example/gpubook/"), DOCKER (default: docker),
# APP_TAG (default: latest), WITH_TRAINING=true to put the training stack into the app image
# (single-server local executor), REQUIRE_DOCKER=1 to fail instead of skipping where docker
# is missing.
set -euo pipefail

cd "$(dirname "$0")/../.."

# tag -> base image (CUDA build of PyTorch) | model label | CUDA label.
# torch/torchvision come from the base image: cu118 wheels end with torch 2.7, cu121 with 2.5.
declare -A BASE=(
  [yolo:v8n-cu118]="pytorch/pytorch:2.7.1-cuda11.8-cudnn9-runtime"
  [yolo:v8x-cu118]="pytorch/pytorch:2.7.1-cuda11.8-cudnn9-runtime"
  [yolo:v10l-cu121]="pytorch/pytorch:2.5.1-cuda12.1-cudnn9-runtime"
)
declare -A MODEL=([yolo:v8n-cu118]=yolov8n [yolo:v8x-cu118]=yolov8x [yolo:v10l-cu121]=yolov10l)
ALL_TAGS=(yolo:v8n-cu118 yolo:v8x-cu118 yolo:v10l-cu121)
build_app=0

dry_run=0
tags=()
for arg in "$@"; do
  case "$arg" in
    --dry-run) dry_run=1 ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    app) build_app=1 ;;
    *)
      if [[ -z "${BASE[$arg]+set}" ]]; then
        echo "build.sh: unknown tag '$arg' (known: ${ALL_TAGS[*]})" >&2
        exit 2
      fi
      tags+=("$arg") ;;
  esac
done
if [[ ${#tags[@]} -eq 0 && $build_app -eq 0 ]]; then
  build_app=1
  tags=("${ALL_TAGS[@]}")
fi

docker_cmd="${DOCKER:-docker}"
if [[ $dry_run -eq 0 ]]; then
  if ! command -v "$docker_cmd" >/dev/null 2>&1 || ! "$docker_cmd" info >/dev/null 2>&1; then
    echo "build.sh: SKIPPED: no usable docker here ('$docker_cmd' missing or its daemon unreachable);" \
         "no image was built. Run it on a machine with Docker (BuildKit)." >&2
    [[ "${REQUIRE_DOCKER:-0}" == 1 ]] && exit 1
    exit 0
  fi
fi

if [[ $build_app -eq 1 ]]; then
  cmd=(env DOCKER_BUILDKIT=1 "$docker_cmd" build
       -f deploy/images/app.Dockerfile
       --build-arg "WITH_TRAINING=${WITH_TRAINING:-false}"
       -t "${REGISTRY:-}gpubook-app:${APP_TAG:-latest}"
       .)
  if [[ $dry_run -eq 1 ]]; then
    printf '%q ' "${cmd[@]}"; echo
  else
    echo "build.sh: building ${REGISTRY:-}gpubook-app:${APP_TAG:-latest}" >&2
    "${cmd[@]}"
  fi
fi

for tag in "${tags[@]+"${tags[@]}"}"; do
  cuda="${tag##*-}"
  cmd=(env DOCKER_BUILDKIT=1 "$docker_cmd" build
       -f deploy/images/trainer.Dockerfile
       --build-arg "BASE_IMAGE=${BASE[$tag]}"
       --build-arg "MODEL=${MODEL[$tag]}"
       --build-arg "CUDA=${cuda}"
       -t "${REGISTRY:-}${tag}"
       .)
  if [[ $dry_run -eq 1 ]]; then
    printf '%q ' "${cmd[@]}"; echo
  else
    echo "build.sh: building ${REGISTRY:-}${tag} from ${BASE[$tag]}" >&2
    "${cmd[@]}"
  fi
done
