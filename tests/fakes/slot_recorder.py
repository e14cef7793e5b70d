"""A stand-in training job for timing tests: appends when it started and when SIGTERM came
(JSON lines, wall-clock seconds) to the file named by its first argument, then exits 75
("checkpointed") on SIGTERM like the real runner."""

import json
import signal
import sys
import time


def log(path: str, event: str) -> None:
    with open(path, "a") as events:
        events.write(json.dumps({"event": event, "t": time.time()}) + "\n")


def main(path: str) -> None:
    def on_term(*_):
        log(path, "sigterm")
        sys.exit(75)

    signal.signal(signal.SIGTERM, on_term)
    log(path, "started")
    while True:
        time.sleep(0.01)


if __name__ == "__main__":
    main(sys.argv[1])
