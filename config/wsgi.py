import gc
import os

from django.core.wsgi import get_wsgi_application
from django.urls import get_resolver

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
application = get_wsgi_application()

# Import every view now, while the worker boots, not in the first requests it serves: a
# gunicorn worker's first bookings otherwise waited for the whole URLconf's imports, the
# slowest 1 % of a 16-client rush after a deploy (benchmarks/booking.py, #19: its first ten
# bookings per client had p99 0.8 s with the URLconf lazy, 0.3 s with it loaded here).
get_resolver().url_patterns  # noqa: B018 (evaluated for its imports)

# What the worker has loaded lives as long as it does: move it out of the collector's sight, so
# a full collection scans only what requests made (32-42 ms with ~130,000 objects, with
# the worker's GIL held, otherwise).
gc.freeze()
