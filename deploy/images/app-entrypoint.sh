#!/bin/sh
# The app image's entrypoint: the first argument names the process; each one is exec'd so it
# is tini's only child and receives SIGTERM itself. GPUBOOK_ENTRYPOINT_DRY_RUN=1 prints the
# command instead (tests/deploy checks every alias names a real command).
set -eu

run() {
  if [ "${GPUBOOK_ENTRYPOINT_DRY_RUN:-0}" = 1 ]; then
    printf '%s\n' "$*"
    exit 0
  fi
  exec "$@"
}

cmd="${1:-web}"
[ "$#" -gt 0 ] && shift
case "$cmd" in
  web)
    run gunicorn config.wsgi --bind "${GUNICORN_BIND:-0.0.0.0:8000}" --worker-class gthread \
      --workers "${GUNICORN_WORKERS:-4}" --threads "${GUNICORN_THREADS:-8}" \
      --forwarded-allow-ips "${GUNICORN_FORWARDED_ALLOW_IPS:-127.0.0.1}" \
      --access-logfile - "$@" ;;
  worker) run celery -A config worker --loglevel "${LOG_LEVEL:-INFO}" --without-gossip "$@" ;;
  beat) run celery -A config beat --loglevel "${LOG_LEVEL:-INFO}" \
      --schedule "${GPUBOOK_VAR_DIR:-/var/lib/gpubook}/celerybeat-schedule" "$@" ;;
  scheduler) run python manage.py scheduler "$@" ;;
  gpu_agent) run python manage.py gpu_agent "$@" ;;
  migrate) run python manage.py migrate --no-input "$@" ;;
  manage) run python manage.py "$@" ;;
  *) run "$cmd" "$@" ;;
esac
